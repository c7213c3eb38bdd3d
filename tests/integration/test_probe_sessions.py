"""The probes' sessions when things go wrong, on a real PostgreSQL and MariaDB.

- :meth:`Session.release_locks` whose unlock statement fails spoils the session, passes the
  error on, and the :class:`Pool` never hands that session out again;
- :func:`abandoning` cancelled (a timeout) cuts the session and lets the statement end;
  one whose work does not end within :data:`ABANDON_GRACE` cancels the work;
- a closed :class:`Pool` hands out no session, and closes the ones given back.

The tests taking the ``db`` fixture run on PostgreSQL and on MariaDB.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import psycopg
import pymysql
import pytest
from dbs import Db
from polling import async_wait_until
from stocksentry.exporter.config import DatabaseConfig
from stocksentry.exporter.probes.base import ProbeUnavailableError
from stocksentry.exporter.probes.dialects import ABANDON_GRACE, Session, abandoning, dialect_for
from stocksentry.exporter.probes.pool import Pool
from test_probes import WAIT, config_on, db_sessions, mariadb

pytestmark = pytest.mark.integration

#: Seconds the slow statements would run: the tests pass long before.
SLEEP = 30
#: What "long before" means: the statement surely did not run to its end.
WELL_BEFORE = SLEEP / 2


def settings(db: Db) -> DatabaseConfig:
    """The test's database, as the exporter's config gives it; the server's own statement
    limit far beyond :data:`SLEEP`, so that only the code under test ends a statement."""
    database = config_on(db, (), database={"statement_timeout": "60s"}).database
    assert database is not None
    return database


def sleep_sql(db: Db) -> str:
    return f"SELECT SLEEP({SLEEP})" if db.mysql else f"SELECT pg_sleep({SLEEP})"


def lock_sql(db: Db) -> str:
    """Takes a session-level lock (what custom SQL may leave behind)."""
    return "SELECT GET_LOCK('stocksentry-test', 0)" if db.mysql else "SELECT pg_advisory_lock(42)"


async def end_session(db: Db, server_id: int) -> None:
    """End the session ``server_id`` from the server's side, as an administrator would,
    and wait until it is gone."""
    if db.mysql:
        mariadb().run_sql(db.raw_url, [f"KILL {int(server_id)}"])
    else:
        async with await psycopg.AsyncConnection.connect(db.raw_url, autocommit=True) as admin:
            # With a timeout, it waits for the backend to be gone (PostgreSQL 14+).
            cursor = await admin.execute(
                "SELECT pg_terminate_backend(%s, %s)", (server_id, int(WAIT * 1000))
            )
            assert await cursor.fetchone() == (True,)
    await wait_closed(db, {server_id})


async def wait_closed(db: Db, ids: set[int] | None = None) -> None:
    """Wait until the sessions ``ids`` (``None``: every session of the exporter) are gone
    from the server."""

    def gone(sessions: set[int]) -> bool:
        return not (sessions if ids is None else sessions & ids)

    await async_wait_until(
        lambda: db_sessions(db),
        accept=gone,
        timeout=WAIT,
        message=f"sessions {'all' if ids is None else sorted(ids)} gone from the server",
    )


def connection_closed(session: Session) -> bool:
    """Whether the driver's connection of ``session`` is closed (both drivers say so)."""
    return bool(session.conn.closed)  # type: ignore[attr-defined]


# --- release_locks ----------------------------------------------------------------------------


async def test_a_failed_unlock_on_a_session_the_server_ended_spoils_it(db: Db) -> None:
    pool = Pool(settings(db))
    try:
        # A healthy session goes back to the pool and is handed out again.
        async with pool.session() as first:
            await first.one(lock_sql(db))
            await first.release_locks()
            assert not first.spoiled
        async with pool.session() as again:
            assert again is first

            assert again.server_id is not None
            await end_session(db, again.server_id)
            with pytest.raises((psycopg.Error, pymysql.MySQLError)):
                await again.release_locks()
            assert again.spoiled
            assert not again.usable

        # Given back spoiled: closed, never handed out again.
        assert connection_closed(again)
        async with pool.session() as fresh:
            assert fresh is not again
            assert fresh.server_id != again.server_id
            assert await fresh.one("SELECT 1") == (1,)
            assert fresh.usable
    finally:
        await pool.close()
    await wait_closed(db)


