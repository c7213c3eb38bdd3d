"""The alert rules against the catalog, the runbooks and their promtool tests (no promtool).

``alert_rules/stocksentry.rules.yml`` is rendered by ``alert_rules/render.py`` from the
hand-written ``alert_rules/source/stocksentry.rules.yml``; these checks keep both honest: every
alert carries the routing labels and annotations Alertmanager and on-call rely on, every
runbook link resolves to a file in ``docs/runbooks/``, every metric an expression names is
one the catalog defines (so a rename breaks here, not on a silent panel), and every alert
has a promtool test that fires it with exact labels and one that keeps it quiet. Metric
names come from promql-parser's syntax tree (:func:`dashboards.lint.metric_names`).
``tests/integration/test_promtool.py`` runs promtool and amtool themselves.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from stocksentry.exporter.durations import parse_duration
from stocksentry.instrumentation import catalog

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dashboards import lint  # noqa: E402 - needs the repository root on sys.path

sys.path.insert(0, str(ROOT / "alert_rules"))
import render  # noqa: E402 - alert_rules/render.py, a script beside the rules

RULES_FILE = ROOT / "alert_rules" / "stocksentry.rules.yml"
SOURCE_FILE = ROOT / "alert_rules" / "source" / "stocksentry.rules.yml"
TESTS_DIR = ROOT / "alert_rules" / "tests"
RUNBOOKS_DIR = ROOT / "docs" / "runbooks"
ALERTMANAGER_FILE = ROOT / "alert_rules" / "alertmanager.example.yml"
README_FILE = ROOT / "alert_rules" / "README.md"

RUNBOOK_BASE = "https://github.com/stocksentry/stocksentry/blob/main/docs/runbooks/"
SEVERITIES = {"critical", "warning", "info"}
#: Annotations of every rendered alert; the source also gives each a dashboard_url, which
#: the rendering keeps only when a Grafana address is given.
ANNOTATIONS = {"summary", "description", "runbook_url"}
#: The location labels of the committed rendering, as the expressions spell them.
LOCATION = ", ".join(render.DEFAULT_LOCATION_LABELS)
#: Series Prometheus makes itself that rules may use.
# `up` comes from the scrape; `ALERTS` from the rule evaluator (the stock pages that hold
# themselves through a probe outage read it).
PROMETHEUS_BUILTINS = frozenset({"up", "ALERTS"})

# --- metric names, from promql-parser's syntax tree (dashboards.lint) -------------------------

metric_names = lint.metric_names


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            'sum by (sku) (rate(stock_reservation_conflict_total{reason!="out_of_stock"}[5m]))',
            {"stock_reservation_conflict_total"},
        ),
        (
            "histogram_quantile(0.99,\n  sum by (le, table) (rate(x_seconds_bucket[5m])))",
            {"x_seconds_bucket"},
        ),
        (
            "a:ratio:rate5m > on() group_left() b:threshold and on() c == 1",
            {"a:ratio:rate5m", "b:threshold", "c"},
        ),
        ("sum(increase(x_total[1h] offset 1w)) or on() vector(0)", {"x_total"}),
        ("rate(x_total[5m] offset -30m)", {"x_total"}),
        ("time() - last_success_seconds > bool 300", {"last_success_seconds"}),
        ('absent(up{job="stocksentry"})', {"up"}),
        ('label_replace(x, "dst", "$1", "src", "(.*)")', {"x"}),
        ("max_over_time(x[1h:5m]) unless ignoring(instance, job) y", {"x", "y"}),
        ("sum(x) by (sku) / sum(y) without (instance)", {"x", "y"}),
        ("a AND b OR c UNLESS d", {"a", "b", "c", "d"}),
        ('topk(5, x) + quantile(0.9, y) + count_values("v", z)', {"x", "y", "z"}),
        ("x > Inf or y < -NaN or z > 1.5e3", {"x", "y", "z"}),
        ("x * on(sku) group_right(strategy) y", {"x", "y"}),
        ("rate(x[1h30m] @ end())", {"x"}),
        ("rate(x[5m] @ start()) or y @ 100", {"x", "y"}),
        ('x{a="{b}", c=~"[d]"} + y', {"x", "y"}),
        ("vector(0.995)", set()),
        ("1 - stocksentry:checkout_slo_objective", {"stocksentry:checkout_slo_objective"}),
    ],
)
def test_metric_names(expr: str, expected: set[str]) -> None:
    assert metric_names(expr) == expected


@pytest.mark.parametrize(
    "expr",
    [
        "rate(x[1h30m]) @ end()",  # @ binds to a selector, not to a function's result
        "sum(rate(x[5m])",
        "x offset 5m offset 1m",
    ],
)
def test_metric_names_refuses_what_prometheus_refuses(expr: str) -> None:
    with pytest.raises(lint.PromQLSyntaxError):
        metric_names(expr)


# --- the rules file -------------------------------------------------------------------------


def _load(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


RULES: dict[str, Any] = _load(RULES_FILE)
SOURCE_ALERTS: dict[str, dict[str, Any]] = {
    r["alert"]: r for g in _load(SOURCE_FILE)["groups"] for r in g["rules"] if "alert" in r
}
GROUPS: list[dict[str, Any]] = RULES["groups"]
ALL_RULES: list[dict[str, Any]] = [rule for group in GROUPS for rule in group["rules"]]
ALERTS: dict[str, dict[str, Any]] = {r["alert"]: r for r in ALL_RULES if "alert" in r}
RECORDS: set[str] = {r["record"] for r in ALL_RULES if "record" in r}
SETTINGS: list[dict[str, Any]] = next(
    g["rules"] for g in GROUPS if g["name"] == "stocksentry-settings"
)


def _rule_id(rule: dict[str, Any]) -> str:
    return str(rule.get("alert") or rule.get("record"))


def test_rules_file_shape() -> None:
    names = [_rule_id(r) for r in ALL_RULES]
    assert len(names) == len(set(names)), "a rule name is used twice"
    assert GROUPS[0]["name"] == "stocksentry-settings"
    for rule in SETTINGS:
        assert "record" in rule, f"{_rule_id(rule)}: the settings group holds constants only"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_routing_labels(name: str) -> None:
    labels = ALERTS[name].get("labels", {})
    assert labels.get("severity") in SEVERITIES, f"{name}: severity {labels.get('severity')!r}"
    assert labels.get("team"), f"{name}: no team label"
    assert re.fullmatch(r"[a-z][a-z0-9-]*", labels["team"]), labels["team"]


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_annotations(name: str) -> None:
    annotations = ALERTS[name].get("annotations", {})
    missing = ANNOTATIONS - set(annotations)
    assert not missing, f"{name}: missing annotations {sorted(missing)}"
    for key in ANNOTATIONS:
        assert str(annotations[key]).strip(), f"{name}: empty {key}"
    assert annotations["runbook_url"] == f"{RUNBOOK_BASE}{name}.md"
    assert "dashboard_url" not in annotations  # no Grafana address by default
    source = SOURCE_ALERTS[name]["annotations"]
    assert source["runbook_url"] == f"$runbook_base/{name}.md"
    assert source["dashboard_url"].startswith("$dashboard_base/d/stocksentry-")


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_runbook_exists(name: str) -> None:
    url = ALERTS[name]["annotations"]["runbook_url"]
    assert url.startswith(RUNBOOK_BASE), url
    path = RUNBOOKS_DIR / url.removeprefix(RUNBOOK_BASE)
    assert path.is_file(), f"{name}: {path.relative_to(ROOT)} does not exist"
    text = path.read_text(encoding="utf-8")
    assert text.startswith(f"# {name}\n"), f"{path.name}: the first line names the alert"


def test_every_runbook_belongs_to_an_alert() -> None:
    runbooks = {p.stem for p in RUNBOOKS_DIR.glob("*.md")}
    assert runbooks == set(ALERTS), {
        "runbooks without an alert": sorted(runbooks - set(ALERTS)),
        "alerts without a runbook": sorted(set(ALERTS) - runbooks),
    }


KNOWN_NAMES = catalog.sample_names() | RECORDS | PROMETHEUS_BUILTINS

_PROMQL_BLOCK = re.compile(r"^```promql\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runbook_queries(text: str) -> list[str]:
    """The PromQL of a runbook: each line of its ```promql blocks, trailing comment dropped."""
    queries: list[str] = []
    for block in _PROMQL_BLOCK.findall(text):
        for line in block.splitlines():
            query = re.sub(r"\s+#.*$", "", line).strip()
            if query:
                queries.append(query)
    return queries


@pytest.mark.parametrize("rule", ALL_RULES, ids=_rule_id)
def test_expression_names_exist(rule: dict[str, Any]) -> None:
    unknown = metric_names(rule["expr"]) - KNOWN_NAMES
    assert not unknown, f"{_rule_id(rule)} uses names outside the catalog: {sorted(unknown)}"


def test_runbook_queries() -> None:
    text = "x\n```promql\nup   # all targets\n\nrate(a[5m])\n```\n```sql\nSELECT 1;\n```\n"
    assert runbook_queries(text) == ["up", "rate(a[5m])"]


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_runbook_queries_name_known_metrics(name: str) -> None:
    """The PromQL a runbook tells on-call to paste names metrics that exist."""
    queries = runbook_queries((RUNBOOKS_DIR / f"{name}.md").read_text(encoding="utf-8"))
    assert queries, f"{name}.md has no ```promql block"
    for query in queries:
        unknown = metric_names(query) - KNOWN_NAMES
        assert not unknown, f"{name}.md: {query!r} uses unknown names {sorted(unknown)}"


