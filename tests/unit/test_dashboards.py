"""The dashboards: committed JSON is fresh, passes the house linter, and every query parses.

The linter (:mod:`dashboards.lint`) is itself tested on broken copies of a dashboard, and
the parser on a broken expression, so that a clean result means something. promtool's own
check of every expression is in ``tests/integration/test_dashboards_promtool.py``.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard
from stocksentry.instrumentation import catalog

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dashboards import build, lint, panels, variables  # noqa: E402 - needs the repository root on sys.path

RULES_FILE = ROOT / "alert_rules" / "stocksentry.rules.yml"
UIDS = ("stocksentry-overview", "stocksentry-sku", "stocksentry-exporter")


RULES_SOURCE = ROOT / "alert_rules" / "source" / "stocksentry.rules.yml"


def _rules(path: Path = RULES_FILE) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in data["groups"] for rule in group["rules"]]


RECORDING_RULES = frozenset(r["record"] for r in _rules() if "record" in r)
ALERTS = frozenset(r["alert"] for r in _rules() if "alert" in r)
ALLOWED_METRICS = catalog.sample_names() | RECORDING_RULES | lint.BUILTIN_SERIES


def load(uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "dashboards" / f"{uid}.json").read_text())
    return data


def panel(board: dict[str, Any], title: str) -> dict[str, Any]:
    (found,) = (p for p in lint.iter_panels(board) if p["title"] == title)
    return found


# --- generated, and fresh ------------------------------------------------------------------


def test_committed_json_equals_a_fresh_build() -> None:
    assert build.stale(build.artefacts()) == [], "run `python dashboards/build.py`"


def test_check_flags_stale_missing_and_extra_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(build, "OUT_DIR", tmp_path)
    assert build.main(["--check"]) == 1  # nothing written yet
    assert build.main([]) == 0
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(build.BUILDERS)
    assert build.main(["--check"]) == 0
    overview = tmp_path / "stocksentry-overview.json"
    overview.write_text(overview.read_text().replace("Reservations", "Reservation"))
    assert build.main(["--check"]) == 1
    assert build.main([]) == 0
    (tmp_path / "old-dashboard.json").write_text("{}")
    assert build.main(["--check"]) == 1
    assert "old-dashboard.json" in capsys.readouterr().out


def test_build_script_runs_from_anywhere(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "dashboards" / "build.py"), "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("uid", UIDS)
def test_json_loads_back_into_the_sdk_model(uid: str) -> None:
    board = load(uid)
    model = Dashboard.from_json(board)
    assert model.uid == uid
    assert len(model.panels or []) == len(board["panels"])


# --- identity ------------------------------------------------------------------------------


def test_uids_are_the_stable_ones_and_name_the_files() -> None:
    assert sorted(build.BUILDERS) == sorted(f"{uid}.json" for uid in UIDS)
    assert [load(uid)["uid"] for uid in UIDS] == list(UIDS)
    assert (panels.OVERVIEW_UID, panels.SKU_UID, panels.EXPORTER_UID) == UIDS


def test_alert_dashboard_urls_point_at_built_dashboards() -> None:
    # The source's links (the rendered file has none while no Grafana address is given).
    urls = [r["annotations"]["dashboard_url"] for r in _rules(RULES_SOURCE) if "alert" in r]
    assert urls
    for url in urls:
        assert url.startswith("$dashboard_base/d/"), url
        match = re.search(r"/d/([\w-]+)(\?var-sku=)?", url)
        assert match, url
        assert match.group(1) in UIDS, url
        if match.group(2):
            assert match.group(1) == "stocksentry-sku"


def test_every_alert_of_the_rules_file_shows_in_the_firing_alerts_panel() -> None:
    (target,) = panel(load("stocksentry-overview"), "Firing alerts")["targets"]
    pattern = re.search(r'alertname=~"([^"]+)"', target["expr"])
    assert pattern
    # Prometheus anchors regex matchers.
    assert [a for a in sorted(ALERTS) if not re.fullmatch(pattern.group(1), a)] == []


# --- the linter ----------------------------------------------------------------------------


@pytest.mark.parametrize("uid", UIDS)
def test_dashboard_passes_the_linter(uid: str) -> None:
    assert lint.lint(load(uid), allowed_metrics=ALLOWED_METRICS, alerts=ALERTS) == []


@pytest.mark.parametrize("uid", UIDS)
def test_variables(uid: str) -> None:
    found = {v["name"]: v for v in lint.variables(load(uid))}
    expected = ["datasource", "cluster", "namespace", "job"] + (
        ["sku"] if uid == "stocksentry-sku" else []
    )
    assert list(found) == expected
    assert found["datasource"]["type"] == "datasource"
    assert found["datasource"]["query"] == "prometheus"
    for label in ("cluster", "namespace"):
        assert found[label]["allValue"] == ".*"  # also matches series without the label
    # namespace lists the namespaces of the chosen clusters
    assert lint.label_values_query(found["namespace"]["query"]) == (
        'stocksentry_build_info{cluster=~"$cluster"}',
        "namespace",
    )
    # One known metric each, never a regex over every series name of the TSDB.
    assert found["cluster"]["query"] == "label_values(stocksentry_build_info, cluster)"
    assert lint.label_values_query(found["job"]["query"]) == (
        '{__name__=~"stocksentry_build_info|stock_reservation_success_total",'
        ' cluster=~"$cluster", namespace=~"$namespace"}',
        "job",
    )
    for variable in found.values():
        assert ".+" not in str(variable.get("query")), variable["name"]
        assert variable.get("hide", 0) == 0, variable["name"]  # all shown by default
    if uid == "stocksentry-sku":
        assert lint.label_values_query(found["sku"]["query"]) == (
            f'{catalog.RESERVATION_SUCCESS.name}{{cluster=~"$cluster", namespace=~"$namespace",'
            ' job=~"$job"}',
            "sku",
        )
        assert found["sku"]["multi"] is False


def test_latency_panels_ask_for_exemplars() -> None:
    board = load("stocksentry-sku")
    for title in ("Reservation latency", "Reservation latency p50 / p99 by outcome"):
        assert all(t["exemplar"] is True for t in panel(board, title)["targets"]), title
    assert panel(board, "Reservation latency")["type"] == "heatmap"
    assert panel(board, "Reservation latency")["targets"][0]["format"] == "heatmap"


@pytest.mark.parametrize(
    "title",
    [
        "Negative-inventory SKUs (probe)",
        "Oversold units (probe)",
        "Negative stock writes by SKU (app)",
        "Refunds due to oversell",
    ],
)
def test_oversell_stats_are_big_and_red_above_zero(title: str) -> None:
    found = panel(load("stocksentry-overview"), title)
    assert found["type"] == "stat"
    assert found["options"]["colorMode"] == "background"
    steps = found["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps == [{"color": "green", "value": None}, {"color": "red", "value": 1e-9}]


def _broken(change: str) -> dict[str, Any]:
    board = copy.deepcopy(load("stocksentry-overview"))
    first = next(lint.iter_panels(board))
    target = first["targets"][0]
    if change == "window":
        target["expr"] = target["expr"].replace("$__rate_interval", "5m")
    elif change == "metric":
        target["expr"] = target["expr"].replace("stock_reservation", "stock_reservatoin")
    elif change == "unit":
        del first["fieldConfig"]["defaults"]["unit"]
    elif change == "description":
        first["description"] = ""
    elif change == "datasource":
        first["datasource"] = {"type": "prometheus", "uid": "prometheus-prod"}
    elif change == "target datasource":
        target["datasource"] = {"type": "prometheus", "uid": "prometheus-prod"}
    elif change == "runbook":
        first["description"] += " " + panels.runbook_url("StockNoSuchAlert")
    elif change == "variable":
        target["expr"] = target["expr"].replace("$job", "$region")
    elif change == "location":
        target["expr"] = "sum by (sku) (rate(stock_reservation_success_total[$__rate_interval]))"
    elif change == "offset":
        target["expr"] += " offset 1w"
    elif change == "id":
        first["id"] = board["panels"][0]["id"]
    elif change == "overlap":
        first["gridPos"]["x"] += 1
    elif change == "syntax":
        target["expr"] = target["expr"].rstrip(")")
    return board


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ("window", "hard-coded window(s) ['5m']"),
        ("metric", "unknown metric(s) ['stock_reservatoin_duration_seconds_count']"),
        ("unit", "no unit"),
        ("description", "description links no runbook"),
        ("datasource", "not ${datasource}"),
        ("target datasource", "query datasource is not ${datasource}"),
        ("runbook", "alerts the rules file lacks: ['StockNoSuchAlert']"),
        ("variable", "undefined variable(s) ['region']"),
        ("location", "sum by (sku) drops cluster, namespace"),
        ("offset", "hard-coded window(s) ['offset 1w']"),
        ("id", "missing or repeated"),
        ("overlap", "overlaps"),
        ("syntax", "does not parse: unclosed left parenthesis"),
    ],
)
def test_linter_catches(change: str, problem: str) -> None:
    problems = lint.lint(_broken(change), allowed_metrics=ALLOWED_METRICS, alerts=ALERTS)
    assert any(problem in p for p in problems), problems


def test_metric_names_skip_functions_labels_strings_and_windows() -> None:
    expr = (
        'sum by (sku) (rate(a_total{reason!="x y", l=~"b|c"}[$__range])) '
        "/ on (sku) group_left () rec:ord:rule offset 1w > bool 0.99 "
        "and histogram_quantile(0.9, sum by (le) (rate(h_bucket[1m]))) or vector(1e-3) "
        'unless label_replace(up, "dst", "$1", "src", "(.*)")'
    )
    assert lint.metric_names(expr) == {"a_total", "rec:ord:rule", "h_bucket", "up"}


def test_substitute_refuses_unknown_variables() -> None:
    assert lint.substitute("x[$__range] ${job}", {"__range": "1h", "job": "j"}) == "x[1h] j"
    with pytest.raises(KeyError):
        lint.substitute("x{a=$nope}", {})


# --- every expression parses ---------------------------------------------------------------


def all_expressions() -> dict[str, str]:
    """Every query and variable selector of the three dashboards, by where it lives."""
    exprs: dict[str, str] = {}
    for uid in UIDS:
        exprs.update(lint.expressions(load(uid)))
    return exprs


def test_every_expression_parses_with_promql_parser() -> None:
    """promtool checks them too (tests/integration/test_dashboards_promtool.py)."""
    exprs = all_expressions()
    assert len(exprs) > 60
    failures = {}
    for key, expr in exprs.items():
        try:
            lint.parse(expr)
        except (lint.PromQLSyntaxError, KeyError) as error:
            failures[key] = str(error)
    assert failures == {}


def test_parse_rejects_a_broken_expression() -> None:
    with pytest.raises(lint.PromQLSyntaxError, match="stock_orders_paid_total"):
        lint.parse("sum(rate(stock_orders_paid_total[1m])")


def test_plain_promql_replaces_windows_outside_strings_only() -> None:
    expr = 'rate(x{job=~"$job", a="[$__range]"}[$__rate_interval] offset $__range)'
    assert lint.plain_promql(expr) == 'rate(x{job=~"$job", a="[$__range]"}[1m] offset 1h)'
    with pytest.raises(KeyError):
        lint.plain_promql("topk($n, x)")


def test_digit_separators_are_the_documented_fallback() -> None:
    """Prometheus reads ``1_000``; promql-parser 0.12 does not, so they are dropped first."""
    assert lint.plain_promql("a_1_000 > 1_000 and b > 2") == "a_1_000 > 1000 and b > 2"
    assert lint.metric_names("a_1_000 > 1_000") == {"a_1_000"}


def test_single_cluster_mode_hides_the_cluster_variable(tmp_path: Path) -> None:
    try:
        assert build.main(["--single-cluster", "--output-dir", str(tmp_path)]) == 0
    finally:
        variables.set_single_cluster(False)  # the module's state, for the other tests
    for uid in UIDS:
        board = json.loads((tmp_path / f"{uid}.json").read_text(encoding="utf-8"))
        found = {v["name"]: v for v in lint.variables(board)}
        # Hidden (Grafana's hide: 2) and left at All, whose .* also matches no label.
        assert found["cluster"]["hide"] == 2
        assert found["cluster"]["allValue"] == ".*"
        assert found["cluster"]["current"]["value"] == ["$__all"]
        assert found["namespace"].get("hide", 0) == 0
        assert lint.lint(board, allowed_metrics=ALLOWED_METRICS, alerts=ALERTS) == []
    # The committed JSON is the multi-cluster build.
    assert build.main(["--check"]) == 0


def test_single_cluster_mode_needs_a_cluster_label(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--single-cluster", "--location-labels", "region,namespace", "--output-dir", "x"]
    try:
        assert build.main(argv) == 2
    finally:
        build.promql.set_location_labels(["cluster", "namespace"])
        variables.set_single_cluster(False)
    assert "the location labels region,namespace do not have" in capsys.readouterr().err
