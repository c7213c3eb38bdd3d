"""PostgreSQL through psycopg: the probes' sessions and the SQL only PostgreSQL speaks.

Every probe run is one read-only transaction opened in one round trip and ended with
``ROLLBACK``: docs/exporter-config.md, "Safety: how the probes read".
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import os
import socket
from collections.abc import Sequence
from typing import Any, Final

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ..config import DatabaseConfig
from ..dburl import libpq_url
from .base import ProbeUnavailableError
from .dialects import Dialect, Params, Session

_KEEPALIVE_COUNT: Final = 3


def _ms(seconds: float) -> int:
    """Whole milliseconds, at least 1 (0 would mean "no limit")."""
    return max(1, math.ceil(seconds * 1000))


class PgSession(Session):
    """A psycopg connection as a probe session (autocommit; see the module)."""

    flavor = "postgresql"
    unlock = "SELECT pg_advisory_unlock_all()"

    def __init__(self, conn: AsyncConnection[TupleRow], *, lock_timeout: float) -> None:
        super().__init__(conn.info.backend_pid)
        self.conn = conn
        self.lock_timeout = lock_timeout

    @property
    def usable(self) -> bool:
        return (
            not self.spoiled
            and not self.conn.closed
            and not self.conn.broken
            and self.conn.info.transaction_status == TransactionStatus.IDLE
        )

    async def execute(self, statement: str, params: Params = None) -> None:
        await self.conn.execute(statement, params)

    async def rows(self, statement: str, params: Params = None) -> list[tuple[Any, ...]]:
        cursor = await self.conn.execute(statement, params)
        return [tuple(row) for row in await cursor.fetchall()]

    async def table(self, statement: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        # prepare=True forces the extended protocol: one statement, no "; COMMIT; ...".
        cursor = await self.conn.execute(statement, prepare=True)
        columns = [c.name for c in cursor.description or ()]
        return columns, [tuple(row) for row in await cursor.fetchall()]

    async def begin(self, statement_timeout: float) -> None:
        await self.execute(
            f"BEGIN READ ONLY; SET LOCAL statement_timeout = {_ms(statement_timeout)};"
            f" SET LOCAL lock_timeout = {_ms(self.lock_timeout)};"
            " SET LOCAL jit = off; SET LOCAL max_parallel_workers_per_gather = 0"
        )

    def abandon(self) -> None:
        self.spoiled = True
        if self.conn.closed:
            return
        # Shut down, not closed: psycopg still watches this descriptor (closing it could
        # hand its number to another socket); shut down, it reads the end at once and fails
        # the statement without sending the cancel request that waits on the server.
        with (
            contextlib.suppress(OSError, psycopg.Error),
            socket.socket(fileno=os.dup(self.conn.pgconn.socket)) as sock,
        ):
            sock.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        # Closing a broken session may raise anything the driver has; it is dropped anyway.
        with contextlib.suppress(Exception):
            await self.conn.close()


class PostgreSQL(Dialect):
    """PostgreSQL's own SQL, and its sessions (:class:`PgSession`)."""

    name = "postgresql"
    partial_indexes = True
    now = "now()"
    ago = "clock_timestamp() - %({})s"
    seconds_since = "extract(epoch FROM clock_timestamp() - {})"
    try_lock_sql = "SELECT pg_try_advisory_lock(%s)"
    # Every client transaction of this database but the probe's own holds the horizon at
    # its start, those that have written nothing yet too (they may still insert with an
    # old now()). Seeing other roles' xact_start needs pg_monitor.
    horizon_sql = (
        "SELECT least(clock_timestamp() - %(settle_after)s,"
        " (SELECT min(a.xact_start) FROM pg_stat_activity AS a"
        " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
        " AND a.backend_type = 'client backend' AND a.xact_start IS NOT NULL))"
        " - %(margin)s, clock_timestamp()"
    )
    # An aggregate, so a table that does not exist is 0 rows (as on MySQL): the probe's
    # next statement then fails naming it, not with "the query returned no row".
    row_estimate_sql = (
        "SELECT coalesce(max(greatest(reltuples, 0)), 0) FROM pg_class"
        " WHERE oid = to_regclass(%(table)s)"
    )
    table_exists_sql = "SELECT to_regclass(%(table)s) IS NOT NULL"
    # pg_index / pg_attribute: the catalogs behind pg_indexes; only valid indexes.
    leading_columns_sql = (
        "SELECT a.attname::text FROM pg_index AS i"
        " JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
        " WHERE i.indrelid = to_regclass(%(table)s) AND i.indisvalid"
    )
    long_transactions_sql = (
        "SELECT count(*), coalesce(max(extract(epoch FROM clock_timestamp() - a.xact_start)), 0)"
        " FROM pg_stat_activity AS a"
        " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
        " AND a.xact_start < clock_timestamp() - %(threshold)s"
        " AND EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND l.granted"
        " AND l.relation = ANY (ARRAY(SELECT to_regclass(t)::oid"
        " FROM unnest(string_to_array(%(tables)s, ',')) AS t)))"
    )
    stop_sql = "SELECT pg_cancel_backend({})"

    def literal(self, value: object) -> str:
        return sql.Literal(value).as_string()

    def interval(self, seconds: float) -> dt.timedelta:
        return dt.timedelta(seconds=seconds)

    def table_params(self, table: str) -> dict[str, object]:
        return {"table": self.quote(table)}

    def lock_waiters_sql(self, flavor: str) -> str:
        # The wait starts at pg_locks.waitstart (PostgreSQL 14+: read through to_jsonb, so
        # older servers without the column run the same statement), else at the session's
        # last state change (the start of the statement that waits), else at its query_start.
        return (
            "SELECT count(DISTINCT l.pid), coalesce(max(extract(epoch FROM clock_timestamp()"
            " - coalesce((to_jsonb(l) ->> 'waitstart')::timestamptz, a.state_change,"
            " a.query_start))), 0) FROM pg_locks AS l JOIN pg_stat_activity AS a"
            " ON a.pid = l.pid WHERE NOT l.granted AND a.datname = current_database()"
            " AND l.pid <> pg_backend_pid()"
        )

    async def open(self, db: DatabaseConfig, *, elector: bool) -> tuple[PgSession, list[str], str]:
        # The config takes the app's driver-qualified URL too; libpq reads neither driver.
        url = libpq_url(db.url.reveal())
        try:
            in_url = conninfo_to_dict(url)
        except psycopg.Error:
            # Never pass the parser's message on: it quotes the part it did not understand.
            raise ProbeUnavailableError(
                f"the database URL from {db.url_source} cannot be parsed"
            ) from None
        options: dict[str, Any] = {
            "application_name": db.application_name,
            "connect_timeout": max(2, math.ceil(db.connect_timeout)) + 1,
        }
        settings = [
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            f"SET statement_timeout = {_ms(db.statement_timeout)}",
            f"SET lock_timeout = {_ms(db.lock_timeout)}",
        ]
        if elector:
            # The election's session: TCP keepalives on both ends, a few seconds apart, end
            # it across a partition, and idle_session_timeout (14+) once its leader is frozen.
            every = max(1, math.ceil(db.leader_retry_interval))
            options["keepalives"] = 1
            for key, value in (("idle", every), ("interval", every), ("count", _KEEPALIVE_COUNT)):
                options[f"keepalives_{key}"] = value
                settings.append(f"SET tcp_keepalives_{key} = {value}")
        # Bounded here too, a second before libpq's own limit: psycopg's connect timeout
        # leaves the socket open until garbage collection, a cancelled connect closes it.
        async with asyncio.timeout(max(2.0, db.connect_timeout)):
            conn = await AsyncConnection.connect(
                url, autocommit=True, **{k: v for k, v in options.items() if k not in in_url}
            )
        version = conn.info.server_version  # 150004: 15.4 (10 and later)
        if elector and version >= 140000:
            settings.append(f"SET idle_session_timeout = {_ms(self.idle_limit(db))}")
        session = PgSession(conn, lock_timeout=db.lock_timeout)
        return session, ["; ".join(settings)], f"PostgreSQL {version // 10000}.{version % 10000}"

    async def deadlocks(self, session: Session) -> tuple[str, Any]:
        database, deadlocks = await session.one(
            "SELECT datname::text, deadlocks FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
        return str(database), deadlocks

    def add_index(self, table: str, columns: Sequence[str], where: str | None) -> str:
        short = table.rsplit(".", 1)[-1]
        name = f"{short}_{columns[0]}_{'partial_' if where else ''}idx"[:63]
        return (
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {self.quote(name)} ON {self.quote(table)}"
            f" ({self.quote(columns[0])})" + (f" WHERE {where}" if where else "") + ";"
        )
