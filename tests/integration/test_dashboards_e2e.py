"""Every dashboard query returns data from a real Prometheus scraping the flash-sale lab.

The lab (``stocksentry demo``) runs its unsafe, check_then_decrement and atomic strategies
and serves ``/metrics``; a Prometheus of the test's own scrapes it every second with the
project's rules loaded. Then every panel query of the three dashboards, with the
template variables filled in as Grafana would, must return at least one series, except
the queries listed in :data:`NO_LAB_DATA`, whose metrics the lab cannot produce yet. The
test fails when a listed query starts returning data, so the list shrinks as features
land. A counter that exists but stayed at zero returns a zero-valued series, which counts
as data.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from polling import WaitTimeout, wait_until
from processes import stop
from prom import Prometheus, free_port

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dashboards import lint  # noqa: E402 - needs the repository root on sys.path

pytestmark = [pytest.mark.integration]

JOB = "stocksentry"
DEEP_DIVE_SKU = "LAB-CHECK_THEN_DECREMENT"
STRATEGIES = ("unsafe", "check_then_decrement", "naive_lock", "atomic")
REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
# Smaller than the lab's default so the whole test stays well under a minute; Redis for
# the naive lock, a share of retried intents and a late cache so those panels get data.
LAB_ARGS = [
    *("--strategy", ",".join(STRATEGIES)),
    *("--buyers", "300", "--stock", "60", "--concurrency", "50", "--work-ms", "5"),
    *("--redis", REDIS_URL, "--retries", "0.2", "--stale-cache"),
]
LINGER_S = 300  # an upper bound: the test stops the lab as soon as it is done
#: How long the lab's sale may take before its report: a bound for a loaded machine, far
#: above the few seconds it takes alone (a CI run beside other test processes took >40 s).
REPORT_TIMEOUT_S = 180
#: What Grafana would put in: one job, every cluster and namespace, a window of at least
#: four scrapes, a range longer than the test so that every series was born inside it.
VALUES = {
    "__rate_interval": "1m",
    "__range": "5m",
    "__interval": "1s",
    "cluster": ".*",
    "namespace": ".*",
    "job": JOB,
    "sku": DEEP_DIVE_SKU,
}
# A rule of the test's own that always fires, so the "Firing alerts" panel has a real
# ALERTS series to show: no project alert is certain to fire on the lab's data.
ALWAYS_FIRING = """\
groups:
  - name: dashboards-e2e
    rules:
      - alert: StockDashboardE2EAlwaysFiring
        expr: vector(1)
        labels:
          severity: none
