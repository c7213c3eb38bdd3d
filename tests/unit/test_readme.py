"""The README's quickstart runs as written and prints what the README says it prints."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block in the quickstart"
    return match.group(1)


def test_quickstart_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", quickstart()],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    logs = [json.loads(line) for line in lines if line.startswith("{")]
    events = [(e["event"], e.get("request_id")) for e in logs]
    assert ("stock_check", "R1") in events
    assert ("stock_update", "R1") in events
    assert ("stock_update", "R2") in events
    update = next(e for e in logs if e["event"] == "stock_update" and e["request_id"] == "R1")
    assert (update["from"], update["to"], update["success"]) == (1, 0, True)
    assert update["idempotency_key"] == "key-1"
    assert update["sku"] == "EGG-01"
    for expected in (
        'stock_reservation_success_total{sku="EGG-01",strategy="atomic"} 1.0',
        'stock_reservation_conflict_total{reason="out_of_stock",sku="EGG-01"} 1.0',
        'stock_orders_paid_total{sku="EGG-01"} 1.0',
    ):
        assert expected in lines
        assert expected in (ROOT / "README.md").read_text()
