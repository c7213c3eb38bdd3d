"""Spans per reservation and payment callback, linked; exemplars carry the trace id."""

from __future__ import annotations

import asyncio
import re

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from stocksentry.instrumentation import Sentry


@pytest.fixture
def sentry(registry: CollectorRegistry, provider: TracerProvider) -> Sentry:
    return Sentry(registry=registry, log=False, tracer_provider=provider)


def test_reservation_span_attributes(sentry: Sentry, spans: InMemorySpanExporter) -> None:
    with sentry.reservation("EGG-01", strategy="atomic", qty=2) as r:
        r.conflict("out_of_stock")
    (span,) = spans.get_finished_spans()
    assert span.name == "stock.reserve"
    assert dict(span.attributes or {}) == {
        "stock.sku": "EGG-01",
        "stock.strategy": "atomic",
        "stock.qty": 2,
        "stock.outcome": "out_of_stock",
    }


def test_error_span_records_the_exception(sentry: Sentry, spans: InMemorySpanExporter) -> None:
    with pytest.raises(ZeroDivisionError), sentry.reservation("EGG-01"):
        _ = 1 / 0
    (span,) = spans.get_finished_spans()
    assert span.status.status_code == trace.StatusCode.ERROR
    assert span.events[0].name == "exception"


def test_checkout_links_to_payment_callback(sentry: Sentry, spans: InMemorySpanExporter) -> None:
    with sentry.reservation("EGG-01", strategy="atomic", order_id="o-1") as r:
        r.success(old_stock=1, new_stock=0)
        stored_with_order = r.trace_context()
    traceparent = stored_with_order["traceparent"]
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", traceparent)

    # Later, in another request with no trace context of its own:
    with sentry.payment_callback(
        "EGG-01", order_id="o-1", payment_reference="pay-9", checkout_context=stored_with_order
    ):
        pass

    reserve, callback = spans.get_finished_spans()
    assert callback.name == "stock.payment_callback"
    assert len(callback.links) == 1
    link = callback.links[0]
    assert link.context.trace_id == reserve.context.trace_id
    assert link.context.span_id == reserve.context.span_id
    assert (callback.attributes or {})["stock.payment_reference"] == "pay-9"
    assert (callback.attributes or {})["stock.payment_result"] == "paid"


def test_callback_without_checkout_context_has_no_link(
    sentry: Sentry, spans: InMemorySpanExporter
) -> None:
    with sentry.payment_callback("EGG-01", checkout_context={"traceparent": "garbage"}):
        pass
    (callback,) = spans.get_finished_spans()
    assert callback.links == ()


def test_exemplar_in_openmetrics(sentry: Sentry, registry: CollectorRegistry) -> None:
    with sentry.reservation("EGG-01") as r:
        r.success()
        trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
    text = openmetrics_latest(registry).decode()
    bucket_lines = [
        line
        for line in text.splitlines()
        if line.startswith("stock_reservation_duration_seconds_bucket") and " # " in line
    ]
    assert len(bucket_lines) == 1
    assert f'trace_id="{trace_id}"' in bucket_lines[0]
    assert 'outcome="success"' in bucket_lines[0]


def test_no_exemplar_without_recording_span(registry: CollectorRegistry) -> None:
    sentry = Sentry(registry=registry, log=False, trace=False)
    with sentry.reservation("EGG-01"):
        pass
    assert " # {" not in openmetrics_latest(registry).decode()


async def test_context_survives_tasks_and_gather(
    sentry: Sentry, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("app")

    async def child(name: str) -> None:
        await asyncio.sleep(0)
        with tracer.start_as_current_span(name):
            await asyncio.sleep(0)

    async with sentry.reservation("EGG-01"):
        await asyncio.create_task(child("in-task"))
        await asyncio.gather(child("in-gather-1"), child("in-gather-2"))

    finished = {s.name: s for s in spans.get_finished_spans()}
    reserve = finished["stock.reserve"]
    for name in ("in-task", "in-gather-1", "in-gather-2"):
        parent = finished[name].parent
        assert parent is not None
        assert parent.span_id == reserve.context.span_id
        assert finished[name].context.trace_id == reserve.context.trace_id
    # The reservation's context is gone once the block ends.
    assert not trace.get_current_span().get_span_context().is_valid
