"""The cardinality guard bounds the series a hostile or huge SKU set can create."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from stocksentry.instrumentation import OVERFLOW_VALUE, LabelGuard, Sentry, sanitize_label_value
from stocksentry.instrumentation.guard import EMPTY_VALUE


def series(registry: CollectorRegistry, sample: str) -> list[dict[str, str]]:
    return [s.labels for metric in registry.collect() for s in metric.samples if s.name == sample]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("EGG-01", "EGG-01"),
        ("sku:a/b@c#d+e.f", "sku:a/b@c#d+e.f"),
        ('A"B', "A_B"),
        ("line\nbreak", "line_break"),
        ("tab\tand\x00nul", "tab_and_nul"),
        ("<script>alert(1)</script>", "_script_alert_1__/script_"),
        ("telur ayam", "telur_ayam"),
        ("\ud800lone", "_lone"),
        ("", EMPTY_VALUE),
        (12345, "12345"),
    ],
)
def test_sanitize(raw: object, expected: str) -> None:
    assert sanitize_label_value(raw) == expected


def test_sanitize_caps_length() -> None:
    assert sanitize_label_value("x" * 10_000) == "x" * 64
    assert sanitize_label_value("y" * 100, max_length=10) == "y" * 10


def test_guard_admits_budget_then_folds() -> None:
    guard = LabelGuard(2, always=["PROMO"])
    assert guard("PROMO") == "PROMO"
    assert guard("A") == "A"
    assert guard("B") == "B"
    assert guard("C") is OVERFLOW_VALUE
    assert guard("A") == "A"  # admitted values stay admitted
    assert guard("PROMO") == "PROMO"  # pinned values never count against the budget
    assert guard.admitted_count == 2
    assert guard.values() == frozenset({"PROMO", "A", "B"})


def test_guard_sanitised_duplicates_share_one_slot() -> None:
    guard = LabelGuard(1)
    assert guard("A\n") == "A_"
    assert guard("A\t") == "A_"
    assert guard.admitted_count == 1


def test_guard_rejects_bad_budget() -> None:
    with pytest.raises(ValueError, match="max_values"):
        LabelGuard(-1)
    with pytest.raises(ValueError, match="max_length"):
        LabelGuard(1, max_length=0)


def test_ten_thousand_skus_stay_bounded(registry: CollectorRegistry) -> None:
    """10,000 distinct SKUs: promo SKUs + 100 own series, the rest in __other__."""
    promo = ["PROMO-1", "PROMO-2", "PROMO-3"]
    sentry = Sentry(registry=registry, promo_skus=promo, log=False, trace=False)
    for i in range(10_000):
        sentry.record_reservation(f"SKU-{i:05d}", "success", strategy="atomic")
    for sku in promo:
        sentry.record_reservation(sku, "success", strategy="atomic")

    labels = series(registry, "stock_reservation_success_total")
    skus = {s["sku"] for s in labels}
    assert len(labels) == 3 + 100 + 1
    assert set(promo) <= skus
    assert OVERFLOW_VALUE in skus
    assert {f"SKU-{i:05d}" for i in range(100)} <= skus
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": OVERFLOW_VALUE, "strategy": "atomic"}
        )
        == 9_900
    )
    assert (
        registry.get_sample_value(
            "stocksentry_label_overflow_total", {"metric": "stock_reservation_success_total"}
        )
        == 9_900
    )
    # Nothing is lost: the series still sum to every recorded reservation.
    total = sum(
        registry.get_sample_value("stock_reservation_success_total", s) or 0 for s in labels
    )
    assert total == 10_003


def test_hostile_values_render_safely(registry: CollectorRegistry) -> None:
    sentry = Sentry(registry=registry, max_skus=10, log=False, trace=False)
    hostile = ['"}\n# HELP fake', "\x1b[31mred", "a" * 5000, "\ud83d", "ok"]
    for value in hostile:
        sentry.record_reservation(value, "out_of_stock")
    text = generate_latest(registry).decode("utf-8")
    assert "# HELP fake" not in text
    for labels in series(registry, "stock_reservation_conflict_total"):
        assert len(labels["sku"]) <= 64
        assert labels["sku"].isprintable()


def test_guard_is_thread_safe() -> None:
    guard = LabelGuard(50)
    results: list[str] = []
    lock = threading.Lock()

    def work(offset: int) -> None:
        local = [guard(f"S{(offset + i) % 200}") for i in range(2000)]
        with lock:
            results.extend(local)

    threads = [threading.Thread(target=work, args=(n * 37,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert guard.admitted_count == 50
    assert len(set(results) - {OVERFLOW_VALUE}) == 50


def test_long_hostile_skus_do_not_grow_memory(registry: CollectorRegistry) -> None:
    """Values that differ only past the length cap share one label and one bounded cache."""
    sentry = Sentry(registry=registry, max_skus=10, log=False, trace=False)
    prefix = "A" * 64
    for i in range(20_000):
        sentry.record_reservation(f"{prefix}{i}", "success", strategy="atomic")
    caches = sentry.metrics._children["stock_reservation_success_total"]
    assert len(caches) <= sentry.metrics._cache_limit
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": prefix, "strategy": "atomic"}
        )
        == 20_000
    )


def test_promo_skus_from_a_generator_are_primed(registry: CollectorRegistry) -> None:
    Sentry(registry=registry, promo_skus=(s for s in ["P-1"]), log=False, trace=False)
    assert registry.get_sample_value("stock_inventory_negative_total", {"sku": "P-1"}) == 0.0
