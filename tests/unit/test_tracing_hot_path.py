"""The reservation's span: its ids in both log lines and the exemplar, the ids following
the current span from line to line, the parent context restored after."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry, catalog
from stocksentry.instrumentation.logs import add_trace_context, configure_logging
from stocksentry.instrumentation.tracing import exemplar_for, hex_id, trace_fields


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_both_lines_and_the_exemplar_carry_the_reservation_span(
    stream: io.StringIO, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, tracer_provider=provider)
    for sku in ("EGG-01", "EGG-02"):
        with sentry.reservation(sku, strategy="atomic") as r:
            r.stock_check(5)
            r.success(old_stock=5, new_stock=4)
    first, second = spans.get_finished_spans()
    check1, update1, check2, update2 = lines(stream)
    for line, span in ((check1, first), (update1, first), (check2, second), (update2, second)):
        assert span.context is not None
        assert line["trace_id"] == format(span.context.trace_id, "032x")
        assert line["span_id"] == format(span.context.span_id, "016x")
        assert line["trace_flags"] == format(span.context.trace_flags, "02x")
    assert (check1["event"], update1["event"], update2["sku"]) == (
        "stock_check",
        "stock_update",
        "EGG-02",
    )
    exemplars = [
        sample.exemplar
        for metric in sentry.metrics.metric(catalog.RESERVATION_DURATION).collect()
        for sample in metric.samples
        if sample.exemplar is not None
    ]
    # Each exemplar names one of the two spans; the latest one, the second reservation's.
    ids = {
        (format(span.context.trace_id, "032x"), format(span.context.span_id, "016x"))
        for span in (first, second)
        if span.context is not None
    }
    assert exemplars
    assert {(e.labels["trace_id"], e.labels["span_id"]) for e in exemplars} <= ids
    latest = max(exemplars, key=lambda e: e.timestamp)
    assert second.context is not None
    assert latest.labels == {
        "trace_id": format(second.context.trace_id, "032x"),
        "span_id": format(second.context.span_id, "016x"),
    }


def test_line_ids_follow_the_current_span_from_line_to_line(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("test")
    outer = tracer.start_span("outer")
    inner = tracer.start_span("inner", context=trace.set_span_in_context(outer))
    outer_ctx, inner_ctx = outer.get_span_context(), inner.get_span_context()

    def ids() -> tuple[object, object]:
        event = add_trace_context(None, "info", {})
        return event.get("trace_id"), event.get("span_id")

    assert ids() == (None, None)
    token = otel_context.attach(trace.set_span_in_context(outer))
    assert ids() == (format(outer_ctx.trace_id, "032x"), format(outer_ctx.span_id, "016x"))
    inner_token = otel_context.attach(trace.set_span_in_context(inner))
    assert ids() == (format(inner_ctx.trace_id, "032x"), format(inner_ctx.span_id, "016x"))
    otel_context.detach(inner_token)
    assert ids() == (format(outer_ctx.trace_id, "032x"), format(outer_ctx.span_id, "016x"))
    # A remote parent that is not recording still names its trace.
    remote = SpanContext(0xAB, 0xCD, is_remote=True, trace_flags=TraceFlags(0))
    remote_token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    assert add_trace_context(None, "info", {}) == {
        "trace_id": format(0xAB, "032x"),
        "span_id": format(0xCD, "016x"),
        "trace_flags": "00",
    }
    otel_context.detach(remote_token)
    otel_context.detach(token)
    assert ids() == (None, None)
    # The caller's own keys are kept, also when the ids are remembered from the last line.
    token = otel_context.attach(trace.set_span_in_context(outer))
    add_trace_context(None, "info", {})
    assert add_trace_context(None, "info", {"trace_id": "mine"})["trace_id"] == "mine"
    otel_context.detach(token)


def test_trace_fields_of_alternating_contexts() -> None:
    a = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1))
    b = SpanContext(0xFFFF, 0xEEEE, is_remote=False, trace_flags=TraceFlags(3))
    for _ in range(2):
        assert trace_fields(a) == (format(1, "032x"), format(2, "016x"), "01")
        assert trace_fields(b) == (format(0xFFFF, "032x"), format(0xEEEE, "016x"), "03")


def test_hex_id_is_the_zero_padded_format_and_any_id_formats() -> None:
    import random

    rng = random.Random(7)
    for size in (8, 16):
        top = 2 ** (8 * size) - 1
        for value in (0, 1, top, *(rng.randrange(top) for _ in range(200))):
            assert hex_id(value, size) == format(value, f"0{2 * size}x")
    # Out of range (a custom id generator's): what format gives, never an OverflowError
    # that would cost the reservation its metrics.
    for value, size in ((2**128, 16), (-5, 8)):
        assert hex_id(value, size) == format(value, f"0{2 * size}x")


def test_the_doctests_of_tracing_pass() -> None:
    import doctest

    from stocksentry.instrumentation import tracing

    result = doctest.testmod(tracing)
    assert result.attempted >= 2
    assert result.failed == 0


def test_exemplar_only_for_a_recording_span(provider: TracerProvider) -> None:
    span = provider.get_tracer("test").start_span("s")
    ctx = span.get_span_context()
    assert exemplar_for(span) == {
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
    }
    assert exemplar_for(NonRecordingSpan(ctx)) is None


def test_lines_follow_a_structlog_configuration_made_without_logger_caching(
    stream: io.StringIO,
) -> None:
    # Without caching, structlog assembles the logger from the configuration of the moment;
    # a reservation's lines (its logger resolved once for both) follow it all the same.
    first, second = io.StringIO(), io.StringIO()
    sentry = Sentry(registry=CollectorRegistry(), trace=False)
    for buffer in (first, second):
        structlog.configure(
            processors=[structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(buffer),
            cache_logger_on_first_use=False,
        )
        with sentry.reservation("EGG-01") as r:
            r.stock_check(3)
            r.success(old_stock=3, new_stock=2)
    for buffer in (first, second):
        events = [json.loads(line)["event"] for line in buffer.getvalue().splitlines()]
        assert events == ["stock_check", "stock_update"]
    assert stream.getvalue() == ""


def test_an_own_logger_receives_the_lines_as_given() -> None:
    seen: list[tuple[str, dict[str, object]]] = []

    class Recorder:
        def info(self, event: str, **fields: object) -> None:
            seen.append((event, fields))

    sentry = Sentry(registry=CollectorRegistry(), trace=False, logger=Recorder())
    with sentry.reservation("EGG-01", strategy="atomic") as r:
        r.stock_check(2)
        r.success(old_stock=2, new_stock=1)
    assert [event for event, _ in seen] == ["stock_check", "stock_update"]
    assert seen[1][1]["to"] == 1


def _redactor_last_chain(redact_keys: list[str]) -> list[Any]:
    """structlog's public processors and ours, chained by hand: the redactor after every
    other field, before the renderer."""
    from stocksentry.instrumentation.logs import (
        Redactor,
        add_logger_name,
        add_timestamp,
    )

    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        add_logger_name,
        add_trace_context,
        add_timestamp,
        structlog.processors.format_exc_info,
        Redactor(redact_keys),
        structlog.processors.JSONRenderer(default=repr),
    ]


@pytest.mark.parametrize("redact_keys", [[], ["email"], ["level", "email"], ["exception"]])
def test_lines_are_those_of_the_redactor_run_last(
    stream: io.StringIO, provider: TracerProvider, redact_keys: list[str]
) -> None:
    """Same lines, secrets masked alike, as with the redactor after every other field."""
    stream = io.StringIO()
    configure_logging(stream=stream, bridge_stdlib=False, redact_keys=redact_keys)
    new_chain = structlog.get_config()["processors"]
    old_chain = _redactor_last_chain(redact_keys)
    card = "4111-1111-1111-1111"

    def render(chain: list[Any], method: str, event: dict[str, Any]) -> dict[str, Any]:
        for processor in chain:
            event = processor(None, method, event)
        assert isinstance(event, str)
        line: dict[str, Any] = json.loads(event)
        line.pop("timestamp")  # may tick between the two renderings
        return line

    events: list[tuple[str, dict[str, Any]]] = [
        ("info", {"event": "stock_update", "sku": "EGG-01", "note": f"card {card}"}),
        ("info", {"event": "x", "email": "a@b.c", "token": "t", "logger": "mine"}),
        ("warning", {"event": "y", "auth": "Bearer abc.def", "nested": {"password": "p"}}),
    ]
    with provider.get_tracer("t").start_as_current_span("s"):
        for method, event in events:
            assert render(new_chain, method, dict(event)) == render(old_chain, method, dict(event))
        try:
            raise RuntimeError(f"declined {card}")
        except RuntimeError:
            event = {"event": "z", "exc_info": True}
            new = render(new_chain, "error", dict(event))
            assert new == render(old_chain, "error", dict(event))
    assert card not in json.dumps(new)
    assert (new["exception"] == "[REDACTED]") == ("exception" in redact_keys)
    assert new["trace_id"]
    assert (new["level"] == "[REDACTED]") == ("level" in redact_keys)


def test_a_reservation_under_a_warning_level_writes_no_info_line() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", stream=stream, bridge_stdlib=False)
    try:
        sentry = Sentry(registry=CollectorRegistry(), trace=False)
        with sentry.reservation("EGG-01") as r:
            r.stock_check(1)
            r.success(old_stock=1, new_stock=-1)  # a negative write: one warning line
        assert [line["event"] for line in lines(stream)] == ["inventory_negative"]
    finally:
        configure_logging(stream=io.StringIO(), bridge_stdlib=False)
        structlog.reset_defaults()


def test_the_reservation_span_is_current_inside_and_the_parent_restored_after(
    provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    sentry = Sentry(registry=CollectorRegistry(), log=False, trace=True, tracer_provider=provider)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("checkout") as outer:
        before = otel_context.get_current()
        with sentry.reservation("EGG-01", strategy="atomic", qty=1) as r:
            inner = trace.get_current_span()
            assert inner is not outer
            with tracer.start_as_current_span("child"):
                pass
            r.success()
        assert otel_context.get_current() is before
        assert trace.get_current_span() is outer
    by_name = {s.name: s for s in spans.get_finished_spans()}
    reserve = by_name["stock.reserve"]
    assert reserve.parent is not None
    assert reserve.parent.span_id == outer.get_span_context().span_id
    child = by_name["child"]
    assert child.parent is not None
    assert child.parent.span_id == reserve.context.span_id
    assert reserve.attributes is not None
    assert reserve.attributes["stock.outcome"] == "success"


def test_a_reservation_ended_in_another_context_is_counted_not_raised(
    provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    import contextvars

    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, log=False, trace=True, tracer_provider=provider)
    reservation = sentry.reservation("EGG-01", strategy="atomic", qty=1)
    contextvars.copy_context().run(reservation.__enter__)
    # Ended here, where its context token was never set: nothing raised to the app, the
    # span still ended and exported, the failure counted.
    assert reservation.__exit__(None, None, None) is False
    assert [s.name for s in spans.get_finished_spans()] == ["stock.reserve"]
    errors = registry.get_sample_value(
        "stocksentry_instrumentation_errors_total", {"component": "tracing"}
    )
    assert errors == 1
    assert trace.get_current_span() is trace.INVALID_SPAN
