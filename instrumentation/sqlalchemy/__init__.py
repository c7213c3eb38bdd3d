"""SQLAlchemy integration: lock waits, deadlocks, conflicts and unsafe read-modify-writes.

:func:`instrument_sqlalchemy` adds dialect event listeners to a sync ``Engine`` or an
``AsyncEngine`` (PostgreSQL, MySQL / MariaDB, SQLite) that turn the SQL it runs into the
database half of the metric catalog. The rules are in ``docs/sqlalchemy.md``.

Example::

    import sqlalchemy as sa
    from stocksentry.instrumentation import configure
    from stocksentry.instrumentation.sqlalchemy import StockTable, instrument_sqlalchemy

    sentry = configure()
    engine = sa.create_engine("postgresql+psycopg://shop@db/shop")
    instrument_sqlalchemy(
        engine, sentry=sentry, stock_tables={"products": StockTable()}, spans="locking"
    )
"""

# Every module of this package imports the real SQLAlchemy as ``import sqlalchemy``: with
# absolute imports (the only kind in Python 3) that is the top-level distribution, never
# this package, whatever its name.
from __future__ import annotations

from .classifier import classify_statement
from .instrumentor import instrument_sqlalchemy, is_instrumented, uninstrument_sqlalchemy
from .model import DEFAULT_READ_WINDOW, SpanMode, StatementInfo, StockTable, WriteKind

__all__ = [
    "DEFAULT_READ_WINDOW",
    "SpanMode",
    "StatementInfo",
    "StockTable",
    "WriteKind",
    "classify_statement",
    "instrument_sqlalchemy",
    "is_instrumented",
    "uninstrument_sqlalchemy",
]
