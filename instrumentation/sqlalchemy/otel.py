"""OpenTelemetry glue: opentelemetry-instrumentation-sqlalchemy's spans for some engines.

``SQLAlchemyInstrumentor().instrument(engine=…)`` is not called: it would also patch
``create_engine`` and ``Engine.connect`` for the whole process (a ``connect`` span and spans
for every engine made later). Its per-engine part, the public ``EngineTracer``, is attached
to each engine of ours instead. The library removes those listeners only all at once
(``EngineTracer.remove_all_event_listeners()``), so detaching one engine removes them all
and attaches them again to the engines still traced.

An application that instruments SQLAlchemy itself owns the library's listeners: while
``SQLAlchemyInstrumentor().is_instrumented_by_opentelemetry``, nothing is attached (its
spans are the ones made) and nothing is removed (that would remove its listeners too).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from opentelemetry import trace as otel_trace
from opentelemetry.trace import TracerProvider

from .model import COMPONENT

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..sentry import Sentry

# The engines that carry an EngineTracer of ours, with their tracer provider.
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
