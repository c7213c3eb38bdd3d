"""`stocksentry demo --strategy unsafe --contain`: the unsafe sale twice, the second one
contained by the whole chain (app metrics, the exporter's probe, Prometheus on the shipped
rules, Alertmanager, the exporter's freeze webhook, Redis, the lab checkout's freeze view).

The sale is paced over 15 s here (the demo's default is 40 s) to keep the test short; the
figures the closing note and docs/containment.md give come from default runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from stocksentry.exporter.lab.contain import CONTAINED, CONTAINED_SKU
from test_lab_embedded import demo_tmp, leftovers, run_demo, truth

pytestmark = pytest.mark.integration


def test_containment_stops_the_oversell_through_the_real_chain(tmp_path: Path) -> None:
    for binary in ("prometheus", "prometheus-alertmanager"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary} is needed (bash .ci/tools.sh)")
    with demo_tmp() as tmp:
        args = ["--strategy", "unsafe", "--contain", "--pace", "15", "--format", "json"]
        done = run_demo(tmp_path, tmp, *args, timeout=600)
        assert leftovers(tmp) == []
    items: dict[str, Any] = {item["strategy"]: item for item in json.loads(done.stdout)}
    assert list(items) == ["unsafe", CONTAINED]
    without, within = items["unsafe"], items[CONTAINED]
    figures = within["containment"]
    assert figures == without["containment"]
    assert figures["oversold_without"] == without["oversold"] > 0
    assert figures["oversold_with"] == within["oversold"]
    # Contained: the SKU was frozen by the alert and the checkout refused the rest.
    assert within["oversold"] < without["oversold"]
    assert within["conflicts"]["frozen"] == within["buyers"] - within["sold"] > 0
    assert "frozen" not in without["conflicts"]
    assert figures["seconds_to_freeze"] is not None
    assert figures["seconds_to_freeze"] >= 0
    assert "frozen by StockOversold (alert)" in within["notes"] or any(
        note.startswith("frozen by Stock") for note in within["notes"]
    )
    assert "StockSkuFrozenAutomatically" in within["alerts"]
    assert "StockSkuFrozenAutomatically" not in without["alerts"]
    # The metrics agree with the database in both runs, counted here by the test's SQL.
    for item in (without, within):
        assert item["consistent"], item["mismatches"]
    shop = truth(tmp_path / "stocksentry-demo.db", CONTAINED_SKU)
    assert shop["units"] == within["sold"]
    assert shop["duplicates"] == 0
    assert truth(tmp_path / "stocksentry-demo.db", "LAB-UNSAFE")["units"] == without["sold"]
