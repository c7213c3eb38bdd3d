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
    timeseries_panel,
    up_panel,
)


def build() -> dashboard_models.Dashboard:
    """The exporter-and-probes dashboard."""
    board = Board(
        EXPORTER_UID,
        "stocksentry / Exporter and probes",
        "Is stocksentry itself healthy? Scrape targets, probe success, duration and data "
        "age, scrape size and time, label overflow and instrumentation errors.",
    )
    sel = promql.SEL

    board.row("Targets and probes")
    board.add(
        up_panel(
            "Scrape targets up",
            "Whether Prometheus can scrape each stocksentry target. DOWN means every "
            "stocksentry metric of that target is missing: no panel or alert sees its "
            "stock.",
            runbooks=("StocksentryExporterDown", "StocksentryMetricsAbsent"),
            no_value="no targets",
            width=8,
            queries=(Query(f"up{sel}", "{{instance}}", instant=True),),
        )
    )
    board.add(
        up_panel(
            "Probes up",
            "Whether each probe's last run succeeded, per exporter. DOWN means the "
            "database or Redis is down, slow (probe timeout) or locked, and that probe's "
            "invariant is not being checked.",
            runbooks=("StocksentryProbeDown",),
            no_value="no probes",
            width=16,
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

    board.row("Redis lock watcher")
    board.add(
        up_panel(
            "Lock watcher subscribed",
            "UP while the sidecar's lock watcher is subscribed to Redis keyspace "
            "notifications. DOWN: lock expiries and foreign releases happening now are "
            "not seen, and nothing replays them.",
            runbooks=("StocksentryLockWatchDisconnected",),
            no_value="no lock watcher",
            width=6,
            queries=(
                Query(promql.series(catalog.LOCKWATCH_CONNECTED), "{{instance}}", instant=True),
            ),
        )
    )
    board.add(
        up_panel(
            "Keyspace notification flags",
            "UP when Redis's notify-keyspace-events holds the flags the watcher needs "
            "(K, g, $, x); DOWN when one is missing, so the subscription stays silent. "
            "No value: the watcher may not read the setting (CONFIG refused); its log "
            "says which flags to set.",
            runbooks=("StocksentryLockWatchNotificationsOff",),
            no_value="unknown",
            width=6,
            queries=(
                Query(
                    promql.series(catalog.LOCKWATCH_NOTIFICATIONS), "{{instance}}", instant=True
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Lock notifications",
            "Keyspace notifications of watched lock keys per second, by event: set "
            "(acquired), expire (TTL set or extended), del (released), expired (the lease "
            "ran out under its holder).",
            runbooks=("StocksentryLockWatchNotificationsOff",),
            unit="ops",
            queries=(
                Query(promql.sum_rate(catalog.LOCKWATCH_EVENT_COUNT, ("event",)), "{{event}}"),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Lock acquisitions, expiries and foreign releases",
            "Per lock, per second, as the watcher saw them in Redis: acquisitions, leases "
            "that expired instead of being released, and suspected releases of a lock "
            "the releaser no longer owned (a DEL right after another holder re-acquired "
            "an expired lock). Any expiry or foreign release means mutual exclusion broke.",
            runbooks=("StockLockExpiredWhileHeld", "StockLockReleaseNotOwned"),
            unit="ops",
            queries=(
                Query(promql.sum_rate(catalog.LOCK_ACQUISITIONS, ("lock",)), "acquired {{lock}}"),
                Query(
                    promql.sum_rate(catalog.LOCK_EXPIRED_WHILE_HELD, ("lock",)),
                    "expired {{lock}}",
                ),
                Query(
                    promql.sum_rate(catalog.LOCK_RELEASE_NOT_OWNED, ("lock",)),
                    "foreign release {{lock}}",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Leases the watcher lost",
            "Leases per second whose end the watcher did not see, by reason (disconnect, "
            "tracked_limit, end_unseen, evicted), and the share of time it was not "
            "subscribed: what the lock panels cannot show.",
            runbooks=("StocksentryLockWatchLeasesLost", "StocksentryLockWatchDisconnected"),
            unit="short",
            queries=(
                Query(promql.sum_rate(catalog.LOCKWATCH_LEASES_LOST, ("reason",)), "{{reason}}"),
                Query(
                    promql.sum_rate(catalog.LOCKWATCH_DISCONNECTED_SECONDS),
                    "share of time not subscribed",
                ),
            ),
        )
    )
    return board.build()