"""

_PROBE = "probe metric: computed by the exporter sidecar's database or Redis probes, not the lab"
_WATCHER = (
    "Redis lock watcher metric: the sidecar's lock_watch, not the lab (its panels are "
    "checked against a real watcher in test_node_app.py)"
)
_RETRIES = "lab retries resend the same payload: replays, never a key conflict"
_FREEZES = (
    "freeze metric: read from Redis by the sidecar's containment section, not the lab (the "
    "lab's --contain run and test_freeze_webhook.py check it)"
)
_HEALTHY = (
    "a labelled counter has no series until its first increment, and the lab never "
    "overflows the guard (its SKUs are promo SKUs)"
)

#: (dashboard uid, panel title) -> (refIds expected to return nothing, why). Threshold
#: queries of the same panels (recording rules) do return data and are not listed.
NO_LAB_DATA: dict[tuple[str, str], tuple[str, str]] = {
    # --- overview ---
    ("stocksentry-overview", "Negative-inventory SKUs (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Oversold units (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "SKUs frozen (containment)"): ("A", _FREEZES),
    # A and B (the app's per-table counters) show zeros: the integration creates the
    # configured tables' series at zero.
    ("stocksentry-overview", "Deadlocks and serialization failures"): (
        "C",
        "C (pg_stat_database) is a " + _PROBE,
    ),
    ("stocksentry-overview", "Sessions waiting for a lock (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Longest current lock wait (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Idempotency replays and key conflicts"): ("B", _RETRIES),
    ("stocksentry-overview", "Duplicate order keys (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Cache drift (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Outbox lag (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Outbox pending events (probe)"): ("A", _PROBE),
    ("stocksentry-overview", "Probe health"): ("A", _PROBE),
    # --- SKU deep dive ---
    ("stocksentry-sku", "Oversold units (probe)"): ("A", _PROBE),
    # --- exporter and probes ---
    ("stocksentry-exporter", "Probes up"): ("A", _PROBE),
    ("stocksentry-exporter", "Probe duration"): ("A", _PROBE),
    ("stocksentry-exporter", "Probe data age"): ("A", _PROBE),
    ("stocksentry-exporter", "Label overflow"): ("A", _HEALTHY),
    ("stocksentry-exporter", "Lock watcher subscribed"): ("A", _WATCHER),
    ("stocksentry-exporter", "Keyspace notification flags"): ("A", _WATCHER),
    ("stocksentry-exporter", "Lock notifications"): ("A", _WATCHER),
    # B and C, expiries and foreign releases, come from the lab's lock wrapper too.
    ("stocksentry-exporter", "Lock acquisitions, expiries and foreign releases"): (
        "A",
        _WATCHER,
    ),
    ("stocksentry-exporter", "Leases the watcher lost"): ("AB", _WATCHER),
}
UIDS = ("stocksentry-overview", "stocksentry-sku", "stocksentry-exporter")


def load(uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "dashboards" / f"{uid}.json").read_text())
    return data


@dataclass(frozen=True)
class Sale:
    """The running set-up: Prometheus with the lab's data, and the lab's own report."""

    prom: Prometheus
    report: dict[str, dict[str, Any]]  # strategy -> the lab's JSON result


def _read_report(lab: subprocess.Popen[str], timeout: float) -> list[dict[str, Any]]:
    """The lab's JSON report; the lab keeps running (lingering) after printing it."""
    lines: list[str] = []
    done = threading.Event()

    def reader() -> None:
        assert lab.stdout is not None
        for line in lab.stdout:
            lines.append(line)
            if line.rstrip("\n") == "]":  # json.dumps(indent=2) closes the list alone
                break
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no lab report in {timeout} s: {''.join(lines)[-2000:]}")
    report: list[dict[str, Any]] = json.loads("".join(lines))
    return report


@pytest.fixture(scope="module")
def sale(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sale]:
    work = tmp_path_factory.mktemp("dashboards-e2e")
    always_firing = work / "always-firing.rules.yml"
    always_firing.write_text(ALWAYS_FIRING)
    lab_stderr = (work / "lab.stderr").open("w")
    port = free_port()
    rules = [ROOT / "alert_rules" / "stocksentry.rules.yml", always_firing]
    with Prometheus({JOB: [f"127.0.0.1:{port}"]}, rule_files=rules) as prom:
        lab = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stocksentry.exporter",
                "demo",
                *LAB_ARGS,
                "--metrics-port",
                str(port),
                "--linger",
                str(LINGER_S),
                "--format",
                "json",
                "--quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=lab_stderr,  # a file: an unread pipe could block the lab
            text=True,
        )
        try:
            try:
                report = {r["strategy"]: r for r in _read_report(lab, timeout=REPORT_TIMEOUT_S)}
            except (TimeoutError, ValueError) as exc:
                raise AssertionError(
                    f"{exc}\nlab stderr: {(work / 'lab.stderr').read_text()[-2000:]}"
                ) from exc
            assert set(report) == set(STRATEGIES)
            # Prometheus has the final figures once the last strategy's total is scraped...
            atomic = report["atomic"]
            prom.wait_for(
                f'stock_reservation_success_total{{sku="{atomic["sku"]}"}} == {atomic["sold"]}'
            )
            # ... and rate() needs a second sample of the newest series: two more scrapes.
            scrapes = f'count_over_time(up{{job="{JOB}"}}[10m])'
            (before,) = prom.wait_for(scrapes)
            prom.wait_for(
                scrapes,
                lambda result: float(result[0]["value"][1]) >= float(before["value"][1]) + 2,
            )
            yield Sale(prom, report)
        finally:
            stop(lab)
            lab_stderr.close()