def _flat(expr: str) -> str:
    """``expr`` on one line, without the blanks just inside parentheses."""
    text = " ".join(expr.split())
    return re.sub(r"\(\s+", "(", re.sub(r"\s+\)", ")", text))


_INCREASE_ABOVE_ZERO = re.compile(
    r"sum by \((?P<by>[^()]*)\) \(increase\((?P<metric>[a-z_:]+)\[(?P<window>\w+)\]\)\) > 0"
)
#: Alerts that fire on any increase of a counter, and so must also count a series born
#: between two scrapes at its full count (alert_rules/README.md, "Counters born at their
#: full count"). StockDeadlocksIncreasing does it in its promo half only.
NEWBORN_ALERTS = frozenset(
    {
        "StockNegativeWrite",
        "StockRefundDueToOversell",
        "StockLockExpiredWhileHeld",
        "StockLockReleaseNotOwned",
        "StockLockStaleFencingToken",
        "StockUnsafeReadModifyWrite",
        "StockIdempotencyKeyConflict",
        "StockDeadlocksIncreasing",
    }
)


#: Counter alerts on the exporter's own counters, whose every label value is exported at 0
#: from the start (docs/exporter-server.md): increase() sees their first event, no
#: series is ever born at its full count.
STARTS_AT_ZERO = frozenset(
    {
        "StocksentryCollectorErrors",
        "StocksentryMultiprocessFilesSkipped",
        "StockSkuFrozenAutomatically",
        "StockFreezeLimitReached",
    }
)


