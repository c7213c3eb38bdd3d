"""A SQLite database made for one test: the engine, with its tables and rows."""

from __future__ import annotations

import sqlalchemy as sa


def sqlite_engine(url: str, *statements: str) -> sa.Engine:
    """An engine on ``url`` (``sqlite://…``) after ``statements`` ran in one transaction."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)
    return engine
