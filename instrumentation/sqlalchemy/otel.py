"""OpenTelemetry glue: opentelemetry-instrumentation-sqlalchemy's spans for one engine.

That library documents one entry point, ``SQLAlchemyInstrumentor().instrument()``: a
process-wide singleton that also patches ``create_engine`` and ``Engine.connect`` and
ignores a second engine, and whose ``uninstrument()`` removes every engine's listeners.
Its per-engine part, ``EngineTracer``, is used here instead; the listeners it registers
are kept only in its private class list ``_remove_event_listener_params``, the one way to
find (and remove) one engine's: no public alternative exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy
from opentelemetry import trace as otel_trace
from opentelemetry.trace import TracerProvider

from .model import COMPONENT

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from .listeners import Instrumentation


def attach_engine_tracer(
    engine: Engine, instrumentation: Instrumentation, tracer_provider: TracerProvider | None
) -> None:
    """Attach opentelemetry-instrumentation-sqlalchemy's per-engine tracer to ``engine``
    (with the version check the instrumentor would do)."""
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.instrumentation.sqlalchemy.version import __version__
    from opentelemetry.metrics import get_meter
    from opentelemetry.semconv.metrics import MetricInstruments

    conflict = get_dependency_conflicts(SQLAlchemyInstrumentor().instrumentation_dependencies())
    if conflict is not None:
        # As the instrumentor itself would: no spans rather than wrong ones.
        instrumentation.sentry.internal_error(COMPONENT, RuntimeError(str(conflict)))
        return
    scope = "opentelemetry.instrumentation.sqlalchemy"
    tracer = otel_trace.get_tracer(scope, __version__, tracer_provider)
    usage = get_meter(scope, __version__).create_up_down_counter(
        name=MetricInstruments.DB_CLIENT_CONNECTIONS_USAGE,
        unit="connections",
        description="The number of connections that are currently in state described by "
        "the state attribute.",
    )
    registered: list[Any] = EngineTracer._remove_event_listener_params
    before = len(registered)
    EngineTracer(tracer, engine, usage)  # type: ignore[no-untyped-call]  # untyped library
    instrumentation.otel_entries = registered[before:]


def detach_engine_tracer(entries: list[Any]) -> None:
    """Remove the listeners :func:`attach_engine_tracer` recorded for one engine."""
    if not entries:
        return
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

    for entry in entries:
        target_ref, name, listener = entry
        target = target_ref()
        if target is not None and sqlalchemy.event.contains(target, name, listener):
            sqlalchemy.event.remove(target, name, listener)
        EngineTracer._dispose_of_event_listener(entry)  # type: ignore[no-untyped-call]  # untyped library
