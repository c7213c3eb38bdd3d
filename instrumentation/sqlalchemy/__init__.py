"""SQLAlchemy integration: lock waits, deadlocks, conflicts and unsafe read-modify-writes.

:func:`instrument_sqlalchemy` adds dialect event listeners to a sync ``Engine`` or an
``AsyncEngine`` (PostgreSQL, MySQL / MariaDB, SQLite) that time every locking statement
(``stock_db_lock_wait_duration_seconds{table}``), count deadlocks and serialization
failures from the driver's SQLSTATE, mark the active reservation ``out_of_stock`` /
``lost_race`` when a guarded stock update matched no row, and count a stock value read
without a lock and written back as a value computed in the application
(``stock_unsafe_read_modify_write_total{table}``). Each SQL text is classified once by a
small tokenizer (no dependency). The rules are in ``docs/sqlalchemy.md``.

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
