"""The incremental bookkeeping of oversold and duplicate_orders, without a database."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from stocksentry.exporter.probes.db import DuplicateKeys
from stocksentry.exporter.probes.soldtotals import RunLog, SoldTotals

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def over(totals: SoldTotals) -> list[tuple[str, float]]:
    return [(s.sku, s.oversold_units) for s in totals.oversold()]


def test_the_boundary_only_moves_forward_and_yields_the_settle_range() -> None:
    totals = SoldTotals()
    assert totals.advance(T0) is None  # the first run has nothing to settle
    assert totals.advance(T0 + timedelta(seconds=15)) == (T0, T0 + timedelta(seconds=15))
    assert totals.advance(T0) is None  # an older horizon (a transaction seen late)
    assert totals.boundary == T0 + timedelta(seconds=15)


def test_settled_plus_recent_against_the_allocation() -> None:
    totals = SoldTotals()
    totals.advance(T0)
    totals.set_recent([(1, "A", 3, 2), (2, "B", 10, 1)])
    assert totals.uncounted(10) == [1, 2]
    assert totals.pending == 2
    totals.counted([1, 2], [(1, 2)])  # B has no paid history: 0
    assert totals.pending == 0
    assert over(totals) == [("A", 1.0)]
    # The recent orders settle; a refund of a recent order shows in the next recent part.
    totals.advance(T0 + timedelta(seconds=15))
    totals.settle([(1, 2), (2, 1)])
    totals.set_recent([])
    assert over(totals) == [("A", 1.0)]
    assert totals.sold_units(1) == 4.0
    # Products never seen are not kept: a settle range does not create them.
    totals.settle([(3, 50)])
    assert totals.sold_units(3) is None


def test_first_counts_are_bounded_and_most_pressing_first() -> None:
    totals = SoldTotals()
    totals.advance(T0)
    totals.set_recent([(1, "A", 100, 1), (2, "B", 1, 5), (3, "C", 10, 9)])
    assert totals.uncounted(2) == [2, 3]  # beyond their allocation by 4, then by -1
    totals.counted([2, 3], [])
    assert totals.uncounted(2) == [1]
    assert over(totals) == [("B", 4.0)]


def test_the_rolling_recount_replaces_totals_finds_old_oversells_and_wraps() -> None:
    totals = SoldTotals()
    totals.advance(T0)
    totals.set_recent([(1, "A", 3, 1)])
    totals.counted([1], [(1, 3)])
    assert over(totals) == [("A", 1.0)]
    # A chunk of two: A's old order was refunded (3 -> 1); D is oversold with no recent sale.
    totals.recounted([(1, "A", 3, 1), (4, "D", 2, 5)], limit=2)
    assert totals.cursor == 4
    assert totals.passes == 0
    assert over(totals) == [("D", 3.0)]
    # A product without sales or risk is not kept; a short chunk ends the pass.
    totals.recounted([(5, "E", 9, 1)], limit=2)
    assert totals.cursor is None
    assert totals.passes == 1
    assert totals.sold_units(5) is None
    assert len(totals) == 2


def test_an_allocation_change_is_seen_with_the_recent_rows() -> None:
    totals = SoldTotals()
    totals.advance(T0)
    totals.set_recent([(1, "A", 3, 0)])
    totals.counted([1], [(1, 3)])
    assert over(totals) == []
    totals.set_recent([(1, "A", 2, 0)])
    assert over(totals) == [("A", 1.0)]


def test_eviction_keeps_the_oversold_and_the_active() -> None:
    totals = SoldTotals(max_products=10)
    totals.advance(T0)
    totals.set_recent([(0, "OVER", 1, 0)])
    totals.counted([0], [(0, 5)])
    for run in range(1, 12):
        totals.advance(T0 + timedelta(seconds=run))
        totals.set_recent([(run, f"S{run}", 100, 1)])
        totals.counted([run], [])
    assert len(totals) <= 10
    assert totals.sold_units(0) == 5.0  # oversold: kept
    assert totals.sold_units(11) == 1.0  # active: kept
    assert totals.sold_units(1) is None  # least recently active: dropped
    assert over(totals) == [("OVER", 4.0)]


def test_duplicate_keys_last_until_their_second_newest_order_leaves_the_window() -> None:
    keys = DuplicateKeys(window=3600)
    keys.update("external_ref", [("a", T0), ("b", T0 - timedelta(minutes=30))])
    keys.update("idempotency_key", [("a", T0)])
    keys.expire(T0 + timedelta(minutes=10))
    assert keys.count() == 3
    keys.expire(T0 + timedelta(minutes=31))
    assert keys.count() == 2  # b's pair is out
    # A third order of "a" moves its end later.
    keys.update("external_ref", [("a", T0 + timedelta(minutes=50))])
    keys.expire(T0 + timedelta(minutes=61))
    assert keys.count() == 1


def test_the_run_log_warns_of_waiting_products_once_a_pass_is_done_then_rests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    totals = SoldTotals()
    totals.advance(T0)
    totals.set_recent([(1, "A", 100, 1), (2, "B", 1, 5)])
    log = RunLog("oversold")
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")
    log.after_run(totals, passes_before=0, recount_batch=2000)
    assert caplog.messages == []  # no pass done yet: the first counts are still due
    totals.passes = 1  # the rolling recount completed its first pass in this run
    log.after_run(totals, passes_before=0, recount_batch=2000)
    log.after_run(totals, passes_before=1, recount_batch=2000)
    assert caplog.messages == [
        "probe oversold: 2 products with recent sales wait for their first count (2000 a"
        " run); raise probes.oversold.recount_batch",
        "probe oversold: the whole paid history is counted; 0 products tracked",
    ]
    log.reset()
    totals.counted([1, 2], [])
    log.after_run(totals, passes_before=0, recount_batch=2000)
    assert caplog.messages[-1] == (
        "probe oversold: the whole paid history is counted; 2 products tracked"
    )


def test_the_default_recount_makes_a_restart_whole_within_an_hour() -> None:
    # An allocation lowered below what was sold, on a product with no recent orders, is
    # seen only by the rolling recount: after a start, its first pass must end within the
    # hour, at the defaults, on a shop of a million products.
    from stocksentry.exporter.config import parse_config
    from stocksentry.exporter.probes.soldtotals import chunk_size

    settings = parse_config("probes: {}\n", environ={}).probes.oversold
    assert settings.recount_period <= 1800
    runs_in_an_hour = 3600 // settings.interval
    chunk = chunk_size(1_000_000, settings.recount_period, settings.interval)
    assert chunk * runs_in_an_hour >= 1_000_000
