"""What every stocksentry dashboard shares: datasource, variables, runbook links, panels.

The panel factories take the unit, a description of what a bad value means and the alerts
whose runbooks explain what to do as required arguments, so no panel can be built without
them. Every panel and every query uses the ``${datasource}`` variable.

Example::

    from dashboards import panels, promql
    from stocksentry.instrumentation import catalog

    board = panels.Board("stocksentry-example", "Example", "What it answers.")
    board.row("Reservations")
    board.add(
        panels.timeseries(
            "Reservations per second",
            "Reservations per second; a drop to zero during a sale means checkout is down.",
            runbooks=("StockReservationConflictSpike",),
            unit="reqps",
            queries=(panels.Query(promql.sum_rate(catalog.RESERVATION_SUCCESS), "success"),),
        )
    )
    dashboard = board.build()
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus as prometheus_builders
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common, prometheus
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models import heatmap as heatmap_models
from stocksentry.instrumentation.catalog import MetricSpec

from . import promql
from .variables import DATASOURCE, datasource_variable, job_variable, location_variables

#: Where the runbooks live by default (``build.py --runbook-url-base``; the Helm chart
#: replaces it with ``links.runbookBaseUrl``); one Markdown file per alert of the rules.
#: The same default as alert_rules/render.py's.
DEFAULT_RUNBOOK_BASE = "https://github.com/stocksentry/stocksentry/blob/main/docs/runbooks/"
RUNBOOK_BASE = DEFAULT_RUNBOOK_BASE


def set_runbook_base(base: str) -> None:
    """Point every runbook link at ``base`` (``<base>/<Alert>.md``)."""
    global RUNBOOK_BASE
    if not re.match(r"^https?://\S+$", base):
        raise ValueError(f"runbook URL base: {base!r} is not an http(s) URL")
    RUNBOOK_BASE = base.rstrip("/") + "/"


#: Tag shared by the dashboards, for the dashboard links between them.
TAG = "stocksentry"
#: Grafana thresholds apply "at or above" a value; anything above zero is already bad.
ABOVE_ZERO = 1e-9

#: Dashboard uids: stable, because alert rules (dashboard_url) and bookmarks point at them.
OVERVIEW_UID = "stocksentry-overview"
SKU_UID = "stocksentry-sku"
EXPORTER_UID = "stocksentry-exporter"


def runbook_url(alert: str) -> str:
    """The runbook of ``alert`` (a name from the rules file)."""
    return f"{RUNBOOK_BASE}{alert}.md"


def sku_link(title: str = "SKU deep dive") -> dashboard_builders.DashboardLink:
    """A data link from a series with a ``sku`` label to that SKU's deep dive."""
    return (
        dashboard_builders.DashboardLink(title)
        .url(
            f"/d/{SKU_UID}?${{__all_variables}}&${{__url_time_range}}"
            "&var-sku=${__field.labels.sku}"
        )
        .target_blank(False)
    )


def alert_runbook_link() -> dashboard_builders.DashboardLink:
    """A data link from a row of ``ALERTS`` to the runbook of its alert."""
    return (
        dashboard_builders.DashboardLink("Runbook of ${__data.fields.alertname}")
        .url(RUNBOOK_BASE + "${__data.fields.alertname}.md")
        .target_blank(True)
    )


@dataclass(frozen=True, slots=True)
class Query:
    """One Prometheus query of a panel.

    ``instant`` for stat, bar gauge and table panels that show the value at the end of the
    range; ``exemplar`` asks Prometheus for exemplars (trace ids on histogram buckets),
    which Grafana links to traces through the datasource's ``exemplarTraceIdDestinations``.
    """

    expr: str
    legend: str = ""
    instant: bool = False
    exemplar: bool = False
    heatmap: bool = False
    table: bool = False


def _target(query: Query, ref_id: str) -> prometheus_builders.Dataquery:
    target = (
        prometheus_builders.Dataquery()
        .expr(query.expr)
        .ref_id(ref_id)
        .datasource(DATASOURCE)
        .editor_mode(prometheus.QueryEditorMode.CODE)
        .exemplar(query.exemplar)
    )
    if query.legend:
        location = " ".join(f"{{{{{label}}}}}" for label in promql.LOCATION_LABELS)
        target = target.legend_format(f"{query.legend} {location}")
    target = target.instant() if query.instant else target.range()
    if query.heatmap:
        target = target.format(prometheus.PromQueryFormat.HEATMAP)
    elif query.table:
        target = target.format(prometheus.PromQueryFormat.TABLE)
    return target


