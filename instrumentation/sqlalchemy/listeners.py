"""The engine event listeners: lock waits, SQLSTATE failures, conflicts, unsafe writes."""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from time import perf_counter
from typing import TYPE_CHECKING, Any, Literal

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode, TracerProvider, get_current_span
from sqlalchemy.engine.interfaces import ExecuteStyle

from .. import catalog, events
from ..heldlocks import held_locks, valid_at
from ..outcomes import refusal_of, status_code_of
from ..reservation import current_reservation, imply_outcome
from ..sentry import Sentry
from ..tracing import TRACER_NAME, exemplar_for
from .classifier import classify_tokens
from .clauses import Tables
from .dialects import MYSQL_DIALECTS, lossless_levels, zero_rows_check
from .fencing import FencePlan, Fencing, fence_plan
from .location import app_location
from .model import (
    COMPONENT,
    MISSING,
    PLAN_CACHE_CHARS,
    PLAN_CACHE_MAX_TEXT,
    PLAN_CACHE_SIZE,
    SpanMode,
    StatementInfo,
    StockTable,
    bound_value,
)
from .negative import NegativeWrites
from .state import (
    ANY_ROW,
    ConnState,
    Key,
    Read,
    key_fields,
    normalise,
    remember,
    request_reads,
    reservation_reads,
    scope,
)
from .tokens import tokenize

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine, ExceptionContext
    from sqlalchemy.engine.interfaces import DBAPICursor, ExecutionContext

# db.operation.name of the locking statements' spans, from the classifier's kind.
_OPERATIONS = {"select": "SELECT", "update": "UPDATE", "delete": "DELETE", "lock": "LOCK TABLE"}
_DB_SYSTEMS = {"mssql": "microsoft.sql_server", "oracle": "oracle.db"}
# The line each concurrency refusal logs and the counter it increments (a lock timeout has
# none); which SQLSTATE is which refusal is outcomes' (a test keeps the two in step).
REFUSALS = {
    "deadlock": (events.DB_DEADLOCK, catalog.DB_DEADLOCK),
    "serialization_failure": (events.DB_SERIALIZATION_FAILURE, catalog.DB_SERIALIZATION_FAILURE),
    "lock_timeout": (events.DB_LOCK_TIMEOUT, None),
}
_EXECUTE = ExecuteStyle.EXECUTE
EXECUTE_EVENTS = ("do_execute", "do_execute_no_params", "do_executemany")


class Route:
    """What the listeners do with one SQL text, decided once from its plan and cached with
    it: an already classified statement costs a dict lookup and a few attribute tests."""

    __slots__ = ("begin", "fence", "guarded", "label", "lock_wait", "no_count", "plan", "watched")

    def __init__(
        self, plan: StatementInfo, fence: FencePlan | None, watched: bool, sqlite: bool
    ) -> None:
        self.plan = plan
        self.label = plan.table or "unknown"
        # Its lock-wait histogram child, once the metrics have cached it.
        self.lock_wait: Any = None
        self.begin = plan.kind == "begin" or plan.kind == "isolation"
        self.guarded = plan.conditional
        # The optional checks an UPDATE of this text goes to: the fencing token it carries,
        # the real negative stock it may leave.
        self.fence = fence
        self.watched = watched
        # pysqlite counts RETURNING rows only as they are fetched: unknown after execute.
        self.no_count = plan.returning and sqlite


