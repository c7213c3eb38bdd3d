"""OpenTelemetry helpers: span context carriers, links and exemplars.

Only the OpenTelemetry *API* is used here (without an SDK, spans are non-recording and
cost next to nothing); :func:`configure_tracing` (the ``otel`` extra) installs an SDK
provider for applications that have none. A checkout span is linked to its payment
callback through the W3C ``traceparent`` carrier of :func:`carrier_for`, stored with the
order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()

#: The instrumentation scope name of stocksentry's spans.
TRACER_NAME = "stocksentry"


def carrier_for(span: Span) -> dict[str, str]:
    """A W3C trace-context carrier (``traceparent``/``tracestate``) naming ``span``.

    Empty when the span context is invalid (no SDK configured).
    """
    carrier: dict[str, str] = {}
    if span.get_span_context().is_valid:
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def link_from_carrier(carrier: Mapping[str, str] | None) -> Link | None:
    """A span link to the span a :func:`carrier_for` carrier names, if it names one."""
    if not carrier:
        return None
    ctx = _PROPAGATOR.extract(dict(carrier))
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid:
        return None
    return Link(span_context, {"stocksentry.link": "checkout"})


def trace_fields(span_context: SpanContext) -> tuple[str, str, str]:
    """``span_context``'s trace id and span id in lowercase hex (32 and 16 characters) and
    its flags as two hex digits, as in W3C ``traceparent``.

    Example::

        >>> from opentelemetry.trace import SpanContext
        >>> trace_fields(SpanContext(0xAB, 0xCD, is_remote=False, trace_flags=1))[1:]
        ('00000000000000cd', '01')
    """
    return (
        hex_id(span_context.trace_id, 16),
        hex_id(span_context.span_id, 8),
        f"{span_context.trace_flags & 0xFF:02x}",
    )


def hex_id(value: int, size: int) -> str:
    """``value`` as ``2 * size`` lowercase hex digits, zero-padded (a trace id is 16 bytes,
    a span id 8).

    ``to_bytes().hex()`` takes a third of the time of ``format(value, "032x")`` for a
    128-bit id, and an exemplar or a log line formats two per reservation; an id out of
    range (a custom id generator's) is formatted as it is.

    Example::

        >>> hex_id(0xCD, 8), hex_id(-1, 1)
        ('00000000000000cd', '-1')
    """
    try:
        return value.to_bytes(size, "big").hex()
    except OverflowError:
        return f"{value:0{2 * size}x}"


def exemplar_for(span: Span) -> dict[str, str] | None:
    """Exemplar labels (``trace_id``, ``span_id``) for a recording span, else ``None``."""
    if not span.is_recording():
        return None
    context = span.get_span_context()
    return {"trace_id": hex_id(context.trace_id, 16), "span_id": hex_id(context.span_id, 8)}


def configure_tracing(
    service_name: str = "checkout",
    *,
    exporter: str = "otlp",
    endpoint: str | None = None,
    set_global: bool = True,
) -> Any:
    """Install an OpenTelemetry SDK tracer provider and return it (needs the ``otel`` extra).

    ``exporter`` is ``"otlp"`` (OTLP over HTTP to ``endpoint`` or the
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` default), ``"console"`` or ``"none"`` (spans are
    recorded, for exemplars and log correlation, but sent nowhere). Set-up code: it
    raises on a bad argument or a missing extra.
    """
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise RuntimeError(
            "configure_tracing needs the OpenTelemetry SDK: pip install 'stocksentry[otel]'"
        ) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        otlp = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(otlp))
    elif exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter != "none":
        raise ValueError(f"exporter must be 'otlp', 'console' or 'none', got {exporter!r}")
    if set_global:
        trace.set_tracer_provider(provider)
    return provider
