"""SKU deep dive (uid ``stocksentry-sku``): what happened to this one SKU, and why?

For on-call following an alert's ``dashboard_url`` (``?var-sku=...``): the SKU's
reservations, conflicts and oversell signals, then the latency and contention context.
Latency, database-lock and distributed-lock metrics carry no ``sku`` label (bounded
cardinality): those panels show every SKU of the selected jobs, and their exemplars lead
to traces whose span attributes name the SKU.
"""

from __future__ import annotations

from grafana_foundation_sdk.models import dashboard as dashboard_models
from stocksentry.instrumentation import catalog

from . import promql
from .overview import (
    abort_queries,
    lock_wait_queries,
    race_conflict_ratio,
    success_ratio,
)
from .panels import (
    SKU_UID,
    Board,
    Query,
    bargauge_panel,
    count_panel,
    heatmap_panel,
    stat_panel,
    timeseries_panel,
)
from .variables import sku_variable


def build() -> dashboard_models.Dashboard:
    """The SKU deep-dive dashboard."""
    board = Board(
        SKU_UID,
        "stocksentry / SKU deep dive",
        "One SKU: its reservations and conflicts, negative writes, oversold units and "
        "refunds, with reservation latency (exemplars link to traces) and the lock "
        "contention behind it.",
    )
    board.variable(sku_variable(catalog.RESERVATION_SUCCESS.name))

    sel, sku_sel = promql.SEL, promql.SKU_SEL
    board.row("Reservations of $sku")
    board.add(
        timeseries_panel(
            "Reservations per second",
            "Successful reservations of the SKU (by checkout strategy) and refusals by "
            "reason. After the stock is gone only out_of_stock should remain; successes "
            "that go on after the stock is gone are an oversell, and lost_race, "
            "lock_timeout or deadlock mean buyers collide on this SKU's row.",
            runbooks=("StockReservationConflictSpike", "StockOversold"),
            unit="reqps",
            width=8,
            queries=(
                Query(
                    promql.sum_rate(catalog.RESERVATION_SUCCESS, ("strategy",), sku_sel),
                    "success ({{strategy}})",
                ),
                Query(
                    promql.sum_rate(catalog.RESERVATION_CONFLICT, ("reason",), sku_sel),
                    "{{reason}}",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Success and race-conflict ratio",
            "Share of the SKU's reservations that succeeded, and share lost to a race "
            "(as StockReservationConflictSpike computes it). A race ratio above the "
            "dashed threshold: the stock path has no correct concurrency control for "
            "this SKU's load.",
            runbooks=("StockReservationConflictSpike",),
            unit="percentunit",
            max_value=1,
            width=8,
            queries=(
                Query(success_ratio(promql.SKU_MATCHER), "success"),
                Query(race_conflict_ratio(promql.SKU_MATCHER), "race conflicts"),
                Query("stocksentry:threshold:conflict_ratio", "alert threshold"),
            ),
        )
    )
    board.add(
        bargauge_panel(
            "Conflicts by reason",
            "Refused reservations of the SKU in the time range, by reason. out_of_stock "
            "is a sold-out SKU doing its job; every other reason is a race the buyer lost.",
            runbooks=("StockReservationConflictSpike",),
            unit="short",
            width=8,
            queries=(
                Query(
                    promql.increase_in_range(catalog.RESERVATION_CONFLICT, ("reason",), sku_sel),
                    "{{reason}}",
                    instant=True,
                ),
            ),
        )
    )

    board.row("Oversell of $sku")
    board.add(
        count_panel(
            "Negative stock writes",
            "Stock writes of the SKU in the time range that left its stock below zero "
            "(counted by the app). Above 0: units were sold that do not exist.",
            runbooks=("StockNegativeWrite",),
            counter=catalog.INVENTORY_NEGATIVE,
            sel=sku_sel,
        )
    )
    board.add(
        stat_panel(
            "Oversold units (probe)",
            "Paid units of the SKU beyond its inventory for the sale (database probe). "
            "Above 0: stop selling the SKU and reconcile before more orders are paid.",
            runbooks=("StockOversold",),
            unit="short",
            no_value="no probe data",
            queries=(
                Query(
                    f"max {promql.by()} ({promql.series(catalog.OVERSOLD_UNITS, sku_sel)})",
                    instant=True,
                ),
            ),
        )
    )
    board.add(
        count_panel(
            "Refunds due to oversell",
            "The SKU's paid orders refunded in the time range because the stock was "
            "not there. Above 0: the oversell has reached customers.",
            runbooks=("StockRefundDueToOversell",),
            counter=catalog.REFUND_DUE_TO_OVERSELL,
            sel=sku_sel,
        )
    )
    board.add(
        timeseries_panel(
            "Paid orders and refunds due to oversell",
            "The SKU's paid orders and refunds due to oversell per second. Paid orders "
            "should stop when the stock is gone; refunds should stay at zero.",
            runbooks=("StockRefundDueToOversell", "StockOversold"),
            unit="ops",
            width=6,
            height=5,
            queries=(
                Query(promql.sum_rate(catalog.ORDERS_PAID, (), sku_sel), "paid orders"),
                Query(promql.sum_rate(catalog.REFUND_DUE_TO_OVERSELL, (), sku_sel), "refunds"),
            ),
        )
    )

    board.row("Reservation latency (all SKUs: the histogram has no sku label)")
    board.add(
        heatmap_panel(
            "Reservation latency",
            "How long reservations take, per latency bucket over time. A band moving up "
            "during the sale means buyers queue on the stock path (locks, retries). The "
            "dots are exemplars: click one to open the trace of that reservation, whose "
            "attributes name its SKU and request.",
            runbooks=("StockLockWaitHigh", "CheckoutErrorBudgetBurnFast"),
            unit="s",
            query=Query(
                promql.sum_rate(catalog.RESERVATION_DURATION, ("le",), sel, "_bucket"),
                "{{le}}",
                exemplar=True,
                heatmap=True,
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Reservation latency p50 / p99 by outcome",
            "Median and 99th percentile reservation time by outcome. A p99 of seconds "
            "for success means checkouts wait on locks; slow conflicts mean buyers are "
            "kept waiting only to be refused. Exemplars link to traces.",
            runbooks=("StockLockWaitHigh", "CheckoutErrorBudgetBurnFast"),
            unit="s",
            queries=(
                Query(
                    promql.quantile(0.5, catalog.RESERVATION_DURATION, ("outcome",), sel),
                    "p50 {{outcome}}",
                    exemplar=True,
                ),
                Query(
                    promql.quantile(0.99, catalog.RESERVATION_DURATION, ("outcome",), sel),
                    "p99 {{outcome}}",
                    exemplar=True,
                ),
            ),
        )
    )

    board.row("Contention (all SKUs: lock metrics are per table and per lock)")
    board.add(
        timeseries_panel(
            "Lock wait p50 / p99 by table",
            "How long locking statements on stock tables take. A p99 above the dashed "
            "threshold means checkouts queue on row locks. Exemplars link to the trace "
            "of a slow statement.",
            runbooks=("StockLockWaitHigh", "StockLockWaitHighDuringPromo"),
            unit="s",
            width=8,
            queries=lock_wait_queries(p50_exemplar=True),
        )
    )
    board.add(
        timeseries_panel(
            "Deadlocks and serialization failures",
            "Deadlocks and serialization failures per second by table. Any during a sale "
            "means transactions lock stock rows in inconsistent order or abort under "
            "contention.",
            runbooks=("StockDeadlocksIncreasing",),
            unit="ops",
            width=8,
            queries=abort_queries(),
        )
    )
    board.add(
        timeseries_panel(
            "Distributed lock acquire wait p99 by outcome",
            "99th percentile of the time spent acquiring a distributed lock (Redis "
            "SET NX or Redlock), by outcome. Seconds here turn into lock_not_acquired "
            "conflicts and slow checkouts.",
            runbooks=("StockReservationConflictSpike",),
            unit="s",
            width=8,
            queries=(
                Query(
                    promql.quantile(0.99, catalog.LOCK_ACQUIRE_DURATION, ("lock", "outcome")),
                    "{{lock}} {{outcome}}",
                ),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Distributed lock hold time / TTL",
            "Lock hold time as a share of its TTL (median and 99th percentile). At or "
            "above 100 % (the dashed line) the lock expired while its holder still "
            "worked: a second holder could enter and sell the same unit.",
            runbooks=("StockLockExpiredWhileHeld",),
            unit="percentunit",
            threshold_line=1.0,
            queries=(
                Query(promql.quantile(0.5, catalog.LOCK_HOLD_RATIO, ("lock",)), "p50 {{lock}}"),
                Query(promql.quantile(0.99, catalog.LOCK_HOLD_RATIO, ("lock",)), "p99 {{lock}}"),
            ),
        )
    )
    board.add(
        timeseries_panel(
            "Distributed lock expirations and foreign releases",
            "Locks whose TTL ran out while held, and releases of a lock the releaser no "
            "longer owned (a naive DEL removing another holder's lock). Both should be "
            "zero; either one means mutual exclusion on the stock was broken.",
            runbooks=("StockLockExpiredWhileHeld", "StockLockReleaseNotOwned"),
            unit="ops",
            queries=(
                Query(
                    promql.sum_rate(catalog.LOCK_EXPIRED_WHILE_HELD, ("lock",)),
                    "expired while held {{lock}}",
                ),
                Query(
                    promql.sum_rate(catalog.LOCK_RELEASE_NOT_OWNED, ("lock",)),
                    "released, not owned {{lock}}",
                ),
            ),
        )
    )
    return board.build()
