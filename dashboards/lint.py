"""Check dashboard JSON against the house rules, and take its queries apart for tests.

:func:`lint` returns one line per problem (an empty list means clean):

- every panel and query uses the ``${datasource}`` variable, every panel has a unit, a
  description and a runbook link to an alert of the rules file;
- panel ids and titles are unique, panels stay inside the 24-column grid and do not
  overlap;
- expressions use only ``$__rate_interval`` or ``$__range`` as windows (no ``[5m]``),
  only variables the dashboard defines, and only metric names that are allowed (the
  catalog's sample names, recording rules, Prometheus built-ins).

Parsing is left to promtool (see ``tests/unit/test_dashboards.py``); this module only
tokenizes enough PromQL to find metric names, windows and variables.

Example::

    import json
    from dashboards import lint

    board = json.loads(open("dashboards/stocksentry-overview.json").read())
    problems = lint.lint(board, allowed_metrics=..., alerts=...)
    for panel, target in lint.iter_targets(board):
        print(panel["title"], lint.metric_names(target["expr"]))
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .panels import DATASOURCE, RUNBOOK_BASE

#: Series Prometheus makes itself, which dashboards may query beside the catalog's.
BUILTIN_SERIES: frozenset[str] = frozenset(
    {
        "ALERTS",
        "ALERTS_FOR_STATE",
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
    }
)
#: Grafana's own variables that may appear in expressions.
GRAFANA_VARIABLES: frozenset[str] = frozenset({"__rate_interval", "__range", "__interval"})
#: The only windows a range selector or an offset may use.
ALLOWED_WINDOWS: frozenset[str] = frozenset({"$__rate_interval", "$__range", "offset $__range"})

_DATASOURCE_JSON: dict[str, object] = DATASOURCE.to_json()
_KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
        "atan2",
    }
)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_WINDOW = re.compile(r"\[([^\]]*)\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_OFFSET = re.compile(r"\boffset\s+(\$\{?\w+\}?|-?[0-9][0-9a-zA-Z]*)")
_TOKEN = re.compile(
    r"(?P<var>\$\{?\w+\}?)|(?P<number>[0-9][0-9a-zA-Z_.]*)|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)"
)
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
_RUNBOOK_LINK = re.compile(re.escape(RUNBOOK_BASE) + r"([A-Za-z0-9]+)\.md")


# --- walking the JSON ----------------------------------------------------------------------


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, including panels inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def iter_targets(dashboard: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every ``(panel, target)`` pair of the dashboard."""
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            yield panel, target


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's template variables."""
    return list(dashboard.get("templating", {}).get("list", []))


