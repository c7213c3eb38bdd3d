"""The instrumentation's rarely taken paths, through the public API: secrets in log values,
freeze values and messages that break the contract, failing tracers, metrics and logging,
and the outcome of a few unusual exceptions. None of them may reach the app."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

import prometheus_client
import pytest
import redis.asyncio
import test_api
import werkzeug.exceptions
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import FreezeSettings, Sentry, catalog
from stocksentry.instrumentation.freeze import (
    FreezeContractError,
    FreezeState,
    check_template,
    parse_message,
)
from stocksentry.instrumentation.heldlocks import held_locks
from stocksentry.instrumentation.locks import track_lock
from stocksentry.instrumentation.logs import configure_logging, get_logger
from stocksentry.instrumentation.secrets import (
    Secret,
    mask_url,
    scrub_text,
    secret_fragments,
    url_has_password,
)
from test_api import value

ERRORS = "stocksentry_instrumentation_errors_total"
CARD = "4111 1111 1111 1111"  # Luhn-valid, the usual test card

sentry = test_api.sentry


def errors(registry: CollectorRegistry, component: str) -> float:
    return value(registry, ERRORS, component=component)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


# --- secrets in log values ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # A date, then the card: the digit run begins at the date.
        f"charged 2024-01-05 {CARD}",
        # A quantity, then the card, dashes or none.
        f"qty 2 {CARD}",
        "qty 2 4111-1111-1111-1111",
        "qty 3 4111111111111111",
        # Before and after.
        f"qty 2 {CARD} 12",
    ],
)
def test_a_card_number_after_a_shorter_digit_group_never_reaches_a_log_line(
    stream: io.StringIO, text: str
) -> None:
    get_logger("checkout").info("payment_note", note=text, nested={"note": [text]})
    (line,) = lines(stream)
    rendered = json.dumps(line)
    assert "4111" not in rendered.replace("****1111", "")
    assert "****1111" in str(line["note"])
    # Only the card is cut: the digits before it stay.
    assert str(line["note"]).split("****")[0] == text.split("4111")[0]


def test_digit_runs_that_hold_no_card_are_left_alone() -> None:
    # Not Luhn-valid whole, and no prefix long enough to be a card.
    assert scrub_text("ref 4111 1111 1111 1112") == "ref 4111 1111 1111 1112"
    assert scrub_text("2024-01-05 2024-01-06 2024") == "2024-01-05 2024-01-06 2024"
    assert scrub_text(f"paid {CARD} ok") == "paid ****1111 ok"


def test_log_values_under_non_string_keys_are_still_scrubbed(stream: io.StringIO) -> None:
    get_logger("checkout").info("by_position", rows={1: f"card {CARD}", "token": "t0k3n"})
    (line,) = lines(stream)
    assert line["rows"] == {"1": "card ****1111", "token": "[REDACTED]"}


def test_console_logging_to_a_stream_without_isatty_has_no_colours(
    stream: io.StringIO,
) -> None:
    class Plain:
        """A stream with write() and flush() only (a socket wrapper, a custom sink)."""

        def __init__(self) -> None:
            self.parts: list[str] = []

        def write(self, text: str) -> int:
            self.parts.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    sink = Plain()
    configure_logging("INFO", stream=sink, json=False)  # type: ignore[arg-type]
    get_logger("checkout").info("reserved", sku="EGG-01", card=f"c {CARD}")
    out = "".join(sink.parts)
    assert "reserved" in out
    assert "EGG-01" in out
    assert "****1111" in out
    assert "\x1b[" not in out
    assert "4111 1111" not in out

    closed = io.StringIO()
    closed.close()
    configure_logging("INFO", stream=closed, json=False)  # isatty() raises ValueError


def test_connection_strings_that_cannot_be_parsed_are_never_shown() -> None:
    broken_ipv6 = "postgresql://shop:s3cret@[::1/shop"
    bad_port = "postgresql://shop:s3cret@db:99999/shop"
    # Cannot be checked: taken as holding a password; never printed.
    assert url_has_password(broken_ipv6) is True
    assert mask_url(broken_ipv6) is None
    assert mask_url(bad_port) is None
    assert mask_url("host=db password=s3cret") is None
    # Blanked whole from messages.
    assert secret_fragments(broken_ipv6) == (broken_ipv6,)
    # An IPv6 host keeps its brackets once the password is masked.
    assert mask_url("postgresql://shop:s3cret@[::1]:5432/shop") == (
        "postgresql://shop:***@[::1]:5432/shop"
    )
    # A libpq list's quoted password is blanked without its quotes.
    assert "two words" in secret_fragments("host=db password='two words' dbname=shop")


def test_a_secret_compares_and_hashes_by_value_without_showing_it() -> None:
    a, b = Secret("s3cret"), Secret("s3cret")
    assert a == b
    assert hash(a) == hash(b)
    assert a != Secret("other")
    assert a != "s3cret"  # a plain string is not a Secret
    assert len({a, b}) == 1
    assert "s3cret" not in f"{a} {a!r}"


# --- freeze values and messages -----------------------------------------------------------


def test_a_freeze_value_with_a_number_too_large_for_a_float_is_a_contract_error() -> None:
    huge = "1" + "0" * 400
    bad_at = f'{{"sku":"EGG-01","reason":"r","source":"person","at":{huge}}}'
    bad_expiry = (
        f'{{"sku":"EGG-01","reason":"r","source":"person","at":1700000000,"expires_at":{huge}}}'
    )
    for raw in (bad_at, bad_expiry):
        with pytest.raises(FreezeContractError):
            FreezeState.from_json(raw)
        with pytest.raises(FreezeContractError):
            parse_message(f'{{"action":"freeze","sku":"EGG-01","state":{raw}}}')


def test_freeze_values_and_messages_outside_the_contract_are_refused() -> None:
    with pytest.raises(FreezeContractError, match="expires_at"):
        FreezeState.from_json(
            '{"sku":"EGG-01","reason":"r","source":"person","at":1,"expires_at":"soon"}'
        )
    with pytest.raises(FreezeContractError, match="unknown action"):
        parse_message('{"action":"thaw","sku":"EGG-01"}')
    with pytest.raises(FreezeContractError, match="unknown action"):
        parse_message('{"action":"freeze","sku":7}')
    with pytest.raises(TypeError, match="key_template must be a str"):
        check_template(b"freeze:{sku}")


def test_freeze_settings_refuse_an_asyncio_client() -> None:
    client = redis.asyncio.Redis()  # not connected: building one opens no socket
    try:
        with pytest.raises(TypeError, match="sync redis-py client"):
            FreezeSettings(client)
    finally:
        asyncio.run(client.aclose())


# --- failures inside the instrumentation ------------------------------------------------------


class _FailingStart(SpanProcessor):
    def on_start(self, span: object, parent_context: object = None) -> None:
        raise RuntimeError("span processor broke")


def test_a_payment_callback_whose_tracer_fails_still_counts_the_payment(
    registry: CollectorRegistry,
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(_FailingStart())
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    ran = []
    with sentry.payment_callback("EGG-01", order_id="o-1"):
        ran.append("callback")
    assert ran == ["callback"]
    assert value(registry, "stock_orders_paid_total", sku="EGG-01") == 1
    assert errors(registry, "tracing") == 1

    # The app's exception passes unchanged; a failed callback counts no payment.
    error = KeyError("order")
    with pytest.raises(KeyError) as info, sentry.payment_callback("EGG-01"):
        raise error
    assert info.value is error
    assert value(registry, "stock_orders_paid_total", sku="EGG-01") == 1
    assert errors(registry, "tracing") == 2


def test_a_malformed_checkout_context_is_a_tracing_error_not_the_apps(
    registry: CollectorRegistry, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    # A carrier read back from storage as a string, not a mapping.
    with sentry.payment_callback("EGG-01", checkout_context="traceparent=00-ab") as cb:  # type: ignore[arg-type]
        cb.refund_due_to_oversell()
    assert errors(registry, "tracing") == 1
    assert value(registry, "stock_orders_paid_total", sku="EGG-01") == 1
    assert value(registry, "stock_refund_due_to_oversell_total", sku="EGG-01") == 1
    assert spans.get_finished_spans() == ()


def test_failing_metrics_in_recording_calls_are_counted_as_metrics_errors(
    sentry: Sentry, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("metrics backend broke")

    # The backend itself breaks: histograms for record_reservation, the paid-order,
    # refund and replay counters for the others (the error counter keeps working).
    counter_inc = prometheus_client.Counter.inc

    def inc(self: prometheus_client.Counter, amount: float = 1, exemplar: object = None) -> None:
        if self._name != "stocksentry_instrumentation_errors":  # type: ignore[attr-defined]
            broken()
        counter_inc(self, amount, exemplar)  # type: ignore[arg-type]

    monkeypatch.setattr(prometheus_client.Histogram, "observe", broken)
    monkeypatch.setattr(prometheus_client.Counter, "inc", inc)

    sentry.record_reservation("EGG-01", "success", duration=0.1)
    sentry.record_refund_due_to_oversell("EGG-01", order_id="o-1")
    with sentry.payment_callback("EGG-01") as cb:
        cb.replay()
    with sentry.payment_callback("EGG-01"):
        pass
    # A backend failure is a metrics error, never a misuse of the API by the app.
    assert errors(registry, "metrics") == 4
    assert errors(registry, "api") == 0


def test_an_instrumentation_error_whose_log_line_fails_is_still_counted(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    class Broken(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            raise RuntimeError("log filter broke")

    broken = Broken()
    logger = logging.getLogger("stocksentry")
    logger.addFilter(broken)
    try:
        sentry.record_reservation("EGG-01", "sold_out")  # type: ignore[arg-type]
    finally:
        logger.removeFilter(broken)
    assert errors(registry, "api") == 1


def test_bad_conflict_on_types(sentry: Sentry, registry: CollectorRegistry) -> None:
    with pytest.raises(TypeError, match="conflict_on must be exception classes"):
        Sentry(registry=None, conflict_on=42)  # type: ignore[arg-type]
    # Per reservation: counted, the reservation still recorded with the instance's types.
    with sentry.reservation("EGG-01", conflict_on=[int]):  # type: ignore[list-item]
        pass
    assert errors(registry, "api") == 1
    assert (
        value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default") == 1
    )


def test_closing_a_sentry_without_a_registry() -> None:
    sentry = Sentry(registry=None, log=False, trace=False)
    sentry.close()
    sentry.reopen()
    with sentry.reservation("EGG-01"):
        pass
    metric = sentry.metrics.metric(catalog.RESERVATION_SUCCESS)
    assert metric.labels("EGG-01", "default")._value.get() == 1


# --- outcomes of unusual exceptions -------------------------------------------------------------


def test_sqlite_database_is_locked_ends_the_reservation_as_a_lock_timeout(
    sentry: Sentry, registry: CollectorRegistry, tmp_path: Path
) -> None:
    path = tmp_path / "shop.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INT)")
    holder.execute("BEGIN IMMEDIATE")  # holds the write lock
    buyer = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with (
            pytest.raises(sqlite3.OperationalError, match="database is locked"),
            sentry.reservation("EGG-01"),
        ):
            buyer.execute("INSERT INTO stock VALUES ('EGG-01', 1)")
    finally:
        buyer.close()
        holder.rollback()
        holder.close()
    conflicts = value(
        registry, "stock_reservation_conflict_total", sku="EGG-01", reason="lock_timeout"
    )
    assert conflicts == 1


def test_an_http_exception_without_a_status_is_an_error_not_an_answer(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    error = werkzeug.exceptions.HTTPException()  # the base class: code is None
    assert error.code is None
    with pytest.raises(werkzeug.exceptions.HTTPException) as info, sentry.reservation("EGG-01"):
        raise error
    assert info.value is error
    assert value(registry, "stock_reservation_duration_seconds_count", outcome="error") == 1


# --- held locks ---------------------------------------------------------------------------------


def test_held_locks_keep_the_newest_32_of_locks_never_released(sentry: Sentry) -> None:
    store: dict[str, str] = {}  # an in-process home-made lock

    def acquire(key: str) -> Callable[[str], bool]:
        return lambda token: store.setdefault(key, token) == token

    def never_released() -> list[str]:
        locks = [
            track_lock(f"lock-{n}", ttl=60, acquire=acquire(f"k{n}"), sentry=sentry)
            for n in range(33)
        ]
        for lock in locks:
            assert lock.acquire()
        return [h.name for h in held_locks()]

    # A context of its own: the holds never released stay out of the other tests.
    held = contextvars.Context().run(never_released)
    assert held == [f"lock-{n}" for n in range(1, 33)]


def test_a_home_made_lock_whose_release_fails_is_no_longer_held(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    store: dict[str, str] = {}

    def release(token: str) -> None:
        raise ConnectionError("lock store unreachable")

    def acquire_then_fail_to_release() -> list[list[str]]:
        lock = track_lock(
            "flaky",
            ttl=60,
            acquire=lambda token: store.setdefault("k", token) == token,
            release=release,
            sentry=sentry,
        )
        assert lock.acquire()
        before = [h.name for h in held_locks()]
        with pytest.raises(ConnectionError, match="unreachable"):
            lock.release()
        return [before, [h.name for h in held_locks()]]

    before, after = contextvars.Context().run(acquire_then_fail_to_release)
    assert before == ["flaky"]
    # The app's critical section is over: what it does next is not under the lock.
    assert after == []
    # Whether the lock was still ours is not known: no release outcome is recorded.
    assert value(registry, "stock_lock_release_not_owned_total", lock="flaky") == 0
    assert value(registry, "stock_lock_hold_ratio_count", lock="flaky") == 0
    assert errors(registry, "locks") == 0


async def test_a_home_made_lock_extends_in_asyncio(
    sentry: Sentry, registry: CollectorRegistry
) -> None:
    memory_lock_store: dict[str, str] = {}  # an in-process home-made lock

    async def extend(token: str, ttl: float) -> bool:
        return memory_lock_store.get("k") == token

    lock = track_lock(
        "async-ext",
        ttl=5,
        acquire=lambda token: memory_lock_store.setdefault("k", token) == token,
        release=lambda token: memory_lock_store.pop("k", None),
        extend=extend,
        sentry=sentry,
    )
    async with lock:
        assert await lock.aextend(10)
        assert lock.hold is not None
        assert lock.hold.lease is not None
        assert lock.hold.lease >= 10
        memory_lock_store["k"] = "someone else"
        assert not await lock.aextend()
    assert value(registry, "stock_lock_extend_failures_total", lock="async-ext") == 1
