"""Hostile label values and misuse cannot grow the app's memory or half-record an event.

Memory is measured inside a child process under an address-space limit (RLIMIT_AS), so a
regression fails by a byte figure or a MemoryError, never by a wall-clock comparison.
"""

from __future__ import annotations

import json
import logging
import resource
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry, catalog
from stocksentry.instrumentation.guard import MAX_CACHED_KEY_LENGTH, LabelGuard
from stocksentry.instrumentation.logs import Redactor, sanitize_id
from stocksentry.instrumentation.metrics import StockMetrics
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy
from stocksentry.instrumentation.sqlalchemy.instrumentor import instrumented
from stocksentry.instrumentation.sqlalchemy.model import PLAN_CACHE_CHARS, PLAN_CACHE_MAX_TEXT

# What the child may grow by, after 2,000 distinct 256 kB SKUs went through reservations
# (500 MB of input, each SKU freed by the app after its reservation).
GROWTH_LIMIT = 20 * 1024 * 1024
ADDRESS_SPACE = 1536 * 1024 * 1024

_CHILD = textwrap.dedent(
    """
    import json, sys, tracemalloc
    from prometheus_client import CollectorRegistry
    from stocksentry.instrumentation import Sentry

    sentry = Sentry(registry=CollectorRegistry(), log=False, trace=False, max_skus=100)
    # Warm up: the first reservation imports and allocates what every later one shares.
    with sentry.reservation("WARM", strategy="atomic") as r:
        r.success(old_stock=1, new_stock=0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(2000):
        sku = f"{i:08d}" + "x" * (256 * 1024)
        with sentry.reservation(sku, strategy="atomic") as r:
            r.success(old_stock=1, new_stock=0)
        sentry.record_paid_order(sku)
        sentry.record_negative_inventory(sku, stock=-1)
        del sku
    grown = tracemalloc.get_traced_memory()[0] - base
    json.dump({"grown": grown}, sys.stdout)
    """
)


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def test_distinct_huge_skus_grow_memory_by_a_bounded_amount() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_address_space,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grown = json.loads(done.stdout)["grown"]
    assert grown < GROWTH_LIMIT, f"grew by {grown / 2**20:.1f} MiB"


def test_guard_does_not_keep_long_raw_values() -> None:
    guard = LabelGuard(max_values=10)
    long_value = "A" * (MAX_CACHED_KEY_LENGTH + 1)
    assert guard(long_value) == "A" * 64
    assert guard(long_value) == "A" * 64  # still right without the cache
    assert long_value not in guard._cache
    short = "B" * MAX_CACHED_KEY_LENGTH
    assert guard(short) == "B" * 64
    assert short in guard._cache


def test_metrics_children_caches_keep_no_long_keys() -> None:
    metrics = StockMetrics(CollectorRegistry(), max_skus=10)
    long_sku = "S" * 10_000
    for _ in range(3):
        metrics.count(catalog.RESERVATION_SUCCESS, long_sku, "atomic")
        metrics.count(catalog.ORDERS_PAID, long_sku)
        metrics.observe(catalog.LOCK_HOLD_RATIO, 0.5, "L" * 10_000)
    for cache in metrics._children.values():
        for key in cache:
            parts = key if isinstance(key, tuple) else (key,)
            assert all(len(part) <= MAX_CACHED_KEY_LENGTH for part in parts)
    registry = metrics.registry
    assert registry is not None
    value = registry.get_sample_value(
        "stock_reservation_success_total", {"sku": "S" * 64, "strategy": "atomic"}
    )
    assert value == 3


def test_redactor_does_not_cache_long_keys() -> None:
    redact = Redactor()
    key = "k" * 100_000
    assert redact(None, "info", {key: "v"}) == {key: "v"}
    assert key not in redact._sensitive


# --- all of a reservation's series or none -----------------------------------------------


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _reservation_series(registry: CollectorRegistry) -> float:
    """The sum of every sample a reservation can touch."""
    total = 0.0
    for metric in registry.collect():
        if metric.name.startswith("stock_reservation") or metric.name.startswith(
            "stock_inventory_negative"
        ):
            for sample in metric.samples:
                if sample.name.endswith(("_total", "_count")):
                    total += sample.value
    return total


def _errors(registry: CollectorRegistry, component: str = "api") -> float:
    return _sample(registry, "stocksentry_instrumentation_errors_total", component=component)


@pytest.mark.parametrize(
    "marks",
    [
        {"new_stock": "0"},
        {"old_stock": "3", "new_stock": 2},
        {"new_stock": 1.5},
        {"new_stock": [0]},
    ],
    ids=["new-str", "old-str", "new-float", "new-list"],
)
def test_wrongly_typed_stock_records_nothing(
    sentry: Sentry, registry: CollectorRegistry, marks: dict[str, object]
) -> None:
    with sentry.reservation("EGG-01", strategy="atomic") as r:
        r.success(**marks)  # type: ignore[arg-type]
    assert _reservation_series(registry) == 0
    assert _errors(registry) == 1


@pytest.mark.parametrize(
    "args",
    [
        {"sku": ["EGG"]},
        {"sku": "EGG", "qty": "1"},
        {"sku": "EGG", "strategy": None},
        {"sku": {"a": 1}},
    ],
    ids=["sku-list", "qty-str", "strategy-none", "sku-dict"],
)
def test_wrongly_typed_arguments_record_nothing(
    sentry: Sentry, registry: CollectorRegistry, args: dict[str, object]
) -> None:
    with sentry.reservation(**args) as r:  # type: ignore[arg-type]
        r.success(new_stock=-1)
    assert _reservation_series(registry) == 0
    assert _errors(registry) == 1