async def test_a_failed_unlock_alone_keeps_the_session_from_the_pool(db: Db) -> None:
    """The unlock fails with a server error on an otherwise healthy connection (the
    statement is replaced by one the server refuses): ``spoiled`` alone keeps it out."""
    pool = Pool(settings(db))
    try:
        async with pool.session() as session:
            session.unlock = "SELECT stocksentry_no_such_function()"
            with pytest.raises((psycopg.errors.UndefinedFunction, pymysql.MySQLError)):
                await session.release_locks()
            assert session.spoiled
            # The connection itself still works; it is out of the pool all the same.
            assert await session.one("SELECT 1") == (1,)
            assert not connection_closed(session)
            assert not session.usable
        assert connection_closed(session)
        async with pool.session() as fresh:
            assert fresh is not session
            assert fresh.server_id != session.server_id
    finally:
        await pool.close()


async def test_a_read_whose_unlock_fails_raises_and_drops_the_session(db: Db) -> None:
    """Through :meth:`Pool.read`: the query's rows are not returned when the locks it may
    have left cannot be released."""
    pool = Pool(settings(db))
    try:
        async with pool.session() as session:
            pass
        session.unlock = "SELECT stocksentry_no_such_function()"
        with pytest.raises((psycopg.errors.UndefinedFunction, pymysql.MySQLError)):
            await pool.read(lambda s: s.one(lock_sql(db)), release_locks=True)
        assert session.spoiled
        assert connection_closed(session)
        # Without release_locks the unlock is not run: a fresh session reads on.
        assert await pool.read(lambda s: s.one("SELECT 1")) == (1,)
        async with pool.session() as fresh:
            assert fresh is not session
    finally:
        await pool.close()


# --- abandoning -------------------------------------------------------------------------------


async def test_a_timeout_cuts_a_statement_in_flight(db: Db) -> None:
    """With a real driver the cut fails the statement at once: the work ends within the
    grace, with the driver's error, not cancelled."""
    database = settings(db)
    session = await dialect_for(database).connect(database)
    ended: list[BaseException] = []

    async def work() -> object:
        try:
            return await session.rows(sleep_sql(db))
        except BaseException as exc:
            ended.append(exc)
            raise

    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(abandoning(session, work()), timeout=0.2)
        elapsed = time.monotonic() - started
        assert elapsed < WELL_BEFORE  # the sleep did not run to its end
        assert session.spoiled
        assert not session.usable
        # The statement failed because the connection was cut; it was not cancelled.
        assert len(ended) == 1
        assert isinstance(ended[0], psycopg.OperationalError | pymysql.MySQLError)
        assert not isinstance(ended[0], asyncio.CancelledError)
    finally:
        await session.close()
    assert connection_closed(session)


class Cut:
    """What :func:`abandoning` needs of its ``conn``: :meth:`abandon`, whose calls it
    records (stands in for a :class:`Session` whose driver would not notice the cut)."""

    def __init__(self) -> None:
        self.abandoned: list[float] = []

    def abandon(self) -> None:
        self.abandoned.append(time.monotonic())


async def test_work_that_outlives_the_grace_is_cancelled() -> None:
    conn = Cut()
    cancelled = asyncio.Event()

    async def stubborn() -> None:
        # Ignores the cut, as a driver that never notices a shut-down socket would.
        try:
            await asyncio.sleep(SLEEP)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(abandoning(cast(Session, conn), stubborn()), timeout=0.2)
    elapsed = time.monotonic() - started
    assert elapsed < WELL_BEFORE
    # Cut once, at the timeout; then the grace was waited for before giving up on it.
    assert len(conn.abandoned) == 1
    assert conn.abandoned[0] - started >= 0.2 * 0.9
    assert elapsed >= 0.2 + ABANDON_GRACE * 0.9
    # And the work was cancelled (it was still running).
    await asyncio.wait_for(cancelled.wait(), timeout=WAIT)


