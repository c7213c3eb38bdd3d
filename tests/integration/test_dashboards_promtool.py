"""promtool parses every expression of the dashboards, and rejects a broken one.

The unit suite parses the same expressions with promql-parser
(``tests/unit/test_dashboards.py``); promtool is the final word on what Prometheus accepts.
``make tools`` installs it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dashboards import lint  # noqa: E402 - needs the repository root on sys.path

pytestmark = pytest.mark.integration

UIDS = ("stocksentry-overview", "stocksentry-sku", "stocksentry-exporter")
#: Template values for promtool: a real window, a lab SKU, the job of the alert rules.
PROMTOOL_VALUES = {
    "__rate_interval": "1m",
    "__range": "1h",
    "__interval": "1m",
    "cluster": ".*",
    "namespace": ".*",
    "job": "stocksentry",
    "sku": "LAB-UNSAFE",
}


def _promtool_check(exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Write each expression as a recording rule of its own group and check the file."""
    groups = [
        {"name": name, "rules": [{"record": f"dashboard_check_{i}", "expr": expr}]}
        for i, (name, expr) in enumerate(exprs.items())
    ]
    rules = tmp_path / "dashboards.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH: `make tools` installs it")
    return subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )


def _all_expressions() -> dict[str, str]:
    exprs: dict[str, str] = {}
    for uid in UIDS:
        board = json.loads((ROOT / "dashboards" / f"{uid}.json").read_text())
        for key, expr in lint.expressions(board).items():
            exprs[key] = lint.substitute(expr, PROMTOOL_VALUES)
    return exprs


def test_every_expression_parses(tmp_path: Path) -> None:
    exprs = _all_expressions()
    assert len(exprs) > 60
    result = _promtool_check(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_promtool_check_rejects_a_broken_expression(tmp_path: Path) -> None:
    result = _promtool_check({"broken": "sum(rate(stock_orders_paid_total[1m])"}, tmp_path)
    assert result.returncode != 0
    assert "broken" in result.stdout + result.stderr
