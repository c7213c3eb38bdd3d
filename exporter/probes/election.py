"""Leader election: of many sidecars, one runs the database probes.

Each sidecar keeps one dedicated session and tries ``pg_try_advisory_lock(key)`` on it
every ``database.leader_retry_interval``. The one that gets the session-level lock leads
until its session ends, so a leader that dies, or loses its connection, lets the lock go
and the next try of another sidecar takes over. The leader checks its session on the same
schedule (``SELECT 1``) and steps down, stopping its database probes, as soon as the
session fails.

A leader that is frozen (SIGSTOP, a stalled node) or cut off by a partition does not close
its session, and TCP would keep it open for hours. So the election session sets
``idle_session_timeout`` (PostgreSQL 14+) to three retry intervals (at least one second):
the server ends a session whose leader stopped pinging, which releases the lock. TCP
keepalives on both ends (libpq's ``keepalives*`` parameters and the server's
``tcp_keepalives_*`` settings), a few seconds apart, cover a partition on older servers.

On MySQL and MariaDB the lock is ``GET_LOCK('stocksentry.<database>.<key>', 0)``, a named
lock held by the session until it ends, and the server-side end of a silent session is
``wait_timeout`` (whole seconds, three retry intervals, at least one second): the leader's
pings keep its session from ever being idle that long.

The election's own health is exported like a probe's, as
``stocksentry_probe_up{probe="leader_election"}``: every sidecar reports whether it can
reach the database, leader or not.

Example::

    election = LeaderElection(db, on_elected=start_probes, on_deposed=stop_probes,
                              on_result=record)
    task = asyncio.create_task(election.run())
    ...
    task.cancel()            # closes the session: the lock is released at once
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, Protocol

from psycopg import sql

from ..config import ELECTION_PROBE, DatabaseConfig
from .base import Backoff, ErrorLog, ProbeResult, ProbeUnavailableError, describe_error
from .postgres import Conn, connect

if TYPE_CHECKING:
    # aiomysql is imported only when the URL is MySQL's (see _connect_mysql).
    from .mysql.pool import MySession

__all__ = ["LeaderElection", "lock_name"]

_TRY_LOCK = sql.SQL("SELECT pg_try_advisory_lock(%s)")
_PING = sql.SQL("SELECT 1")
_KEEPALIVE_COUNT: Final = 3
# The server ends an election session idle this many retry intervals (but at least the
# floor): a live leader pings every interval, so only a frozen or cut-off one is ended.
_IDLE_INTERVALS: Final = 3
_IDLE_FLOOR: Final = 1.0


class _Session(Protocol):
    """The election's dedicated session on one dialect."""

    @property
    def usable(self) -> bool: ...

    async def try_lock(self, key: int) -> bool: ...

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


