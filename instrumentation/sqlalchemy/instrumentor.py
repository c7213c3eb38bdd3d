"""The public set-up: :func:`instrument_sqlalchemy`, :func:`uninstrument_sqlalchemy`."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import sqlalchemy
from opentelemetry.trace import TracerProvider

from ..api import get_sentry
from ..sentry import Sentry
from .clauses import Tables
from .fencing import Fencing
from .listeners import Instrumentation
from .model import DEFAULT_READ_WINDOW, SpanMode, StockTable
from .negative import NegativeWrites
from .otel import attach_engine_tracer

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

_EVENTS = ("do_execute", "do_execute_no_params", "do_executemany", "handle_error")
instrumented: weakref.WeakKeyDictionary[Engine, Instrumentation] = weakref.WeakKeyDictionary()


def _sync_engine(engine: Engine | AsyncEngine) -> Engine:
    sync = getattr(engine, "sync_engine", engine)
    if not isinstance(sync, sqlalchemy.engine.Engine):
        raise TypeError(f"expected a SQLAlchemy Engine or AsyncEngine, got {type(engine)!r}")
    return sync


def instrument_sqlalchemy(
    engine: Engine | AsyncEngine,
    *,
    sentry: Sentry | None = None,
    stock_tables: Mapping[str, StockTable] | None = None,
    spans: SpanMode | bool = "off",
    tracer_provider: TracerProvider | None = None,
    read_window: float = DEFAULT_READ_WINDOW,
    fencing: Mapping[str, str] | None = None,
    negative_writes: bool = True,
    read_back_stock: bool | Iterable[str] = False,
) -> None:
    """Watch ``engine``'s SQL for lock waits, deadlocks, conflicts and unsafe writes.

    ``sentry`` defaults to the process-wide one (:func:`get_sentry`, looked up now: call
    this after :func:`configure`). ``stock_tables`` maps table names to
    :class:`StockTable` (default ``{"products": StockTable()}``). ``spans``: ``"off"``
    (``False``), ``"locking"`` (a ``stock.db.lock`` span around each locking statement) or
    ``"all"`` (``True``: opentelemetry-instrumentation-sqlalchemy's span for every
    statement); ``tracer_provider`` defaults to the Sentry's tracer for ``"locking"`` and
    the global provider for ``"all"``. ``read_window`` is how long (seconds) a read of a
    stock value is remembered by the unsafe read-modify-write detector.

    ``fencing`` maps stock tables to their fencing-token column (``{"products":
    "fence_token"}``): an UPDATE carrying a token below one already written for the row
    counts ``stock_lock_stale_fencing_token_total``. ``negative_writes`` reads the stock an
    ``UPDATE … RETURNING`` returns (no extra query) and counts a negative one in
    ``stock_inventory_negative_total``; ``read_back_stock`` (``True`` or table names) also
    reads it back after a relative decrement without ``RETURNING`` (one ``SELECT`` by key
    each). See :mod:`.fencing` and :mod:`.negative`.

    Calling it again for the same engine does nothing. Listeners never raise into the
    application: their failures count ``stocksentry_instrumentation_errors_total
    {component="sqlalchemy"}``. Bad arguments raise (set-up code).

    Example::

        engine = create_async_engine("postgresql+asyncpg://shop@db/shop")
        instrument_sqlalchemy(engine, stock_tables={"products": StockTable()})
        ...
        uninstrument_sqlalchemy(engine)
    """
    sync = _sync_engine(engine)
    if sync in instrumented:
        return
    mode: SpanMode
    if spans is True:
        mode = "all"
    elif spans is False:
        mode = "off"
    elif spans in ("off", "locking", "all"):
        mode = spans
    else:
        raise ValueError(f"spans must be 'off', 'locking' or 'all', got {spans!r}")
    if not read_window > 0:
        raise ValueError("read_window must be positive")
    configured = stock_tables if stock_tables is not None else {"products": StockTable()}
    tables = Tables(configured)
    instrumentation = Instrumentation(
        sentry if sentry is not None else get_sentry(),
        tables,
        sync.dialect.name,
        sync.dialect.paramstyle,
        mode,
        tracer_provider,
        read_window,
        db_namespace=sync.url.database,
    )
    _set_write_checks(instrumentation, configured, fencing, negative_writes, read_back_stock)
    # Dialect events only (they are filed under the engine's own dialect): an engine event
    # would switch on SQLAlchemy's per-execute event path, which costs more than all of
    # this integration's own work.
    for name in _EVENTS:
        listener = getattr(instrumentation, name)
        sqlalchemy.event.listen(sync, name, listener)
        instrumentation.listeners.append((name, listener))
    instrumented[sync] = instrumentation
    try:
        # Known tables' series start at zero, so their first deadlock is an increase.
        instrumentation.metrics.prime_tables(configured)
    except Exception as exc:
        instrumentation.sentry.internal_error("sqlalchemy", exc)
    if mode == "all":
        try:
            attach_engine_tracer(sync, instrumentation, tracer_provider)
        except Exception:
            uninstrument_sqlalchemy(sync)
            raise


def _set_write_checks(
    instrumentation: Instrumentation,
    tables: Mapping[str, StockTable],
    fencing: Mapping[str, str] | None,
    negative_writes: bool,
    read_back_stock: bool | Iterable[str],
) -> None:
    """Switch on the optional UPDATE checks (:mod:`.fencing`, :mod:`.negative`)."""
    sentry = instrumentation.sentry
    paramstyle = instrumentation.paramstyle
    if fencing:
        instrumentation.fencing = Fencing(sentry, fencing, tables, paramstyle)
    instrumentation.negative = NegativeWrites.build(
        sentry, tables, returning=negative_writes, read_back=read_back_stock, paramstyle=paramstyle
    )


def uninstrument_sqlalchemy(engine: Engine | AsyncEngine) -> None:
    """Remove every listener :func:`instrument_sqlalchemy` added to ``engine`` (if any).

    Example::

        uninstrument_sqlalchemy(engine)
        assert not is_instrumented(engine)
    """
    sync = _sync_engine(engine)
    instrumentation = instrumented.pop(sync, None)
    if instrumentation is None:
        return
    for name, listener in instrumentation.listeners:
        if sqlalchemy.event.contains(sync, name, listener):
            sqlalchemy.event.remove(sync, name, listener)
    if instrumentation.otel_entries:
        from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

        for entry in instrumentation.otel_entries:
            target_ref, name, listener = entry
            target = target_ref()
            if target is not None and sqlalchemy.event.contains(target, name, listener):
                sqlalchemy.event.remove(target, name, listener)
            EngineTracer._dispose_of_event_listener(entry)  # type: ignore[no-untyped-call]  # untyped library
    instrumentation.listeners.clear()
    instrumentation.otel_entries = []


def is_instrumented(engine: Engine | AsyncEngine) -> bool:
    """Whether :func:`instrument_sqlalchemy` is in effect on ``engine``.

    Example::

        instrument_sqlalchemy(engine)
        assert is_instrumented(engine)
    """
    return _sync_engine(engine) in instrumented
