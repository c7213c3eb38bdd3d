"""The probes' read-only sessions: opening one, and the small fail-fast pool sharing them.

Every probe query runs in a read-only transaction opened with one round trip::

    BEGIN READ ONLY; SET LOCAL statement_timeout = 2000; SET LOCAL lock_timeout = 200;
    SET LOCAL jit = off; SET LOCAL max_parallel_workers_per_gather = 0

(the statement timeout is the probe's own ``statement_timeout``) and ends with
``ROLLBACK`` (nothing to commit; a rollback is the cheapest end). The sessions themselves
are read-only by default too, so a statement outside that transaction could not write
either.

psycopg-pool was weighed for this and not taken: the probes need a pool that fails *at
once* while the database is known to be down (spaced by :class:`Backoff`, so a scrape
reports it instead of every probe waiting out its timeout), closes rather than reuses a
session cancelled mid-query, and releases advisory locks that custom SQL took; with
psycopg-pool each of those is a callback around its own reconnect loop, and the pool
here is a hundred lines.

Example::

    pool = PgPool(config.database)
    one = await pool.read(lambda conn: conn.execute("SELECT 1"))
    await pool.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import psycopg
from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow

from ...config import DatabaseConfig
from ..base import Backoff, ProbeUnavailableError, describe_error

__all__ = ["Conn", "PgPool", "connect", "ms"]

Conn = AsyncConnection[TupleRow]
_T = TypeVar("_T")
_ROLLBACK: Final = sql.SQL("ROLLBACK")
_UNLOCK_ALL: Final = sql.SQL("SELECT pg_advisory_unlock_all()")


def ms(seconds: float) -> sql.Literal:
    """``seconds`` as a literal of whole milliseconds, at least 1 (0 would mean "no limit")."""
    return sql.Literal(max(1, math.ceil(seconds * 1000)))


async def connect(db: DatabaseConfig, *, params: Mapping[str, Any] | None = None) -> Conn:
    """Open one autocommit session whose transactions are read-only by default.

    ``statement_timeout`` and ``lock_timeout`` are set for the session as well, as a
    backstop for anything that runs outside a probe's own transaction. ``params``: more
    libpq connection parameters, for those the URL does not set itself.
    """
    url = db.url.reveal()
    try:
        in_url = conninfo_to_dict(url)
    except psycopg.Error:
        # Never pass the parser's message on: it quotes the part it did not understand.
        raise ProbeUnavailableError(
            f"the database URL from {db.url_source} cannot be parsed"
        ) from None
    options: dict[str, Any] = {}
    if "application_name" not in in_url:
        options["application_name"] = db.application_name
    if "connect_timeout" not in in_url:
        options["connect_timeout"] = max(2, math.ceil(db.connect_timeout))
    options.update({k: v for k, v in (params or {}).items() if k not in in_url})
    conn = await AsyncConnection.connect(url, autocommit=True, **options)
    try:
        await conn.execute(
            sql.SQL(
                "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY; "
                "SET statement_timeout = {}; SET lock_timeout = {}"
            ).format(ms(db.statement_timeout), ms(db.lock_timeout))
        )
    except BaseException:
        await conn.close()
        raise
    return conn


def _begin(statement_timeout: float, lock_timeout: float) -> sql.Composed:
    """The one round trip that opens a probe transaction.

    ``jit = off``: a probe statement reads few rows through indexes, but over a big table
    the planner's estimate can pass ``jit_above_cost`` and compiling would cost more than
    the query (tens of milliseconds a run). ``max_parallel_workers_per_gather = 0``: a
    probe must stay one backend's work; parallel workers would multiply its CPU on the
    shop's database for a few milliseconds gained.
    """
    return sql.SQL(
        "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {};"
        " SET LOCAL jit = off; SET LOCAL max_parallel_workers_per_gather = 0"
    ).format(ms(statement_timeout), ms(lock_timeout))


def _reusable(conn: Conn) -> bool:
    return (
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status == TransactionStatus.IDLE
    )


async def _unlock_all(conn: Conn) -> None:
    """Release the session's advisory locks; when that fails, close the session instead."""
    try:
        await conn.execute(_UNLOCK_ALL)
    except BaseException:
        # Whether the locks went is unknown: never hand this session out again.
        await _close_quietly(conn)
        raise


