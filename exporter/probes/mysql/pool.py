"""The MySQL/MariaDB probes' read-only sessions: opening one, and the small pool sharing them.

Driver: aiomysql (asyncio on PyMySQL; see :mod:`stocksentry.exporter.dburl` for why). Each
session is opened in autocommit mode and set up once::

    SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY

READ COMMITTED, so each probe statement sees what had committed when it started (InnoDB's
default, REPEATABLE READ, would freeze the first statement's snapshot for the whole run;
the oversold horizon relies on later statements seeing later commits), and READ ONLY, so
not even a statement outside a probe's transaction can write. Every probe run is one
``START TRANSACTION READ ONLY`` ... ``ROLLBACK``, after the session's limits::

    SET SESSION max_statement_time = 2.0,           -- MariaDB, seconds
                innodb_lock_wait_timeout = 1, lock_wait_timeout = 1
    SET SESSION max_execution_time = 2000, ...      -- MySQL 8, milliseconds, SELECT only

``innodb_lock_wait_timeout`` (row locks) and ``lock_wait_timeout`` (metadata locks: a
``LOCK TABLES`` or an ``ALTER TABLE`` of the app) take whole seconds, at least 1: a probe
gives up after ``database.lock_timeout`` rounded up. The ``SET`` is sent only when the
probe's limit differs from what the session has.

Which server it is (MariaDB or MySQL) is read from the handshake's version string, not
from the URL's scheme: a ``mysql://`` URL may point at a MariaDB.

Example::

    pool = MyPool(config.database)
    rows = await pool.read(lambda session: session.rows("SELECT 1"))
    await pool.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import aiomysql  # type: ignore[import-untyped]  # ships no types; stubs are not a dependency
import pymysql  # type: ignore[import-untyped]  # types-PyMySQL is not a dependency
from pymysql.constants import CLIENT  # type: ignore[import-untyped]  # as above

from ...config import DatabaseConfig
from ...dburl import mysql_connect_args
from ..base import Backoff, ProbeUnavailableError, describe_error

__all__ = ["MyPool", "MySession", "connect_session"]

_T = TypeVar("_T")
#: What a failed connection attempt raises (a refused port, a bad password, a timeout).
CONNECT_ERRORS: Final = (pymysql.err.MySQLError, OSError, TimeoutError, ProbeUnavailableError)


def whole_seconds(seconds: float) -> int:
    """A lock wait limit in whole seconds, at least 1 (the server's smallest)."""
    return max(1, math.ceil(seconds))


class MySession:
    """One probe session: the driver's connection, which server it is, its limits.

    ``flavor`` is ``mariadb`` or ``mysql``; ``version`` the server's version string.
    """

    def __init__(self, conn: aiomysql.Connection, *, lock_timeout: float) -> None:
        self.conn = conn
        self.version = str(conn.get_server_info() or "")
        self.flavor = "mariadb" if "mariadb" in self.version.lower() else "mysql"
        self.lock_seconds = whole_seconds(lock_timeout)
        self.statement_timeout: float | None = None
        #: ``True`` between START TRANSACTION and its ROLLBACK.
        self.in_transaction = False
        #: The server's id of the session (``CONNECTION_ID()``), to kill its query.
        self.thread_id: int | None = conn.thread_id()

    @property
    def closed(self) -> bool:
        return bool(self.conn.closed)

    async def execute(self, statement: str, params: Any = None) -> None:
        """Run a statement whose result, if any, is not needed."""
        async with self.conn.cursor() as cursor:
            await cursor.execute(statement, params)

    async def rows(self, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Every row of ``statement`` (``params``: PyMySQL's ``%(name)s`` / ``%s`` style)."""
        async with self.conn.cursor() as cursor:
            await cursor.execute(statement, params)
            return [tuple(row) for row in await cursor.fetchall()]

    async def one(self, statement: str, params: Any = None) -> tuple[Any, ...]:
        """The single row of an aggregate ``statement``."""
        found = await self.rows(statement, params)
        if not found:  # aggregates always return a row; a view mapped as a table might not
            raise ValueError("the query returned no row")
        return found[0]

    def limits_statement(self, statement_timeout: float) -> str:
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
        """Open the probe's read-only transaction with ``statement_timeout``."""
        if self.statement_timeout != statement_timeout:
            await self.execute(self.limits_statement(statement_timeout))
            self.statement_timeout = statement_timeout
        await self.execute("START TRANSACTION READ ONLY")
        self.in_transaction = True

    async def rollback(self) -> None:
        await self.execute("ROLLBACK")
        self.in_transaction = False

    def close(self) -> None:
        """Close at once (no goodbye to the server: the session may be mid-query)."""
        with contextlib.suppress(Exception):
            self.conn.close()


async def connect_session(db: DatabaseConfig, *, lock_timeout: float | None = None) -> MySession:
    """Open one autocommit session whose transactions are READ COMMITTED and read-only."""
    try:
        args = mysql_connect_args(db.url.reveal())
    except ValueError as exc:
        raise ProbeUnavailableError(f"the database URL from {db.url_source}: {exc}") from None
    args.setdefault("program_name", db.application_name)
    args.setdefault("charset", "utf8mb4")
    timeout = max(1.0, db.connect_timeout)
    # aiomysql always asks for multiple statements per query; the probes send one each,
    # and custom SQL must not be able to append "; SET SESSION TRANSACTION READ WRITE;
    # COMMIT; DELETE ...". So the flag is cleared before the handshake, which is what
    # aiomysql.connect() itself does after building the connection (Connection, then
    # _connect()).
    conn = aiomysql.Connection(**args, autocommit=True, connect_timeout=timeout)
    conn.client_flag &= ~CLIENT.MULTI_STATEMENTS
    try:
        async with asyncio.timeout(timeout + 1.0):
            await conn._connect()
    except BaseException:
        conn.close()
        raise
    session = MySession(
        conn, lock_timeout=db.lock_timeout if lock_timeout is None else lock_timeout
    )
    try:
        await session.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED, READ ONLY")
        await session.execute(session.limits_statement(db.statement_timeout))
        session.statement_timeout = db.statement_timeout
    except BaseException:
        session.close()
        raise
    return session


class MyPool:
    """A few lazily opened sessions shared by the probes, with backoff on connect errors.

    The same contract as :class:`~stocksentry.exporter.probes.postgres.PgPool`: at most
    ``database.max_connections`` sessions; a session cancelled mid-query, broken or left
    in a transaction is closed rather than reused; while the database is unreachable,
    attempts are spaced by :class:`Backoff` and probe runs fail at once with
    :class:`ProbeUnavailableError`.
    """

    def __init__(self, db: DatabaseConfig, *, backoff: Backoff | None = None) -> None:
        self.db = db
        self._slots = asyncio.Semaphore(db.max_connections)
        self._idle: list[MySession] = []
        self._backoff = backoff or Backoff()
        self._last_error = ""
        self._closed = False
        self._killers: set[asyncio.Task[None]] = set()
        #: ``mariadb`` or ``mysql`` once a session has been opened.
        self.flavor: str | None = None

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[MySession]:
        """A session of the pool for the duration of the block."""
        if self._closed:
            raise ProbeUnavailableError("the pool is closed")
        async with self._slots:
            session = self._idle.pop() if self._idle else await self._connect()
            try:
                yield session
            finally:
                if not session.closed and not session.in_transaction and not self._closed:
                    self._idle.append(session)
                else:
                    session.close()

    async def read(
        self,
        query: Callable[[MySession], Awaitable[_T]],
        *,
        release_locks: bool = False,
        statement_timeout: float | None = None,
    ) -> _T:
        """Run ``query(session)`` in a read-only transaction with the configured limits.

        ``release_locks``: afterwards, also release the named locks (``GET_LOCK``) the
        query may have taken; a ``ROLLBACK`` does not. ``statement_timeout``: the probe's
        own, instead of ``database.statement_timeout``.
        """
        limit = self.db.statement_timeout if statement_timeout is None else statement_timeout
        async with self.session() as session:
            try:
                await session.begin(limit)
                result = await query(session)
            except asyncio.CancelledError:
                # Cancelled mid-query (the probe's timeout): the session's state is unknown,
                # so session() closes it (in_transaction stays set). Closing the socket does
                # not stop the server's query (it notices only when it writes), so it is
                # killed from a session of its own, in the background: the server's
                # statement limit is the backstop if even that cannot connect.
                session.in_transaction = True
                self._kill_later(session)
                raise
            except BaseException:
                if session.in_transaction and not session.closed:
                    with contextlib.suppress(pymysql.err.MySQLError, OSError):
                        await session.rollback()
                if release_locks and not session.closed:
                    await self._release(session)
                raise
            await session.rollback()
            if release_locks:
                await self._release(session)
            return result

    def _kill_later(self, session: MySession) -> None:
        thread_id = session.thread_id
        if thread_id is None or self._closed:
            return
        task = asyncio.get_running_loop().create_task(
            self._kill(thread_id), name=f"stocksentry-kill-query-{thread_id}"
        )
        # Kept until done: a task nobody references may be collected before it runs.
        self._killers.add(task)
        task.add_done_callback(self._killers.discard)

    async def _kill(self, thread_id: int) -> None:
        """``KILL QUERY`` the statement of a session given up on (a user may kill its own
        sessions' queries without any grant)."""
        try:
            async with asyncio.timeout(max(1.0, self.db.connect_timeout) + 2.0):
                killer = await connect_session(self.db)
                try:
                    await killer.execute(f"KILL QUERY {int(thread_id)}")
                finally:
                    killer.close()
        except (*CONNECT_ERRORS, asyncio.CancelledError):
            # Best effort: max_statement_time / max_execution_time ends it anyway.
            return

    async def _release(self, session: MySession) -> None:
        try:
            await session.execute("SELECT RELEASE_ALL_LOCKS()")
        except BaseException:
            # Whether the locks went is unknown: never hand this session out again.
            session.in_transaction = True
            raise

    async def _connect(self) -> MySession:
        wait = self._backoff.wait_time()
        if wait > 0:
            raise ProbeUnavailableError(
                f"database unreachable ({self._last_error}); next attempt in {wait:.1f}s"
            )
        try:
            session = await connect_session(self.db)
        except (*CONNECT_ERRORS, asyncio.CancelledError) as exc:
            self._last_error = describe_error(exc)
            self._backoff.failed()
            raise
        self._backoff.succeeded()
        self.flavor = session.flavor
        return session

    async def close_idle(self) -> None:
        """Close the sessions nobody uses (a follower keeps none open)."""
        idle, self._idle = self._idle, []
        for session in idle:
            session.close()

    async def close(self) -> None:
        """Close every session (and wait for the queries being killed); the pool cannot be
        used afterwards."""
        self._closed = True
        await self.close_idle()
        if self._killers:
            await asyncio.wait(list(self._killers))
