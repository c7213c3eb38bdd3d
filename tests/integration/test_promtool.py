"""promtool and amtool on the alert rules and the Alertmanager example, and a real Alertmanager.

``make tools`` installs promtool and amtool (Debian packages prometheus and
prometheus-alertmanager, which also ship the Alertmanager binary). Outputs are asserted
exactly; a failure shows the tool's own output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from polling import WaitTimeout, http_ok, wait_until
from processes import stop
from prom import free_port
from stocksentry.exporter.config.containment import DEFAULT_FREEZE_ALERTS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "alert_rules"
RULES_FILE = RULES_DIR / "stocksentry.rules.yml"
TESTS_DIR = RULES_DIR / "tests"
AM_FILE = RULES_DIR / "alertmanager.example.yml"
TEST_FILES = sorted(p.name for p in TESTS_DIR.glob("*.yml"))

RULES: dict[str, Any] = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
ALERTS: dict[str, dict[str, Any]] = {
    rule["alert"]: rule for group in RULES["groups"] for rule in group["rules"] if "alert" in rule
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: `make tools` installs it")
    return path


def run(
    *args: str | Path, cwd: Path = ROOT, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def show(done: subprocess.CompletedProcess[str]) -> str:
    return (
        f"$ {' '.join(done.args)}\nexit {done.returncode}\n"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )


# --- promtool -------------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    done = run(tool("promtool"), "check", "rules", "alert_rules/stocksentry.rules.yml")
    count = sum(len(group["rules"]) for group in RULES["groups"])
    expected = f"Checking alert_rules/stocksentry.rules.yml\n  SUCCESS: {count} rules found\n\n"
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, ""), show(done)


@pytest.fixture(scope="module")
def unit_test_runs() -> dict[str, subprocess.CompletedProcess[str]]:
    """``promtool test rules`` on each test file, one per CPU (the long-history files are slow)."""
    promtool = tool("promtool")
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = pool.map(
            lambda name: run(promtool, "test", "rules", name, cwd=TESTS_DIR), TEST_FILES
        )
        return dict(zip(TEST_FILES, runs, strict=True))


@pytest.mark.parametrize("name", TEST_FILES)
def test_promtool_unit_tests(
    name: str, unit_test_runs: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    done = unit_test_runs[name]
    expected = f"Unit Testing:  {name}\n  SUCCESS\n\n"
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, ""), show(done)


def _write_test(tmp_path: Path, series: str, values: str, **checks: Any) -> Path:
    """A promtool rule test: one input series every minute, and ``checks``."""
    test = {"interval": "1m", "input_series": [{"series": series, "values": values}], **checks}
    path = tmp_path / "case.yml"
    doc = {"rule_files": [str(RULES_FILE)], "evaluation_interval": "1m", "tests": [test]}
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def test_promtool_reports_a_wrong_expectation(tmp_path: Path) -> None:
    """The harness can fail: a StockOversold test that expects the wrong severity does."""
    expected = {"exp_labels": {"severity": "warning", "team": "checkout", "sku": "EGG-01"}}
    path = _write_test(
        tmp_path,
        'stock_oversold_units{sku="EGG-01"}',
        "3x5",
        alert_rule_test=[
            {"eval_time": "1m", "alertname": "StockOversold", "exp_alerts": [expected]}
        ],
    )
    done = run(tool("promtool"), "test", "rules", path)
    assert done.returncode == 1, show(done)
    assert (
        'Labels:{alertname="StockOversold", severity="critical", sku="EGG-01", team="checkout"}'
        in (done.stderr)
    ), show(done)


def test_promtool_rejects_a_series_named_like_a_recording_rule(tmp_path: Path) -> None:
    """Why the promo tests label their stocksentry:promo_active series source="test".

    An input series with exactly the name and labels of a recording rule's output collides
    with what the rule writes at the same timestamp, and promtool fails the test.
    """
    path = _write_test(
        tmp_path,
        "stocksentry:promo_active",
        "1x5",
        promql_expr_test=[
            {
                "expr": "stocksentry:promo_active",
                "eval_time": "1m",
                "exp_samples": [{"labels": "stocksentry:promo_active", "value": 1}],
            }
        ],
    )
    done = run(tool("promtool"), "test", "rules", path)
    assert done.returncode == 1, show(done)
    assert "rule: stocksentry:promo_active, time: 0s, err: duplicate sample for timestamp" in (
        done.stderr
    ), show(done)


def test_runbook_queries_parse(tmp_path: Path) -> None:
    """Every PromQL line of every runbook parses: promtool checks them as recording rules.

    (The same lines as tests/unit/test_rules.py's runbook_queries, which checks their names.)
    """
    rules: list[dict[str, str]] = []
    for path in sorted((ROOT / "docs" / "runbooks").glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"^```promql\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            for line in block.splitlines():
                query = re.sub(r"\s+#.*$", "", line).strip()
                if query:
                    rules.append({"record": f"runbook:{path.stem}:{len(rules)}", "expr": query})
    assert len(rules) >= len(ALERTS)
    path = tmp_path / "runbook-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": rules}]}))
    done = run(tool("promtool"), "check", "rules", path)
    expected = f"Checking {path}\n  SUCCESS: {len(rules)} rules found\n\n"
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, ""), show(done)


# --- amtool ---------------------------------------------------------------------------------

AM: dict[str, Any] = yaml.safe_load(AM_FILE.read_text(encoding="utf-8"))


def test_amtool_check_config() -> None:
    done = run(tool("amtool"), "check-config", "alert_rules/alertmanager.example.yml")
    expected = (
        "Checking 'alert_rules/alertmanager.example.yml'  SUCCESS\n"
        "Found:\n"
        " - global config\n"
        " - route\n"
        f" - {len(AM['inhibit_rules'])} inhibit rules\n"
        f" - {len(AM['receivers'])} receivers\n"
        " - 0 templates\n"
        "\n"
    )
    assert (done.returncode, done.stdout) == (0, expected), show(done)


def route(*labels: str, expect: str) -> subprocess.CompletedProcess[str]:
    return run(
        tool("amtool"),
        "config",
        "routes",
        "test",
        f"--config.file={AM_FILE}",
        f"--verify.receivers={expect}",
        *labels,
    )


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (("severity=critical", "team=checkout"), "oncall-pager"),
        (("severity=warning", "team=checkout"), "team-checkout"),
        (("severity=info", "team=checkout"), "null"),
        (("severity=critical", "team=sre"), "sre-pager"),
        (("severity=warning", "team=sre"), "sre-channel"),
        (("severity=info", "team=sre"), "null"),
        # A team without a route of its own: critical still pages, the rest goes to SRE.
        (("severity=critical", "team=payments"), "oncall-pager"),
        (("severity=warning", "team=payments"), "sre-channel"),
        ((), "sre-channel"),
    ],
    ids=lambda v: ",".join(v) if isinstance(v, tuple) else v,
)
def test_amtool_routes(labels: tuple[str, ...], receiver: str) -> None:
    done = route(*labels, expect=receiver)
    assert (done.returncode, done.stdout) == (0, f"{receiver}\n"), show(done)


RECEIVER_BY_ROUTING = {
    ("critical", "checkout"): "oncall-pager",
    ("warning", "checkout"): "team-checkout",
    ("critical", "sre"): "sre-pager",
    ("warning", "sre"): "sre-channel",
}


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_amtool_routes_every_alert(name: str) -> None:
    """Each alert of the rules file, with its own labels, reaches the receiver they promise."""
    labels = ALERTS[name]["labels"]
    severity, team = labels["severity"], labels["team"]
    expect = "null" if severity == "info" else RECEIVER_BY_ROUTING[(severity, team)]
    if name in DEFAULT_FREEZE_ALERTS:
        # They reach the freeze webhook first and go on to their pager (continue: true).
        expect = f"stocksentry-freeze,{expect}"
    done = route(f"alertname={name}", *(f"{k}={v}" for k, v in labels.items()), expect=expect)
    assert (done.returncode, done.stdout) == (0, f"{expect}\n"), show(done)


# --- a real Alertmanager: inhibition --------------------------------------------------------


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """The example config in a fresh Alertmanager of the test's own (no cluster); its URL."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.fail("Alertmanager is not on PATH: `make tools` installs it")
    port = free_port()
    data = tmp_path
    log = (data / "alertmanager.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={AM_FILE}",
            f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(
                    "Alertmanager did not start:\n" + (data / "alertmanager.log").read_text()
                )
            return http_ok(f"{base}/-/ready")

        try:
            wait_until(ready, timeout=20, interval=0.1)
        except WaitTimeout:
            pytest.fail("Alertmanager did not start:\n" + (data / "alertmanager.log").read_text())
        yield base
    finally:
        stop(proc)
        log.close()


def _post(base: str, alerts: list[dict[str, str]]) -> None:
    body = json.dumps([{"labels": labels} for labels in alerts]).encode()
    request = urllib.request.Request(
        f"{base}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        assert resp.status == 200


def _states(base: str, case: str) -> dict[frozenset[tuple[str, str]], str]:
    """This case's alerts in Alertmanager: label set -> active or suppressed."""
    url = f"{base}/api/v2/alerts?filter=case%3D%22{case}%22"
    with urllib.request.urlopen(url, timeout=5) as resp:
        alerts = json.load(resp)
    return {frozenset(a["labels"].items()): a["status"]["state"] for a in alerts}


SRE0 = {"team": "sre", "job": "stocksentry", "instance": "s-0:19464"}
SRE1 = {"team": "sre", "job": "stocksentry", "instance": "s-1:19464"}
CHECKOUT = {"team": "checkout"}
ON, MUTED = "active", "suppressed"


def alert(name: str, severity: str, state: str, **labels: str) -> tuple[dict[str, str], str]:
    """An alert's labels, and the state Alertmanager must give it."""
    return {"alertname": name, "severity": severity, **labels}, state


# Each case: the alerts fired together, each with the state Alertmanager must give it.
INHIBITION_CASES = {
    "exporter-down-mutes-its-probe-alerts": [
        alert("StocksentryExporterDown", "critical", ON, **SRE0),
        alert("StocksentryProbeDown", "warning", MUTED, probe="oversold", **SRE0),
        alert("StocksentryProbeStale", "warning", MUTED, probe="outbox", **SRE0),
        # Another instance's probe, and the invariant alerts, are not muted.
        alert("StocksentryProbeDown", "warning", ON, probe="oversold", **SRE1),
        alert(
            "StockNegativeInventory",
            "critical",
            ON,
            team="checkout",
            job="stocksentry",
            instance="s-0:19464",
        ),
    ],
    "probe-down-mutes-its-own-staleness": [
        alert("StocksentryProbeDown", "warning", ON, probe="oversold", **SRE0),
        alert("StocksentryProbeStale", "warning", MUTED, probe="oversold", **SRE0),
        alert("StocksentryProbeStale", "warning", ON, probe="outbox", **SRE0),
    ],
    "promo-lock-wait-mutes-the-everyday-one": [
        alert("StockLockWaitHighDuringPromo", "critical", ON, table="products", **CHECKOUT),
        alert("StockLockWaitHigh", "warning", MUTED, table="products", **CHECKOUT),
        alert("StockLockWaitHigh", "warning", ON, table="orders", **CHECKOUT),
    ],
    "page-mutes-ticket": [
        alert("CheckoutErrorBudgetBurnFast", "critical", ON, **CHECKOUT),
        alert("CheckoutErrorBudgetBurnSlow", "warning", MUTED, **CHECKOUT),
    ],
    # No rule has two severities today; the inhibit rule is there for when one does.
    "critical-mutes-warning-of-same-alert-and-sku": [
        alert("StockOversold", "critical", ON, sku="EGG-01", **CHECKOUT),
        alert("StockOversold", "warning", MUTED, sku="EGG-01", **CHECKOUT),
        alert("StockOversold", "warning", ON, sku="EGG-02", **CHECKOUT),
    ],
}


@pytest.mark.parametrize("case", sorted(INHIBITION_CASES))
def test_alertmanager_inhibition(alertmanager: str, case: str) -> None:
    alerts = [({**labels, "case": case}, state) for labels, state in INHIBITION_CASES[case]]
    _post(alertmanager, [labels for labels, _ in alerts])
    expected = {frozenset(labels.items()): state for labels, state in alerts}
    # The inhibitor learns of new alerts from a subscription, a moment after the POST: wait
    # for the expected states (a few milliseconds; seconds on a loaded machine).
    states = wait_until(
        lambda: _states(alertmanager, case),
        accept=lambda got: got == expected,
        timeout=30,
        message=lambda got: f"states {got} != {expected}",
    )
    assert states == expected
