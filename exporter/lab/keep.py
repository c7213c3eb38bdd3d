"""A copy of the lab's shop in a SQLite file, for ``stocksentry reconcile`` afterwards.

The embedded servers are gone when the demo ends; :func:`save_shop` copies the shop's
tables (products, orders, order_items, idempotency_keys, outbox) into a SQLite file first,
so the audit can be run again on exactly what the demo sold.

Example::

    save_shop("postgresql+psycopg://postgres@/postgres?host=/tmp/pg", "stocksentry-demo.db")
    # then: stocksentry reconcile --database sqlite:///stocksentry-demo.db \\
    #           --allocation initial_stock
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from .config import LabError
from .shop import first_line, metadata, normalize_url

#: Rows copied per INSERT.
BATCH = 2000


def save_shop(database_url: str, path: str | Path) -> int:
    """Copy the shop's tables from ``database_url`` into the SQLite file ``path``
    (replaced); returns the rows copied. Raises :class:`LabError` on failure."""
    target = Path(path)
    source = sa.create_engine(normalize_url(database_url))
    copy = sa.create_engine(f"sqlite:///{target}")
    copied = 0
    try:
        target.unlink(missing_ok=True)
        metadata.create_all(copy)
        with source.connect() as src, copy.begin() as dst:
            for table in metadata.sorted_tables:
                result = src.execute(sa.select(table)).mappings()
                while rows := result.fetchmany(BATCH):
                    dst.execute(table.insert(), [dict(row) for row in rows])
                    copied += len(rows)
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        raise LabError(f"cannot save the shop to {target}: {first_line(exc)}") from exc
    finally:
        source.dispose()
        copy.dispose()
    return copied
