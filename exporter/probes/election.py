"""Leader election: of many sidecars, one runs the database probes.

Each sidecar keeps one dedicated session and tries a session-level lock on it every
``database.leader_retry_interval`` (``pg_try_advisory_lock(key)``, or ``GET_LOCK`` on
MySQL/MariaDB). The one that gets it leads until its session ends; it pings the session
on the same schedule and steps down, stopping its probes, as soon as that fails. The
server ends the session of a frozen or cut-off leader (``idle_session_timeout``,
``wait_timeout``, TCP keepalives: :meth:`.dialects.Dialect.connect` with ``elector``),
which frees the lock. See docs/exporter-config.md, "Leader election".

The election's own health is exported like a probe's, as
``stocksentry_probe_up{probe="leader_election"}``.

Example::

    election = LeaderElection(db, on_elected=start_probes, on_deposed=stop_probes,
                              on_result=record, errors=errors)
    task = asyncio.create_task(election.run())
    ...
    task.cancel()            # closes the session: the lock is released at once
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from ..config import ELECTION_PROBE, DatabaseConfig
from .base import Backoff, ErrorLog, ProbeResult, describe_error
from .dialects import Connection, dialect_for

__all__ = ["LeaderElection"]


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
        self._dialect = dialect_for(db)
        self._conn: Connection | None = None
        self._last_success: float | None = None
        #: Seconds one :meth:`step` may take: it may connect and run one statement.
        self.timeout = db.connect_timeout + db.statement_timeout

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
            await self.close()

    async def step(self) -> None:
        """One round: (re)connect if needed, then try the lock or check the session."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout):
                conn = await self._connection()
                if self.leading:
                    await conn.one("SELECT 1")
                    elected = False
                else:
                    elected = await self._dialect.try_lock(conn, self.db.advisory_lock_key)
        except Exception as exc:
            message = self._errors.failed(ELECTION_PROBE, describe_error(exc, self.timeout))
            self._record(False, started, message)
            try:
                if self.leading:
                    # Probes first: the session may still be alive and hold the lock (a
                    # ping that timed out), and closing it lets another sidecar lead, so
                    # this one must have stopped probing by then.
                    self.leading = False
                    await self._on_deposed()
            finally:
                await self.close()
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

    async def _connection(self) -> Connection:
        if self._conn is not None and self._conn.usable:
            return self._conn
        # Any failure to open the session (refused, bad password, a timeout, a URL that
        # cannot be parsed): the next attempt waits for the backoff.
        with self._backoff.attempt("database"):
            self._conn = await self._dialect.connect(self.db, elector=True)
        return self._conn

    async def close(self) -> None:
        """Close the election's session (which releases the lock it holds)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
