"""Probes of the server's own state on MySQL/MariaDB: lock waiters, deadlocks, long
transactions.

They read ``information_schema.innodb_trx`` (InnoDB's open transactions, with the time
each started and, while it waits for a row lock, since when) joined to
``information_schema.processlist`` for the session's database, and the global status
counter ``Innodb_deadlocks``; never the shop's tables. Both views need the ``PROCESS``
privilege to show other users' sessions.

The figures keep the metric names of PostgreSQL (the dashboards and alerts are the same).
The server-wide counters follow mysqld_exporter's naming, which the docs map:
``Innodb_deadlocks`` is what mysqld_exporter exports as
``mysql_global_status_innodb_deadlocks``.

MySQL 8 differences (see docs/exporter-config.md): ``processlist.time_ms`` is MariaDB's,
so the longest wait on MySQL comes from ``trx_wait_started`` alone (whole seconds); the
lock graph itself is ``performance_schema.data_lock_waits`` there
(``information_schema.innodb_lock_waits`` is MariaDB's and MySQL 5.7's).
"""

from __future__ import annotations

from typing import Final

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ..base import LONG_TRANSACTION_MAX, LONG_TRANSACTIONS, family
from .common import MyDbProbe, interval_us, number
from .pool import MyPool, MySession

__all__ = ["DeadlocksProbe", "LockWaitersProbe", "LongTransactionsProbe"]

# A waiting transaction of a session of this database. trx_wait_started has whole seconds
# (rounded down, so the wait looks up to a second longer); on MariaDB the statement's own
# time in processlist (milliseconds, and never shorter than its wait) bounds it too.
_WAITERS: Final = (
    "SELECT count(*), coalesce(max({wait}), 0) / 1000000"
    " FROM information_schema.innodb_trx AS t"
    " JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id"
    " WHERE t.trx_state = 'LOCK WAIT' AND p.db = database()"
    " AND t.trx_mysql_thread_id <> connection_id()"
)
_WAIT_MARIADB: Final = (
    "least(timestampdiff(MICROSECOND, t.trx_wait_started, now(6)), p.time_ms * 1000)"
)
_WAIT_MYSQL: Final = "timestampdiff(MICROSECOND, t.trx_wait_started, now(6))"


class LockWaitersProbe(MyDbProbe):
    """``stock_db_lock_waiters`` and ``stock_db_lock_wait_max_seconds`` in this database:
    InnoDB transactions waiting for a row lock, and the longest wait."""

    specs = (catalog.DB_LOCK_WAITERS, catalog.DB_LOCK_WAIT_MAX)

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        super().__init__("lock_waiters", config.probes.lock_waiters, pool)
        self._sql = {
            "mariadb": _WAITERS.format(wait=_WAIT_MARIADB),
            "mysql": _WAITERS.format(wait=_WAIT_MYSQL),
        }

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        waiters, longest = await session.one(self._sql[session.flavor])
        return (
            family(catalog.DB_LOCK_WAITERS, [((), number(waiters))]),
            family(catalog.DB_LOCK_WAIT_MAX, [((), max(0.0, number(longest)))]),
        )


class DeadlocksProbe(MyDbProbe):
    """``stock_db_deadlocks_total{database}`` from the global status ``Innodb_deadlocks``.

    InnoDB counts deadlocks for the whole server, not per schema (mysqld_exporter's
    ``mysql_global_status_innodb_deadlocks``); the ``database`` label is the URL's
    database, as on PostgreSQL, so the same alert reads both.
    """

    specs = (catalog.DB_DEADLOCKS,)
    _SQL: Final = "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'"

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        super().__init__("deadlocks", config.probes.deadlocks, pool)
        #: The URL's database, read once (it does not change for the probe's sessions).
        self._database: str | None = None

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        database = self._database
        if database is None:
            (name,) = await session.one("SELECT database()")
            database = self._database = str(name or "")
        found = await session.rows(self._SQL)
        deadlocks = number(found[0][1]) if found else 0.0
        return (family(catalog.DB_DEADLOCKS, [((database,), deadlocks)]),)


class LongTransactionsProbe(MyDbProbe):
    """InnoDB transactions open longer than ``threshold`` in sessions of this database.

    Exports ``stock_db_long_transactions`` and ``stock_db_long_transaction_max_seconds``.
    Without ``performance_schema`` (off by default on MariaDB) the tables a transaction
    locked are not visible, so every InnoDB transaction of a session whose database is
    the shop's counts: one that has read or written an InnoDB table (a transaction that
    ran only ``SELECT 1`` has no InnoDB transaction and does not). ``trx_started`` has
    whole seconds.
    """

    specs = (LONG_TRANSACTIONS, LONG_TRANSACTION_MAX)
    _SQL: Final = (
        "SELECT count(*),"
        " coalesce(max(timestampdiff(MICROSECOND, t.trx_started, now(6))), 0) / 1000000"
        " FROM information_schema.innodb_trx AS t"
        " JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id"
        " WHERE p.db = database() AND t.trx_mysql_thread_id <> connection_id()"
        " AND t.trx_started < now(6) - INTERVAL %(threshold)s MICROSECOND"
    )

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        settings = config.probes.long_transactions
        super().__init__("long_transactions", settings, pool)
        self._params = {"threshold": interval_us(settings.threshold)}

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        count, oldest = await session.one(self._SQL, self._params)
        return (
            family(LONG_TRANSACTIONS, [((), number(count))]),
            family(LONG_TRANSACTION_MAX, [((), max(0.0, number(oldest)))]),
        )