def newborn_guard(window: str) -> str:
    """Which targets' newborn series count: scraped successfully ``window`` ago, or new
    since (no ``up`` of theirs then) while Prometheus scraped other targets then."""
    return (
        f"(up offset {window} == 1) or ((up unless on({LOCATION}, instance, job)"
        f" (up offset {window})) and on({LOCATION}) (count by ({LOCATION})"
        f" (up offset {window}) > 0))"
    )


def newborn_half(by: str, metric: str, window: str) -> str:
    """The clause that counts a series born within ``window`` (see :func:`newborn_guard`)."""
    return (
        f"sum by ({by}) (({metric} unless {metric} offset {window})"
        f" and on({LOCATION}, instance, job) ({newborn_guard(window)})) > 0"
    )


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_counter_alerts_count_newborn_series(name: str) -> None:
    """Every ``increase(x[w]) > 0`` of an alert without a ``for`` has its newborn half.

    (An alert with a ``for`` as long as its window, StocksentryInstrumentationErrors,
    could never hold a newborn series long enough; it is info-only and left out.)
    """
    rule = ALERTS[name]
    expr = _flat(rule["expr"])
    found = list(_INCREASE_ABOVE_ZERO.finditer(expr))
    if name not in NEWBORN_ALERTS:
        assert not found or "for" in rule or name in STARTS_AT_ZERO, (
            f"{name}: increase() > 0 without the newborn half"
        )
        return
    assert found, f"{name}: no increase() > 0"
    for match in found:
        by, metric, window = match.group("by", "metric", "window")
        half = newborn_half(by, metric, window)
        assert f"{match.group(0)} or {half}" in expr, f"{name}: missing {half!r}"


