"""Gunicorn-style workers write to PROMETHEUS_MULTIPROC_DIR; the merged totals are exact."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

WORKER = textwrap.dedent(
    """
    import sys
    from stocksentry.instrumentation import Sentry

    worker = int(sys.argv[1])
    sentry = Sentry(log=False, trace=False)
    for i in range(250):
        with sentry.reservation(f"SKU-{i % 3}", strategy="atomic") as r:
            if i % 5 == 0:
                r.conflict("out_of_stock")
            else:
                r.success(old_stock=1, new_stock=-1 if i % 50 == 1 else 0)
    sentry.record_paid_order("SKU-0")
    """
)


def test_workers_merge_to_exact_totals(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(n)], env=env) for n in range(4)]
    assert [w.wait(timeout=120) for w in workers] == [0, 0, 0, 0]
    assert len(list(tmp_path.glob("counter_*.db"))) == 4

    merged = CollectorRegistry()
    MultiProcessCollector(merged, path=str(tmp_path))

    def total(name: str, **labels: str) -> float:
        return merged.get_sample_value(name, labels) or 0.0

    # Per worker: i in 0..249; conflicts where i % 5 == 0 (50), successes 200.
    successes = {f"SKU-{k}": sum(1 for i in range(250) if i % 3 == k and i % 5) for k in range(3)}
    conflicts = {
        f"SKU-{k}": sum(1 for i in range(250) if i % 3 == k and not i % 5) for k in range(3)
    }
    negatives = {
        f"SKU-{k}": sum(1 for i in range(250) if i % 3 == k and i % 50 == 1) for k in range(3)
    }
    for sku in successes:
        assert (
            total("stock_reservation_success_total", sku=sku, strategy="atomic")
            == 4 * successes[sku]
        )
        assert (
            total("stock_reservation_conflict_total", sku=sku, reason="out_of_stock")
            == 4 * conflicts[sku]
        )
        assert total("stock_inventory_negative_total", sku=sku) == 4 * negatives[sku]
    assert total("stock_reservation_duration_seconds_count", outcome="success") == 4 * 200
    assert total("stock_reservation_duration_seconds_count", outcome="out_of_stock") == 4 * 50
    assert total("stock_orders_paid_total", sku="SKU-0") == 4
