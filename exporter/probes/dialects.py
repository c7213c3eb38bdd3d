"""What a probe needs of a database: a :class:`Session`, and a :class:`Dialect` holding the
SQL that differs between PostgreSQL (:mod:`.pg`, psycopg) and MySQL/MariaDB (:mod:`.my`,
aiomysql). Statements are text with ``%(name)s`` parameters, which both drivers take
(:meth:`Dialect.render` for the invariant statements); identifiers reach SQL only through
:meth:`Dialect.quote`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Awaitable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ..invariants import Param, Query, quote
from .base import LOGGER

if TYPE_CHECKING:
    from ..config import DatabaseConfig

_T = TypeVar("_T")

#: A statement's parameters: ``%(name)s`` by name or ``%s`` in order; ``None``: none, so a
#: ``%`` in the text stays as written.
Params = Mapping[str, object] | Sequence[object] | None

# The election's session is ended by the server when idle this many retry intervals (at
# least the floor): a live leader pings every interval, so only a frozen one is ended.
IDLE_INTERVALS: Final = 3
IDLE_FLOOR: Final = 1.0
#: Seconds a statement cut off by :meth:`Session.abandon` may take to notice (the socket
#: is shut down, so it fails at once; this only bounds a driver that would not).
ABANDON_GRACE: Final = 1.0


class Session(abc.ABC):
    """A read-only session on one driver connection; ``flavor``: ``postgresql``,
    ``mariadb`` or ``mysql``."""

    flavor: str
    #: The statement that releases the session-level locks custom SQL may take.
    unlock: str

    def __init__(self, server_id: int | None) -> None:
        #: The server's id of the session (a backend pid, a thread id), to stop its query.
        self.server_id = server_id
        #: Never to be handed out again (its state is unknown).
        self.spoiled = False

    @abc.abstractmethod
    async def rows(self, statement: str, params: Params = None) -> list[tuple[Any, ...]]: ...

    async def one(self, statement: str, params: Params = None) -> tuple[Any, ...]:
        """The single row of an aggregate statement."""
        found = await self.rows(statement, params)
        if not found:  # aggregates always return a row; a view mapped as a table might not
            raise ValueError("the query returned no row")
        return found[0]

    @abc.abstractmethod
    async def execute(self, statement: str, params: Params = None) -> None: ...

    @abc.abstractmethod
    async def table(self, statement: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        """The column names and rows of one statement, sent without parameters."""

    @property
    @abc.abstractmethod
    def usable(self) -> bool:
        """Open, healthy, and outside any transaction: it may be handed out again."""

    @abc.abstractmethod
    async def begin(self, statement_timeout: float) -> None:
        """Open a read-only transaction whose statements stop after ``statement_timeout``."""

    async def rollback(self) -> None:
        await self.execute("ROLLBACK")

    async def release_locks(self) -> None:
        """Release the session-level locks (a rollback does not); failing, spoil."""
        try:
            await self.execute(self.unlock)
        except BaseException:
            self.spoiled = True
            raise

    @abc.abstractmethod
    def abandon(self) -> None:
        """Cut the connection at once, never waiting on a server that may be silent: a
        statement in flight fails, nothing more is sent (no cancel request, no goodbye)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close; never raises."""


class Dialect(abc.ABC):
    """The SQL of one database family that the probes cannot share, and its driver."""

    #: The dialect of :class:`~stocksentry.exporter.invariants.InvariantSql` and quoting.
    name: str
    #: Whether ``CREATE INDEX ... WHERE`` exists (the index advice differs without).
    partial_indexes: bool
    #: The SQL of the database's clock; of the clock less the interval parameter ``{}``
    #: (:meth:`interval`); of the seconds from the point in time ``{}`` to the clock.
    now: str
    ago: str
    seconds_since: str
    #: ``(horizon, the clock)`` from ``%(settle_after)s`` and ``%(margin)s``: no row
    #: created before the horizon can still be uncommitted (see :mod:`.db`, oversold).
    horizon_sql: str
    #: The planner's estimate of the rows of ``%(table)s`` (:meth:`table_params`).
    row_estimate_sql: str
    #: Whether ``%(table)s`` exists; the first column of each of its indexes.
    table_exists_sql: str
    leading_columns_sql: str
    #: ``(transactions open beyond %(threshold)s, the oldest one's age)`` touching the
    #: tables ``%(tables)s`` (quoted names, comma-separated).
    long_transactions_sql: str
    #: The statement that stops the query of the session ``{}``, from another session.
    stop_sql: str
    #: Takes the election's session-level lock ``%s`` if it is free: 1 when taken.
    try_lock_sql: str

    #: Whether :meth:`connect` has logged the server found (once per dialect object).
    announced: bool = False

    def quote(self, name: str) -> str:
        return quote(name, self.name)

    def fold(self, column: str) -> str:
        """A column name as :meth:`leading_columns` spells it."""
        return column

    def literal(self, value: object) -> str | None:
        """``value`` as an SQL literal, for the constants of a :class:`Query`; ``None``:
        keep them as parameters."""
        return None

    def render(self, query: Query) -> tuple[str, dict[str, object] | None]:
        """An invariant statement as text and parameters, its constants inlined where
        :meth:`literal` says so (they then match a partial index's predicate)."""
        literals = {
            p.name: text
            for p in query.parts
            if isinstance(p, Param) and p.constant and (text := self.literal(p.value)) is not None
        }
        params = {k: v for k, v in query.params.items() if k not in literals}
        # With parameters the driver reads every % as the start of a placeholder.
        marks = "%%" if params else "%"
        parts = tuple(
            literals[p.name].replace("%", marks)
            if isinstance(p, Param) and p.name in literals
            else p
            for p in query.parts
        )
        return Query(parts, query.columns).text("pyformat"), params or None

    @abc.abstractmethod
    def interval(self, seconds: float) -> object:
        """``seconds`` as the parameter :meth:`ago` takes."""

    @abc.abstractmethod
    def table_params(self, table: str) -> dict[str, object]:
        """The parameters that name ``table`` in :attr:`row_estimate_sql` and the like."""

    async def connect(self, db: DatabaseConfig, *, elector: bool = False) -> Session:
        """Open a session whose transactions are read-only. ``elector``: the election's,
        which the server ends once it goes silent."""
        session, settings, found = await self.open(db, elector=elector)
        try:
            for statement in settings:
                await session.execute(statement)
        except BaseException:
            await session.close()
            raise
        if not elector and not self.announced:
            # At the probes' first session: the server found and its limits.
            self.announced = True
            LOGGER.info("database: %s", found)
        return session

    @abc.abstractmethod
    async def open(self, db: DatabaseConfig, *, elector: bool) -> tuple[Session, list[str], str]:
        """A new session, the statements that set it up for :meth:`connect`, and what
        the start-up says of the server."""

    async def stop_query(self, db: DatabaseConfig, server_id: int) -> None:
        """Stop the server's query of the session ``server_id``, abandoned mid-query: the
        server notices a gone client only when it writes, so the statement would run up to
        its ``statement_timeout``. A session of its own runs :attr:`stop_sql` (a user may
        stop its own sessions' queries without any grant), bounded by the connect timeout;
        never raises (the statement limit is the backstop)."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            async with asyncio.timeout(max(1.0, db.connect_timeout) + 2.0):
                stopper = await self.connect(db)
                try:
                    await stopper.execute(self.stop_sql.format(int(server_id)))
                finally:
                    await stopper.close()

    async def horizon(
        self, session: Session, *, settle_after: float, margin: float
    ) -> tuple[datetime, datetime]:
        """:attr:`horizon_sql`'s ``(horizon, the clock)``."""
        params = {"settle_after": self.interval(settle_after), "margin": self.interval(margin)}
        return await session.one(self.horizon_sql, params)

    @abc.abstractmethod
    def lock_waiters_sql(self, flavor: str) -> str:
        """``(sessions waiting for a lock, the longest wait in seconds)`` in this database."""

    @abc.abstractmethod
    async def deadlocks(self, session: Session) -> tuple[str, Any]:
        """``(database, deadlocks counted by the server)``."""

    async def leading_columns(self, session: Session, table: str) -> set[str] | None:
        """The first column of each index of ``table``; ``None``: no such table."""
        params = self.table_params(table)
        (exists,) = await session.one(self.table_exists_sql, params)
        if not exists:
            return None
        return {self.fold(str(c)) for (c,) in await session.rows(self.leading_columns_sql, params)}

    @abc.abstractmethod
    def add_index(self, table: str, columns: Sequence[str], where: str | None) -> str:
        """The statement that adds an index on ``columns`` (``where``: its predicate)."""

    async def try_lock(self, session: Session, key: int) -> bool:
        (got,) = await session.one(self.try_lock_sql, (await self.lock_id(session, key),))
        return bool(got == 1)

    async def lock_id(self, session: Session, key: int) -> object:
        """The election's lock ``key`` as :attr:`try_lock_sql` takes it."""
        return key

    def idle_limit(self, db: DatabaseConfig) -> float:
        """Seconds of silence after which the server ends the election's session."""
        return max(IDLE_FLOOR, IDLE_INTERVALS * db.leader_retry_interval)

    def lease(self, db: DatabaseConfig) -> float:
        """Seconds a leader leads after the start of its last good ping: one retry interval
        less than :meth:`idle_limit`, when the server can free the lock at the earliest."""
        return self.idle_limit(db) - db.leader_retry_interval


async def abandoning(conn: Session, work: Awaitable[_T]) -> _T:
    """``await work`` (statements on ``conn``); cancelled (a timeout), cut ``conn`` first
    (:meth:`Session.abandon`), then let ``work`` end: a driver cancelled mid-statement
    would wait for the server's answer to its cancel request (psycopg: up to 10 s), which
    a silent network never gives. The caller then closes ``conn``.

    Example::

        rows = await abandoning(conn, conn.rows("SELECT 1"))
    """
    task = asyncio.ensure_future(work)
    try:
        # wait() does not pass a cancellation on to the task: this one decides how it ends.
        await asyncio.wait([task])
    except asyncio.CancelledError:
        conn.abandon()
        done, _ = await asyncio.wait([task], timeout=ABANDON_GRACE)
        if not done:
            task.cancel()
        elif not task.cancelled():
            task.exception()  # retrieved, so the loop does not log it: the error is the cut
        raise
    return task.result()


def dialect_for(db: DatabaseConfig) -> Dialect:
    """The dialect of the database URL (a PostgreSQL sidecar never imports aiomysql)."""
    if db.dialect == "mysql":
        from .my import MySQL

        return MySQL()
    from .pg import PostgreSQL

    return PostgreSQL()


def number(value: object) -> float:
    """A numeric column's value as a float; ``NULL`` (an empty aggregate) is 0. MySQL's
    status values and some ``information_schema`` columns are text."""
    if value is None:
        return 0.0
    if isinstance(value, bool | int | float | Decimal | bytes | str):
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")
