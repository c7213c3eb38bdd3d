"""SQLAlchemy integration: lock waits, deadlocks, conflicts and unsafe read-modify-writes.

:func:`instrument_sqlalchemy` adds engine event listeners that watch the SQL the
application really runs (sync ``Engine`` or ``AsyncEngine``; PostgreSQL through psycopg 3
or asyncpg, SQLite through pysqlite or aiosqlite) and record:

- ``stock_db_lock_wait_duration_seconds{table}``: the duration of every locking statement
  (``SELECT … FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE`` and ``LOCK TABLE`` on any
  table, ``UPDATE`` and ``DELETE`` on the configured stock tables), with the trace id as
  exemplar;
- ``stock_db_deadlock_total{table}`` and ``stock_db_serialization_failure_total{table}``
  from the driver's SQLSTATE (40P01, 40001), one per failed statement; a lock timeout
  (55P03) is observed as a lock wait and logged, the reservation's ``lock_timeout`` comes
  from :func:`~stocksentry.instrumentation.classify_exception`;
- a conditional stock update that matched no row (``SET s = s - :q WHERE … AND s >= :q``)
  marks the active reservation ``out_of_stock`` (``lost_race`` for a compare-and-set);
- ``stock_unsafe_read_modify_write_total{table}`` and one ``unsafe_read_modify_write``
  warning line with the code location, when a stock value read without a lock is written
  back as a value computed in the application.

Every statement is classified once per distinct SQL text by a small tokenizer (no
dependency), so the per-statement cost is a dictionary lookup. The rules are in
``docs/sqlalchemy.md``.

Example::

    import sqlalchemy as sa
    from stocksentry.instrumentation import configure
    from stocksentry.instrumentation.sqlalchemy import StockTable, instrument_sqlalchemy

    sentry = configure()
    engine = sa.create_engine("postgresql+psycopg://shop@db/shop")
    instrument_sqlalchemy(
        engine, sentry=sentry, stock_tables={"products": StockTable()}, spans="locking"
    )

The package is split by role: :mod:`.model` (``StockTable``, ``StatementInfo``),
:mod:`.tokens` and :mod:`.clauses` (the tokenizer and its helpers), :mod:`.classifier`,
:mod:`.state` (remembered reads and per-connection locks), :mod:`.location` (the
application's code location), :mod:`.listeners`, :mod:`.otel` (the opentelemetry
instrumentation's spans) and :mod:`.instrumentor` (the set-up functions).
"""

# Every module of this package imports the real SQLAlchemy as ``import sqlalchemy``: with
# absolute imports (the only kind in Python 3) that is the top-level distribution, never
# this package, whatever its name.
from __future__ import annotations

from .classifier import classify_statement
from .instrumentor import (
    _instrumented as _instrumented,  # the tests read which engines are instrumented
)
from .instrumentor import (
    instrument_sqlalchemy,
    is_instrumented,
    uninstrument_sqlalchemy,
)
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