def describe(text: str, runbooks: Sequence[str]) -> str:
    """A panel description: what a bad value means, then the runbook link(s)."""
    if not runbooks:
        raise ValueError("every panel links at least one runbook")
    links = ", ".join(f"[{alert}]({runbook_url(alert)})" for alert in runbooks)
    return f"{text}\n\nRunbook: {links}"


#: The panel builders, each with the title, description, links, unit and size setters.
_Panel = TypeVar(
    "_Panel", timeseries.Panel, stat.Panel, bargauge.Panel, heatmap.Panel, table.Panel
)


def _panel(
    panel: _Panel,
    title: str,
    description: str,
    runbooks: Sequence[str],
    unit: str,
    width: int,
    height: int,
) -> _Panel:
    """What every panel has: title, description and runbook links, datasource, unit, size."""
    links: list[cogbuilder.Builder[dashboard_models.DashboardLink]] = [
        dashboard_builders.DashboardLink(f"Runbook: {alert}")
        .url(runbook_url(alert))
        .target_blank(True)
        for alert in runbooks
    ]
    return (
        panel.title(title)
        .description(describe(description, runbooks))
        .links(links)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
    )


def _with_queries(
    panel: _Panel,
    queries: Sequence[Query],
    links: Sequence[dashboard_builders.DashboardLink] = (),
) -> _Panel:
    """``panel`` with its queries (ref ids A, B...) and data links."""
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[index]))
    if links:
        panel = panel.data_links(list(links))
    return panel


def _steps(below: str, at: float, color: str) -> dashboard_builders.ThresholdsConfig:
    """Absolute thresholds: ``below`` under ``at``, ``color`` from ``at`` on."""
    return (
        dashboard_builders.ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps(
            [
                dashboard_models.Threshold(value=None, color=below),
                dashboard_models.Threshold(value=at, color=color),
            ]
        )
    )


def red_above_zero() -> dashboard_builders.ThresholdsConfig:
    """Green at zero, red for anything above it."""
    return _steps("green", ABOVE_ZERO, "red")


def timeseries_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    unit: str,
    queries: Sequence[Query],
    width: int = 12,
    height: int = 8,
    min_value: float | None = 0,
    max_value: float | None = None,
    threshold_line: float | None = None,
) -> timeseries.Panel:
    """A time series panel; ``threshold_line`` draws a dashed red line at that value."""
    panel = (
        _panel(timeseries.Panel(), title, description, runbooks, unit, width, height)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["max", "lastNotNull"])
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
        .fill_opacity(10)
        .span_nulls(False)
    )
    panel = _with_queries(panel, queries)
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if threshold_line is not None:
        panel = panel.thresholds(_steps("transparent", threshold_line, "red")).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(
                common.GraphThresholdsStyleMode.DASHED
            )
        )
    return panel


def stat_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    unit: str,
    queries: Sequence[Query],
    no_value: str,
    width: int = 6,
    height: int = 5,
    links: Sequence[dashboard_builders.DashboardLink] = (),
) -> stat.Panel:
    """A big-number panel, red above zero.

    ``no_value`` is what an empty result means: ``"0"`` for an app counter that was never
    incremented (its labelled series does not exist yet), a warning for a probe gauge
    (no series means the probe is not running, not that all is well).
    """
    panel = (
        _panel(stat.Panel(), title, description, runbooks, unit, width, height)
        .no_value(no_value)
        .decimals(0)
        .thresholds(red_above_zero())
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .text_mode(common.BigValueTextMode.VALUE_AND_NAME)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    return _with_queries(panel, queries, links)


def count_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    counter: MetricSpec,
    by: Sequence[str] = (),
    sel: str | None = None,
    width: int = 6,
    height: int = 5,
    links: Sequence[dashboard_builders.DashboardLink] = (),
) -> stat.Panel:
    """How much an app counter grew in the time range (one number per ``by`` group), red
    above zero; no series (a counter never incremented) shows 0."""
    legend = " ".join(f"{{{{{label}}}}}" for label in by)
    return stat_panel(
        title,
        description,
        runbooks=runbooks,
        unit="short",
        no_value="0",
        width=width,
        height=height,
        queries=(Query(promql.increase_in_range(counter, by, sel), legend, instant=True),),
        links=links,
    )