def test_newborn_half_is_the_documented_one() -> None:
    expr = _flat(ALERTS["StockNegativeWrite"]["expr"])
    assert expr == (
        "sum by (cluster, namespace, sku) (increase(stock_inventory_negative_total[5m])) > 0"
        " or sum by (cluster, namespace, sku) ((stock_inventory_negative_total unless"
        " stock_inventory_negative_total offset 5m) and on(cluster, namespace, instance, job)"
        " ((up offset 5m == 1) or ((up unless on(cluster, namespace, instance, job)"
        " (up offset 5m)) and on(cluster, namespace) (count by (cluster, namespace)"
        " (up offset 5m) > 0)))) > 0"
    )
    readme = _flat(README_FILE.read_text(encoding="utf-8"))
    assert expr in readme


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_dashboard_sku_is_url_escaped(name: str) -> None:
    """A SKU may hold ``/``, ``#`` or ``+`` (the guard keeps them): escape it in the link."""
    url = SOURCE_ALERTS[name]["annotations"]["dashboard_url"]
    assert "$labels.sku }}" not in url, url
    if "var-sku=" in url:
        assert url.endswith("?var-sku={{ $labels.sku | urlquery }}"), url


def _promo_calendar_example() -> str:
    """The promo calendar expression the settings group's comment offers to copy."""
    lines = RULES_FILE.read_text(encoding="utf-8").splitlines()
    at = lines.index("      - record: stocksentry:promo_active")
    comment = [line.strip().removeprefix("#").strip() for line in lines[:at]]
    start = max(i for i, line in enumerate(comment) if line.endswith("for example"))
    return comment[start + 1]


def test_promo_calendar_example_is_tested_and_documented() -> None:
    """The example a reader copies records 1 in the window and 0 outside (recording.yml)."""
    example = _promo_calendar_example()
    assert example == "(vector(1) and on() (hour() >= 12 and hour() < 14)) or on() vector(0)"
    doc = _load(TESTS_DIR / "recording.yml")
    values = {
        (case["eval_time"], sample["value"])
        for group in doc["tests"]
        for case in group.get("promql_expr_test", [])
        if case["expr"] == example
        for sample in case["exp_samples"]
    }
    assert values == {("11h59m", 0), ("12h", 1), ("13h59m", 1), ("14h", 0)}
    assert f"expr: {example}" in README_FILE.read_text(encoding="utf-8")


def test_promo_alerts_treat_any_positive_value_as_a_promo() -> None:
    promo = [name for name, rule in ALERTS.items() if "stocksentry:promo_active" in rule["expr"]]
    assert sorted(promo) == ["StockDeadlocksIncreasing", "StockLockWaitHighDuringPromo"]
    for name in promo:
        expr = _flat(ALERTS[name]["expr"])
        assert "and on() stocksentry:promo_active > 0" in expr, name
        assert "promo_active ==" not in expr, name


