"""Probes of the server's own state: lock waiters, deadlocks, long transactions.

They read PostgreSQL's statistics views (``pg_locks``, ``pg_stat_activity``,
``pg_stat_database``) for the current database, never the shop's tables.
"""

from __future__ import annotations

import datetime as dt
from typing import Final

from prometheus_client.core import Metric
from psycopg import sql
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ..base import LONG_TRANSACTION_MAX, LONG_TRANSACTIONS, family
from .common import DbProbe, number, one_row, quoted_name
from .pool import Conn, PgPool

__all__ = ["DeadlocksProbe", "LockWaitersProbe", "LongTransactionsProbe"]


_LOCK_WAITERS_SQL: Final = (
    "SELECT count(DISTINCT l.pid),"
    " coalesce(max(extract(epoch FROM clock_timestamp() - {since})), 0)"
    " FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
    " WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid()"
)


class LockWaitersProbe(DbProbe):
    """``stock_db_lock_waiters`` and ``stock_db_lock_wait_max_seconds`` in this database.

    The wait starts at ``pg_locks.waitstart`` (PostgreSQL 14+), else at the session's last
    state change (the start of the statement that waits), else its ``query_start``.
    Other roles' sessions show their times only to members of ``pg_monitor``.
    """

    specs = (catalog.DB_LOCK_WAITERS, catalog.DB_LOCK_WAIT_MAX)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("lock_waiters", config.probes.lock_waiters, pool)
        self._sql_14 = sql.SQL(
            _LOCK_WAITERS_SQL.format(since="coalesce(l.waitstart, a.state_change, a.query_start)")
        )
        self._sql_old = sql.SQL(
            _LOCK_WAITERS_SQL.format(since="coalesce(a.state_change, a.query_start)")
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        query = self._sql_14 if conn.info.server_version >= 140000 else self._sql_old
        waiters, longest = await one_row(conn, query)
        return (
            family(catalog.DB_LOCK_WAITERS, [((), number(waiters))]),
            family(catalog.DB_LOCK_WAIT_MAX, [((), max(0.0, number(longest)))]),
        )


class DeadlocksProbe(DbProbe):
    """``stock_db_deadlocks_total{database}`` from ``pg_stat_database``."""

    specs = (catalog.DB_DEADLOCKS,)
    _SQL: Final = sql.SQL(
        "SELECT datname::text, deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("deadlocks", config.probes.deadlocks, pool)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        database, deadlocks = await one_row(conn, self._SQL)
        return (family(catalog.DB_DEADLOCKS, [((str(database),), number(deadlocks))]),)


class LongTransactionsProbe(DbProbe):
    """Transactions open longer than ``threshold`` that hold a lock on a stock table.

    Exports ``stock_db_long_transactions`` and ``stock_db_long_transaction_max_seconds``.
    The stock tables are the mapped products, orders, order_items, reservations and outbox tables.
    """

    specs = (LONG_TRANSACTIONS, LONG_TRANSACTION_MAX)
    _SQL: Final = sql.SQL(
        "SELECT count(*), coalesce(max(extract(epoch FROM clock_timestamp() - a.xact_start)), 0)"
        " FROM pg_stat_activity AS a"
        " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
        " AND a.xact_start < clock_timestamp() - %(threshold)s"
        " AND EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND l.granted"
        " AND l.relation = ANY (ARRAY(SELECT to_regclass(t)::oid"
        " FROM unnest(%(tables)s::text[]) AS t)))"
    )

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        settings = config.probes.long_transactions
        super().__init__("long_transactions", settings, pool)
        s = config.schema
        tables = [s.products.table, s.orders.table, s.order_items.table]
        if s.reservations is not None:
            tables.append(s.reservations.table)
        if s.outbox is not None:
            tables.append(s.outbox.table)
        self._params = {
            "threshold": dt.timedelta(seconds=settings.threshold),
            "tables": [quoted_name(t) for t in dict.fromkeys(tables)],
        }

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        count, oldest = await one_row(conn, self._SQL, self._params)
        return (
            family(LONG_TRANSACTIONS, [((), number(count))]),
            family(LONG_TRANSACTION_MAX, [((), max(0.0, number(oldest)))]),
        )
