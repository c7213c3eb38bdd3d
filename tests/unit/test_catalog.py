"""The catalog matches the design's metric list, and its generated docs are fresh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.metrics import StockMetrics

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
