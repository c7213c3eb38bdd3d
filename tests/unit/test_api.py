"""The recording API counts exactly, and never changes what the application sees."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import prometheus_client
import psycopg.errors
import pytest
import structlog
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import (
    ReservationConflict,
    Sentry,
    catalog,
    classify_exception,
    configure,
    current_reservation,
    get_sentry,
    reservation,
    reserves,
)


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_success_conflict_and_negative(sentry: Sentry, registry: CollectorRegistry) -> None:
    with sentry.reservation("EGG-01", strategy="atomic") as r:
        r.stock_check(available=1)
        r.success(old_stock=1, new_stock=0)
    with sentry.reservation("EGG-01", strategy="unsafe") as r:
        r.success(old_stock=0, new_stock=-1)
    with sentry.reservation("EGG-01", strategy="atomic") as r:
        r.conflict("out_of_stock")
    with sentry.reservation("EGG-01", strategy="atomic"):
        pass  # no mark, no exception: a success

    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="atomic") == 2
    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="unsafe") == 1
    assert (
        value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="out_of_stock")
        == 1
    )
    assert value(registry, "stock_inventory_negative_total", sku="EGG-01") == 1
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="success") == 3
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="out_of_stock") == 1


def test_app_exception_passes_unchanged(sentry: Sentry, registry: CollectorRegistry) -> None:
    boom = KeyError("app bug")
    with pytest.raises(KeyError) as caught, sentry.reservation("EGG-01"):
        raise boom
    assert caught.value is boom
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 1
    assert (
        value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default") == 0
    )


def test_conflict_exception_is_counted_and_reraised(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    exc = ReservationConflict("lost_race")
    with pytest.raises(ReservationConflict) as caught, sentry.reservation("EGG-01"):
        raise exc
    assert caught.value is exc
    assert (
        value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="lost_race") == 1
    )


def test_mark_wins_over_exception(sentry: Sentry, registry: CollectorRegistry) -> None:
    def handler() -> None:
        with sentry.reservation("EGG-01") as r:
            r.conflict("out_of_stock")
            raise RuntimeError("409 to the client")

    with pytest.raises(RuntimeError):
        handler()
    assert (
        value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="out_of_stock")
        == 1
    )


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (psycopg.errors.DeadlockDetected("deadlock detected"), "deadlock"),
        (psycopg.errors.SerializationFailure("could not serialize"), "serialization_failure"),
        (psycopg.errors.LockNotAvailable("could not obtain lock"), "lock_timeout"),
        (psycopg.errors.UniqueViolation("dup"), "error"),
        (ValueError("x"), "error"),
    ],
)
def test_classify_driver_errors(exc: BaseException, outcome: str) -> None:
    assert classify_exception(exc) == outcome


def test_classify_sqlalchemy_wrapped_error() -> None:
    from sqlalchemy.exc import OperationalError

    wrapped = OperationalError("UPDATE ...", {}, psycopg.errors.DeadlockDetected("deadlock"))
    assert classify_exception(wrapped) == "deadlock"


def test_classify_lock_refusals() -> None:
    import pottery.exceptions
    import redis.exceptions
    from stocksentry.instrumentation.locks import LockNotAcquired

    assert classify_exception(LockNotAcquired("lock:sku", 0.0)) == "lock_not_acquired"
    waited = LockNotAcquired("lock:sku", 2.0, reason="lock_timeout")
    assert classify_exception(waited) == "lock_timeout"
    refused = redis.exceptions.LockError("Unable to acquire lock within the time specified")
    assert classify_exception(refused) == "lock_not_acquired"
    quorum = pottery.exceptions.QuorumNotAchieved("redlock:sku", frozenset())
    assert classify_exception(quorum) == "lock_not_acquired"
    # Raised by the release of a lock that expired: the work under it was done.
    assert classify_exception(redis.exceptions.LockNotOwnedError("expired")) == "error"


@pytest.mark.parametrize(
    ("blocking_timeout", "reason"), [(0.0, "lock_not_acquired"), (0.05, "lock_timeout")]
)
def test_a_refused_tracked_lock_ends_the_reservation_as_a_lock_conflict(
    sentry: Sentry, registry: CollectorRegistry, blocking_timeout: float, reason: str
) -> None:
    from stocksentry.instrumentation.locks import LockNotAcquired, track_lock

    lock = track_lock(
        "lock:EGG-01",
        ttl=5,
        acquire=lambda token: False,  # always held by someone else
        release=lambda token: True,
        blocking_timeout=blocking_timeout,
        retry_delay=0.01,
        sentry=sentry,
    )
    with pytest.raises(LockNotAcquired) as caught, sentry.reservation("EGG-01"), lock:
        pytest.fail("the body of a refused lock never runs")
    assert caught.value.reason == reason
    assert value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason=reason) == 1
    assert value(registry, "stocksentry_instrumentation_errors_total", component="api") == 0


def test_unknown_conflict_reason_is_an_instrumentation_error(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    with sentry.reservation("EGG-01") as r:
        r.conflict("bogus")  # type: ignore[arg-type]
    assert value(registry, "stocksentry_instrumentation_errors_total", component="api") == 1
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 1


async def test_async_context_manager(sentry: Sentry, registry: CollectorRegistry) -> None:
    async def buyer(i: int) -> None:
        async with sentry.reservation("EGG-01", strategy="atomic") as r:
            await asyncio.sleep(0)
            assert current_reservation() is r
            if i % 2:
                r.conflict("out_of_stock")

    await asyncio.gather(*(buyer(i) for i in range(10)))
    assert current_reservation() is None
    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="atomic") == 5
    assert (
        value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="out_of_stock")
        == 5
    )


def test_decorator_sync(sentry: Sentry, registry: CollectorRegistry) -> None:
    stock = {"A": 1}

    @sentry.reserves(strategy="atomic")
    def reserve(sku: str, qty: int = 1) -> bool:
        if stock[sku] >= qty:
            stock[sku] -= qty
            return True
        return False

    assert reserve("A") is True
    assert reserve(sku="A") is False
    assert reserve.__name__ == "reserve"
    assert value(registry, "stock_reservation_success_total", sku="A", strategy="atomic") == 1
    assert value(registry, "stock_reservation_conflict_total", sku="A", reason="out_of_stock") == 1


async def test_decorator_async_with_marks(sentry: Sentry, registry: CollectorRegistry) -> None:
    @sentry.reserves(strategy="for_update", sku_arg="product")
    async def reserve(product: str) -> str:
        handle = current_reservation()
        assert handle is not None
        handle.conflict("lock_timeout")
        return "busy"

    assert await reserve("B") == "busy"
    assert value(registry, "stock_reservation_conflict_total", sku="B", reason="lock_timeout") == 1


def test_decorator_needs_a_sku(sentry: Sentry) -> None:
    with pytest.raises(TypeError, match="no argument 'sku'"):

        @sentry.reserves()
        def reserve(product: str) -> bool:
            return True


def test_payment_callback_marks(sentry: Sentry, registry: CollectorRegistry) -> None:
    with sentry.payment_callback("EGG-01", order_id="o1", payment_reference="pay-1"):
        pass
    with sentry.payment_callback("EGG-01", order_id="o1") as cb:
        cb.replay()
    with sentry.payment_callback("EGG-01", order_id="o2") as cb:
        cb.refund_due_to_oversell()
    with sentry.payment_callback("EGG-01", order_id="o3") as cb:
        cb.failed()
    with pytest.raises(TimeoutError), sentry.payment_callback("EGG-01", order_id="o4"):
        raise TimeoutError
    assert value(registry, "stock_orders_paid_total", sku="EGG-01") == 2
    assert value(registry, "stock_refund_due_to_oversell_total", sku="EGG-01") == 1
    assert value(registry, "stock_idempotency_replay_total", operation="payment_callback") == 1


def test_record_functions(sentry: Sentry, registry: CollectorRegistry) -> None:
    sentry.record_paid_order("EGG-01", order_id="o1", payment_reference="p1")
    sentry.record_refund_due_to_oversell("EGG-01", order_id="o1")
    sentry.record_negative_inventory("EGG-01", stock=-2)
    sentry.record_idempotency_replay("checkout", key="k1")
    sentry.record_idempotency_replay("checkout", key="k1")
    sentry.record_idempotency_conflict("checkout", key="k1")
    sentry.record_stale_cache_hit("redis", sku="EGG-01", cached=3, actual=0)
    sentry.record_reservation("EGG-01", "deadlock", duration=0.2)
    assert value(registry, "stock_orders_paid_total", sku="EGG-01") == 1
    assert value(registry, "stock_refund_due_to_oversell_total", sku="EGG-01") == 1
    assert value(registry, "stock_inventory_negative_total", sku="EGG-01") == 1
    assert value(registry, "stock_idempotency_replay_total", operation="checkout") == 2
    assert value(registry, "stock_idempotency_conflict_total", operation="checkout") == 1
    assert value(registry, "stock_cache_stale_hit_total", cache="redis") == 1
    assert (
        value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="deadlock") == 1
    )
    assert value(registry, "stock_reservation_duration_seconds_sum", outcome="deadlock") == 0.2


def test_failing_metrics_never_reach_the_app(
    sentry: Sentry,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("metrics backend broke")

    # The backend itself breaks (the histogram every reservation observes), whichever
    # StockMetrics method the reservation records through.
    monkeypatch.setattr(prometheus_client.Histogram, "observe", broken)
    results = []
    with caplog.at_level(logging.WARNING, logger="stocksentry"):
        for _ in range(5):
            with sentry.reservation("EGG-01") as r:
                r.success(old_stock=5, new_stock=4)
                results.append("done")
    assert results == ["done"] * 5
    assert value(registry, "stocksentry_instrumentation_errors_total", component="metrics") == 5
    # Rate-limited: one line for five failures in the same interval.
    lines = [rec for rec in caplog.records if "instrumentation error in metrics" in rec.message]
    assert len(lines) == 1
    assert "RuntimeError: metrics backend broke" in lines[0].message


def test_failing_logging_never_reaches_the_app(registry: CollectorRegistry) -> None:
    def broken_processor(*_: object) -> dict[str, object]:
        raise OSError("disk full")

    structlog.configure(processors=[broken_processor])
    try:
        sentry = Sentry(registry=registry, log=True, trace=False)
        with sentry.reservation("EGG-01") as r:
            r.stock_check(available=1)
            r.success(old_stock=1, new_stock=0)
        sentry.record_paid_order("EGG-01")
    finally:
        structlog.reset_defaults()
    # stock_check, stock_update and order_paid lines failed; every count still landed.
    assert value(registry, "stocksentry_instrumentation_errors_total", component="logging") == 3
    assert (
        value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default") == 1
    )
    assert value(registry, "stock_orders_paid_total", sku="EGG-01") == 1


def test_configure_replaces_the_process_wide_instance() -> None:
    first_registry = CollectorRegistry()
    second_registry = CollectorRegistry()
    first = configure(registry=first_registry, log=False, trace=False)
    assert get_sentry() is first
    with reservation("EGG-01"):
        pass
    second = configure(registry=second_registry, log=False, trace=False)
    assert get_sentry() is second
    with reservation("EGG-01"):
        pass

    @reserves(strategy="deco")
    def reserve(sku: str) -> bool:
        return True

    reserve("EGG-01")
    assert (
        first_registry.get_sample_value(
            "stock_reservation_success_total", {"sku": "EGG-01", "strategy": "default"}
        )
        is None
    )  # unregistered on replacement
    assert (
        value(second_registry, "stock_reservation_success_total", sku="EGG-01", strategy="default")
        == 1
    )
    assert (
        value(second_registry, "stock_reservation_success_total", sku="EGG-01", strategy="deco")
        == 1
    )
    second.close()


def test_exception_after_a_success_mark_is_not_a_success(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    """A failed COMMIT after r.success(): the stock was not taken."""

    def checkout() -> None:
        with sentry.reservation("EGG-01") as r:
            r.success(old_stock=1, new_stock=0)
            raise psycopg.errors.SerializationFailure("could not serialize access")

    with pytest.raises(psycopg.errors.SerializationFailure):
        checkout()
    assert (
        value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default") == 0
    )
    assert (
        value(
            registry,
            "stock_reservation_conflict_total",
            sku="EGG-01",
            reason="serialization_failure",
        )
        == 1
    )


def test_unknown_reason_in_reservation_conflict_is_an_error(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    with pytest.raises(ReservationConflict), sentry.reservation("EGG-01"):
        raise ReservationConflict("sold_out")  # type: ignore[arg-type]
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 1


def test_first_use_never_raises_when_the_default_registry_is_taken() -> None:
    from prometheus_client import REGISTRY
    from stocksentry.instrumentation import api, record_paid_order

    own = Sentry(log=False, trace=False)  # the app's own, on the default registry
    saved = api._default
    api._default = None
    try:
        record_paid_order("EGG-01")  # lazily builds the process-wide instance: no raise
        fallback = api._default
        assert fallback is not None
        assert fallback.metrics.registry is None
        # The fallback records into no registry: the app's own series are untouched.
        assert REGISTRY.get_sample_value("stock_orders_paid_total", {"sku": "EGG-01"}) is None
    finally:
        api._default = saved
        own.close()


def test_a_failing_span_processor_leaves_no_context_behind(registry: CollectorRegistry) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    class Broken(SpanProcessor):
        def on_end(self, span: object) -> None:
            raise RuntimeError("exporter queue broke")

    provider = TracerProvider()
    provider.add_span_processor(Broken())
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    with sentry.reservation("EGG-01"), sentry.payment_callback("EGG-01"):
        pass
    assert not trace.get_current_span().get_span_context().is_valid
    assert current_reservation() is None
    assert (
        value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default") == 1
    )


# A checkout that configured stocksentry's metrics but no logging: the library must not print.
_UNCONFIGURED_CHECKOUT = """
from stocksentry.instrumentation import configure, payment_callback, reservation

