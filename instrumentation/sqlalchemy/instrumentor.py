"""The public set-up: :func:`instrument_sqlalchemy`, :func:`uninstrument_sqlalchemy`."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, get_args

import sqlalchemy
from opentelemetry import trace as otel_trace
from opentelemetry.trace import TracerProvider

from ..api import get_sentry
from ..sentry import Sentry
from .listeners import Instrumentation
from .model import COMPONENT, DEFAULT_READ_WINDOW, SpanMode, StockTable

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine

instrumented: weakref.WeakKeyDictionary[Engine, Instrumentation] = weakref.WeakKeyDictionary()
# spans="all": the engines that carry an EngineTracer of ours (opentelemetry-instrumentation-
# sqlalchemy's public per-engine part; SQLAlchemyInstrumentor().instrument() would patch the
# whole process), with their tracer provider. See docs/sqlalchemy.md, "Spans".
traced: weakref.WeakKeyDictionary[Engine, TracerProvider | None] = weakref.WeakKeyDictionary()


def _attach(engine: Engine, tracer_provider: TracerProvider | None) -> None:
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.instrumentation.sqlalchemy.version import __version__
    from opentelemetry.metrics import get_meter
    from opentelemetry.semconv.metrics import MetricInstruments

    scope = "opentelemetry.instrumentation.sqlalchemy"
    tracer = otel_trace.get_tracer(scope, __version__, tracer_provider)
    usage = get_meter(scope, __version__).create_up_down_counter(
        name=MetricInstruments.DB_CLIENT_CONNECTIONS_USAGE,
        unit="connections",
        description="The number of connections that are currently in state described by "
        "the state attribute.",
    )
    EngineTracer(tracer, engine, usage)  # type: ignore[no-untyped-call]  # untyped library


def attach_engine_tracer(
    engine: Engine, tracer_provider: TracerProvider | None, sentry: Sentry
) -> None:
    """Attach opentelemetry-instrumentation-sqlalchemy's per-engine tracer to ``engine``
    (with the version check the instrumentor would do)."""
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    instrumentor = SQLAlchemyInstrumentor()
    conflict = get_dependency_conflicts(instrumentor.instrumentation_dependencies())
    if conflict is not None:
        # As the instrumentor itself would: no spans rather than wrong ones.
        sentry.internal_error(COMPONENT, RuntimeError(str(conflict)))
        return
    if instrumentor.is_instrumented_by_opentelemetry:
        return
    _attach(engine, tracer_provider)
    traced[engine] = tracer_provider


def detach_engine_tracer(engine: Engine) -> None:
    """Remove what :func:`attach_engine_tracer` attached to ``engine`` (if anything)."""
    if engine not in traced:
        return
    del traced[engine]
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

    if SQLAlchemyInstrumentor().is_instrumented_by_opentelemetry:
        return  # the application's listeners would go too: ours stay
    EngineTracer.remove_all_event_listeners()  # type: ignore[no-untyped-call]  # untyped library
    for other, tracer_provider in list(traced.items()):
        _attach(other, tracer_provider)


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

    ``sentry`` defaults to :func:`get_sentry` (looked up now: call this after
    :func:`configure`); ``stock_tables`` to ``{"products": StockTable()}``. ``spans``:
    ``"off"``, ``"locking"`` (a span around each locking statement) or ``"all"``
    (opentelemetry-instrumentation-sqlalchemy's span for every statement). ``fencing``,
    ``negative_writes`` and ``read_back_stock`` switch on the write checks of
    :mod:`.fencing` and :mod:`.negative`; every argument is in docs/sqlalchemy.md.

    Calling it again for the same engine does nothing. Listeners never raise into the
    application (their failures count ``stocksentry_instrumentation_errors_total``); bad
    arguments raise.

    Example::

        engine = create_async_engine("postgresql+asyncpg://shop@db/shop")
        instrument_sqlalchemy(engine, stock_tables={"products": StockTable()})
    """
    sync = _sync_engine(engine)
    if sync in instrumented:
        return
    mode: SpanMode = ("all" if spans else "off") if isinstance(spans, bool) else spans
    if mode not in get_args(SpanMode):
        raise ValueError(f"spans must be 'off', 'locking' or 'all', got {spans!r}")
    if not read_window > 0:
        raise ValueError("read_window must be positive")
    configured = stock_tables if stock_tables is not None else {"products": StockTable()}
    instrumentation = Instrumentation(
        sentry if sentry is not None else get_sentry(),
        sync,
        configured,
        mode,
        tracer_provider,
        read_window,
        fencing,
        negative_writes,
        read_back_stock,
    )
    # Dialect events only (they are filed under the engine's own dialect): an engine event
    # would switch on SQLAlchemy's per-execute event path, which costs more than all of
    # this integration's own work.
    for name, listener in instrumentation.listeners:
        sqlalchemy.event.listen(sync, name, listener)
    instrumented[sync] = instrumentation
    try:
        # Known tables' series start at zero, so their first deadlock is an increase.
        instrumentation.metrics.prime_tables(configured)
    except Exception as exc:
        instrumentation.sentry.internal_error("sqlalchemy", exc)
    if mode == "all":
        try:
            attach_engine_tracer(sync, tracer_provider, instrumentation.sentry)
        except Exception:
            uninstrument_sqlalchemy(sync)
            raise


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
    detach_engine_tracer(sync)
    instrumentation.listeners.clear()


def is_instrumented(engine: Engine | AsyncEngine) -> bool:
    """Whether :func:`instrument_sqlalchemy` is in effect on ``engine``.

    Example::

        instrument_sqlalchemy(engine)
        assert is_instrumented(engine)
    """
    return _sync_engine(engine) in instrumented
