"""MySQL and MariaDB through aiomysql: the probes' sessions and the SQL only they speak.

Which server it is comes from the handshake, not the URL's scheme. How the sessions read
(isolation, limits, lock waits) and why: docs/exporter-config.md, "How the probes read there".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Sequence
from typing import Any, Final

import aiomysql  # type: ignore[import-untyped]  # ships no types; stubs are not a dependency

from ..config import DatabaseConfig
from ..dburl import mysql_connect_args
from ..durations import format_duration
from .base import ProbeUnavailableError
from .dialects import Dialect, Params, Session


def lock_name(database: str | None, key: int) -> str:
    """The ``GET_LOCK`` name of ``key``: per database, as PostgreSQL's advisory locks are
    (MySQL's named locks are server-wide), within the 64 characters allowed."""
    return f"stocksentry.{database or ''}.{key}"[-64:]


def server_found(version: str, lock_timeout: float, lock_seconds: int) -> str:
    """What the start-up says of the server: its name and version from the handshake
    (MariaDB's ``5.5.5-`` prefix dropped), and ``database.lock_timeout`` as the server
    takes it when that differs.

    Example::

        >>> server_found("5.5.5-10.11.6-MariaDB-0+deb12u1", 0.2, 1)
        'MariaDB 10.11.6; lock_timeout 200ms became 1 s (lock waits take whole seconds here)'
    """
    name = "MariaDB" if "mariadb" in version.lower() else "MySQL"
    found = re.search(r"\d+\.\d+(\.\d+)?", version.removeprefix("5.5.5-"))
    text = f"{name} {found.group(0) if found else version or 'of unknown version'}"
    if lock_seconds != lock_timeout:
        text += (
            f"; lock_timeout {format_duration(lock_timeout)} became {lock_seconds} s"
            " (lock waits take whole seconds here)"
        )
    return text


class MySession(Session):
    """An aiomysql connection as a probe session (see the module)."""

    unlock = "SELECT RELEASE_ALL_LOCKS()"

    def __init__(self, conn: aiomysql.Connection, *, lock_timeout: float) -> None:
        super().__init__(conn.thread_id())
        self.conn = conn
        self.version = str(conn.get_server_info() or "")
        self.flavor = "mariadb" if "mariadb" in self.version.lower() else "mysql"
        self.lock_seconds = max(1, math.ceil(lock_timeout))
        self.statement_timeout: float | None = None
        #: Set between START TRANSACTION and its ROLLBACK.
        self.in_transaction = False

    @property
    def usable(self) -> bool:
        return not self.conn.closed and not self.in_transaction and not self.spoiled

    async def execute(self, statement: str, params: Params = None) -> None:
        async with self.conn.cursor() as cursor:
            await cursor.execute(statement, params)

    async def rows(self, statement: str, params: Params = None) -> list[tuple[Any, ...]]:
        async with self.conn.cursor() as cursor:
            await cursor.execute(statement, params)
            return [tuple(row) for row in await cursor.fetchall()]

    async def table(self, statement: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        # One statement: the config refuses custom SQL with a ";" that could end it (the
        # session would run several).
        async with self.conn.cursor() as cursor:
            await cursor.execute(statement)
            columns = [str(c[0]) for c in cursor.description or ()]
            return columns, [tuple(row) for row in await cursor.fetchall()]

    def limits(self, statement_timeout: float) -> str:
        """The ``SET SESSION`` of this server's statement time limit and lock waits."""
        if self.flavor == "mariadb":
            limit = f"max_statement_time = {max(0.001, statement_timeout):.3f}"
        else:
            limit = f"max_execution_time = {max(1, math.ceil(statement_timeout * 1000))}"
        return (
            f"SET SESSION {limit}, innodb_lock_wait_timeout = {self.lock_seconds},"
            f" lock_wait_timeout = {self.lock_seconds}"
        )

    async def begin(self, statement_timeout: float) -> None:
        if self.statement_timeout != statement_timeout:
            await self.execute(self.limits(statement_timeout))
            self.statement_timeout = statement_timeout
        self.in_transaction = True
        await self.execute("START TRANSACTION READ ONLY")

    async def rollback(self) -> None:
        await super().rollback()
        self.in_transaction = False

    def abandon(self) -> None:
        # aiomysql's close() is already the cut: the transport goes at once, no COM_QUIT,
        # and a read in flight ends with a lost connection.
        self.spoiled = True
        with contextlib.suppress(Exception):
            self.conn.close()

    async def close(self) -> None:
        """Close at once (no goodbye to the server: the session may be mid-query)."""
        self.abandon()


# A waiting transaction of a session of this database. trx_wait_started has whole seconds;
# on MariaDB the statement's own time in processlist (ms, never shorter than its wait)
# bounds it too. MySQL 8 has no processlist.time_ms.
_WAITERS: Final = (
    "SELECT count(*), coalesce(max({wait}), 0) / 1000000"
    " FROM information_schema.innodb_trx AS t"
    " JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id"
    " WHERE t.trx_state = 'LOCK WAIT' AND p.db = database()"
    " AND t.trx_mysql_thread_id <> connection_id()"
)
_WAIT: Final = {
    "mariadb": "least(timestampdiff(MICROSECOND, t.trx_wait_started, now(6)), p.time_ms * 1000)",
    "mysql": "timestampdiff(MICROSECOND, t.trx_wait_started, now(6))",
}


class MySQL(Dialect):
    """MySQL's and MariaDB's own SQL, and their sessions (:class:`MySession`)."""

    name = "mysql"
    # MySQL has no partial index: a plain one whose leading IS NULL / status part skips the
    # released and published rows does the same job.
    partial_indexes = False
    now = "now(6)"
    ago = "now(6) - INTERVAL %({})s MICROSECOND"
    seconds_since = "timestampdiff(MICROSECOND, {}, now(6)) / 1000000"
    try_lock_sql = "SELECT GET_LOCK(%s, 0)"
    # MySQL's least() is NULL when an argument is, hence the coalesce; innodb_trx has whole
    # seconds, rounded down, so the horizon is at most a second early (safe).
    horizon_sql = (
        "SELECT least(now(6) - INTERVAL %(settle_after)s MICROSECOND,"
        " coalesce((SELECT min(t.trx_started) FROM information_schema.innodb_trx AS t"
        " WHERE t.trx_mysql_thread_id <> connection_id()), now(6)))"
        " - INTERVAL %(margin)s MICROSECOND, now(6)"
    )
    row_estimate_sql = (
        "SELECT coalesce(max(table_rows), 0) FROM information_schema.tables"
        " WHERE table_schema = coalesce(%(schema)s, database()) AND table_name = %(table)s"
    )
    table_exists_sql = (
        "SELECT count(*) FROM information_schema.tables"
        " WHERE table_schema = coalesce(%(schema)s, database()) AND table_name = %(table)s"
    )
    leading_columns_sql = (
        "SELECT DISTINCT column_name FROM information_schema.statistics"
        " WHERE table_schema = coalesce(%(schema)s, database()) AND table_name = %(table)s"
        " AND seq_in_index = 1"
    )
    # Without performance_schema (off by default on MariaDB) the tables a transaction locked
    # are not visible: every InnoDB transaction of a session of this database counts.
    long_transactions_sql = (
        "SELECT count(*),"
        " coalesce(max(timestampdiff(MICROSECOND, t.trx_started, now(6))), 0) / 1000000"
        " FROM information_schema.innodb_trx AS t"
        " JOIN information_schema.processlist AS p ON p.id = t.trx_mysql_thread_id"
        " WHERE p.db = database() AND t.trx_mysql_thread_id <> connection_id()"
        " AND t.trx_started < now(6) - INTERVAL %(threshold)s MICROSECOND"
    )
    stop_sql = "KILL QUERY {}"

    def fold(self, column: str) -> str:
        return column.lower()  # column names compare without case in MySQL

    def interval(self, seconds: float) -> int:
        """Whole microseconds, for ``INTERVAL %s MICROSECOND``."""
        return round(seconds * 1_000_000)

    def table_params(self, table: str) -> dict[str, object]:
        # information_schema's schema (None: the URL's database) and table.
        schema, _, name = table.rpartition(".")
        return {"schema": schema or None, "table": name}

    def lock_waiters_sql(self, flavor: str) -> str:
        return _WAITERS.format(wait=_WAIT[flavor])

    async def open(self, db: DatabaseConfig, *, elector: bool) -> tuple[MySession, list[str], str]:
        try:
            args = mysql_connect_args(db.url.reveal())
        except ValueError as exc:
            raise ProbeUnavailableError(f"the database URL from {db.url_source}: {exc}") from None
        args.setdefault("program_name", db.application_name)
        args.setdefault("charset", "utf8mb4")
        timeout = max(1.0, db.connect_timeout)
        async with asyncio.timeout(timeout + 1.0):
            conn = await aiomysql.connect(**args, autocommit=True, connect_timeout=timeout)
        session = MySession(conn, lock_timeout=db.lock_timeout)
        session.statement_timeout = db.statement_timeout
        settings = [
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY",
            session.limits(db.statement_timeout),
        ]
        if elector:
            # The leader's pings keep its session from ever being idle that long.
            settings.append(f"SET SESSION wait_timeout = {math.ceil(self.idle_limit(db))}")
        found = server_found(session.version, db.lock_timeout, session.lock_seconds)
        return session, settings, found

    async def deadlocks(self, session: Session) -> tuple[str, Any]:
        # InnoDB counts deadlocks for the whole server (mysqld_exporter's
        # mysql_global_status_innodb_deadlocks); the label is the URL's database.
        (database,) = await session.one("SELECT database()")
        found = await session.rows("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        return str(database or ""), (found[0][1] if found else 0)

    def add_index(self, table: str, columns: Sequence[str], where: str | None) -> str:
        # ALGORITHM=INPLACE, LOCK=NONE: reads and writes go on while it is built.
        name = f"{table.rsplit('.', 1)[-1]}_{'_'.join(columns)}_idx"[:64]
        listed = ", ".join(self.quote(c) for c in columns)
        return (
            f"ALTER TABLE {self.quote(table)} ADD INDEX {self.quote(name)} ({listed}),"
            " ALGORITHM=INPLACE, LOCK=NONE;"
        )

    async def lock_id(self, session: Session, key: int) -> str:
        (database,) = await session.one("SELECT database()")
        return lock_name(None if database is None else str(database), key)