def bargauge_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    unit: str,
    queries: Sequence[Query],
    width: int = 12,
    height: int = 8,
    links: Sequence[dashboard_builders.DashboardLink] = (),
) -> bargauge.Panel:
    """Horizontal bars, one per series (a top-k list), red above zero."""
    panel = (
        _panel(bargauge.Panel(), title, description, runbooks, unit, width, height)
        .min(0)
        .decimals(0)
        .thresholds(red_above_zero())
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    return _with_queries(panel, queries, links)


def heatmap_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    unit: str,
    query: Query,
    width: int = 12,
    height: int = 8,
) -> heatmap.Panel:
    """A heatmap of a Prometheus histogram (buckets as they are, exemplars shown)."""
    if not query.heatmap:
        raise ValueError("a heatmap query needs heatmap=True (format heatmap)")
    return (
        _panel(heatmap.Panel(), title, description, runbooks, unit, width, height)
        .with_target(_target(query, "A"))
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(unit))
        .cell_values(heatmap.CellValues().unit("reqps"))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_models.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            # Exponential: the rare slow buckets stay visible beside the busy fast ones.
            .scale(heatmap_models.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .exemplars_color("rgba(255,0,255,0.7)")
        .show_legend()
        .mode(common.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
    )


def table_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    unit: str,
    query: Query,
    hidden_columns: Sequence[str] = (),
    width: int = 24,
    height: int = 8,
    links: Sequence[dashboard_builders.DashboardLink] = (),
) -> table.Panel:
    """A table of an instant query's series, one row each, some label columns hidden."""
    if not (query.instant and query.table):
        raise ValueError("a table query needs instant=True and table=True")
    panel = _panel(table.Panel(), title, description, runbooks, unit, width, height)
    if hidden_columns:
        panel = panel.with_transformation(
            dashboard_models.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": dict.fromkeys(hidden_columns, True)},
            )
        )
    return _with_queries(panel, (query,), links)


def up_panel(
    title: str,
    description: str,
    *,
    runbooks: Sequence[str],
    no_value: str,
    queries: Sequence[Query],
    width: int = 6,
    height: int = 5,
) -> stat.Panel:
    """A stat panel of 0/1 series shown as DOWN (red) or UP (green)."""
    panel = stat_panel(
        title,
        description,
        runbooks=runbooks,
        unit="none",
        no_value=no_value,
        width=width,
        height=height,
        queries=queries,
    )
    return panel.thresholds(_steps("red", 1, "green")).mappings(up_down_mappings())


def up_down_mappings() -> list[dashboard_models.ValueMapping]:
    """1 shows as UP (green), 0 as DOWN (red)."""
    return [
        dashboard_models.ValueMap(
            options={
                "0": dashboard_models.ValueMappingResult(text="DOWN", color="red", index=0),
                "1": dashboard_models.ValueMappingResult(text="UP", color="green", index=1),
            }
        )
    ]


# --- assembling a dashboard ----------------------------------------------------------------


class Board:
    """A dashboard under assembly: panels numbered in order, laid out left to right.

    It starts with the variables every panel's queries use: ``$datasource``, the location
    variables and ``$job``. Rows are open (not collapsed) and hold no panels of their own;
    the panels after a row belong to it, as Grafana expects of an open row.
    """

    def __init__(self, uid: str, title: str, description: str) -> None:
        self._next_id = 1
        self._builder = (
            dashboard_builders.Dashboard(title)
            .uid(uid)
            .description(description)
            .tags([TAG, "flash-sale"])
            .editable()
            .refresh("30s")
            .time("now-1h", "now")
            .timezone("browser")
            .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
            .link(
                dashboard_builders.DashboardLink("stocksentry")
                .type(dashboard_models.DashboardLinkType.DASHBOARDS)
                .tags([TAG])
                .as_dropdown(True)
                .include_vars(True)
                .keep_time(True)
            )
            .annotation(
                dashboard_builders.AnnotationQuery()
                .name("Annotations & Alerts")
                .datasource(
                    dashboard_models.DataSourceRef(type_val="grafana", uid="-- Grafana --")
                )
                .enable(True)
                .hide(True)
                .icon_color("rgba(0, 211, 255, 1)")
                .type("dashboard")
                .built_in(1)
            )
        )
        self.variable(datasource_variable())
        for variable in (*location_variables(), job_variable()):
            self.variable(variable)

    def variable(
        self, variable: dashboard_builders.QueryVariable | dashboard_builders.DatasourceVariable
    ) -> Board:
        """Add a template variable (in display order)."""
        self._builder = self._builder.with_variable(variable)
        return self

    def row(self, title: str) -> Board:
        """Start a new row of panels."""
        self._builder = self._builder.with_row(dashboard_builders.Row(title).id(self._take_id()))
        return self

    def add(
        self,
        panel: timeseries.Panel | stat.Panel | bargauge.Panel | heatmap.Panel | table.Panel,
    ) -> Board:
        """Add a panel to the current row, after the previous one."""
        self._builder = self._builder.with_panel(panel.id(self._take_id()))
        return self

    def _take_id(self) -> int:
        panel_id = self._next_id
        self._next_id += 1
        return panel_id

    def build(self) -> dashboard_models.Dashboard:
        """The finished dashboard model."""
        return self._builder.build()