configure()
with reservation("EGG-01", strategy="atomic") as r:
    r.stock_check(1)
    r.success(old_stock=1, new_stock=-1)
with reservation("EGG-01", strategy="atomic") as r:
    r.conflict("out_of_stock")
with payment_callback("EGG-01", order_id="o-1"):
    pass
"""


def test_nothing_is_written_to_stdout_unless_logging_is_configured() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _UNCONFIGURED_CHECKOUT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr == ""
    # The same checkout after configure_logging() writes its JSON lines, as documented.
    configured = "from stocksentry.instrumentation.logs import configure_logging\n"
    configured += "configure_logging()\n" + _UNCONFIGURED_CHECKOUT
    done = subprocess.run(
        [sys.executable, "-c", configured], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    events = [json.loads(line)["event"] for line in done.stdout.splitlines()]
    assert events == [
        "stock_check",
        "stock_update",
        "inventory_negative",
        "stock_update",
        "payment_callback",
    ]


def test_an_apps_own_structlog_configuration_receives_the_lines(
    registry: CollectorRegistry,
) -> None:
    sentry = Sentry(registry=registry, trace=False)
    structlog.reset_defaults()
    logging_on: list[bool] = [sentry.log_enabled]  # structlog's default would print to stdout
    try:
        with structlog.testing.capture_logs() as logs:
            logging_on.append(sentry.log_enabled)
            with sentry.reservation("EGG-01") as r:
                r.stock_check(available=3)
    finally:
        structlog.reset_defaults()
    assert logging_on == [False, True]
    assert [line["event"] for line in logs] == ["stock_check", "stock_update"]
    sentry.log_enabled = False
    with structlog.testing.capture_logs() as logs:
        sentry.record_paid_order("EGG-01")
    assert logs == []


def test_reservation_finished_resolves_both_series_before_touching_either() -> None:
    from stocksentry.instrumentation.metrics import StockMetrics

    registry = CollectorRegistry()
    metrics = StockMetrics(registry)
    with pytest.raises(ValueError, match="unknown outcome"):
        metrics.reservation_finished("EGG-01", "atomic", "bogus", 0.1)
    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="atomic") == 0
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 0
    metrics.reservation_finished("EGG-01", "atomic", "success", 0.1)
    metrics.reservation_finished("EGG-01", "atomic", "error", 0.2)
    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="atomic") == 1
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="success") == 1
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 1


def test_known_label_sets_start_at_zero(registry: CollectorRegistry) -> None:
    import sqlalchemy as sa
    from stocksentry.instrumentation.locks import track_lock
    from stocksentry.instrumentation.sqlalchemy import (
        instrument_sqlalchemy,
        uninstrument_sqlalchemy,
    )

    # A counter series born at its first increment hides a burst inside one scrape from
    # increase(): series whose labels are known in advance exist at zero before any event.
    sentry = Sentry(registry=registry, log=False, trace=False, promo_skus=["EGG-01", "EGG-02"])

    def exists(name: str, **labels: str) -> bool:
        return registry.get_sample_value(name, labels) == 0.0

    for reason in ("out_of_stock", "lock_not_acquired", "deadlock"):
        assert exists("stock_reservation_conflict_total", sku="EGG-01", reason=reason)
    assert exists("stock_inventory_negative_total", sku="EGG-02")
    # A strategy, once seen on any SKU, has its success series for every promo SKU.
    with sentry.reservation("OTHER-9", strategy="for_update"):
        pass
    assert exists("stock_reservation_success_total", sku="EGG-02", strategy="for_update")
    # The configured stock tables of an instrumented engine.
    engine = sa.create_engine("sqlite://")
    instrument_sqlalchemy(engine, sentry=sentry)
    try:
        assert exists("stock_db_deadlock_total", table="products")
        assert exists("stock_unsafe_read_modify_write_total", table="products")
        assert exists("stock_db_lock_wait_duration_seconds_count", table="products")
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    # A lock's expiry and foreign-release series, from its first acquire on.
    lock = track_lock(
        "lock:EGG-01", ttl=5, acquire=lambda token: True, release=lambda token: True, sentry=sentry
    )
    assert (
        registry.get_sample_value("stock_lock_expired_while_held_total", {"lock": "lock:EGG-01"})
        is None
    )
    with lock:
        pass
    assert exists("stock_lock_expired_while_held_total", lock="lock:EGG-01")
    assert exists("stock_lock_release_not_owned_total", lock="lock:EGG-01")
    assert exists(
        "stock_lock_acquire_duration_seconds_count", lock="lock:EGG-01", outcome="timeout"
    )
    # Priming never counts a label overflow.
    assert (
        registry.get_sample_value(
            "stocksentry_label_overflow_total", {"metric": "stock_lock_expired_while_held_total"}
        )
        is None
    )


def test_a_decision_from_a_stale_cache_is_named(registry: CollectorRegistry) -> None:
    from structlog.testing import capture_logs

    sentry = Sentry(registry=registry, trace=False)
    stale = "stock_cache_stale_hit_total"
    with capture_logs() as lines:
        # The cache said 5; the database, read for the write, said 2.
        with sentry.reservation("EGG-01", strategy="cached") as r:
            r.stock_check(5, source="cache", cache="redis_stock")
            r.success(old_stock=2, new_stock=1)
        # The cache said 1 was there; the database refused: out of stock.
        with sentry.reservation("EGG-01", strategy="cached") as r:
            r.stock_check(1, source="cache", cache="redis_stock")
            r.conflict("out_of_stock")
        # A cache that agreed with the database, and a decision from the database itself.
        with sentry.reservation("EGG-01", strategy="cached") as r:
            r.stock_check(3, source="cache", cache="redis_stock")
            r.success(old_stock=3, new_stock=2)
        with sentry.reservation("EGG-01", strategy="atomic") as r:
            r.stock_check(0)
            r.conflict("out_of_stock")
    assert value(registry, stale, cache="redis_stock") == 2
    hits = [line for line in lines if line["event"] == "cache_stale_hit"]
    assert [(h["cached"], h.get("actual")) for h in hits] == [(5, 2), (1, None)]
    assert all(h["sku"] == "EGG-01" for h in hits)
    checks = [line for line in lines if line["event"] == "stock_check"]
    assert checks[0]["source"] == "cache"
    assert "source" not in checks[-1]


def test_a_bad_stock_check_source_records_nothing(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    with sentry.reservation("EGG-01") as r:
        r.stock_check(1, source="guess")
    assert value(registry, "stocksentry_instrumentation_errors_total", component="api") == 1
    assert (
        value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="unknown") == 0
    )


# --- SKUs as shops pass them ---------------------------------------------------------------


def _sku_registry() -> tuple[CollectorRegistry, Sentry]:
    registry = CollectorRegistry()
    return registry, Sentry(registry=registry, log=False, trace=False)


@pytest.mark.parametrize(
    ("given", "label", "errors"),
    [
        (8891, "8891", 0.0),  # a product id, as the incident's checkout passes it
        (b"EGG-01", "EGG-01", 0.0),
        (bytearray(b"EGG-02"), "EGG-02", 0.0),
        (None, catalog.UNKNOWN_SKU, 1.0),
        (b"\xff\xfe", catalog.UNKNOWN_SKU, 1.0),
    ],
)
def test_a_reservation_records_an_int_or_bytes_sku_and_names_a_missing_one(
    given: object, label: str, errors: float
) -> None:
    registry, sentry = _sku_registry()
    with sentry.reservation(given, strategy="atomic") as r:  # type: ignore[arg-type]
        r.success(old_stock=1, new_stock=0)
    sentry.record_paid_order(given)  # type: ignore[arg-type]
    value = registry.get_sample_value
    assert value("stock_reservation_success_total", {"sku": label, "strategy": "atomic"}) == 1
    assert value("stock_orders_paid_total", {"sku": label}) == 1
    # One per call that had no usable SKU: the reservation and the paid order.
    api_errors = value("stocksentry_instrumentation_errors_total", {"component": "api"})
    assert api_errors == 2 * errors


def test_a_bool_is_still_not_a_sku() -> None:
    registry, sentry = _sku_registry()
    with sentry.reservation(True, strategy="atomic") as r:  # type: ignore[arg-type]
        r.success(old_stock=1, new_stock=0)
    assert (
        registry.get_sample_value("stocksentry_instrumentation_errors_total", {"component": "api"})
        == 1
    )
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": "True", "strategy": "atomic"}
        )
        is None
    )


def test_the_decorator_takes_an_int_product_id() -> None:
    registry, sentry = _sku_registry()

    @sentry.reserves(strategy="atomic", sku_arg="product_id")
    def reserve(product_id: int) -> bool:
        return True

    reserve(8891)
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": "8891", "strategy": "atomic"}
        )
        == 1
    )


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"promo_skus": "EGG-01"}, TypeError, "promo_skus must be a list of SKUs"),
        ({"promo_skus": [None]}, TypeError, "promo_skus: each SKU must be a str or an int"),
        ({"max_skus": "100"}, TypeError, "max_skus must be an int, got str"),
        ({"max_skus": -1}, ValueError, "max_skus must be >= 0, got -1"),
        ({"max_label_length": 64.0}, TypeError, "max_label_length must be an int, got float"),
        ({"error_log_interval": "60"}, TypeError, "error_log_interval must be seconds"),
    ],
)
def test_configure_refuses_bad_settings_at_the_call(
    settings: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        configure(registry=CollectorRegistry(), **settings)  # type: ignore[arg-type]


def test_promo_skus_may_be_product_ids() -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, promo_skus=[8891], max_skus=0, log=False, trace=False)
    with sentry.reservation(8891, strategy="atomic") as r:
        r.success(old_stock=1, new_stock=0)
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": "8891", "strategy": "atomic"}
        )
        == 1
    )


def test_a_refused_configure_keeps_the_instance_it_had() -> None:
    registry = CollectorRegistry()
    before = configure(registry=registry, log=False, trace=False)
    with pytest.raises(TypeError, match="max_skus"):
        configure(registry=registry, max_skus="100")  # type: ignore[arg-type]
    assert get_sentry() is before
    # Its metrics are registered again: the process-wide functions still record.
    with reservation("EGG-01", strategy="atomic") as r:
        r.success(old_stock=1, new_stock=0)
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": "EGG-01", "strategy": "atomic"}
        )
        == 1
    )


def test_a_span_processor_that_raises_leaves_the_reservation_current(
    registry: CollectorRegistry,
) -> None:
    """A failing tracer costs the span only: the reservation is still current in its
    block (the SQLAlchemy integration finds it there to imply a conflict), its log lines
    still carry the SKU, and its outcome is recorded."""
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    class Broken(SpanProcessor):
        def on_start(self, span: object, parent_context: object = None) -> None:
            raise RuntimeError("span processor down")

    provider = TracerProvider()
    provider.add_span_processor(Broken())
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    with sentry.reservation("EGG-01", strategy="atomic") as r:
        assert current_reservation() is r
        assert structlog.contextvars.get_contextvars().get("sku") is None  # log=False
        r.conflict("lost_race")
    assert current_reservation() is None
    assert value(registry, "stocksentry_instrumentation_errors_total", component="tracing") == 1
    assert value(registry, "stocksentry_instrumentation_errors_total", component="api") == 0
    assert (
        value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="lost_race") == 1
    )

    lines: list[dict[str, object]] = []

    class Lines:
        def info(self, event: str, **fields: object) -> None:
            lines.append({"event": event, **fields})

        debug = warning = error = info

    logged = Sentry(registry=CollectorRegistry(), logger=Lines(), tracer_provider=provider)
    with logged.reservation("EGG-02", strategy="atomic") as r:
        assert current_reservation() is r
        assert structlog.contextvars.get_contextvars().get("sku") == "EGG-02"
        r.stock_check(available=3)
    assert lines
    assert lines[0]["event"] == "stock_check"
    assert structlog.contextvars.get_contextvars().get("sku") is None