def test_recording_rules_are_defined_before_use() -> None:
    """A recording rule used in a group must come from an earlier group or earlier in its own."""
    seen: set[str] = set()
    for group in GROUPS:
        for rule in group["rules"]:
            used = metric_names(rule["expr"]) & RECORDS
            assert used <= seen, f"{_rule_id(rule)} uses {sorted(used - seen)} before they exist"
            if "record" in rule:
                seen.add(rule["record"])


#: The label-less series a join may match ``on()``: the settings and what they derive.
CONSTANTS = frozenset({r["record"] for r in SETTINGS} | {"stocksentry:checkout_error_budget"})


@pytest.mark.parametrize("rule", ALL_RULES, ids=_rule_id)
def test_every_aggregation_keeps_the_location(rule: dict[str, Any]) -> None:
    """No ``sum by (sku)``: every aggregation and join keeps cluster and namespace."""
    assert lint.location_problems(rule["expr"], constants=CONSTANTS) == [], _rule_id(rule)


def test_location_check_catches_the_old_forms() -> None:
    assert lint.location_problems("sum by (sku) (rate(x[5m]))") == [
        "sum by (sku) drops cluster, namespace"
    ]
    assert lint.location_problems("max(x)") == ["max(...) without by drops cluster, namespace"]
    assert lint.location_problems("a and on() b") == ["on() drops cluster, namespace"]
    assert lint.location_problems("a > on() group_left() t", constants={"t"}) == []


def test_rendering_with_other_location_labels_keeps_them_all() -> None:
    options = render.Options(location_labels=("region", "cluster", "namespace"))
    text = render.render(SOURCE_FILE.read_text(encoding="utf-8"), options)
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    labels = ("region", "cluster", "namespace")
    for rule in rules:
        assert lint.location_problems(rule["expr"], labels, CONSTANTS) == [], _rule_id(rule)
    summary = next(r for r in rules if r.get("alert") == "StockOversold")["annotations"]
    assert summary["summary"] == (
        "SKU {{ $labels.sku }} is oversold by {{ $value }} unit(s)"
        '{{ $locsep := " in " }}'
        "{{ with or $labels.region $externalLabels.region }}"
        '{{ $locsep }}region {{ . }}{{ $locsep = ", " }}{{ end }}'
        "{{ with or $labels.cluster $externalLabels.cluster }}"
        '{{ $locsep }}cluster {{ . }}{{ $locsep = ", " }}{{ end }}'
        "{{ with or $labels.namespace $externalLabels.namespace }}"
        '{{ $locsep }}namespace {{ . }}{{ $locsep = ", " }}{{ end }}.'
    )


def test_rendering_fills_every_placeholder() -> None:
    options = render.Options(
        job="shop-stocksentry",
        runbook_base="https://git.shop.example/runbooks/",
        dashboard_base="https://grafana.shop.example",
    )
    text = render.render(SOURCE_FILE.read_text(encoding="utf-8"), options)
    assert not [p for p in render.PLACEHOLDERS if p in text]
    alerts = {
        r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r
    }
    down = alerts["StocksentryExporterDown"]
    assert down["expr"] == 'up{job="shop-stocksentry"} == 0'
    assert down["annotations"]["runbook_url"] == (
        "https://git.shop.example/runbooks/StocksentryExporterDown.md"
    )
    assert alerts["StockOversold"]["annotations"]["dashboard_url"] == (
        "https://grafana.shop.example/d/stocksentry-sku?var-sku={{ $labels.sku | urlquery }}"
    )
    assert set(alerts) == set(ALERTS)


