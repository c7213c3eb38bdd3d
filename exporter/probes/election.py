"""Leader election: of many sidecars, one runs the database probes.

Each sidecar keeps one dedicated session and tries ``pg_try_advisory_lock(key)`` on it
every ``database.leader_retry_interval``. The one that gets the session-level lock leads
until its session ends, so a leader that dies, or loses its connection, lets the lock go
and the next try of another sidecar takes over. The leader checks its session on the same
schedule (``SELECT 1``) and steps down, stopping its database probes, as soon as the
session fails.

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
import time
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import sql

from ..config import ELECTION_PROBE, DatabaseConfig
from .base import Backoff, ErrorLog, ProbeResult, ProbeUnavailableError, describe_error
from .postgres import Conn, connect

__all__ = ["LeaderElection"]

_TRY_LOCK = sql.SQL("SELECT pg_try_advisory_lock(%s)")
_PING = sql.SQL("SELECT 1")


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
        self._conn: Conn | None = None
        self._last_success: float | None = None
        # One step may connect and run one statement.
        self._timeout = db.connect_timeout + db.statement_timeout

    async def run(self) -> None:
        """Take part in the election until cancelled (cancelling releases the lock)."""
        try:
            while True:
                await self.step()
                await asyncio.sleep(self.db.leader_retry_interval)
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
                    await conn.execute(_PING)
                    elected = False
                else:
                    cursor = await conn.execute(_TRY_LOCK, [self.db.advisory_lock_key])
                    row = await cursor.fetchone()
                    elected = bool(row and row[0])
        except Exception as exc:
            message = self._errors.failed(ELECTION_PROBE, describe_error(exc, self._timeout))
            self._record(False, started, message)
            await self._drop_connection()
            if self.leading:
                self.leading = False
                await self._on_deposed()
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

    async def _connection(self) -> Conn:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        wait = self._backoff.wait_time()
        if wait > 0:
            raise ProbeUnavailableError(f"database unreachable; next attempt in {wait:.1f}s")
        try:
            self._conn = await connect(self.db)
        except (psycopg.Error, OSError, TimeoutError, asyncio.CancelledError):
            self._backoff.failed()
            raise
        self._backoff.succeeded()
        return self._conn

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