def label_values_query(query: str) -> tuple[str, str] | None:
    """``label_values(selector, label)`` as ``(selector, label)``; ``None`` for others."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query, re.DOTALL)
    return (match.group(1).strip(), match.group(2)) if match else None


# --- taking PromQL apart -------------------------------------------------------------------


def _without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords or labels).

    Example::

        >>> sorted(metric_names('sum by (sku) (rate(a_total{x="y"}[5m])) / b:rule'))
        ['a_total', 'b:rule']
    """
    text = _MATCHERS.sub(" ", _without_strings(expr))
    text = _WINDOW.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    names: set[str] = set()
    for match in _TOKEN.finditer(text):
        name = match.group("ident")
        if name is None or name in _KEYWORDS:
            continue
        rest = text[match.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation, not a series
        names.add(name)
    return names


def windows(expr: str) -> list[str]:
    """The contents of every range selector ``[...]`` and every ``offset`` of ``expr``."""
    text = _MATCHERS.sub(" ", _without_strings(expr))
    found = [w.strip() for w in _WINDOW.findall(text)]
    found += [f"offset {o}" for o in _OFFSET.findall(text)]
    return found


def variable_names(text: str) -> set[str]:
    """Template variables used in ``text`` (``$name`` and ``${name}`` forms)."""
    return {a or b for a, b in _VARIABLE.findall(text)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every ``$name`` / ``${name}`` replaced; raises ``KeyError`` if unknown.

    Example::

        >>> substitute('rate(x{sku="$sku"}[$__rate_interval])',
        ...            {"sku": "A", "__rate_interval": "1m"})
        'rate(x{sku="A"}[1m])'
    """

    def replace(match: re.Match[str]) -> str:
        return values[match.group(1) or match.group(2)]

    return _VARIABLE.sub(replace, expr)


def runbook_alerts(text: str) -> list[str]:
    """Alert names of the runbook links in ``text``."""
    return _RUNBOOK_LINK.findall(text)


# --- the linter ----------------------------------------------------------------------------


def lint(
    dashboard: Mapping[str, Any],
    *,
    allowed_metrics: frozenset[str],
    alerts: frozenset[str],
) -> list[str]:
    """Every problem of ``dashboard``, one line each; ``[]`` when it is clean.

    ``allowed_metrics``: sample names, recording rules and built-ins a query may name;
    ``alerts``: the alert names runbook links may point to.
    """
    problems: list[str] = []
    uid = dashboard.get("uid", "<no uid>")
    defined = {v.get("name", "") for v in variables(dashboard)} | GRAFANA_VARIABLES
    problems += _lint_variables(uid, dashboard, defined, allowed_metrics)
    titles: set[str] = set()
    ids: set[int] = set()
    for panel in dashboard.get("panels", []):
        panel_id = panel.get("id")
        if not isinstance(panel_id, int) or panel_id in ids:
            problems.append(f"{uid}: panel id {panel_id!r} missing or repeated")
        else:
            ids.add(panel_id)
    for panel in iter_panels(dashboard):
        where = f"{uid} / {panel.get('title', '<no title>')}"
        if panel.get("title", "") in titles:
            problems.append(f"{where}: title repeated")
        titles.add(panel.get("title", ""))
        problems += [f"{where}: {p}" for p in _lint_panel(panel, alerts)]
        for target in panel.get("targets", []):
            ref = target.get("refId", "?")
            problems += [
                f"{where} [{ref}]: {p}" for p in _lint_target(target, defined, allowed_metrics)
            ]
    problems += _lint_grid(uid, dashboard)
    return problems


def _lint_variables(
    uid: str,
    dashboard: Mapping[str, Any],
    defined: set[str],
    allowed_metrics: frozenset[str],
) -> list[str]:
    problems: list[str] = []
    found = {v.get("name"): v for v in variables(dashboard)}
    source = found.get("datasource")
    if source is None or source.get("type") != "datasource" or source.get("query") != "prometheus":
        problems.append(f"{uid}: no datasource variable of type prometheus")
    for name, variable in found.items():
        if variable.get("type") != "query":
            continue
        if variable.get("datasource") != _DATASOURCE_JSON:
            problems.append(f"{uid}: variable {name} does not use ${{datasource}}")
        parsed = label_values_query(str(variable.get("query", "")))
        if parsed is None:
            problems.append(f"{uid}: variable {name} is not a label_values() query")
            continue
        unknown = metric_names(parsed[0]) - allowed_metrics
        if unknown:
            problems.append(f"{uid}: variable {name} names unknown metrics {sorted(unknown)}")
        undefined = variable_names(parsed[0]) - defined
        if undefined:
            problems.append(f"{uid}: variable {name} uses undefined {sorted(undefined)}")
    return problems


def _lint_panel(panel: Mapping[str, Any], alerts: frozenset[str]) -> list[str]:
    problems: list[str] = []
    if panel.get("datasource") != _DATASOURCE_JSON:
        problems.append(f"datasource is {panel.get('datasource')!r}, not ${{datasource}}")
    if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
        problems.append("no unit")
    description = str(panel.get("description", ""))
    linked = runbook_alerts(description)
    if len(description) < 40:
        problems.append("no description of what a bad value means")
    if not linked:
        problems.append("description links no runbook")
    links = [str(link.get("url", "")) for link in panel.get("links", [])]
    linked += [alert for url in links for alert in runbook_alerts(url)]
    unknown = sorted(set(linked) - alerts)
    if unknown:
        problems.append(f"runbook links to alerts the rules file lacks: {unknown}")
    if not panel.get("targets"):
        problems.append("no queries")
    return problems


def _lint_target(
    target: Mapping[str, Any], defined: set[str], allowed_metrics: frozenset[str]
) -> list[str]:
    problems: list[str] = []
    expr = str(target.get("expr", ""))
    if not expr.strip():
        return ["empty expression"]
    if target.get("datasource") != _DATASOURCE_JSON:
        problems.append("query datasource is not ${datasource}")
    bad_windows = [w for w in windows(expr) if w not in ALLOWED_WINDOWS]
    if bad_windows:
        problems.append(f"hard-coded window(s) {bad_windows}: use $__rate_interval or $__range")
    unknown = sorted(metric_names(expr) - allowed_metrics)
    if unknown:
        problems.append(f"unknown metric(s) {unknown}")
    undefined = sorted(variable_names(expr) - defined)
    if undefined:
        problems.append(f"undefined variable(s) {undefined}")
    return problems


def _lint_grid(uid: str, dashboard: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard.get("panels", []):
        pos = panel.get("gridPos", {})
        x, y, w, h = (int(pos.get(k, -1)) for k in ("x", "y", "w", "h"))
        title = panel.get("title", "<no title>")
        if x < 0 or y < 0 or w < 1 or h < 1 or x + w > 24:
            problems.append(f"{uid} / {title}: outside the grid {pos}")
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                other = cells.setdefault((cx, cy), title)
                if other != title:
                    problems.append(f"{uid} / {title}: overlaps {other}")
                    break
            else:
                continue
            break
    return problems
