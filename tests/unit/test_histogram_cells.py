"""HistogramCells: the lock-wait observation without prometheus_client's per-call checks.

The SQLAlchemy integration adds to a histogram child's cells directly; what it records must
be what ``Histogram.observe`` records, in one process and in multiprocess mode, and a
label that overflowed must still count its overflow on every observation.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.metrics import HistogramCells, StockMetrics, histogram_cells
from stocksentry.instrumentation.tracing import TraceExemplar

BOUNDS = catalog.LATENCY_BUCKETS
# Every bound exactly, just under and over it, zero and far past the last finite bound.
AMOUNTS = [
    0.0,
    *[b for b in BOUNDS],
    *[math.nextafter(b, 0.0) for b in BOUNDS],
    *[math.nextafter(b, math.inf) for b in BOUNDS],
    1e9,
]


def samples(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of ``name`` with its ``table`` label dropped, sorted (_created left out)."""
    out = []
    for metric in registry.collect():
        if metric.name != name:
            continue
        for s in metric.samples:
            if s.name.endswith("_created"):
                continue
            labels = {k: v for k, v in s.labels.items() if k != "table"}
            out.append((s.name, labels, s.value))
    return sorted(out, key=lambda x: (x[0], sorted(x[1].items()), x[2]))


def test_cells_record_exactly_what_observe_records() -> None:
    registry = CollectorRegistry()
    plain = Histogram("plain_seconds", "h", ["table"], buckets=BOUNDS, registry=registry)
    fast = Histogram("fast_seconds", "h", ["table"], buckets=BOUNDS, registry=registry)
    cells = histogram_cells(fast.labels("t"))
    assert isinstance(cells, HistogramCells)
    for amount in AMOUNTS:
        plain.labels("t").observe(amount)
        cells.observe(amount)
    expected = samples(registry, "plain_seconds")
    assert expected  # buckets, count and sum
    assert [(n.replace("plain", "fast"), lab, v) for n, lab, v in expected] == samples(
        registry, "fast_seconds"
    )
    assert registry.get_sample_value("fast_seconds_count", {"table": "t"}) == len(AMOUNTS)


def test_only_a_labelled_histogram_child_has_cells() -> None:
    registry = CollectorRegistry()
    labelled = Histogram("h_seconds", "h", ["table"], registry=registry)
    bare = Histogram("bare_seconds", "h", registry=registry)
    counter = Counter("c", "c", ["table"], registry=registry)
    assert histogram_cells(labelled) is None  # the parent: observe() would raise
    assert histogram_cells(counter.labels("t")) is None
    assert histogram_cells(object()) is None
    assert histogram_cells(bare) is None  # no labels: not what the cells are for
    assert histogram_cells(labelled.labels("t")) is not None


def test_a_child_not_laid_out_as_expected_has_no_cells() -> None:
    child: Any = Histogram("odd_seconds", "h", ["table"], registry=None).labels("t")
    child._upper_bounds = child._upper_bounds[:-1]  # bounds and buckets out of step
    assert histogram_cells(child) is None


def test_lock_wait_cells_come_from_the_cache_only() -> None:
    metrics = StockMetrics(CollectorRegistry())
    assert metrics.db_lock_wait_cells("products") is None  # never observed
    metrics.db_lock_wait("products", 0.01)
    cells = metrics.db_lock_wait_cells("products")
    assert cells is not None
    cells.observe(0.02)
    registry = metrics.registry
    assert registry is not None
    name = catalog.DB_LOCK_WAIT.name
    assert registry.get_sample_value(f"{name}_count", {"table": "products"}) == 2
    assert registry.get_sample_value(f"{name}_sum", {"table": "products"}) == pytest.approx(0.03)


MP_WORKER = textwrap.dedent(
    """
    import sys
    from stocksentry.instrumentation.metrics import StockMetrics
    from stocksentry.instrumentation import mpexemplars
    amounts = [float(a) for a in sys.argv[1].split(",")]
    metrics = StockMetrics(None)
    metrics.db_lock_wait("fast", amounts[0])
    cells = metrics.db_lock_wait_cells("fast")
    assert cells is not None, "no cells in multiprocess mode"
    assert type(cells.child) is mpexemplars.ExemplarHistogram, type(cells.child)
    for amount in amounts[1:]:
        cells.observe(amount)
    for amount in amounts:
        metrics.db_lock_wait("plain", amount)
    print("ok")
    """
)


