"""OpenTelemetry glue: opentelemetry-instrumentation-sqlalchemy's spans for one engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import trace as otel_trace
from opentelemetry.trace import TracerProvider

from .model import COMPONENT

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from .listeners import Instrumentation


def attach_engine_tracer(
    engine: Engine, instrumentation: Instrumentation, tracer_provider: TracerProvider | None
) -> None:
    """Attach opentelemetry-instrumentation-sqlalchemy's per-engine tracer to ``engine``.

    ``SQLAlchemyInstrumentor().instrument(engine=...)`` would also patch ``create_engine``
    and ``Engine.connect`` process-wide, and as a singleton it ignores a second engine; its
    ``EngineTracer`` is the per-engine part. The version check it would do is done here.
    """
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
