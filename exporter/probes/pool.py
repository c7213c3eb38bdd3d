"""The probes' small connection pool, on either dialect.

Not psycopg-pool's or aiomysql's: this one fails *at once* while the database is known to
be down (:class:`Backoff`), cuts a session cancelled mid-query rather than wait on a silent
network (:func:`~.dialects.abandoning`), counts the session stopping an abandoned query
within ``max_connections``, and releases the locks custom SQL took.

Example::

    pool = Pool(config.database)
    rows = await pool.read(lambda session: session.rows("SELECT 1"))
    await pool.close()
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ..config import DatabaseConfig
from .base import Backoff, ProbeUnavailableError, note_phase
from .dialects import Session, abandoning, dialect_for

_T = TypeVar("_T")


class Pool:
    """A few lazily opened read-only sessions shared by the probes, at most
    ``database.max_connections`` sockets (a probe waits for one within its timeout). A
    session left in a transaction or broken is closed, not reused; one cancelled mid-query
    is cut (its query stopped from another session, which keeps the slot meanwhile)."""

    def __init__(self, db: DatabaseConfig) -> None:
        self.db = db
        self.dialect = dialect_for(db)
        self._slots = asyncio.Semaphore(db.max_connections)
        self._idle: list[Session] = []
        self._backoff = Backoff()
        self._closed = False
        self._stoppers: set[asyncio.Task[None]] = set()

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A session of the pool for the duration of the block."""
        if self._closed:
            raise ProbeUnavailableError("the pool is closed")
        if self._slots.locked():
            note_phase(
                f"waiting for a free database session ({self.db.max_connections} of "
                f"{self.db.max_connections} in use)"
            )
        await self._slots.acquire()
        release = True
        try:
            if self._closed:  # closed while this one waited for a slot
                raise ProbeUnavailableError("the pool is closed")
            if self._idle:
                session = self._idle.pop()
            else:
                note_phase("connecting to the database")
                with self._backoff.attempt("database"):
                    session = await self.dialect.connect(self.db)
            note_phase("waiting for the database's reply")
            try:
                yield session
            except asyncio.CancelledError:
                # Cancelled mid-query (the probe's timeout): the session's state is
                # unknown. Stopping its query takes a socket: it keeps this slot.
                session.abandon()
                release = not self._stop_query(session)
                raise
            finally:
                if session.usable and not self._closed:
                    self._idle.append(session)
                else:
                    await session.close()
        finally:
            if release:
                self._slots.release()

    async def read(
        self,
        query: Callable[[Session], Awaitable[_T]],
        *,
        release_locks: bool = False,
        statement_timeout: float | None = None,
    ) -> _T:
        """Run ``query(session)`` in a read-only transaction with the configured limits
        (``statement_timeout``: the probe's own); ``release_locks``: afterwards, also
        release the session-level locks it may have taken (custom SQL can)."""
        limit = self.db.statement_timeout if statement_timeout is None else statement_timeout

        async def end(session: Session) -> None:
            await abandoning(session, session.rollback())
            if release_locks:
                await abandoning(session, session.release_locks())

        async with self.session() as session:
            try:
                await abandoning(session, session.begin(limit))
                result = await abandoning(session, query(session))
            except asyncio.CancelledError:
                raise  # the session is cut (see session())
            except BaseException:
                with contextlib.suppress(Exception):
                    await end(session)
                raise
            await end(session)
            return result

    def _stop_query(self, session: Session) -> bool:
        """Stop the query of the abandoned ``session`` in the background; True when a
        task does (it releases the caller's slot once done)."""
        if self._closed or session.server_id is None:
            return False
        stop = self.dialect.stop_query(self.db, session.server_id)
        task = asyncio.get_running_loop().create_task(stop, name="stocksentry-stop-query")
        # Kept until done: a task nobody references may be collected before it runs.
        self._stoppers.add(task)
        task.add_done_callback(self._stoppers.discard)
        task.add_done_callback(lambda _: self._slots.release())
        return True

    async def close_idle(self) -> None:
        """Close the sessions nobody uses (a follower keeps none open)."""
        idle, self._idle = self._idle, []
        for session in idle:
            await session.close()

    async def close(self) -> None:
        """Close every session, wait for the queries being stopped; the pool is done."""
        self._closed = True
        await self.close_idle()
        if self._stoppers:
            await asyncio.wait(list(self._stoppers))
