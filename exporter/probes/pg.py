"""PostgreSQL through psycopg: the probes' sessions and the SQL only PostgreSQL speaks.

Every probe run is one read-only transaction opened in one round trip (``BEGIN READ
ONLY`` with ``statement_timeout``, ``lock_timeout``, ``jit = off`` and no parallel
workers: a probe reads few rows through indexes and stays one backend's work) and ended
with ``ROLLBACK``; the sessions are read-only by default too. See
docs/exporter-config.md, "Safety: how the probes read".
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
from .base import ProbeUnavailableError
from .dialects import Connection, Dialect, Params, Session

__all__ = ["PgSession", "PostgreSQL"]

_KEEPALIVE_COUNT: Final = 3

# The horizon: every client transaction of this database but the probe's own holds it at
# its start, those that have written nothing yet too (they may still insert with an old
# now()). Seeing other roles' xact_start needs pg_monitor.
_HORIZON: Final = (
    "SELECT least(clock_timestamp() - %(settle_after)s,"
    " (SELECT min(a.xact_start) FROM pg_stat_activity AS a"
    " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
    " AND a.backend_type = 'client backend' AND a.xact_start IS NOT NULL))"
    " - %(margin)s, clock_timestamp()"
)
# The wait starts at pg_locks.waitstart (PostgreSQL 14+: read through to_jsonb, so older
# servers without the column run the same statement), else at the session's last state
# change (the start of the statement that waits), else at its query_start.
_LOCK_WAITERS: Final = (
    "SELECT count(DISTINCT l.pid), coalesce(max(extract(epoch FROM clock_timestamp()"
    " - coalesce((to_jsonb(l) ->> 'waitstart')::timestamptz, a.state_change, a.query_start))),"
    " 0) FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
    " WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid()"
)
_DEADLOCKS: Final = (
    "SELECT datname::text, deadlocks FROM pg_stat_database WHERE datname = current_database()"
)
_LONG_TRANSACTIONS: Final = (
    "SELECT count(*), coalesce(max(extract(epoch FROM clock_timestamp() - a.xact_start)), 0)"
    " FROM pg_stat_activity AS a"
    " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
    " AND a.xact_start < clock_timestamp() - %(threshold)s"
    " AND EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND l.granted"
    " AND l.relation = ANY (ARRAY(SELECT to_regclass(t)::oid"
    " FROM unnest(%(tables)s::text[]) AS t)))"
)
_LEADING_COLUMNS: Final = (
    "SELECT to_regclass(%(table)s) IS NOT NULL,"
    " ARRAY(SELECT a.attname::text FROM pg_index AS i"
    " JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
    " WHERE i.indrelid = to_regclass(%(table)s) AND i.indisvalid)"
)


def _ms(seconds: float) -> int:
    """Whole milliseconds, at least 1 (0 would mean "no limit")."""
    return max(1, math.ceil(seconds * 1000))


class PgSession(Connection):
    """A psycopg connection as a probe session (autocommit; see the module)."""

    flavor = "postgresql"

    def __init__(self, conn: AsyncConnection[TupleRow], *, lock_timeout: float) -> None:
        self.conn = conn
        self.lock_timeout = lock_timeout
        self._spoiled = False
        self._backend_pid: int | None = conn.info.backend_pid

    @property
    def usable(self) -> bool:
        info = self.conn.info
        return (
            not self._spoiled
            and not self.conn.closed
            and not self.conn.broken
            and info.transaction_status == TransactionStatus.IDLE
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

    async def rollback(self) -> None:
        await self.execute("ROLLBACK")

    async def release_locks(self) -> None:
        try:
            await self.execute("SELECT pg_advisory_unlock_all()")
        except BaseException:
            # Whether the locks went is unknown: never hand this session out again.
            self._spoiled = True
            raise

    def spoil(self) -> None:
        self._spoiled = True

    @property
    def server_id(self) -> int | None:
        return self._backend_pid

    def abandon(self) -> None:
        self._spoiled = True
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

    def literal(self, value: object) -> str:
        return sql.Literal(value).as_string()

    def interval(self, seconds: float) -> dt.timedelta:
        return dt.timedelta(seconds=seconds)

    def ago(self, param: str) -> str:
        return f"clock_timestamp() - %({param})s"

    def seconds_since(self, expression: str) -> str:
        return f"extract(epoch FROM clock_timestamp() - {expression})"

    async def connect(self, db: DatabaseConfig, *, elector: bool = False) -> PgSession:
        url = db.url.reveal()
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
        # The election's session: TCP keepalives on both ends, a few seconds apart, end it
        # across a partition, and idle_session_timeout (14+) once its leader is frozen.
        keepalive = max(1, math.ceil(db.leader_retry_interval))
        settings = [
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
            f"SET statement_timeout = {_ms(db.statement_timeout)}",
            f"SET lock_timeout = {_ms(db.lock_timeout)}",
        ]
        if elector:
            options.update(
                keepalives=1,
                keepalives_idle=keepalive,
                keepalives_interval=keepalive,
                keepalives_count=_KEEPALIVE_COUNT,
            )
            settings += [
                f"SET tcp_keepalives_idle = {keepalive}",
                f"SET tcp_keepalives_interval = {keepalive}",
                f"SET tcp_keepalives_count = {_KEEPALIVE_COUNT}",
            ]
        # Bounded here too, a second before libpq's own limit: psycopg's connect timeout
        # leaves the socket open until garbage collection, a cancelled connect closes it.
        async with asyncio.timeout(max(2.0, db.connect_timeout)):
            conn = await AsyncConnection.connect(
                url, autocommit=True, **{k: v for k, v in options.items() if k not in in_url}
            )
        if elector and conn.info.server_version >= 140000:
            settings.append(f"SET idle_session_timeout = {_ms(self.idle_limit(db))}")
        session = PgSession(conn, lock_timeout=db.lock_timeout)
        try:
            await session.execute("; ".join(settings))
        except BaseException:
            await session.close()
            raise
        if not elector:
            version = conn.info.server_version  # 150004: 15.4 (10 and later)
            self.announce(f"PostgreSQL {version // 10000}.{version % 10000}")
        return session

    async def horizon(
        self, session: Session, *, settle_after: float, margin: float
    ) -> tuple[dt.datetime, dt.datetime]:
        horizon, now = await session.one(
            _HORIZON,
            {"settle_after": self.interval(settle_after), "margin": self.interval(margin)},
        )
        return horizon, now

    async def row_estimate(self, session: Session, table: str) -> float:
        (estimate,) = await session.one(
            "SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass(%s)",
            (self.quote(table),),
        )
        return float(estimate)

    async def lock_waiters(self, session: Session) -> tuple[Any, Any]:
        waiters, longest = await session.one(_LOCK_WAITERS)
        return waiters, longest

    async def deadlocks(self, session: Session) -> tuple[str, Any]:
        database, deadlocks = await session.one(_DEADLOCKS)
        return str(database), deadlocks

    async def long_transactions(
        self, session: Session, *, threshold: float, tables: Sequence[str]
    ) -> tuple[Any, Any]:
        params = {"threshold": self.interval(threshold), "tables": [self.quote(t) for t in tables]}
        count, oldest = await session.one(_LONG_TRANSACTIONS, params)
        return count, oldest

    async def leading_columns(self, session: Session, table: str) -> set[str] | None:
        # pg_index / pg_attribute: the catalogs behind pg_indexes; only valid indexes.
        exists, columns = await session.one(_LEADING_COLUMNS, {"table": self.quote(table)})
        return set(columns) if exists else None

    def add_index(self, table: str, columns: Sequence[str], where: str | None) -> str:
        short = table.rsplit(".", 1)[-1]
        name = f"{short}_{columns[0]}_{'partial_' if where else ''}idx"[:63]
        return (
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {self.quote(name)} ON {self.quote(table)}"
            f" ({self.quote(columns[0])})" + (f" WHERE {where}" if where else "") + ";"
        )

    def stop_statement(self, server_id: int) -> str:
        return f"SELECT pg_cancel_backend({int(server_id)})"

    async def try_lock(self, session: Session, key: int) -> bool:
        (got,) = await session.one("SELECT pg_try_advisory_lock(%s)", (key,))
        return bool(got)