def test_misuse_lets_the_app_exception_through_unchanged(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    error = RuntimeError("the app's own")

    def checkout() -> None:
        with sentry.reservation("EGG-01", qty="two") as r:  # type: ignore[arg-type]
            r.success(new_stock="x")  # type: ignore[arg-type]
            raise error

    with pytest.raises(RuntimeError) as raised:
        checkout()
    assert raised.value is error
    assert _reservation_series(registry) == 0
    assert _errors(registry) == 1


def test_int_like_values_are_accepted(sentry: Sentry, registry: CollectorRegistry) -> None:
    class Index:
        def __index__(self) -> int:
            return -1

        def __lt__(self, other: int) -> bool:
            return True

    with sentry.reservation("EGG-01", qty=True) as r:
        r.success(old_stock=0, new_stock=Index())  # type: ignore[arg-type]
    assert _sample(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default")
    assert _sample(registry, "stock_inventory_negative_total", sku="EGG-01") == 1
    assert _sample(registry, "stock_reservation_duration_seconds_count", outcome="success") == 1
    assert _errors(registry) == 0


def test_payment_callback_misuse_records_nothing(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    with sentry.payment_callback(["EGG"], qty=1) as p:  # type: ignore[arg-type]
        p.refund_due_to_oversell()
    with sentry.payment_callback("EGG", qty="1"):  # type: ignore[arg-type]
        pass
    for metric in registry.collect():
        if metric.name in ("stock_orders_paid", "stock_refund_due_to_oversell"):
            assert all(s.value == 0 for s in metric.samples if s.name.endswith("_total"))
    assert _errors(registry) == 2


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.record_reservation("EGG", "success", new_stock="0"),
        lambda s: s.record_reservation("EGG", "success", duration="0.1"),
        lambda s: s.record_reservation("EGG", "success", strategy=1),
        lambda s: s.record_reservation("EGG", "no_such_outcome", duration=0.1),
        # A SKU of no usable type (ints, bytes and None are labels: test_api.py).
        lambda s: s.record_reservation(["EGG"], "out_of_stock", duration=0.1),
        lambda s: s.record_paid_order({"sku": "EGG"}),
        lambda s: s.record_refund_due_to_oversell(7.5),
        lambda s: s.record_negative_inventory("EGG", stock="-1"),
        lambda s: s.record_idempotency_replay(None),
        lambda s: s.record_idempotency_conflict(["op"]),
        lambda s: s.record_stale_cache_hit("redis", cached="1", actual=0),
    ],
)
def test_record_functions_validate_before_recording(
    sentry: Sentry, registry: CollectorRegistry, call: object
) -> None:
    call(sentry)  # type: ignore[operator]
    for metric in registry.collect():
        if metric.name == "stocksentry_instrumentation_errors":
            continue
        for sample in metric.samples:
            if sample.name.endswith(("_total", "_count")):
                assert sample.value == 0, sample
    assert _errors(registry) == 1


def test_record_reservation_records_all_series(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    sentry.record_reservation("EGG", "success", duration=0.1, new_stock=-1)
    assert _sample(registry, "stock_reservation_success_total", sku="EGG", strategy="default")
    assert _sample(registry, "stock_inventory_negative_total", sku="EGG") == 1
    assert _sample(registry, "stock_reservation_duration_seconds_count", outcome="success") == 1
    assert _errors(registry) == 0


def test_misuse_is_logged_at_most_once_a_minute(
    sentry: Sentry, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    hostile = "x" * 100_000
    with caplog.at_level(logging.WARNING, logger="stocksentry"):
        for _ in range(50):
            with sentry.reservation("EGG", qty=hostile) as r:  # type: ignore[arg-type]
                r.success()
    lines = [rec for rec in caplog.records if rec.name == "stocksentry"]
    assert len(lines) == 1
    assert hostile not in lines[0].getMessage()
    assert len(lines[0].getMessage()) < 300
    assert _errors(registry) == 50


def test_sqlalchemy_statement_cache_is_bounded_in_characters(registry: CollectorRegistry) -> None:
    engine = sa.create_engine("sqlite://")
    instrument_sqlalchemy(engine, sentry=Sentry(registry=registry, log=False, trace=False))
    try:
        state = instrumented[engine]
        with engine.connect() as conn:
            for i in range(40):
                # Distinct texts, as an app that renders literals into its SQL sends.
                padding = "x" * (PLAN_CACHE_MAX_TEXT + i)
                conn.exec_driver_sql(f"SELECT 1 /* {padding} */")
            for i in range(300):
                conn.exec_driver_sql(f"SELECT {i} /* {'y' * 10_000} */")
        assert all(len(text) <= PLAN_CACHE_MAX_TEXT for text in state.plans)
        assert state.plan_chars == sum(len(text) for text in state.plans)
        assert state.plan_chars <= PLAN_CACHE_CHARS
    finally:
        uninstrument_sqlalchemy(engine)


def test_sanitize_id_refuses_a_huge_id_without_scanning_it() -> None:
    assert sanitize_id("r" * 128) == "r" * 128
    assert sanitize_id("r" * 129) is None
    assert sanitize_id("r" * 10_000_000) is None
