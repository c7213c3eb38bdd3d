"""stocksentry's hot paths against the same work done by hand with the dependency's API.

For each hot path, one line on stdout::

    bench floor NAME overhead_us=X floor_us=Y ratio=Z

``overhead_us`` is what stocksentry costs for that part of one reservation, ``floor_us``
what the same work costs written by hand with the dependency's public API, ``ratio`` the
first over the second. Both are measured side by side in one process: ``--repeats``
rounds, each running every block of ``--n`` operations in an order that rotates from
round to round; the figures are medians over the rounds.

- ``metrics``: what a reservation records in its metrics
  (``StockMetrics.reservation_finished``: the outcome's counter and the duration) against
  one cached ``labels()`` child's ``inc()`` plus one ``observe()``.
- ``logs``: what the two lines of a reservation (``stock_check``, ``stock_update``) add to
  the block, through ``configure_logging`` to a null sink, against structlog's recommended
  production JSON chain (``merge_contextvars``, ``add_log_level``, ``StackInfoRenderer``,
  ``format_exc_info``, ``TimeStamper``, ``JSONRenderer``) writing two lines with the same
  keys to the same sink, the SKU bound in contextvars for the block as a reservation does.
  Ours adds, on top: the redaction of secrets and card numbers, the trace ids.
- ``span``: what tracing adds to the block (SDK ``TracerProvider`` without a span
  processor), against ``tracer.start_span(...)`` with the same attributes, the outcome
  attribute and ``end()``.
- ``span_current``: the same overhead against the API's way to trace a block,
  ``tracer.start_as_current_span(...)`` with the same attributes: a reservation's span is
  current inside its block (the app's database spans are its children, its log lines carry
  its ids), which the bare start/end of ``span`` does not pay for. Ours also formats the
  exemplar its duration observation carries.

Run::

    python benchmarks/bench_floor.py [--repeats 15] [--n 2000]
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter, Histogram
from stocksentry.instrumentation import Sentry, catalog
from stocksentry.instrumentation.logs import configure_logging

SKU = "BENCH-SKU-1"
STRATEGY = "atomic"
SECONDS = 0.0042

Op = Callable[[], None]


def reservation_op(sentry: Sentry) -> Op:
    def op() -> None:
        with sentry.reservation(SKU, strategy=STRATEGY) as r:
            r.stock_check(5)
            r.success(old_stock=5, new_stock=4)

    return op


def metrics_floor() -> Op:
    registry = CollectorRegistry()
    success = Counter("floor_success", "s", ["sku", "strategy"], registry=registry)
    duration = Histogram(
        "floor_seconds", "d", ["outcome"], buckets=catalog.LATENCY_BUCKETS, registry=registry
    )
    success_child = success.labels(SKU, STRATEGY)
    duration_child = duration.labels("success")

    def op() -> None:
        success_child.inc()
        duration_child.observe(SECONDS)

    return op


def metrics_op(sentry: Sentry) -> Op:
    metrics = sentry.metrics

    def op() -> None:
        metrics.reservation_finished(SKU, STRATEGY, "success", SECONDS)

    return op


def logs_floor(sink: Any) -> Op:
    # structlog's recommended production chain for JSON lines, writing lines with the
    # same keys as a reservation's: the SKU bound in contextvars for the block (as a
    # reservation binds it for the app's own lines), the logger's name bound once.
    log = structlog.wrap_logger(
        structlog.WriteLogger(sink),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    ).bind(logger="stocksentry")

    def op() -> None:
        with structlog.contextvars.bound_contextvars(sku=SKU):
            log.info("stock_check", strategy=STRATEGY, available=5)
            log.info(
                "stock_update",
                **{"strategy": STRATEGY, "qty": 1, "success": True, "from": 5, "to": 4},
            )

    return op


def span_floor(provider: TracerProvider) -> Op:
    tracer = provider.get_tracer("floor")

    def op() -> None:
        span = tracer.start_span(
            "stock.reserve",
            attributes={"stock.sku": SKU, "stock.strategy": STRATEGY, "stock.qty": 1},
        )
        span.set_attribute("stock.outcome", "success")
        span.end()

    return op


def span_current_floor(provider: TracerProvider) -> Op:
    tracer = provider.get_tracer("floor")

    def op() -> None:
        with tracer.start_as_current_span(
            "stock.reserve",
            attributes={"stock.sku": SKU, "stock.strategy": STRATEGY, "stock.qty": 1},
        ) as span:
            span.set_attribute("stock.outcome", "success")

    return op


def time_block(op: Op, n: int) -> float:
    """Seconds per operation over a block of ``n``."""
    gc.collect()
    start = time.perf_counter()
    for _ in range(n):
        op()
    return (time.perf_counter() - start) / n


def run_rounds(ops: dict[str, Op], repeats: int, n: int) -> dict[str, list[float]]:
    names = list(ops)
    for name in names:  # warm-up: caches filled, series created
        time_block(ops[name], max(1, n // 10))
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for index in range(repeats):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            per_round[name].append(time_block(ops[name], n))
    return per_round


def median_us(values: Sequence[float]) -> float:
    return statistics.median(values) * 1e6


def paired_us(case: Sequence[float], base: Sequence[float]) -> float:
    """Median over the rounds of the case's block less the base block of the same round."""
    return median_us([c - b for c, b in zip(case, base, strict=True)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args(argv)

    sink = open(os.devnull, "w")  # noqa: SIM115 - closed at the end of main
    configure_logging("INFO", stream=sink, bridge_stdlib=False)
    provider = TracerProvider()  # no span processor: spans are recorded, sent nowhere
    plain = Sentry(registry=CollectorRegistry(), log=False, trace=False)
    logged = Sentry(registry=CollectorRegistry(), log=True, trace=False)
    traced = Sentry(registry=CollectorRegistry(), log=False, tracer_provider=provider)
    ops: dict[str, Op] = {
        "metrics": metrics_op(plain),
        "plain": reservation_op(plain),
        "logged": reservation_op(logged),
        "traced": reservation_op(traced),
        "metrics_floor": metrics_floor(),
        "logs_floor": logs_floor(sink),
        "span_floor": span_floor(provider),
        "span_current_floor": span_current_floor(provider),
    }
    try:
        rounds = run_rounds(ops, args.repeats, args.n)
    finally:
        structlog.reset_defaults()
        sink.close()
    errors = [
        sentry.metrics.registry.get_sample_value(
            "stocksentry_instrumentation_errors_total", {"component": component}
        )
        for sentry in (plain, logged, traced)
        if sentry.metrics.registry is not None
        for component in ("api", "metrics", "logging", "tracing")
    ]
    if any(errors):
        print(f"bench floor: instrumentation errors during the run: {errors}")
        return 1
    figures = {
        "metrics": (median_us(rounds["metrics"]), median_us(rounds["metrics_floor"])),
        "logs": (paired_us(rounds["logged"], rounds["plain"]), median_us(rounds["logs_floor"])),
        "span": (paired_us(rounds["traced"], rounds["plain"]), median_us(rounds["span_floor"])),
        "span_current": (
            paired_us(rounds["traced"], rounds["plain"]),
            median_us(rounds["span_current_floor"]),
        ),
    }
    for name, (overhead, floor) in figures.items():
        ratio = overhead / floor if floor > 0 else float("inf")
        print(
            f"bench floor {name} overhead_us={overhead:.3f} floor_us={floor:.3f} ratio={ratio:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