def test_cells_write_the_same_multiprocess_files_as_observe(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", MP_WORKER, ",".join(repr(a) for a in AMOUNTS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    by_table: dict[str, list[tuple[str, tuple[tuple[str, str], ...], float]]] = {}
    for metric in registry.collect():
        if metric.name != catalog.DB_LOCK_WAIT.name:
            continue
        for s in metric.samples:
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "table"))
            by_table.setdefault(s.labels["table"], []).append((s.name, rest, s.value))
    assert sorted(by_table["fast"]) == sorted(by_table["plain"])
    count = [v for n, _, v in by_table["fast"] if n.endswith("_count")]
    assert count == [len(AMOUNTS)]


# --- exemplars and the reservation duration ---------------------------------------------------

TRACE = TraceExemplar(trace_id="ab" * 16, span_id="cd" * 8)


def exemplars(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float]]:
    return sorted(
        (s.labels["le"], dict(s.exemplar.labels), s.exemplar.value)
        for metric in registry.collect()
        if metric.name == name
        for s in metric.samples
        if s.exemplar is not None
    )


def test_an_exemplar_is_set_as_observe_sets_it() -> None:
    registry = CollectorRegistry()
    plain = Histogram("plain_seconds", "h", ["table"], buckets=BOUNDS, registry=registry)
    fast = Histogram("fast_seconds", "h", ["table"], buckets=BOUNDS, registry=registry)
    cells = histogram_cells(fast.labels("t"))
    assert cells is not None
    assert cells.direct_exemplars
    for amount in (0.0005, 0.02, 0.02, 3.0, 1e9):
        plain.labels("t").observe(amount, TRACE)
        cells.observe_exemplar(amount, TRACE)
    assert exemplars(registry, "plain_seconds") == exemplars(registry, "fast_seconds")
    assert len(exemplars(registry, "fast_seconds")) == 4  # one per bucket hit, the latest
    assert [
        (n.replace("plain", "fast"), lab, v) for n, lab, v in samples(registry, "plain_seconds")
    ] == samples(registry, "fast_seconds")


def test_an_exemplar_not_made_by_stocksentry_is_checked_as_observe_checks_it() -> None:
    fast = Histogram("fast_seconds", "h", ["table"], registry=CollectorRegistry())
    cells = histogram_cells(fast.labels("t"))
    assert cells is not None
    # A plain dict is whatever the app passed: prometheus_client's checks decide.
    with pytest.raises(ValueError, match="Exemplar labels"):
        cells.observe_exemplar(0.1, {"trace_id": "x" * 200})
    # A TraceExemplar is 63 characters by construction: never checked, never too long.
    cells.observe_exemplar(0.1, TraceExemplar(trace_id="ab" * 16, span_id="cd" * 8))


def test_the_reservation_duration_takes_the_cells_path_with_its_checks() -> None:
    registry = CollectorRegistry()
    metrics = StockMetrics(registry)
    name = catalog.RESERVATION_DURATION.name
    for _ in range(3):
        metrics.reservation_finished("EGG-01", "atomic", "success", 0.004, None)
    metrics.reservation_finished("EGG-01", "atomic", "success", 0.03, TRACE)
    # NaN, as observe() counts it: in the sum, in no bucket.
    metrics.reservation_finished("EGG-01", "atomic", "success", math.nan, None)
    success = {"outcome": "success"}
    assert registry.get_sample_value(f"{name}_count", success) == 4
    assert math.isnan(registry.get_sample_value(f"{name}_sum", success) or 0.0)
    assert registry.get_sample_value(f"{name}_bucket", {**success, "le": "0.005"}) == 3
    (exemplar,) = exemplars(registry, name)
    assert exemplar[1] == dict(TRACE)
    assert exemplar[2] == 0.03
    assert (
        registry.get_sample_value(
            "stock_reservation_success_total", {"sku": "EGG-01", "strategy": "atomic"}
        )
        == 5
    )
    with pytest.raises(ValueError, match="unknown outcome"):
        metrics.reservation_finished("EGG-01", "atomic", "no such outcome", 0.1, None)
    assert registry.get_sample_value(f"{name}_count", success) == 4
