"""Flash sale overview (uid ``stocksentry-overview``): is the sale selling what it has?

For the SRE watching a sale: reservations and their outcomes, the SKUs losing races,
negative and oversold stock, refunds due to oversell, lock waits and deadlocks,
idempotency replays, stale cache, outbox lag, firing alerts and probe health.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models
from stocksentry.instrumentation import catalog

from . import promql
from .panels import (
    OVERVIEW_UID,
    Board,
    Query,
    alert_runbook_link,
    bargauge_panel,
    count_panel,
    sku_link,
    stat_panel,
    table_panel,
    timeseries_panel,
    up_panel,
)

#: Races, not sell-outs: an out_of_stock refusal is the stock doing its job, and a frozen
#: one a person's (or an alert's) decision to stop the SKU.
RACE = 'reason!~"out_of_stock|frozen"'
#: stocksentry's alerts (every alert of alert_rules/stocksentry.rules.yml matches).
STOCKSENTRY_ALERTS = 'alertname=~"Stock.*|Checkout.*"'


def success_ratio(*extra: str) -> str:
    """Successful reservations as a share of all reservations (successes and conflicts).

    ``extra`` matchers narrow it (the SKU deep dive passes its SKU).
    """
    sel = promql.selector(*extra)
    return promql.ratio_zero_filled(
        promql.rate(catalog.RESERVATION_SUCCESS, sel),
        promql.rate(catalog.RESERVATION_CONFLICT, sel),
        ("sku",),
    )


def race_conflict_ratio(*extra: str) -> str:
    """Race conflicts / (race conflicts + successes): the StockReservationConflictSpike ratio."""
    return promql.ratio_zero_filled(
        promql.rate(catalog.RESERVATION_CONFLICT, promql.selector(*extra, RACE)),
        promql.rate(catalog.RESERVATION_SUCCESS, promql.selector(*extra)),
        ("sku",),
    )


def checkout_error_ratio() -> str:
    """Errors and races over all reservations (the SLO's bad events) per location.

    0 when none failed.
    """
    duration = catalog.RESERVATION_DURATION
    bad = promql.selector('outcome!~"success|out_of_stock"')
    total = f"sum {promql.by()} ({promql.rate(duration, promql.SEL, '_count')})"
    return (
        f"(sum {promql.by()} ({promql.rate(duration, bad, '_count')}) or 0 * {total})\n/\n{total}"
    )


def lock_wait_queries(*, p50_exemplar: bool = False) -> tuple[Query, ...]:
    """Lock wait p50 and p99 by table (exemplars on p99), and the p99 alert threshold."""
    return (
        Query(
            promql.quantile(0.5, catalog.DB_LOCK_WAIT, ("table",)),
            "p50 {{table}}",
            exemplar=p50_exemplar,
        ),
        Query(
            promql.quantile(0.99, catalog.DB_LOCK_WAIT, ("table",)), "p99 {{table}}", exemplar=True
        ),
        Query("stocksentry:threshold:lock_wait_p99_seconds", "p99 alert threshold"),
    )


def abort_queries() -> tuple[Query, ...]:
    """Deadlocks and serialization failures per second by table, as the app saw them."""
    return (
        Query(promql.sum_rate(catalog.DB_DEADLOCK, ("table",)), "deadlocks {{table}}"),
        Query(
            promql.sum_rate(catalog.DB_SERIALIZATION_FAILURE, ("table",)),
            "serialization failures {{table}}",
        ),
    )


def build() -> dashboard_models.Dashboard:
    """The overview dashboard."""
    board = Board(
        OVERVIEW_UID,
        "stocksentry / Flash sale overview",
        "Is the sale selling exactly the stock it has? Reservations and conflicts per SKU, "
        "negative and oversold stock, refunds due to oversell, locks, retries, cache, "
        "outbox, alerts and probe health.",
    )

    sel = promql.SEL
    board.row("Reservations")
    board.add(
        timeseries_panel(
            "Reservations per second by outcome",
            "Every reservation by how it ended. During a sale, success should carry the "
            "load until the stock is gone and out_of_stock afterwards. lost_race, "
            "lock_timeout, lock_not_acquired, deadlock or serialization_failure rising "
            "means buyers collide on the stock path; error means the checkout raised.",
            runbooks=("StockReservationConflictSpike", "CheckoutErrorBudgetBurnFast"),
            unit="reqps",
            queries=(
                Query(
                    promql.sum_rate(catalog.RESERVATION_DURATION, ("outcome",), sel, "_count"),
                    "{{outcome}}",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Success and race-conflict ratio by SKU",
            "Share of reservations per SKU that succeeded, and share lost to a race "
            "(conflicts other than out_of_stock, over races plus successes, as the alert "
            "computes it). A race-conflict ratio above the dashed alert threshold means "
            "buyers of that SKU are failing on contention, not on a sell-out.",
            runbooks=("StockReservationConflictSpike",),
            unit="percentunit",
            max_value=1,
            queries=(
                Query(success_ratio(), "success {{sku}}"),
                Query(race_conflict_ratio(), "race conflicts {{sku}}"),
                Query("stocksentry:threshold:conflict_ratio", "alert threshold"),
            ),
        )
    )
    board.add(
        bargauge_panel(
            "Top SKUs by conflicts",
            "The ten SKUs with the most refused reservations (all reasons) in the time "
            "range. Out-of-stock refusals on a sold-out promo SKU are expected; a SKU "
            "that still has stock but tops this list is losing races. Click a bar for "
            "the SKU deep dive.",
            runbooks=("StockReservationConflictSpike",),
            unit="short",
            queries=(
                Query(
                    promql.topk(
                        10, promql.increase_in_range(catalog.RESERVATION_CONFLICT, ("sku",))
                    ),
                    "{{sku}}",
                    instant=True,
                ),
            ),
            links=(sku_link(),),
        )
    )
    board.add(
        timeseries_panel(
            "Checkout error ratio (SLO)",
            "Reservations that ended in an error or a race, over all reservations "
            "(out_of_stock is a correct answer and counts as good). Above the dashed "
            "error budget line for long, the burn-rate alerts fire.",
            runbooks=("CheckoutErrorBudgetBurnFast", "CheckoutErrorBudgetBurnSlow"),
            unit="percentunit",
            queries=(
                Query(checkout_error_ratio(), "error ratio"),
                Query("stocksentry:checkout_error_budget", "error budget (1 - objective)"),
            ),
        )
    )

    board.row("Oversell")
    board.add(
        stat_panel(
            "Negative-inventory SKUs (probe)",
            "SKUs whose stock in the database is below zero, found by the exporter's "
            "database probe. Anything above 0 means units were sold that do not exist: "
            "disable the SKUs and reconcile.",
            runbooks=("StockNegativeInventory",),
            unit="short",
            no_value="no probe data",
            queries=(
                Query(
                    f"max {promql.by()} ({promql.series(catalog.NEGATIVE_INVENTORY_SKUS)})",
                    instant=True,
                ),
            ),
        )
    )
    board.add(
        stat_panel(
            "Oversold units (probe)",
            "Paid units beyond the inventory of the sale, summed over SKUs (database "
            "probe). Anything above 0 is an oversell: customers paid for stock that is "
            "not there.",
            runbooks=("StockOversold",),
            unit="short",
            no_value="no probe data",
            queries=(
                Query(
                    f"sum {promql.by()} "
                    f"(max {promql.by('sku')} ({promql.series(catalog.OVERSOLD_UNITS)}))",
                    instant=True,
                ),
            ),
        )
    )
    board.add(
        count_panel(
            "Negative stock writes by SKU (app)",
            "Stock writes in the time range that left a SKU's stock below zero, counted "
            "by the checkout app as it wrote them: a check-then-decrement without a "
            "guard. Every such write is an oversold unit. Click for the SKU deep dive.",
            runbooks=("StockNegativeWrite",),
            counter=catalog.INVENTORY_NEGATIVE,
            by=("sku",),
            links=(sku_link(),),
        )
    )
    board.add(
        count_panel(
            "Refunds due to oversell",
            "Paid orders refunded in the time range because their stock was not there. "
            "Each one is a customer who paid and got nothing; above 0 during a sale "
            "means the oversell has reached payments.",
            runbooks=("StockRefundDueToOversell", "StockRefundsAboveBaseline"),
            counter=catalog.REFUND_DUE_TO_OVERSELL,
        )
    )
    board.add(
        timeseries_panel(
            "Paid orders and refunds due to oversell",
            "Orders confirmed as paid per second, and refunds due to oversell per SKU. "
            "Refunds should stay at zero; a refund line following the paid line means "
            "the checkout sells more than the stock.",
            runbooks=("StockRefundDueToOversell", "StockRefundsAboveBaseline"),
            unit="ops",
            width=24,
            queries=(
                Query(promql.sum_rate(catalog.ORDERS_PAID), "paid orders"),
                Query(
                    promql.sum_rate(catalog.REFUND_DUE_TO_OVERSELL, ("sku",)),
                    "refunds due to oversell {{sku}}",
                ),
            ),
        )
    )

    board.add(
        stat_panel(
            "SKUs frozen (containment)",
            "SKUs frozen now: every checkout honouring the freeze refuses them "
            "(docs/containment.md). Set by a person (stocksentry freeze) or by the freeze "
            "webhook when an oversell alert fired; `stocksentry frozen` lists who froze "
            "each and why. Above 0 means part of the sale is stopped.",
            runbooks=("StockSkuFrozenAutomatically", "StockFreezeLimitReached"),
            unit="short",
            no_value="no containment",
            queries=(
                Query(
                    f"count {promql.by()} "
                    f"(max {promql.by('sku')} ({promql.series(catalog.SKU_FROZEN)}) > 0)",
                    instant=True,
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Reservations refused by a freeze, by SKU",
            "Reservations per second refused because their SKU is frozen "
            "(stock_reservation_conflict_total reason frozen): the oversell the freeze is "
            "holding back. A frozen SKU with no refusals is one nobody is buying; "
            "refusals on a SKU the panel beside does not count come from a checkout whose "
            "view is stale (docs/containment.md).",
            runbooks=("StockSkuFrozenAutomatically",),
            unit="ops",
            width=18,
            queries=(
                Query(
                    promql.sum_rate(
                        catalog.RESERVATION_CONFLICT,
                        ("sku",),
                        promql.selector('reason="frozen"'),
                    ),
                    "refused {{sku}}",
                ),
            ),
        )
    )

    board.row("Database locks")
    board.add(
        timeseries_panel(
            "Lock wait p50 / p99 by table",
            "How long locking statements on stock tables take (median and 99th "
            "percentile). A p99 above the dashed alert threshold means checkouts queue "
            "on row locks; at promo start it grows before conflicts do. Exemplars link "
            "to the trace of a slow statement.",
            runbooks=("StockLockWaitHigh", "StockLockWaitHighDuringPromo"),
            unit="s",
            queries=lock_wait_queries(),
        )
    )
    board.add(
        timeseries_panel(
            "Deadlocks and serialization failures",
            "Deadlocks and serialization failures per second as the app saw them (by "
            "table) and as PostgreSQL counts them (pg_stat_database, by database). Any "
            "during a promo means transactions lock stock rows in inconsistent order or "
            "run at an isolation level that aborts under contention.",
            runbooks=("StockDeadlocksIncreasing",),
            unit="ops",
            queries=(
                *abort_queries(),
                Query(
                    promql.sum_rate(catalog.DB_DEADLOCKS, ("database",)),
                    "deadlocks in {{database}} (pg_stat_database)",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Sessions waiting for a lock (probe)",
            "Database sessions waiting for a lock right now (database probe). A queue "
            "that grows with the sale's traffic means the stock rows are a hot spot.",
            runbooks=("StockLockWaitHighDuringPromo",),
            unit="short",
            width=8,
            queries=(
                Query(f"max {promql.by()} ({promql.series(catalog.DB_LOCK_WAITERS)})", "waiters"),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Longest current lock wait (probe)",
            "The longest lock wait in progress (database probe). Seconds here mean a "
            "buyer's checkout is stuck behind another transaction.",
            runbooks=("StockLockWaitHigh",),
            unit="s",
            width=8,
            queries=(
                Query(
                    f"max {promql.by()} ({promql.series(catalog.DB_LOCK_WAIT_MAX)})",
                    "longest wait",
                ),
            ),
        )
    )
    board.add(
        count_panel(
            "Unsafe read-modify-write",
            "Times in the time range the app read a stock column without a lock and "
            "wrote back a value computed in the app, by table. Above 0: a lost-update bug "
            "is in the code path; the unsafe_read_modify_write log line names the file.",
            runbooks=("StockUnsafeReadModifyWrite",),
            counter=catalog.UNSAFE_READ_MODIFY_WRITE,
            by=("table",),
            width=8,
            height=8,
        )
    )

    board.row("Retries, cache and outbox")
    board.add(
        timeseries_panel(
            "Idempotency replays and key conflicts",
            "Requests answered from their idempotency record (a retry of a known "
            "intent), and keys reused with a different payload. Replays spiking means "
            "clients, proxies or the payment provider retry hard; any key conflict is a "
            "client bug or a key collision.",
            runbooks=("StockIdempotencyReplaySpike", "StockIdempotencyKeyConflict"),
            unit="ops",
            width=9,
            queries=(
                Query(
                    promql.sum_rate(catalog.IDEMPOTENCY_REPLAY, ("operation",)),
                    "replays {{operation}}",
                ),
                Query(
                    promql.sum_rate(catalog.IDEMPOTENCY_CONFLICT, ("operation",)),
                    "key conflicts {{operation}}",
                ),
            ),
        )
    )
    board.add(
        stat_panel(
            "Duplicate order keys (probe)",
            "Idempotency keys or external references with more than one order (database "
            "probe). Above 0: a retry reserved stock twice for one purchase.",
            runbooks=("StockDuplicateOrders",),
            unit="short",
            no_value="no probe data",
            width=3,
            height=8,
            queries=(
                Query(
                    f"max {promql.by()} ({promql.series(catalog.DUPLICATE_ORDER_KEYS)})",
                    instant=True,
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Stale cache decisions",
            "Stock decisions per second taken on a cached value that the database "
            "contradicted, by cache. Above the dashed alert threshold the cache is "
            "selling stock the database no longer has.",
            runbooks=("StockStaleCacheDecisions",),
            unit="ops",
            queries=(
                Query(promql.sum_rate(catalog.CACHE_STALE_HIT, ("cache",)), "{{cache}}"),
                Query("stocksentry:threshold:stale_cache_rate", "alert threshold"),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Cache drift (probe)",
            "SKUs whose cached stock differs from the database beyond tolerance and "
            "grace, by cache (Redis probe). Above 0 for minutes: cache invalidation is "
            "broken and buyers see stock that is gone.",
            runbooks=("StockCacheDrift",),
            unit="short",
            width=8,
            queries=(
                Query(
                    f"max {promql.by('cache')} ({promql.series(catalog.CACHE_DRIFT_SKUS)})",
                    "{{cache}}",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Outbox lag (probe)",
            "Age of the oldest unpublished outbox event. Above the dashed alert "
            "threshold the publisher is stuck: orders are saved but other systems "
            "(payment, warehouse) do not hear of them.",
            runbooks=("StockOutboxLag",),
            unit="s",
            width=8,
            queries=(
                Query(f"max {promql.by()} ({promql.series(catalog.OUTBOX_LAG)})", "oldest event"),
                Query("stocksentry:threshold:outbox_lag_seconds", "alert threshold"),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Outbox pending events (probe)",
            "Outbox events not yet published. A count that only grows means the "
            "publisher stopped; a saw-tooth is normal.",
            runbooks=("StockOutboxLag",),
            unit="short",
            width=8,
            queries=(
                Query(f"max {promql.by()} ({promql.series(catalog.OUTBOX_PENDING)})", "pending"),
            ),
        )
    )

    board.row("Alerts and probes")
    board.add(
        table_panel(
            "Firing alerts",
            "stocksentry alerts firing now, one row each with its labels (SKU, table, "
            "lock...). Any critical row pages on-call. Click a row for its alert's runbook; "
            "the two that mean customers already bought stock that does not exist are "
            "below.",
            runbooks=("StockNegativeWrite", "StockOversold"),
            unit="short",
            width=16,
            query=Query(
                f'ALERTS{{alertstate="firing", {STOCKSENTRY_ALERTS}}}',
                instant=True,
                table=True,
            ),
            hidden_columns=("Time", "Value", "__name__", "alertstate"),
            links=(alert_runbook_link(),),
        )
    )
    board.add(
        up_panel(
            "Probe health",
            "Whether each of the exporter's probes (database, Redis) succeeded on its "
            "last run. DOWN means that invariant (negative stock, oversell, duplicates, "
            "drift...) is not being checked: the panels above that say (probe) are blind.",
            runbooks=("StocksentryProbeDown", "StocksentryProbeStale"),
            no_value="no probes",
            width=8,
            height=8,
            queries=(
                Query(
                    f"min {promql.by('probe')} ({promql.series(catalog.PROBE_UP)})",
                    "{{probe}}",
                    instant=True,
                ),
            ),
        )
    )
    return board.build()
