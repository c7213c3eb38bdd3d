"""The catalogs: metrics match the design's list and their docs are fresh; every log line
the code writes is a catalogued event with catalogued fields."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, get_args

import pytest
import structlog
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry, catalog, events
from stocksentry.instrumentation.logs import CORRELATION_KEYS
from stocksentry.instrumentation.metrics import StockMetrics
from structlog.testing import capture_logs

ROOT = Path(__file__).resolve().parents[2]


def test_names_prefixes_and_uniqueness() -> None:
    names = [m.name for m in catalog.ALL]
    assert len(names) == len(set(names)) == len(catalog.BY_NAME)
    for m in catalog.ALL:
        assert m.name.startswith(("stock_", "stocksentry_")), m.name
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert m.help.endswith("."), m.name
        if m.kind == "histogram":
            assert m.buckets, m.name
            assert list(m.buckets) == sorted(m.buckets), m.name
        if m.kind == "gauge":
            assert m.multiprocess_mode is not None, m.name
        # Identifiers belong in logs and exemplars, never in labels.
        assert not set(m.labels) & {"request_id", "order_id", "idempotency_key", "trace_id"}


#: What a name may end in to say what it counts or measures: names that differ only here
#: are one family's (stock_inventory_negative_total, _skus, _units).
UNIT_WORDS = frozenset(
    {"total", "units", "unit", "skus", "sku", "keys", "seconds", "ratio", "events", "max"}
)


def test_one_name_per_thing() -> None:
    """No twins: two names with the same words, give or take a plural or the word order
    (stock_db_deadlock_total beside stock_db_deadlocks_total; stock_negative_inventory_units
    beside stock_inventory_negative_total) are one thing named twice."""
    seen: dict[tuple[str, ...], str] = {}
    orders: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}
    for m in catalog.ALL:
        words = tuple(word.removesuffix("s") for word in m.name.split("_") if word != "total")
        twin = seen.setdefault(tuple(sorted(words)), m.name)
        assert twin == m.name, f"{m.name} and {twin} are one name twice"
        stem = tuple(word for word in m.name.split("_") if word not in UNIT_WORDS)
        first = orders.setdefault(tuple(sorted(stem)), (m.name, stem))
        assert first[1] == stem, f"{m.name} orders the words of {first[0]} otherwise"


def test_app_metrics_register_exactly_as_cataloged() -> None:
    registry = CollectorRegistry()
    StockMetrics(registry)
    registered = {metric.name: metric.type for metric in registry.collect()}
    expected = {(m.base_name if m.kind == "counter" else m.name): m.kind for m in catalog.APP}
    assert registered == expected


def test_generated_docs_are_fresh() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- the log event catalog against what the code logs ---------------------------------------

# Keys any line may carry besides its event's own fields: the correlation ids (bound, or
# passed along by the recording API), the trace ids, and what capture_logs itself adds.
ALWAYS_ALLOWED = frozenset(
    {*CORRELATION_KEYS, "trace_id", "span_id", "trace_flags", "event", "log_level"}
)
# Events no pure scenario here can produce: the database's own refusals and a stale
# fencing token (the PostgreSQL tests check them) and the instrumentation error, a stdlib
# record (checked below); a refusal of a frozen SKU needs Redis (tests/integration/
# test_freeze.py checks its line).
NOT_HERE = {
    events.RESERVATION_FROZEN.name,
    events.STALE_FENCING_TOKEN.name,
    events.DB_DEADLOCK.name,
    events.DB_SERIALIZATION_FAILURE.name,
    events.DB_LOCK_TIMEOUT.name,
    events.INSTRUMENTATION_ERROR.name,
}


def uncatalogued(lines: list[MutableMapping[str, Any]]) -> list[str]:
    """What in ``lines`` (from capture_logs) the event catalog does not say."""
    problems = []
    for line in lines:
        event = events.by_name(line["event"])
        if event is None:
            problems.append(f"{line['event']}: not in the catalog")
            continue
        if line["log_level"] != event.level:
            problems.append(f"{event.name}: logged at {line['log_level']}, not {event.level}")
        extra = set(line) - set(event.fields) - ALWAYS_ALLOWED
        if extra:
            problems.append(f"{event.name}: fields {sorted(extra)} not catalogued")
    return problems


def recording_api_scenarios(sentry: Sentry) -> None:
    with sentry.reservation(
        "EGG-01", strategy="unsafe", request_id="r-1", idempotency_key="k-1", order_id="o-1"
    ) as r:
        r.stock_check(available=1)
        r.success(old_stock=1, new_stock=-1)
    with sentry.reservation("EGG-01", strategy="atomic") as r:
        r.conflict("out_of_stock")
    with pytest.raises(RuntimeError), sentry.reservation("EGG-01"):
        raise RuntimeError("pricing service down")
    for mark in ("paid", "replay", "refund_due_to_oversell", "failed"):
        with sentry.payment_callback("EGG-01", order_id="o-1", payment_reference="p-1") as cb:
            if mark != "paid":
                getattr(cb, mark)()
    sentry.record_paid_order("EGG-01", order_id="o-3", payment_reference="p-3")
    sentry.record_refund_due_to_oversell("EGG-01", order_id="o-3")
    sentry.record_negative_inventory("EGG-01", stock=-2)
    sentry.record_idempotency_replay("checkout", key="k-1")
    sentry.record_idempotency_conflict("checkout", key="k-1")
    sentry.record_stale_cache_hit("redis", sku="EGG-01", cached=1, actual=0)


def sqlalchemy_scenarios(sentry: Sentry, path: Path) -> None:
    import sqlalchemy as sa
    from sqlitedb import sqlite_engine
    from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy

    engine = sqlite_engine(
        f"sqlite:///{path}",
        "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL,"
        " available_stock INTEGER NOT NULL)",
        "INSERT INTO products VALUES (1, 'EGG-01', 1)",
    )
    instrument_sqlalchemy(engine, sentry=sentry)
    try:
        # A lost update: read in one transaction, a computed value written in another.
        with sentry.reservation("EGG-01", strategy="unsafe"):
            with engine.begin() as conn:
                stock = conn.execute(
                    sa.text("SELECT available_stock FROM products WHERE sku = :sku"),
                    {"sku": "EGG-01"},
                ).scalar_one()
            with engine.begin() as conn:
                conn.execute(
                    sa.text("UPDATE products SET available_stock = :v WHERE sku = :sku"),
                    {"v": stock - 1, "sku": "EGG-01"},
                )
        # A guarded update that matched no row, outside a reservation.
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE products SET available_stock = available_stock - 1"
                    " WHERE sku = :sku AND available_stock >= 1"
                ),
                {"sku": "EGG-01"},
            )
    finally:
        engine.dispose()


def lock_scenarios(sentry: Sentry) -> None:
    from stocksentry.instrumentation.locks import LockRecorder, track_lock

    held: dict[str, str] = {}

    def take(token: str) -> bool:
        return held.setdefault("key", token) == token

    def drop(token: str) -> None:
        held.pop("key", None)

    def lock(ttl: float, **kwargs: Any) -> Any:
        return track_lock(
            "checkout",
            ttl=ttl,
            acquire=take,
            release=drop,
            owner=lambda: held.get("key"),
            sentry=sentry,
            **kwargs,
        )

    with lock(5):  # acquired, released while ours
        pass
    first = lock(0.001)
    assert first.acquire()
    assert lock(5).acquire() is False  # timeout
    time.sleep(0.01)
    held["key"] = "another-holder"
    assert first.release() is False  # expired while held, release not owned
    second = lock(60, extend=lambda token, ttl: False)
    held.clear()
    assert second.acquire()
    assert second.extend() is False  # extend failed
    held["key"] = "another-holder"
    assert second.release() is False  # not owned before its TTL: lost_before_ttl

    def broken(token: str) -> bool:
        raise ConnectionError("redis went away")

    with pytest.raises(ConnectionError):
        track_lock("checkout", ttl=1, acquire=broken, release=drop, sentry=sentry).acquire()
    recorder = LockRecorder("checkout", sentry)
    recorder.released(
        None,
        owned=False,
        started=time.perf_counter(),
        current_holder="x",
        deleted_other_holder=True,
    )


def test_every_logged_event_is_catalogued_with_its_fields(tmp_path: Path) -> None:
    sentry = Sentry(registry=CollectorRegistry(), trace=False)
    # capture_logs keeps the wrapper class: start from structlog's defaults, which let
    # debug lines through, whatever level an earlier test configured.
    saved, was_configured = structlog.get_config(), structlog.is_configured()
    structlog.reset_defaults()
    try:
        with capture_logs() as lines:
            recording_api_scenarios(sentry)
            sqlalchemy_scenarios(sentry, tmp_path / "shop.db")
            lock_scenarios(sentry)
    finally:
        structlog.configure(**saved)
        if not was_configured:
            structlog.reset_defaults()
    assert uncatalogued(lines) == []
    seen = {line["event"] for line in lines}
    # Every catalogued event is produced by some scenario, so a new one gets a check too.
    assert seen == {event.name for event in events.EVENTS} - NOT_HERE


def test_the_instrumentation_error_record_carries_its_catalogued_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sentry = Sentry(registry=CollectorRegistry(), log=False, trace=False)
    with caplog.at_level(logging.WARNING, logger="stocksentry"):
        sentry.internal_error("metrics", ValueError("broken"))
    (record,) = caplog.records
    event = events.INSTRUMENTATION_ERROR
    assert record.levelname.lower() == event.level
    assert {field: getattr(record, field) for field in event.fields} == {
        "component": "metrics",
        "error": "ValueError",
    }


def test_conflict_reasons_and_outcomes_are_one_list() -> None:
    import stocksentry.instrumentation as package

    assert package.ConflictReason is catalog.ConflictReason
    assert package.Outcome is catalog.Outcome
    assert get_args(catalog.ConflictReason) == catalog.CONFLICT_REASONS
    assert get_args(catalog.Outcome) == ("success", *catalog.CONFLICT_REASONS, "error")
    assert get_args(catalog.Outcome) == catalog.OUTCOMES
