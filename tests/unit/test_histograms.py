"""The histograms of lock waits and reservation durations, recorded through a cached
``labels()`` child's ``observe()``: in one process and in multiprocess mode, a label that
overflowed counting its overflow on every observation, exemplars as prometheus_client sets
and checks them.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.metrics import StockMetrics

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


def test_lock_waits_of_a_table_add_up() -> None:
    metrics = StockMetrics(CollectorRegistry())
    metrics.observe(catalog.DB_LOCK_WAIT, 0.01, "products")
    metrics.observe(catalog.DB_LOCK_WAIT, 0.02, "products")
    registry = metrics.registry
    assert registry is not None
    name = catalog.DB_LOCK_WAIT.name
    assert registry.get_sample_value(f"{name}_count", {"table": "products"}) == 2
    assert registry.get_sample_value(f"{name}_sum", {"table": "products"}) == pytest.approx(0.03)


MP_WORKER = textwrap.dedent(
    """
    import sys
    from stocksentry.instrumentation import catalog, mpexemplars
    from stocksentry.instrumentation.metrics import StockMetrics
    amounts = [float(a) for a in sys.argv[1].split(",")]
    metrics = StockMetrics(None)
    kind = type(metrics.metric(catalog.DB_LOCK_WAIT))
    assert kind is mpexemplars.ExemplarHistogram, kind
    for amount in amounts:
        metrics.observe(catalog.DB_LOCK_WAIT, amount, "t")
    print("ok")
    """
)


def test_lock_waits_write_the_multiprocess_files_as_observe_would(tmp_path: Path) -> None:
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
    reference = CollectorRegistry()
    plain = Histogram(
        catalog.DB_LOCK_WAIT.name, "h", ["table"], buckets=BOUNDS, registry=reference
    )
    for amount in AMOUNTS:
        plain.labels("t").observe(amount)
    name = catalog.DB_LOCK_WAIT.name
    assert samples(registry, name) == samples(reference, name)
    assert registry.get_sample_value(f"{name}_count", {"table": "t"}) == len(AMOUNTS)


# --- exemplars and the reservation duration ---------------------------------------------------

TRACE = {"trace_id": "ab" * 16, "span_id": "cd" * 8}


def exemplars(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float]]:
    return sorted(
        (s.labels["le"], dict(s.exemplar.labels), s.exemplar.value)
        for metric in registry.collect()
        if metric.name == name
        for s in metric.samples
        if s.exemplar is not None
    )


def test_an_exemplar_is_checked_as_observe_checks_it() -> None:
    metrics = StockMetrics(CollectorRegistry())
    # Whatever the app passed: prometheus_client's checks decide.
    with pytest.raises(ValueError, match="Exemplar labels"):
        metrics.observe(catalog.DB_LOCK_WAIT, 0.1, "t", exemplar={"trace_id": "x" * 200})
    metrics.observe(
        catalog.DB_LOCK_WAIT, 0.1, "t", exemplar=TRACE
    )  # 63 characters: within the limit


def test_the_reservation_duration_with_its_checks() -> None:
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
