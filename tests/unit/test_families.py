"""The probes' dialect-neutral result building: worst SKUs by name, the outbox's log line."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from polling import FakeClock
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes.families import (
    OutboxStuck,
    OutboxStuckLog,
    negative_stock_families,
    worst_sku_samples,
)
from stocksentry.instrumentation.guard import LabelGuard


def samples(metric) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.values()): s.value for s in metric.samples}


def test_the_worst_skus_are_named_and_the_rest_summed_under_other():
    rows = [("B", 5), ("A", 5), ("C", 1), ("D", 9), ("E", 0), ("F", -2)]
    got = worst_sku_samples(rows, top=2, guard=LabelGuard(100), pinned=("P",))
    # D (9) first, then A and B tie at 5: A by name. B and C to __other__; E, F not > 0.
    assert got == [(("A",), 5.0), (("D",), 9.0), (("P",), 0.0), (("__other__",), 6.0)]


def test_the_guard_bounds_the_named_skus():
    guard = LabelGuard(1)
    guard("ALREADY-ADMITTED")
    got = worst_sku_samples([("X", 3), ("Y", 2)], top=10, guard=guard)
    assert got == [(("__other__",), 5.0)]


def test_negative_units_not_fetched_row_by_row_go_to_other():
    # 3 SKUs below zero, 10 units in all; only the worst two rows were fetched.
    metrics = negative_stock_families(
        3, 10, [("EGG-01", -6), ("EGG-02", -3)], top=2, guard=LabelGuard(100)
    )
    skus, units, per_sku = metrics
    assert samples(skus) == {(): 3.0}
    assert samples(units) == {(): 10.0}
    assert samples(per_sku) == {("EGG-01",): 6.0, ("EGG-02",): 3.0, ("__other__",): 1.0}
    assert per_sku.name == "stock_inventory_negative_sku_units"


def test_the_duplicate_sku_statement_is_parameterised_in_every_dialect():
    schema = parse_config("schema: {}\n", environ={}).schema
    since = datetime(2026, 12, 1, tzinfo=UTC)
    for dialect, quote in (("postgresql", '"'), ("mysql", "`")):
        query = InvariantSql(schema, dialect).duplicate_key_skus(
            "external_ref", ["k1", "k'2"], since=since
        )
        text = query.text()
        assert f"o.{quote}external_ref{quote} IN (:key0, :key1)" in text
        assert "k'2" not in text
        assert query.params == {"since": since, "key0": "k1", "key1": "k'2"}
        assert query.columns == ("sku", "keys")


def test_outbox_stuck_logs_once_per_transition_then_once_a_minute(caplog):
    caplog.set_level(logging.INFO, logger="test.outbox")
    clock = FakeClock(0.0)
    log = OutboxStuckLog(
        max_publish_latency=30.0, logger=logging.getLogger("test.outbox"), clock=clock
    )
    stuck = OutboxStuck(count=3, oldest_id=1042, oldest_age=95.0)
    assert not log.observe(OutboxStuck(0, None, 2.0))  # nothing stuck, nothing said
    assert log.observe(stuck)
    for second in (15, 30, 45, 59):
        clock.now = float(second)
        assert not log.observe(stuck)
    clock.now = 60.0
    assert log.observe(OutboxStuck(count=4, oldest_id=1042, oldest_age=155.0))
    clock.now = 75.0
    assert log.observe(OutboxStuck(0, None, 1.0))
    assert not log.observe(OutboxStuck(0, None, 1.0))
    assert [r.getMessage() for r in caplog.records] == [
        "outbox stuck: 3 event(s) unpublished beyond 30s; the oldest, id 1042, is 1m35s old",
        "outbox stuck: 4 event(s) unpublished beyond 30s; the oldest, id 1042, is 2m35s old",
        "outbox recovered: no event unpublished beyond 30s",
    ]
    assert caplog.records[0].levelno == logging.WARNING
    assert caplog.records[0].oldest_event_id == "1042"


def test_outbox_stuck_without_an_id_column_names_the_age(caplog):
    caplog.set_level(logging.INFO, logger="test.outbox")
    log = OutboxStuckLog(max_publish_latency=60.0, logger=logging.getLogger("test.outbox"))
    log.observe(OutboxStuck(count=1, oldest_id=None, oldest_age=61.0))
    assert [r.getMessage() for r in caplog.records] == [
        "outbox stuck: 1 event(s) unpublished beyond 1m; the oldest is 1m1s old"
    ]
