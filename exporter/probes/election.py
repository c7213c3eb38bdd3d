"""Leader election: of many sidecars, one runs the database probes.

Each sidecar tries a session-level lock every ``database.leader_retry_interval``; the
holder leads while its pings renew its *lease* (:meth:`~.dialects.Dialect.lease`) and steps
down when one fails or the lease runs out: docs/exporter-config.md, "Leader election". Its
health is ``stocksentry_probe_up{probe="leader_election"}``.

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
from ..durations import format_duration
from .base import Backoff, ErrorLog, ProbeResult, at_fixed_rate, describe_error
from .dialects import Session, abandoning, dialect_for


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
    ) -> None:
        self.db = db
        self.leading = False
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._on_result = on_result
        self._errors = errors
        self._backoff = Backoff()
        self._dialect = dialect_for(db)
        self._conn: Session | None = None
        self._last_success: float | None = None
        #: Seconds one :meth:`step` may take: it may connect and run one statement.
        self.timeout = db.connect_timeout + db.statement_timeout
        #: Seconds the leader leads after the start of its last successful ping.
        self.lease = self._dialect.lease(db)
        #: When (event loop clock) the lease runs out while leading.
        self._lease_end = 0.0

    async def run(self) -> None:
        """Take part in the election until cancelled (cancelling releases the lock)."""
        try:
            # A fixed rate, so the leader's pings are never further apart than the interval
            # (plus one step), well inside the idle_session_timeout.
            await at_fixed_rate(self.db.leader_retry_interval, self.step)
        finally:
            # The leader's probes are stopped by the runner before it cancels this task,
            # so closing the session here is what hands the lock over.
            await self.close()

    async def step(self) -> None:
        """One round: (re)connect if needed, then try the lock or renew the lease."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        sent = loop.time()
        timeout = self.timeout
        if self.leading:
            timeout = min(timeout, self._lease_end - sent)
        work = asyncio.ensure_future(self._round())
        try:
            # wait() leaves the round running at the timeout: a leader stops its probes
            # while its session still holds the lock, and only then cuts it.
            done, _ = await asyncio.wait([work], timeout=max(0.0, timeout))
        except asyncio.CancelledError:
            work.cancel()
            raise
        error = work.exception() if done else None
        if done and error is None:
            self._errors.recovered(ELECTION_PROBE)
            self._record(True, started, None)
            if self.leading or work.result():
                # The server's silence clock restarted no earlier than this was sent.
                self._lease_end = sent + self.lease
            if not self.leading and work.result():
                self.leading = True
                await self._on_elected()
            return
        if error is not None:
            reason = describe_error(error, timeout)
        elif self.leading and timeout < self.timeout:
            reason = f"lease of {format_duration(self.lease)} not renewed: stepping down"
        else:
            reason = f"timed out after {format_duration(timeout)}"
        message = self._errors.failed(ELECTION_PROBE, reason)
        self._record(False, started, message)
        try:
            if self.leading:
                # Probes first: the session may still be alive and hold the lock (a ping
                # that timed out), and closing it lets another sidecar lead, so this one
                # must have stopped probing by then.
                self.leading = False
                await self._on_deposed()
        finally:
            if not done:
                work.cancel()  # cuts the session (abandoning): no wait on a silent server
                await asyncio.wait([work])
                if not work.cancelled():
                    work.exception()
            await self.close()

    async def _round(self) -> bool:
        """Connect if needed, then ping (leading) or try the lock; True when elected."""
        conn = await self._connection()
        if self.leading:
            await abandoning(conn, conn.one("SELECT 1"))
            return False
        return await abandoning(conn, self._dialect.try_lock(conn, self.db.advisory_lock_key))

    def _record(self, up: bool, started: float, error: str | None) -> None:
        if up:
            self._last_success = time.time()
        duration = time.perf_counter() - started
        self._on_result(ProbeResult(up, duration, self._last_success, error=error))

    async def _connection(self) -> Session:
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
