"""Exporter and probes (uid ``stocksentry-exporter``): can stocksentry be trusted right now?

For the SRE who owns stocksentry itself: are the targets scraped, do the probes run, how
old is their data, how big and slow is a scrape, does the cardinality guard fold labels,
does the instrumentation fail. When these are bad, the other dashboards are blind.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models
from stocksentry.instrumentation import catalog

from . import promql
from .panels import (
    EXPORTER_UID,
    Board,
    Query,
    datasource_variable,
    job_variable,
    location_variables,
    stat_panel,
    timeseries_panel,
    up_down_mappings,
    up_thresholds,
)


def build() -> dashboard_models.Dashboard:
    """The exporter-and-probes dashboard."""
    board = Board(
        EXPORTER_UID,
        "stocksentry / Exporter and probes",
        "Is stocksentry itself healthy? Scrape targets, probe success, duration and data "
        "age, scrape size and time, label overflow and instrumentation errors.",
    )
    board.variable(datasource_variable())
    for variable in location_variables():
        board.variable(variable)
    board.variable(job_variable())
    sel = promql.SEL

    board.row("Targets and probes")
    board.add(
        stat_panel(
            "Scrape targets up",
            "Whether Prometheus can scrape each stocksentry target. DOWN means every "
            "stocksentry metric of that target is missing: no panel or alert sees its "
            "stock.",
            runbooks=("StocksentryExporterDown", "StocksentryMetricsAbsent"),
            unit="none",
            no_value="no targets",
            width=8,
            thresholds=up_thresholds(),
            mappings=up_down_mappings(),
            queries=(Query(f"up{sel}", "{{instance}}", instant=True),),
        )
    )
    board.add(
        stat_panel(
            "Probes up",
            "Whether each probe's last run succeeded, per exporter. DOWN means the "
            "database or Redis is down, slow (probe timeout) or locked, and that probe's "
            "invariant is not being checked.",
            runbooks=("StocksentryProbeDown",),
            unit="none",
            no_value="no probes",
            width=16,
            thresholds=up_thresholds(),
            mappings=up_down_mappings(),
            queries=(
                Query(promql.series(catalog.PROBE_UP), "{{instance}} {{probe}}", instant=True),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Probe duration",
            "How long each probe's last run took. Creeping towards its timeout means the "
            "database is slow or the probe's query lost its index; at the timeout the "
            "probe goes DOWN.",
            runbooks=("StocksentryProbeDown",),
            unit="s",
            queries=(
                Query(
                    f"max {promql.by('instance', 'probe')} "
                    f"({promql.series(catalog.PROBE_DURATION)})",
                    "{{instance}} {{probe}}",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Probe data age",
            "Seconds since each probe last succeeded. A growing line means the probe "
            "keeps failing and the probe panels show old figures; above the dashed "
            "alert threshold the data is stale.",
            runbooks=("StocksentryProbeStale",),
            unit="s",
            queries=(
                Query(
                    f"time() - max {promql.by('instance', 'probe')} "
                    f"({promql.series(catalog.PROBE_LAST_SUCCESS)})",
                    "{{instance}} {{probe}}",
                ),
                Query("stocksentry:threshold:probe_staleness_seconds", "alert threshold"),
            ),
        )
    )

    board.row("Scrapes")
    board.add(
        timeseries_panel(
            "Scrape duration",
            "How long Prometheus takes to scrape each target. Probes never run on the "
            "scrape path, so this should stay in milliseconds; near the scrape timeout "
            "the target goes down.",
            runbooks=("StocksentryExporterDown",),
            unit="s",
            queries=(
                Query(
                    f"max {promql.by('instance')} (scrape_duration_seconds{sel})", "{{instance}}"
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Samples per scrape",
            "Samples each scrape returns. A steady climb means label cardinality is "
            "growing (more SKUs than the guard's budget should allow, or a new label); "
            "big scrapes get slow and cost Prometheus memory.",
            runbooks=("StocksentryExporterDown",),
            unit="short",
            queries=(
                Query(
                    f"max {promql.by('instance')} (scrape_samples_scraped{sel})", "{{instance}}"
                ),
            ),
        )
    )

    board.row("Instrumentation")
    board.add(
        timeseries_panel(
            "Label overflow",
            "Label values folded into __other__ per second, by metric, because the "
            "cardinality guard's budget was spent. Above 0 during a sale: some SKUs are "
            "not shown by name; add the promo SKUs to the guard's list.",
            runbooks=("StocksentryInstrumentationErrors",),
            unit="ops",
            queries=(Query(promql.sum_rate(catalog.LABEL_OVERFLOW, ("metric",)), "{{metric}}"),),
        )
    )
    board.add(
        timeseries_panel(
            "Instrumentation errors",
            "Failures inside stocksentry's instrumentation per second, by component "
            "(swallowed, never raised into the app). Above 0: the app is fine but its "
            "metrics, logs or spans may be incomplete.",
            runbooks=("StocksentryInstrumentationErrors",),
            unit="ops",
            queries=(
                Query(
                    promql.sum_rate(catalog.INSTRUMENTATION_ERRORS, ("component",)),
                    "{{component}}",
                ),
            ),
        )
    )
    return board.build()