async def _close_quietly(conn: Conn) -> None:
    # Closing a session that is already broken may raise anything the driver has; the
    # session is dropped either way.
    with contextlib.suppress(Exception):
        await conn.close()


class PgPool:
    """A few lazily opened sessions shared by the probes, with backoff on connect errors.

    At most ``database.max_connections`` sessions are open; a probe waits for a free one
    within its own timeout. A session left in a transaction, broken or cancelled mid-query
    is closed rather than reused. While the database is unreachable, connection attempts
    are spaced by :class:`Backoff` and probe runs fail at once with
    :class:`ProbeUnavailableError`.

    Example::

        pool = PgPool(config.database)
        stock = await pool.read(lambda conn: conn.execute("SELECT 1"))
        await pool.close()
    """

    def __init__(self, db: DatabaseConfig, *, backoff: Backoff | None = None) -> None:
        self.db = db
        self._slots = asyncio.Semaphore(db.max_connections)
        self._idle: list[Conn] = []
        self._backoff = backoff or Backoff()
        self._last_error = ""
        self._closed = False
        self._begin = _begin(db.statement_timeout, db.lock_timeout)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A session of the pool for the duration of the block."""
        if self._closed:
            raise ProbeUnavailableError("the pool is closed")
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                yield conn
            finally:
                if _reusable(conn) and not self._closed:
                    self._idle.append(conn)
                else:
                    await _close_quietly(conn)

    async def read(
        self,
        query: Callable[[Conn], Awaitable[_T]],
        *,
        release_locks: bool = False,
        statement_timeout: float | None = None,
    ) -> _T:
        """Run ``query(conn)`` in a read-only transaction with the configured timeouts.

        ``release_locks``: afterwards, also release the session-level advisory locks the
        query may have taken (custom SQL can call ``pg_advisory_lock``); a ``ROLLBACK``
        does not, and the session goes back to the pool. ``statement_timeout``: the
        probe's own, instead of ``database.statement_timeout``.
        """
        begin = self._begin
        if statement_timeout is not None and statement_timeout != self.db.statement_timeout:
            begin = _begin(statement_timeout, self.db.lock_timeout)
        async with self.connection() as conn:
            await conn.execute(begin)
            try:
                result = await query(conn)
            except asyncio.CancelledError:
                # Cancelled mid-query (the probe's timeout): the session's state is unknown,
                # connection() closes it instead of rolling back.
                raise
            except BaseException:
                if conn.info.transaction_status in (
                    TransactionStatus.INTRANS,
                    TransactionStatus.INERROR,
                ):
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute(_ROLLBACK)
                if release_locks and _reusable(conn):
                    with contextlib.suppress(psycopg.Error):
                        await _unlock_all(conn)
                raise
            await conn.execute(_ROLLBACK)
            if release_locks:
                await _unlock_all(conn)
            return result

    async def _connect(self) -> Conn:
        wait = self._backoff.wait_time()
        if wait > 0:
            raise ProbeUnavailableError(
                f"database unreachable ({self._last_error}); next attempt in {wait:.1f}s"
            )
        try:
            conn = await connect(self.db)
        except (psycopg.Error, OSError, asyncio.CancelledError, ProbeUnavailableError) as exc:
            self._last_error = describe_error(exc)
            self._backoff.failed()
            raise
        self._backoff.succeeded()
        return conn

    async def close_idle(self) -> None:
        """Close the sessions nobody uses (a follower keeps none open)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close_quietly(conn)

    async def close(self) -> None:
        """Close every session; the pool cannot be used afterwards."""
        self._closed = True
        await self.close_idle()