async def test_work_that_ends_within_the_grace_is_not_cancelled() -> None:
    """The other branch: the work notices the cut (as a driver does) and fails at once;
    the caller still gets the cancellation, not the work's error."""
    cut = asyncio.Event()
    outcome: list[str] = []

    class Noticed(Cut):
        def abandon(self) -> None:
            super().abandon()
            cut.set()

    async def noticing() -> None:
        try:
            await cut.wait()
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise
        outcome.append("noticed the cut")
        raise ConnectionResetError("the connection was cut")

    conn = Noticed()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(abandoning(cast(Session, conn), noticing()), timeout=0.2)
    assert time.monotonic() - started < 0.2 + ABANDON_GRACE  # not waited out
    assert len(conn.abandoned) == 1
    assert outcome == ["noticed the cut"]


async def test_abandoning_returns_the_work_s_result_when_not_cancelled(db: Db) -> None:
    database = settings(db)
    session = await dialect_for(database).connect(database)
    try:
        assert await abandoning(session, session.rows("SELECT 1")) == [(1,)]
        assert not session.spoiled
        assert session.usable
    finally:
        await session.close()


# --- a closed pool ----------------------------------------------------------------------------


async def test_a_closed_pool_hands_out_no_session(db: Db) -> None:
    pool = Pool(settings(db))
    assert await pool.read(lambda s: s.one("SELECT 1")) == (1,)
    await pool.close()
    # The idle session is closed with the pool.
    await wait_closed(db)
    with pytest.raises(ProbeUnavailableError, match=r"^the pool is closed$"):
        async with pool.session():
            pytest.fail("a closed pool handed out a session")
    with pytest.raises(ProbeUnavailableError, match=r"^the pool is closed$"):
        await pool.read(lambda s: s.one("SELECT 1"))
    # Refused without connecting.
    assert not await db_sessions(db)
    await pool.close()  # idempotent


async def test_a_session_given_back_after_close_is_closed_not_kept(db: Db) -> None:
    pool = Pool(settings(db))
    async with pool.session() as idle:
        pass
    async with pool.session() as session:
        assert session is idle
        async with pool.session() as other:  # a second one, in use when the pool closes
            assert other is not session
            await pool.close()
            # Closing the pool cuts no session in use.
            assert await other.one("SELECT 1") == (1,)
            assert other.usable
        assert connection_closed(other)
        assert await session.one("SELECT 2") == (2,)
    assert connection_closed(session)
    assert session.server_id is not None
    assert other.server_id is not None
    await wait_closed(db, {session.server_id, other.server_id})
    with pytest.raises(ProbeUnavailableError, match=r"^the pool is closed$"):
        async with pool.session():
            pytest.fail("a closed pool handed out a session")


async def test_a_caller_waiting_for_a_slot_when_the_pool_closes_gets_no_session(
    db: Db,
) -> None:
    """A caller already waiting for a free slot when the pool closes is refused as a new
    caller is: the pool does not open a session after ``close()`` returned."""
    database = config_on(
        db, (), database={"statement_timeout": "60s", "max_connections": 1}
    ).database
    assert database is not None
    pool = Pool(database)
    async with pool.session() as only:
        waiter = asyncio.ensure_future(pool.read(lambda s: s.one("SELECT 1")))
        await asyncio.sleep(0.1)  # the waiter is queued on the only slot
        assert not waiter.done()
        await pool.close()
        assert only.server_id is not None
        ids = {only.server_id}
    with pytest.raises(ProbeUnavailableError, match=r"^the pool is closed$"):
        await waiter
    await wait_closed(db, ids)
    # No session was opened for the waiter, before or after.
    assert not await db_sessions(db)