def test_the_committed_rendering_is_fresh() -> None:
    assert render.main(["--check"]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--location-labels", ""], "give at least one"),
        (["--location-labels", "cluster,cluster"], "repeats a label"),
        (["--location-labels", "cluster,sku"], "'sku' is a label the rules use already"),
        (["--location-labels", "cluster-name"], "'cluster-name' is not a Prometheus label name"),
        (["--runbook-url-base", "ftp://x"], "is not an http(s) URL"),
        (["--job", 'a"b'], "without quotes"),
        ([], "--runbook-url-base is required: the address where your copy of docs/runbooks"),
    ],
)
def test_render_refuses_bad_options(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert render.main([*args, "-o", "-"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("render: "), err
    assert message in err, err
    assert err.count("\n") == 1


def test_every_setting_is_documented() -> None:
    readme = README_FILE.read_text(encoding="utf-8")
    for rule in SETTINGS:
        assert f"`{rule['record']}`" in readme, f"{rule['record']} is not in alert_rules/README.md"


# --- the promtool tests ---------------------------------------------------------------------

TEST_FILES = sorted(TESTS_DIR.glob("*.yml"))


#: A Prometheus duration (``1w1h25m``, ``90s``) in seconds: the one grammar of the package.
duration_seconds = parse_duration


def test_duration_seconds() -> None:
    assert duration_seconds("1w1h25m") == 604800 + 3600 + 25 * 60
    assert duration_seconds("90s") == 90
    with pytest.raises(ValueError, match="1h 5m"):
        duration_seconds("1h 5m")


@dataclass(frozen=True)
class AlertCase:
    """One ``alert_rule_test`` entry: at ``at`` seconds, ``alertname`` fires ``alerts``."""

    path: Path
    group: int
    step: float
    at: float
    alertname: str
    alerts: list[dict[str, Any]]


def _alert_cases() -> Iterator[AlertCase]:
    for path in TEST_FILES:
        doc = _load(path)
        step = duration_seconds(doc["evaluation_interval"])
        for index, group in enumerate(doc.get("tests", [])):
            for case in group.get("alert_rule_test", []) or []:
                yield AlertCase(
                    path,
                    index,
                    step,
                    duration_seconds(case["eval_time"]),
                    case["alertname"],
                    case.get("exp_alerts") or [],
                )


ALERT_CASES = list(_alert_cases())


def test_there_are_test_files() -> None:
    assert len(TEST_FILES) >= 5, TEST_FILES


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: p.name)
def test_test_file_header(path: Path) -> None:
    doc = _load(path)
    assert doc["rule_files"] == ["../stocksentry.rules.yml"]
    # One-minute steps; the files that carry days of history say why they take longer ones,
    # and those of alerts with a `for` under a minute why they take shorter ones.
    interval = doc["evaluation_interval"]
    assert interval in {"5s", "1m", "5m", "10m"}, interval
    if interval == "5s":
        assert "evaluated every 5 s" in path.read_text(encoding="utf-8")
    elif interval != "1m":
        assert "not every minute: promtool evaluates all" in path.read_text(encoding="utf-8")
    # Deterministic order: settings before recording rules before the alerts that read them.
    assert doc["group_eval_order"] == [g["name"] for g in GROUPS]


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_has_a_firing_test_with_exact_labels(name: str) -> None:
    rule = ALERTS[name]
    firing = [c.alerts for c in ALERT_CASES if c.alertname == name and c.alerts]
    assert firing, f"{name}: no promtool test makes it fire"
    for alerts in firing:
        for alert in alerts:
            labels = alert.get("exp_labels", {})
            for key, value in rule["labels"].items():
                assert labels.get(key) == value, f"{name}: exp_labels {key}={labels.get(key)!r}"
            annotations = alert.get("exp_annotations", {})
            assert set(annotations) == ANNOTATIONS, (
                f"{name}: exp_annotations {sorted(annotations)}"
            )
            assert annotations["runbook_url"] == rule["annotations"]["runbook_url"]


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_has_a_quiet_test(name: str) -> None:
    assert any(c.alertname == name and not c.alerts for c in ALERT_CASES), (
        f"{name}: no promtool test shows it quiet"
    )


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_alert_is_tested_on_both_sides_of_its_for(name: str) -> None:
    """Some test group shows the alert quiet one evaluation before it shows it firing.

    With a ``for``, that is the edge of the ``for``; without, the evaluation that first
    sees the fault.
    """
    cases = [c for c in ALERT_CASES if c.alertname == name]
    quiet = {(c.path, c.group, c.at) for c in cases if not c.alerts}
    assert any((c.path, c.group, c.at - c.step) in quiet for c in cases if c.alerts), (
        f"{name}: no test shows it quiet one step before it fires"
    )


def _new_target_groups() -> Iterator[tuple[Path, dict[str, Any]]]:
    """Test groups with a new target: an ``up`` absent at first (``_``) while another
    target's ``up`` is there from the start."""
    for path in TEST_FILES:
        for group in _load(path).get("tests", []):
            ups = [
                str(s["values"]).split()[0]
                for s in group.get("input_series", [])
                if s["series"].startswith("up{")
            ]
            if any(v.startswith("_") for v in ups) and any(not v.startswith("_") for v in ups):
                yield path, group


@pytest.mark.parametrize("name", sorted(NEWBORN_ALERTS))
def test_counter_alerts_fire_for_a_series_born_on_a_new_target(name: str) -> None:
    """A pod added during the sale has no ``up`` a window ago: its newborn series counts.

    (alert_rules/README.md, "Counters born at their full count".)
    """
    firing = [
        group["name"]
        for _, group in _new_target_groups()
        for case in group.get("alert_rule_test", []) or []
        if case["alertname"] == name and case.get("exp_alerts")
    ]
    assert firing, f"{name}: no promtool test fires it for a series born on a new target"


def _test_file_expressions() -> Iterator[tuple[str, str]]:
    """Every PromQL of the promtool test files: ``promql_expr_test`` and input series."""
    for path in TEST_FILES:
        for group in _load(path).get("tests", []):
            for case in group.get("promql_expr_test", []) or []:
                yield f"{path.name}: {case['expr']}", case["expr"]
            for series in group.get("input_series", []):
                yield f"{path.name}: {series['series']}", series["series"]


def test_test_files_parse() -> None:
    """Syntax errors in the promtool tests show here too, without promtool."""
    found = dict(_test_file_expressions())
    assert len(found) > 100
    failures = {}
    for where, expr in found.items():
        try:
            metric_names(expr)
        except lint.PromQLSyntaxError as error:
            failures[where] = str(error)
    assert failures == {}


def test_tests_only_name_existing_alerts() -> None:
    unknown = {c.alertname for c in ALERT_CASES} - set(ALERTS)
    assert not unknown, sorted(unknown)


# --- the Alertmanager example ---------------------------------------------------------------


def _matcher_alertnames(matchers: list[str]) -> set[str]:
    names: set[str] = set()
    for matcher in matchers:
        m = re.fullmatch(r'alertname(=~|=)"([^"]*)"', matcher)
        if m:
            names.update(m.group(2).split("|") if m.group(1) == "=~" else [m.group(2)])
    return names


def test_alertmanager_inhibit_rules_name_existing_alerts() -> None:
    config = _load(ALERTMANAGER_FILE)
    named: set[str] = set()
    for rule in config["inhibit_rules"]:
        named |= _matcher_alertnames(rule.get("source_matchers", []))
        named |= _matcher_alertnames(rule.get("target_matchers", []))
    assert named, "no inhibit rule names an alert"
    assert named <= set(ALERTS), sorted(named - set(ALERTS))


def test_alertmanager_placeholders_are_placeholders() -> None:
    text = ALERTMANAGER_FILE.read_text(encoding="utf-8")
    for url in re.findall(r"https?://[^\s'\"]+", text):
        host = url.split("/")[2]
        assert host == "example.com" or host.endswith(".example.com"), url