class _PgSession:
    """PostgreSQL: a session-level advisory lock, ``idle_session_timeout`` (see above)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    @property
    def usable(self) -> bool:
        return not self.conn.closed and not self.conn.broken

    async def try_lock(self, key: int) -> bool:
        cursor = await self.conn.execute(_TRY_LOCK, [key])
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def ping(self) -> None:
        await self.conn.execute(_PING)

    async def close(self) -> None:
        await self.conn.close()


def lock_name(database: str | None, key: int) -> str:
    """The MySQL ``GET_LOCK`` name of ``key``: per database, as PostgreSQL's advisory locks
    are (MySQL's named locks are server-wide), within the 64 characters allowed."""
    return f"stocksentry.{database or ''}.{key}"[-64:]


class _MySession:
    """MySQL/MariaDB: ``GET_LOCK(name, 0)``, ``wait_timeout`` (see above)."""

    def __init__(self, session: MySession) -> None:
        self.session = session
        self._name: str | None = None

    @property
    def usable(self) -> bool:
        return not self.session.closed

    async def try_lock(self, key: int) -> bool:
        if self._name is None:
            (database,) = await self.session.one("SELECT database()")
            self._name = lock_name(None if database is None else str(database), key)
        (got,) = await self.session.one("SELECT GET_LOCK(%s, 0)", (self._name,))
        return bool(got == 1)

    async def ping(self) -> None:
        await self.session.one("SELECT 1")

    async def close(self) -> None:
        self.session.close()


class LeaderElection:
    """Competes for the advisory lock and calls back when leadership changes."""

    def __init__(
        self,
        db: DatabaseConfig,
        *,
        on_elected: Callable[[], Awaitable[None]],
        on_deposed: Callable[[], Awaitable[None]],
        on_result: Callable[[ProbeResult], None],
        errors: ErrorLog,
        backoff: Backoff | None = None,
    ) -> None:
        self.db = db
        self.leading = False
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._on_result = on_result
        self._errors = errors
        self._backoff = backoff or Backoff()
        self._conn: _Session | None = None
        self._last_success: float | None = None
        # One step may connect and run one statement.
        self._timeout = db.connect_timeout + db.statement_timeout

    async def run(self) -> None:
        """Take part in the election until cancelled (cancelling releases the lock)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                await self.step()
                # A fixed rate, so the leader's pings are never further apart than the
                # interval (plus one step), well inside the idle_session_timeout.
                await asyncio.sleep(
                    max(0.0, started + self.db.leader_retry_interval - loop.time())
                )
        finally:
            # The leader's probes are stopped by the runner before it cancels this task,
            # so closing the session here is what hands the lock over.
            await self._drop_connection()

    async def step(self) -> None:
        """One round: (re)connect if needed, then try the lock or check the session."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout):
                conn = await self._connection()
                if self.leading:
                    await conn.ping()
                    elected = False
                else:
                    elected = await conn.try_lock(self.db.advisory_lock_key)
        except Exception as exc:
            message = self._errors.failed(ELECTION_PROBE, describe_error(exc, self._timeout))
            self._record(False, started, message)
            try:
                if self.leading:
                    # Probes first: the session may still be alive and hold the lock (a
                    # ping that timed out), and closing it lets another sidecar lead, so
                    # this one must have stopped probing by then.
                    self.leading = False
                    await self._on_deposed()
            finally:
                await self._drop_connection()
            return
        self._errors.recovered(ELECTION_PROBE)
        self._record(True, started, None)
        if elected:
            self.leading = True
            await self._on_elected()

    def _record(self, up: bool, started: float, error: str | None) -> None:
        if up:
            self._last_success = time.time()
        self._on_result(
            ProbeResult(
                up=up,
                duration=time.perf_counter() - started,
                last_success=self._last_success,
                error=error,
            )
        )

    async def _connection(self) -> _Session:
        if self._conn is not None and self._conn.usable:
            return self._conn
        wait = self._backoff.wait_time()
        if wait > 0:
            raise ProbeUnavailableError(f"database unreachable; next attempt in {wait:.1f}s")
        try:
            if self.db.dialect == "mysql":
                self._conn = _MySession(await self._connect_mysql())
            else:
                self._conn = _PgSession(await self._connect())
        except (Exception, asyncio.CancelledError):
            # Any failure to open the session (refused, bad password, a timeout, a URL
            # that cannot be parsed): the next attempt waits for the backoff.
            self._backoff.failed()
            raise
        self._backoff.succeeded()
        return self._conn

    async def _connect_mysql(self) -> MySession:
        """A session the server ends when this sidecar stops pinging it (``wait_timeout``)."""
        from .mysql.pool import connect_session

        session = await connect_session(self.db)
        idle = max(1, math.ceil(max(_IDLE_FLOOR, _IDLE_INTERVALS * self.db.leader_retry_interval)))
        try:
            await session.execute(f"SET SESSION wait_timeout = {idle}")
        except BaseException:
            session.close()
            raise
        return session

    async def _connect(self) -> Conn:
        """A session the server ends when this sidecar stops pinging it (see above)."""
        interval = self.db.leader_retry_interval
        keepalive = max(1, math.ceil(interval))
        conn = await connect(
            self.db,
            params={
                "keepalives": 1,
                "keepalives_idle": keepalive,
                "keepalives_interval": keepalive,
                "keepalives_count": _KEEPALIVE_COUNT,
            },
        )
        settings = sql.SQL(
            "SET tcp_keepalives_idle = {0}; SET tcp_keepalives_interval = {0}; "
            "SET tcp_keepalives_count = {1}"
        ).format(sql.Literal(keepalive), sql.Literal(_KEEPALIVE_COUNT))
        if conn.info.server_version >= 140000:
            idle_ms = math.ceil(max(_IDLE_FLOOR, _IDLE_INTERVALS * interval) * 1000)
            settings += sql.SQL("; SET idle_session_timeout = {}").format(sql.Literal(idle_ms))
        try:
            await conn.execute(settings)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