class Instrumentation:
    """The listeners of one engine. Holds no reference to the engine itself."""

    def __init__(
        self,
        sentry: Sentry,
        engine: Engine,
        stock_tables: Mapping[str, StockTable],
        span_mode: SpanMode,
        tracer_provider: TracerProvider | None,
        read_window: float,
        fencing: Mapping[str, str] | None,
        negative_writes: bool,
        read_back_stock: bool | Iterable[str],
    ) -> None:
        self.sentry = sentry
        self.metrics = sentry.metrics
        self.tables = Tables(stock_tables)
        self.dialect_name = dialect_name = engine.dialect.name
        self.paramstyle = paramstyle = engine.dialect.paramstyle
        self.db_namespace = engine.url.database
        # OpenTelemetry's well-known db.system.name values, from SQLAlchemy's dialect names.
        self.db_system = _DB_SYSTEMS.get(dialect_name, dialect_name)
        self.read_window = read_window
        # MySQL drivers may count changed rows, not matched ones: what reads a 0 right.
        self.zero_rows = zero_rows_check(dialect_name)
        # The read window's clock; a test moves it instead of sleeping.
        self.clock: Callable[[], float] = time.monotonic
        self.plans: dict[str, Route] = {}
        self.plan_chars = 0
        # Per SQLAlchemy Connection (one checkout): it goes with the Connection.
        self.conns: weakref.WeakKeyDictionary[Connection, ConnState] = weakref.WeakKeyDictionary()
        self.lock_tracer: Any = None
        if span_mode == "locking":
            if tracer_provider is None and sentry.tracer is not None:
                self.lock_tracer = sentry.tracer
            else:
                self.lock_tracer = otel_trace.get_tracer(
                    TRACER_NAME, tracer_provider=tracer_provider
                )
        # (event name, listener) of everything listen()ed on the engine, for uninstrument;
        # never the engine itself, which holds this object through its listeners. The three
        # execute events have one listener, told which event it runs for.
        self.listeners: list[tuple[str, Callable[..., Any]]] = [
            (event, functools.partial(self.run, event)) for event in EXECUTE_EVENTS
        ]
        self.listeners.append(("handle_error", self.handle_error))
        self.mine = dict(self.listeners)
        # The optional write checks (each SQL text's route decides once whether its
        # UPDATEs go to them); one that is switched off costs nothing.
        self.fencing = Fencing(sentry, fencing, stock_tables, paramstyle) if fencing else None
        negative = NegativeWrites(
            sentry,
            stock_tables,
            returning=negative_writes,
            read_back=read_back_stock,
            paramstyle=paramstyle,
        )
        self.negative = negative if negative.returning or negative.read_back else None

    def route(self, statement: str) -> Route:
        """The cached :class:`Route` of ``statement``, classified on a miss."""
        route = self.plans.get(statement)
        if route is not None:
            return route
        toks = tokenize(statement, self.paramstyle, self.dialect_name in MYSQL_DIALECTS)
        plan = classify_tokens(toks, self.tables)
        fence: FencePlan | None = None
        watched = False
        if plan.stock and plan.kind == "update":
            # A guarded UPDATE (the atomic reservation) cannot leave the stock negative:
            # with no fencing on its table, it is not even looked at.
            if self.fencing is not None and plan.table in self.fencing.columns:
                fence = fence_plan(toks, self.fencing.columns[plan.table])
            watched = self.negative is not None and self.negative.applies(plan)
        route = Route(plan, fence, watched, self.dialect_name == "sqlite")
        size = len(statement)
        if size <= PLAN_CACHE_MAX_TEXT:
            if len(self.plans) >= PLAN_CACHE_SIZE or self.plan_chars + size > PLAN_CACHE_CHARS:
                self.plans.clear()
                self.plan_chars = 0
            self.plans[statement] = route
            self.plan_chars += size
        return route

    def state(self, conn: Connection) -> ConnState:
        """``conn``'s state, the locks of its last transaction forgotten if that ended."""
        state = self.conns.get(conn)
        if state is None:
            state = self.conns[conn] = ConnState()
        state.sync(conn.get_transaction())
        return state

    # --- events ----------------------------------------------------------------------------

    def run(self, event: str, *args: Any) -> bool:
        """The listener of the dialect's execute ``event``: run a locking statement (timed)
        or a single execute on a stock table (its bookkeeping after it ran) here and return
        True, SQLAlchemy's "executed"; leave any other to SQLAlchemy (False)."""
        context: ExecutionContext = args[-1]
        span: Any = None
        try:
            route = self.plans.get(args[1]) or self.route(args[1])
            plan = route.plan
            bookkeeping = (
                plan.stock and event == "do_execute" and context.execute_style is _EXECUTE
            )
            if not plan.locking and not bookkeeping:
                if route.begin:
                    state = self.state(context.root_connection)
                    if state.txn is None:
                        state.pending = plan
                    else:
                        state.apply_begin(plan)
                return False
            if plan.locking and self.lock_tracer is not None:
                span = self._lock_span(plan)
            t0 = perf_counter()  # last, so the figure is the statement's own time
        except Exception as exc:
            self.sentry.internal_error(COMPONENT, exc)
            return False
        try:
            # SQLAlchemy stops at the first do_execute listener that returns True and
            # documents no call for "the listeners after this one": its dispatch collection
            # for the event is iterated, as SQLAlchemy itself iterates it, so those
            # listeners keep their turn; none of them having run it, the dialect does.
            dialect = context.dialect
            listeners = getattr(dialect.dispatch, event)
            if len(listeners) == 1:  # ours alone
                getattr(dialect, event)(*args)
            else:
                mine = self.mine[event]
                after = False
                for fn in listeners:
                    if after and fn(*args):
                        break
                    after = after or fn == mine
                else:
                    getattr(dialect, event)(*args)
        except BaseException as exc:
            if plan.locking:
                self._lock_done(route, t0, span, exc)
            raise  # the driver's own exception, unchanged: SQLAlchemy wraps it as usual
        if plan.locking:
            self._lock_done(route, t0, span, None)
        if bookkeeping:
            # Apart, so that a failure in the timing does not switch off the bookkeeping.
            try:
                self._stock_statement(context.root_connection, args[0], route, args[2])
            except Exception as exc:
                self.sentry.internal_error(COMPONENT, exc)
        return True

    def _lock_span(self, plan: StatementInfo) -> Any:
        # OpenTelemetry's database conventions: "{operation} {collection}" as the name.
        operation = _OPERATIONS.get(plan.kind, "")
        table = plan.table or "unknown"
        attributes: dict[str, str] = {
            "db.system.name": self.db_system,
            "db.collection.name": table,
            "db.operation.name": operation,
            "stock.lock": plan.lock_clause or "",
        }
        if self.db_namespace:
            attributes["db.namespace"] = self.db_namespace
        return self.lock_tracer.start_span(
            f"{operation} {table}" if operation else table,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )

    def handle_error(self, ctx: ExceptionContext) -> None:
        try:
            statement = ctx.statement
            plan = self.route(statement).plan if isinstance(statement, str) else None
            # SQLSTATE 40P01 / 55P03, MySQL 1213 / 1205: which is which refusal is outcomes'.
            refusal = refusal_of(ctx.original_exception) or refusal_of(ctx.sqlalchemy_exception)
            if refusal is None:
                return
            reason, state = refusal
            event, metric = REFUSALS[reason]
            table = plan.table if plan is not None else None
            if table is None and ctx.connection is not None:
                # A failure at COMMIT (SERIALIZABLE) names no statement: use the last stock
                # table this connection worked on.
                held = self.conns.get(ctx.connection)
                table = held.last_table if held is not None else None
            table = table or "unknown"
            if metric is not None:
                self.metrics.count(metric, table)
            self.sentry.log_event(event, table=table, sqlstate=state)
        except Exception as exc:
            self.sentry.internal_error(COMPONENT, exc)

    # --- pieces ----------------------------------------------------------------------------

    def _lock_done(self, route: Route, t0: float, span: Any, exc: BaseException | None) -> None:
        try:
            elapsed = perf_counter() - t0
            current = span
            if current is None and otel_context.get_current():  # an empty one holds no span
                current = get_current_span()
            exemplar = exemplar_for(current) if current is not None else None
            if route.lock_wait is not None:
                route.lock_wait.observe(elapsed, exemplar)
            else:
                self.metrics.observe(catalog.DB_LOCK_WAIT, elapsed, route.label, exemplar=exemplar)
                route.lock_wait = self.metrics.cached_child(catalog.DB_LOCK_WAIT, route.label)
            if span is not None:
                if exc is not None and span.is_recording():
                    code = status_code_of(exc)
                    if code is not None:
                        span.set_attribute("db.response.status_code", code)
                    span.set_attribute("error.type", type(exc).__qualname__)
                    span.set_status(StatusCode.ERROR)
                span.end()
        except Exception as err:
            self.sentry.internal_error(COMPONENT, err)

    def _stock_statement(
        self, conn: Connection, cursor: DBAPICursor, route: Route, parameters: Any
    ) -> None:
        """The bookkeeping of a statement on a stock table that ran: the reads it made, the
        row locks it took, the conflict a guarded UPDATE that matched no row implies, then
        the optional checks of an UPDATE (fencing tokens, real negative stock)."""
        plan = route.plan
        kind = plan.kind
        if kind == "lock":
            if plan.table_lock:
                self.state(conn).lock_all.add(route.label)
            return
        keys: list[Key] = []
        for column, ref in plan.keys:
            value = bound_value(ref, parameters)
            if value is not MISSING:
                keys.append((route.label, column, normalise(value)))
        if kind == "select":
            if keys and (plan.reads_stock or plan.protects_rows):
                self._read(conn, plan, keys)
            return
        # An UPDATE or a DELETE from here on. The rows it matched; -1 when not known.
        rowcount: int = -1 if route.no_count else getattr(cursor, "rowcount", -1)
        if rowcount == 0 and kind == "update" and self.zero_rows is not None:
            rowcount = self.zero_rows(cursor)  # MySQL: matched, not changed, rows
        if keys or kind == "update":
            state = self.state(conn)
            state.last_table = plan.table
            if keys and rowcount != 0:
                if plan.write == "blind" and not route.guarded:  # the detector's case
                    self._check_write(conn, keys, state)
                state.locks.update(keys)
        if route.guarded:
            if rowcount == 0:
                self._no_row(plan, keys)
            elif rowcount > 0:
                # A retry that now matched undoes the conflict an earlier attempt implied.
                reservation = current_reservation()
                if reservation is not None:
                    imply_outcome(reservation, None)
        if route.fence is not None and self.fencing is not None and keys:
            self.fencing.after_update(conn, route.fence, parameters, keys[0], rowcount)
        if route.watched and self.negative is not None:
            self.negative.after_update(conn, cursor, plan, keys, rowcount)

    def _read(self, conn: Connection, plan: StatementInfo, keys: list[Key]) -> None:
        """A SELECT naming stock rows: remember the read, and the row locks it took."""
        state = self.state(conn)
        if _autocommit(conn):
            locked = False  # each statement is its own transaction: no lock outlives it
        elif plan.protects_rows:
            state.locks.update(keys)
            locked = True
        else:
            locked = (
                "*" in state.lock_all
                or keys[0][0] in state.lock_all
                or any(k in state.locks for k in keys)
            )
        if not plan.reads_stock:
            return
        read = Read(locked, state.txn, self.clock(), held_locks())
        reservation = current_reservation()
        res_store = scope(reservation_reads, reservation, True) if reservation else None
        request_id = structlog.contextvars.get_contextvars().get("request_id")
        req_store = scope(request_reads, request_id, True) if request_id is not None else None
        for key in keys:
            remember(state.reads, key, read)
            if res_store is not None:
                remember(res_store, key, read)
                # A reservation is for one SKU: a later write keyed by another column (the
                # ORM reads by sku and flushes by id) is taken to be about the same row.
                remember(res_store, (key[0], ANY_ROW, key[1]), read)
            if req_store is not None:
                remember(req_store, key, read)

    def _check_write(self, conn: Connection, keys: list[Key], state: ConnState) -> None:
        """A blind write of ``keys``: flag it when computed from a read that did not keep
        the row from changing (see docs/sqlalchemy.md, "Unsafe read-modify-write")."""
        now = self.clock()
        oldest = now - self.read_window
        res_store = scope(reservation_reads, current_reservation(), False)
        request_id = structlog.contextvars.get_contextvars().get("request_id")
        stores = [
            (name, store)
            for name, store in (
                ("connection", state.reads),
                ("reservation", res_store),
                ("request", scope(request_reads, request_id, False)),
            )
            if store is not None
        ]
        # A write uses up the reads it was computed from: every one of its keys', expired
        # or not.
        found = [
            (read, name, key)
            for key in keys
            for name, store in stores
            if (read := store.pop(key, None)) is not None and read.at >= oldest
        ]
        if res_store is not None:
            # Within a reservation, a read keyed by another column of the same table (read
            # by sku, written by id, as the ORM does) is taken to be about this row, when
            # no read of this very key decided. Used up by the write either way.
            table, written = keys[0][0], {key[1] for key in keys}
            loose = [
                (res_store.pop(k, None), k[2])
                for k in list(res_store)
                if k[0] == table and k[1] == ANY_ROW
            ]
            if not found:
                found = [
                    (read, "reservation", keys[0])
                    for read, column in loose
                    # The same key column with another value: another row.
                    if read is not None and read.at >= oldest and column not in written
                ]
        if not found:
            return  # a blind write without a read we saw (a restock, an admin fix)
        latest, latest_scope, latest_key = max(found, key=lambda candidate: candidate[0].at)
        txn = conn.get_transaction()
        same_txn = txn is not None and latest.txn is not None and latest.txn() is txn
        if same_txn and (latest.locked or self._serializable(conn, state)):
            return
        lost_lock: dict[str, str] = {}
        if latest.held:
            # A distributed lock held since before the read and still owned at the write
            # serialises the read-modify-write as a row lock would: safe. One whose lease
            # ran out in between let a second holder in: the lost update it exists to stop.
            at = time.perf_counter()
            if any(valid_at(hold, at) for hold in latest.held):
                return
            expired = [hold for hold in latest.held if not hold.released]
            lost_lock = (
                {"lock": expired[0].name, "reason": "lock expired before the write"}
                if expired
                else {"lock": latest.held[0].name, "reason": "lock released before the write"}
            )
        self.metrics.count(catalog.UNSAFE_READ_MODIFY_WRITE, latest_key[0])
        if self.sentry.log_enabled:  # app_location() walks the stack: only for a line
            code, function = app_location()
            self.sentry.log_event(
                events.UNSAFE_READ_MODIFY_WRITE,
                **key_fields(latest_key),
                code=code,
                function=function,
                read_scope=latest_scope,
                read_age_s=round(now - latest.at, 3),
                read_locked=latest.locked,
                same_transaction=same_txn,
                **lost_lock,
            )

    def _no_row(self, plan: StatementInfo, keys: list[Key]) -> None:
        reason: Literal["out_of_stock", "lost_race"] = (
            "out_of_stock" if plan.write == "self" else "lost_race"
        )
        reservation = current_reservation()
        if reservation is not None:
            imply_outcome(reservation, reason)
            return
        # Outside a reservation there is no SKU label or outcome to attach it to: a debug
        # line only, so a batch job's guarded updates do not count as checkout conflicts.
        self.sentry.log_event(
            events.STOCK_UPDATE_MATCHED_NO_ROW,
            table=plan.table,
            reason=reason,
            key=str(keys[0][2]) if keys else None,
        )

    def _serializable(self, conn: Connection, state: ConnState) -> bool:
        """Whether a plain read and a write in one transaction cannot lose an update."""
        if self.dialect_name == "sqlite":
            # Only a BEGIN the application sends makes pysqlite read inside the transaction
            # (by default it begins before the first write); then SQLite is serializable.
            return state.begun
        if _autocommit(conn):
            return False
        if state.isolation is None:
            # Asked of the server once per transaction (only a write that would be flagged
            # gets here): create_engine(isolation_level=...) has no other public accessor.
            state.isolation = conn.get_isolation_level()
        return state.isolation in lossless_levels(self.dialect_name)


def _autocommit(conn: Connection) -> bool:
    """Whether ``conn`` runs each statement as its own transaction (``AUTOCOMMIT`` set on
    the engine, the connection or the driver), asked of the driver without a round trip."""
    dbapi_connection = conn.connection.dbapi_connection
    # A dialect that cannot tell (or an SQLAlchemy 2.0 before the method): the option.
    with contextlib.suppress(AttributeError, NotImplementedError):
        if dbapi_connection is not None:
            return conn.dialect.detect_autocommit_setting(dbapi_connection)
    return conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
