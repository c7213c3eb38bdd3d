"""The lab's 80-column summary and how alerts are attributed to strategies (no service)."""

from __future__ import annotations

import dataclasses
import shlex

from stocksentry.exporter.lab.cli import closing_lines, wrap_command
from stocksentry.exporter.lab.config import STRATEGY_NAMES, DbFigures, LabConfig, StrategyResult
from stocksentry.exporter.lab.observe import AlertSeries, alert_owner
from stocksentry.exporter.lab.report import alert_cell, format_summary

CONFIG = LabConfig()


def result(name: str, start: float, **changes: object) -> StrategyResult:
    base = dataclasses.replace(
        StrategyResult.skip(CONFIG, name, "x"),
        skipped=None,
        started_at=start,
        ended_at=start + 1.0,
        sold=100,
        orders=100,
        final_stock=0,
        db=DbFigures(100, 100, 0, 0),
        consistent=True,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def a_run() -> list[StrategyResult]:
    results = [result(name, 1000.0 + 2 * i) for i, name in enumerate(STRATEGY_NAMES)]
    by_name = {r.strategy: i for i, r in enumerate(results)}
    results[by_name["unsafe"]] = dataclasses.replace(
        results[by_name["unsafe"]],
        sold=500,
        oversold=400,
        lost_updates=488,
        unsafe_read_modify_write=500,
        first_oversell_at=1000.2,
        metrics={"stock_reservation_success_total": 500, "stock_inventory_negative_total": 0},
        probes={"stock_oversold_units": 400.0, "stock_db_lock_waiters": 49.0},
        alerts={
            "StockOversold": {"state": "firing", "after_s": 2.3},
            "StockUnsafeReadModifyWrite": {"state": "firing", "after_s": 0.0},
            "StockLockWaitHigh": {"state": "pending", "after_s": 0.3},
        },
    )
    check = by_name["check_then_decrement"]
    results[check] = dataclasses.replace(
        results[check], final_stock=-49, db=DbFigures(149, 149, 49, -49)
    )
    no_key = by_name["retry_no_key"]
    results[no_key] = dataclasses.replace(
        results[no_key], db=DbFigures(108, 108, 0, 0, duplicate_keys=8, duplicate_orders=8)
    )
    return results


def test_the_summary_fits_80_columns() -> None:
    text = format_summary(
        CONFIG,
        a_run(),
        notes=["alerts: Prometheus evaluated alert_rules/stocksentry.rules.yml (unchanged)"],
        evaluated=True,
        watched=True,
        database="embedded PostgreSQL 16.2 (pgserver)",
    )
    assert max(len(line) for line in text.splitlines()) <= 80
    words = " ".join(text.split())
    assert "StockUnsafeReadModifyWrite FIRING +0s" in words
    assert "(atomic, for_update, redlock, retry_idempotent) fired no alert" in words
    for name in STRATEGY_NAMES:
        assert any(line.split()[:1] == [name] for line in text.splitlines()), name


def test_a_pending_alert_on_a_safe_strategy_is_said_pending_not_raised() -> None:
    results = a_run()
    atomic = next(i for i, r in enumerate(results) if r.strategy == "atomic")
    # Fifty checkouts waiting on one row lock: a real wait, kept from firing by its for:.
    results[atomic] = dataclasses.replace(
        results[atomic], alerts={"StockLockWaitHigh": {"state": "pending", "after_s": 1.2}}
    )
    words = " ".join(format_summary(CONFIG, results, evaluated=True).split())
    assert "retry_idempotent) fired no alert; pending only, never firing: atomic" in words
    assert "atomic (StockLockWaitHigh)" in words
    assert "raised" not in words
    assert "fired alerts" not in words
    results[atomic] = dataclasses.replace(
        results[atomic], alerts={"StockOversold": {"state": "firing", "after_s": 2.0}}
    )
    words = " ".join(format_summary(CONFIG, results, evaluated=True).split())
    assert "retry_idempotent) fired alerts: atomic (see above)" in words
    assert "pending only" not in words


def test_a_retry_run_without_duplicates_says_why() -> None:
    results = a_run()
    words = " ".join(format_summary(CONFIG, results, evaluated=True).split())
    assert "retry_no_key: duplicate orders per idempotency key" in words
    no_key = next(i for i, r in enumerate(results) if r.strategy == "retry_no_key")
    results[no_key] = dataclasses.replace(results[no_key], db=DbFigures(100, 100, 0, 0))
    words = " ".join(format_summary(CONFIG, results, evaluated=True).split())
    assert "retry_no_key: no duplicate order this run: every resubmit found the stock" in words
    assert "--stock more units than --concurrency" in words


def test_alerts_not_evaluated_are_said_so() -> None:
    unsafe = a_run()[0]
    assert alert_cell(unsafe, evaluated=False) == "not evaluated"
    assert alert_cell(dataclasses.replace(unsafe, alerts={}), evaluated=True) == "none"


def test_an_alert_belongs_to_the_strategy_its_labels_name() -> None:
    ran = a_run()
    series = AlertSeries({"alertname": "StockOversold", "sku": "LAB-NAIVE_LOCK"}, 1003.0)
    assert alert_owner(series, ran) == "naive_lock"
    lock = AlertSeries({"alertname": "StockLockExpiredWhileHeld", "lock": "naive_lock"}, 1030.0)
    assert alert_owner(lock, ran) == "naive_lock"


def test_a_shop_wide_alert_belongs_to_the_strategy_that_can_cause_it() -> None:
    ran = a_run()
    # Negative stock went active during the next sale (probe and scrape delay): it is
    # still check_then_decrement's, the only one with negative stock.
    negative = AlertSeries({"alertname": "StockNegativeInventory"}, 1004.5)
    assert alert_owner(negative, ran) == "check_then_decrement"
    duplicates = AlertSeries({"alertname": "StockDuplicateOrders"}, 1015.5)
    assert alert_owner(duplicates, ran) == "retry_no_key"


def test_any_other_alert_belongs_to_the_sale_running_a_second_before() -> None:
    ran = a_run()
    budget = AlertSeries({"alertname": "CheckoutErrorBudgetBurnFast"}, 1009.5)
    assert alert_owner(budget, ran) == "for_update"


def test_the_closing_commands_fit_80_columns_and_run_as_printed() -> None:
    deep = "/srv/shop-sre/2026-11-29/flash-sale"
    lines = closing_lines(f"{deep}/stocksentry-demo.log", f"{deep}/stocksentry-demo.db", None, ())
    assert lines[:2] == ["", "reproduce the findings on what this demo just ran:"]
    commands = "\n".join(lines[2:]).split(" \\\n")
    assert all(len(line) <= 80 for line in lines), lines
    # Read back as the shell reads the continuations: the two commands, word for word.
    text = "\n".join(lines[2:]).replace(" \\\n", " ")
    timeline, reconcile = (shlex.split(line) for line in text.splitlines())
    assert timeline[1:] == [
        "timeline",
        f"{deep}/stocksentry-demo.log",
        "--limit",
        "5",
        "--sku",
        "LAB-UNSAFE",
    ]
    assert reconcile[1:] == [
        "reconcile",
        "--database",
        f"sqlite:///{deep}/stocksentry-demo.db",
        "--allocation",
        "initial_stock",
    ]
    assert len(commands) > 2  # the long paths did wrap


def test_a_word_longer_than_a_line_gets_a_line_of_its_own() -> None:
    long = "/" + "x" * 100
    assert wrap_command(["stocksentry", "timeline", long, "--limit", "5"]) == [
        "  stocksentry timeline \\",
        f"      {long} \\",
        "      --limit 5",
    ]
    assert wrap_command(["stocksentry", "timeline", "a.log"]) == ["  stocksentry timeline a.log"]
