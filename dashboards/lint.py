"""Check dashboard JSON against the house rules, and take its queries apart for tests.

:func:`lint` returns one line per problem (an empty list means clean):

- every panel and query uses the ``${datasource}`` variable, every panel has a unit, a
  description and a runbook link to an alert of the rules file;
- panel ids and titles are unique, panels stay inside the 24-column grid and do not
  overlap;
- expressions use only ``$__rate_interval`` or ``$__range`` as windows (no ``[5m]``),
  only variables the dashboard defines, and only metric names that are allowed (the
  catalog's sample names, recording rules, Prometheus built-ins);
- every aggregation keeps the location labels (``cluster``, ``namespace``:
  :func:`location_problems`, which ``tests/unit/test_rules.py`` also runs on the rules).

Metric names come from the syntax tree: each expression is parsed with ``promql-parser``
(the Rust ``promql-parser`` crate behind a Python wheel) and its vector selectors are
collected, so functions, keywords, label names, strings and durations can never be taken
for a metric. An expression the parser rejects is a lint problem of its own.

Grafana's window variables (``$__rate_interval``, ``$__range``, ``$__interval``) are not
PromQL: :func:`plain_promql` replaces them (outside string literals) with sample windows
before parsing; variables inside label matchers' strings need no replacing. One known
gap of the parser, with its fallback: Prometheus (since 2.54) accepts ``_`` digit
separators in numbers (``1_000``) and promql-parser 0.12 does not, so
:func:`plain_promql` removes them first. Windows and variables are found on the template
text itself (:func:`windows`, :func:`variable_names`), since the tree no longer shows
which window was ``$__rate_interval``. promtool, the final word on what Prometheus
accepts, checks every expression in ``tests/integration/test_dashboards_promtool.py``.

Example::

    import json
    from dashboards import lint

    board = json.loads(open("dashboards/stocksentry-overview.json").read())
    problems = lint.lint(board, allowed_metrics=..., alerts=...)
    for panel, target in lint.iter_targets(board):
        print(panel["title"], lint.metric_names(target["expr"]))
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import promql_parser

from .panels import RUNBOOK_BASE
from .promql import LOCATION_LABELS
from .variables import DATASOURCE

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
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_WINDOW = re.compile(r"\[([^\]]*)\]")
_OFFSET = re.compile(r"\boffset\s+(\$\{?\w+\}?|-?[0-9][0-9a-zA-Z]*)")
#: A number with ``_`` digit separators, not part of a name (``a_1_000`` stays).
_SEPARATED_NUMBER = re.compile(r"(?<![\w:.])(\d+(?:_\d+)+)(?![\w:])")
#: What Grafana's own variables stand for when an expression is parsed.
SAMPLE_WINDOWS: Mapping[str, str] = {"__rate_interval": "1m", "__range": "1h", "__interval": "1m"}
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


def expressions(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Every PromQL template of ``dashboard``: its queries and its variables' selectors.

    Keyed ``"<uid> / <panel title> [<refId>]"`` and ``"<uid> / variable <name>"``, so a
    failure names where the expression lives.
    """
    uid = dashboard.get("uid", "<no uid>")
    found: dict[str, str] = {}
    for panel, target in iter_targets(dashboard):
        found[f"{uid} / {panel.get('title')} [{target.get('refId')}]"] = str(target["expr"])
    for variable in variables(dashboard):
        parsed = label_values_query(str(variable.get("query", "")))
        if variable.get("type") == "query" and parsed:
            found[f"{uid} / variable {variable['name']}"] = parsed[0]
    return found


# --- taking PromQL apart -------------------------------------------------------------------


def _without_strings(expr: str) -> str:
    return _STRING.sub('""', expr)


class PromQLSyntaxError(ValueError):
    """An expression that promql-parser rejects; the message names the expression."""


def _outside_strings(expr: str, change: Any) -> str:
    """``expr`` with ``change(text)`` applied to each stretch outside string literals."""
    out: list[str] = []
    at = 0
    for match in _STRING.finditer(expr):
        out += [change(expr[at : match.start()]), match.group(0)]
        at = match.end()
    out.append(change(expr[at:]))
    return "".join(out)


def plain_promql(expr: str, windows: Mapping[str, str] = SAMPLE_WINDOWS) -> str:
    """``expr`` as plain PromQL: Grafana's window variables replaced outside strings.

    Digit separators (``1_000``), which Prometheus accepts and promql-parser does not,
    are dropped too. Variables inside string literals (``job=~"$job"``) stay as they are:
    they are valid PromQL there. A variable outside a string that is not one of
    ``windows`` raises :class:`KeyError`.

    >>> plain_promql('rate(x{job=~"$job"}[$__rate_interval]) > 1_000')
    'rate(x{job=~"$job"}[1m]) > 1000'
    """

    def change(text: str) -> str:
        text = substitute(text, windows)
        return _SEPARATED_NUMBER.sub(lambda m: m.group(1).replace("_", ""), text)

    return _outside_strings(expr, change)