def _empty_refs(prom: Prometheus, uid: str, expected: dict[str, str]) -> dict[str, str]:
    """Panel title -> refIds whose query returned no series.

    Recording rules and alerts settle a few evaluations after the data: query again until
    the answer is ``expected`` (at once, when it already is) or the wait runs out, and
    return the last answer.
    """
    queries = [
        (panel["title"], target["refId"], lint.substitute(target["expr"], VALUES))
        for panel, target in lint.iter_targets(load(uid))
    ]

    latest: dict[str, str] = {}

    def empty() -> dict[str, str]:
        latest.clear()
        for title, ref, expr in queries:
            if not prom.query(expr):
                latest[title] = latest.get(title, "") + ref
        return dict(latest)

    with contextlib.suppress(WaitTimeout):  # the caller compares, and shows the difference
        wait_until(empty, accept=lambda found: found == expected, timeout=30, interval=0.5)
    return latest


@pytest.mark.parametrize("uid", UIDS)
def test_every_panel_has_data_except_the_listed_ones(sale: Sale, uid: str) -> None:
    expected = {title: refs for (u, title), (refs, _) in NO_LAB_DATA.items() if u == uid}
    assert _empty_refs(sale.prom, uid, expected) == expected


def test_allow_list_names_real_panels_and_gives_reasons() -> None:
    titles = {(uid, p["title"]) for uid in UIDS for p in lint.iter_panels(load(uid))}
    assert set(NO_LAB_DATA) <= titles
    assert all(reason for _, reason in NO_LAB_DATA.values())


def _instant(sale: Sale, uid: str, title: str) -> list[Any]:
    (panel,) = (p for p in lint.iter_panels(load(uid)) if p["title"] == title)
    return sale.prom.query(lint.substitute(panel["targets"][0]["expr"], VALUES))


def _by_label(result: list[Any], label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in result}


def test_negative_writes_show_the_labs_count(sale: Sale) -> None:
    negative = sale.report["check_then_decrement"]["negative_writes"]
    assert negative > 0
    overview = _by_label(
        _instant(sale, "stocksentry-overview", "Negative stock writes by SKU (app)"), "sku"
    )
    # Every promo SKU's series exists from the start (at zero), so each lab SKU is listed.
    assert overview == {r["sku"]: r["negative_writes"] for r in sale.report.values()}
    assert overview[DEEP_DIVE_SKU] == negative
    deep_dive = _instant(sale, "stocksentry-sku", "Negative stock writes")
    assert [float(r["value"][1]) for r in deep_dive] == [negative]


def test_conflict_panels_show_the_labs_counts(sale: Sale) -> None:
    # Promo SKUs' conflict series start at zero, so SKUs without conflicts show 0.
    expected = {r["sku"]: float(sum(r["conflicts"].values())) for r in sale.report.values()}
    top = _by_label(_instant(sale, "stocksentry-overview", "Top SKUs by conflicts"), "sku")
    assert top == expected
    by_reason = _by_label(_instant(sale, "stocksentry-sku", "Conflicts by reason"), "reason")
    reasons = sale.report["check_then_decrement"]["conflicts"]
    assert {k: v for k, v in by_reason.items() if v} == reasons


def test_firing_alerts_panel_lists_a_firing_alert(sale: Sale) -> None:
    rows = _instant(sale, "stocksentry-overview", "Firing alerts")
    assert "StockDashboardE2EAlwaysFiring" in {r["metric"]["alertname"] for r in rows}


def test_variable_queries_list_the_lab(sale: Sale) -> None:
    found: dict[str, list[str]] = {}
    for variable in lint.variables(load("stocksentry-sku")):
        parsed = lint.label_values_query(str(variable.get("query", "")))
        if parsed is not None:
            selector, label = parsed
            match = lint.substitute(selector, VALUES)
            found[variable["name"]] = sale.prom.label_values(label, [match])
    assert found["job"] == [JOB]
    assert found["cluster"] == []  # one Prometheus, no cluster label; "All" (.*) still matches
    assert found["namespace"] == []  # no Kubernetes here; "All" (.*) still matches
    assert sorted(found["sku"]) == sorted(r["sku"] for r in sale.report.values())