def parse(expr: str) -> promql_parser.Expr:
    """The syntax tree of a dashboard or rule expression (see :func:`plain_promql`).

    Raises :class:`PromQLSyntaxError` when promql-parser rejects it, and :class:`KeyError`
    for a variable outside a string that is not one of Grafana's windows.
    """
    plain = plain_promql(expr)
    try:
        tree: promql_parser.Expr = promql_parser.parse(plain)
    except ValueError as error:  # the parser's one error type
        raise PromQLSyntaxError(f"{error} in {plain!r}") from None
    return tree


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, keywords or labels).

    The names of the vector selectors of its syntax tree (see :func:`parse`), including
    a name given as a ``__name__`` equality matcher (``{__name__="x"}``).

    >>> sorted(metric_names('sum by (sku) (rate(a_total{x="y"}[5m])) / b:rule'))
    ['a_total', 'b:rule']
    """
    names: set[str] = set()

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            alternatives = [node.matchers.matchers, *node.matchers.or_matchers]
            names.update(
                m.value
                for matchers in alternatives
                for m in matchers
                if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal
            )

    promql_parser.walk(parse(expr), visit)
    return names


#: Aggregations that keep the labels of the series they pick, so need no ``by``.
_SELECTING = frozenset({"topk", "bottomk", "limitk", "limit_ratio"})


def _node_names(node: promql_parser.Expr) -> set[str]:
    names: set[str] = set()

    def visit(inner: promql_parser.Expr) -> None:
        if isinstance(inner, promql_parser.VectorSelector) and inner.name:
            names.add(inner.name)

    promql_parser.walk(node, visit)
    return names


def _lost(wanted: Sequence[str], listed: Sequence[str], *, listed_are_lost: bool) -> list[str]:
    """The labels of ``wanted`` that a ``by``/``on`` list (or ``without``/``ignoring`` list,
    ``listed_are_lost``) does not keep."""
    return [label for label in wanted if (label in listed) == listed_are_lost]


def location_problems(
    expr: str,
    labels: Sequence[str] = LOCATION_LABELS,
    constants: Collection[str] = (),
) -> list[str]:
    """Where ``expr`` drops a location label: one line per aggregation or join that does.

    An aggregation must group ``by`` every label of ``labels`` (or aggregate ``without``
    none of them); ``topk`` and its kin keep their series' labels and pass. A join
    ``on(...)`` must list them too, unless one side selects only ``constants`` (the
    label-less settings: ``> on() group_left() stocksentry:threshold:x``) or nothing at
    all (``vector(0)``); ``ignoring(...)`` must not list one.

    >>> location_problems("sum by (sku) (rate(x[5m]))", ("cluster",))
    ['sum by (sku) drops cluster']
    >>> location_problems("x > on() group_left() t", ("cluster",), {"t"})
    []
    """
    problems: list[str] = []
    wanted = list(labels)

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.AggregateExpr):
            op = str(node.op)
            modifier = node.modifier
            if modifier is None:
                if op not in _SELECTING:
                    problems.append(f"{op}(...) without by drops {', '.join(wanted)}")
                return
            kept = list(modifier.labels)
            without = modifier.type == promql_parser.AggModifierType.Without
            lost = _lost(wanted, kept, listed_are_lost=without)
            if lost:
                grouping = "without" if without else "by"
                problems.append(f"{op} {grouping} ({', '.join(kept)}) drops {', '.join(lost)}")
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            matching = node.modifier.matching
            if matching is None:
                return
            on = list(matching.labels)
            ignoring = matching.type == promql_parser.LabelModifierType.Exclude
            lost = _lost(wanted, on, listed_are_lost=ignoring)
            if not lost:
                return
            sides = (_node_names(node.lhs), _node_names(node.rhs))
            if not ignoring and any(side <= set(constants) for side in sides):
                return
            keyword = "ignoring" if ignoring else "on"
            problems.append(f"{keyword}({', '.join(on)}) drops {', '.join(lost)}")

    promql_parser.walk(parse(expr), visit)
    return problems


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
        try:
            unknown = metric_names(parsed[0]) - allowed_metrics
        except (PromQLSyntaxError, KeyError) as error:
            problems.append(f"{uid}: variable {name} does not parse: {error}")
            continue
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
    try:
        unknown = sorted(metric_names(expr) - allowed_metrics)
    except (PromQLSyntaxError, KeyError) as error:
        problems.append(f"does not parse: {error}")
    else:
        if unknown:
            problems.append(f"unknown metric(s) {unknown}")
    undefined = sorted(variable_names(expr) - defined)
    if undefined:
        problems.append(f"undefined variable(s) {undefined}")
    with contextlib.suppress(PromQLSyntaxError, KeyError):  # reported above
        problems += location_problems(expr)
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
