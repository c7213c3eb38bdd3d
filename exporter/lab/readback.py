"""What the lab reads back after a strategy's run: the registry's totals and SQL's truth.

The metric totals come from the run's ``CollectorRegistry`` (``get_sample_value``); the
ground truth (paid orders, units, negative writes, duplicate orders per key, the final
stock) from SQL against the shop's tables. :func:`strategy_result` compares the two and
builds the :class:`~stocksentry.exporter.lab.config.StrategyResult`.

Example::

    figures = count_in_db(engine, product_id)
    print(figures.orders, figures.negative_writes, figures.final_stock)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine
from stocksentry.instrumentation import catalog

from .config import CACHE_NAME, IDEMPOTENT_OPERATION, STOCK_TABLE, DbFigures, StrategyResult
from .names import REDIS_STRATEGIES

if TYPE_CHECKING:
    from .driver import Tally
    from .shop import LabRun


SUCCESS = catalog.RESERVATION_SUCCESS.name
CONFLICT = catalog.RESERVATION_CONFLICT.name
NEGATIVE = catalog.INVENTORY_NEGATIVE.name
DURATION_COUNT = f"{catalog.RESERVATION_DURATION.name}_count"
REPLAY = catalog.IDEMPOTENCY_REPLAY.name
STALE = catalog.CACHE_STALE_HIT.name
UNSAFE_RMW = catalog.UNSAFE_READ_MODIFY_WRITE.name
LOCK_WAIT = catalog.LOCK_ACQUIRE_DURATION.name
LOCK_RATIO = catalog.LOCK_HOLD_RATIO.name
LOCK_EXPIRED = catalog.LOCK_EXPIRED_WHILE_HELD.name
LOCK_NOT_OWNED = catalog.LOCK_RELEASE_NOT_OWNED.name
LOCK_EXTEND_FAILED = catalog.LOCK_EXTEND_FAILURES.name
LOCK_RETRIES = catalog.LOCK_ACQUIRE_RETRIES.name
DEADLOCK = catalog.DB_DEADLOCK.name


# --- the database's figures ------------------------------------------------------------------


def count_in_db(engine: Engine, product_id: int) -> DbFigures:
    """The ground truth: paid orders, units and negative writes by SQL, and the stock."""
    with engine.begin() as conn:
        row = conn.execute(
            sa.text(
                "SELECT COUNT(DISTINCT o.id), COALESCE(SUM(oi.quantity), 0),"
                " COALESCE(SUM(CASE WHEN oi.stock_after < 0 THEN 1 ELSE 0 END), 0)"
                " FROM order_items oi JOIN orders o ON o.id = oi.order_id"
                " WHERE oi.product_id = :pid AND o.status = 'PAID'"
            ),
            {"pid": product_id},
        ).one()
        final = conn.execute(
            sa.text("SELECT available_stock FROM products WHERE id = :pid"), {"pid": product_id}
        ).scalar_one()
        duplicates = conn.execute(
            sa.text(
                "SELECT COUNT(*), COALESCE(SUM(n - 1), 0) FROM ("
                " SELECT o.idempotency_key, COUNT(*) AS n"
                " FROM order_items oi JOIN orders o ON o.id = oi.order_id"
                " WHERE oi.product_id = :pid AND o.status = 'PAID'"
                " GROUP BY o.idempotency_key HAVING COUNT(*) > 1) d"
            ),
            {"pid": product_id},
        ).one()
    return DbFigures(
        orders=int(row[0]),
        units=int(row[1]),
        negative_writes=int(row[2]),
        final_stock=int(final),
        duplicate_keys=int(duplicates[0]),
        duplicate_orders=int(duplicates[1]),
    )


def count_outbox(engine: Engine, sku: str) -> tuple[int, int]:
    """The outbox events of ``sku`` and how many of them are still unpublished, by SQL."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT COUNT(*), COALESCE(SUM(CASE WHEN published_at IS NULL THEN 1 ELSE 0 END),"
                " 0) FROM outbox WHERE sku = :sku"
            ),
            {"sku": sku},
        ).one()
    return int(row[0]), int(row[1])


def read_stock_by_id(engine: Engine, product_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT available_stock FROM products WHERE id = :pid"),
                {"pid": product_id},
            ).scalar_one()
        )


# --- the registry's totals --------------------------------------------------------------------


def sample(registry: CollectorRegistry, name: str, labels: Mapping[str, str]) -> float:
    value = registry.get_sample_value(name, dict(labels))
    return 0.0 if value is None else value


def durations(registry: CollectorRegistry) -> dict[str, float]:
    # The duration histogram has no sku label (bounded cardinality), so the lab takes the
    # difference before and after each strategy; strategies run one after the other.
    return {
        outcome: sample(registry, DURATION_COUNT, {"outcome": outcome})
        for outcome in catalog.OUTCOMES
    }


def unlabelled_totals(registry: CollectorRegistry, lock: str) -> dict[str, float]:
    """Totals of the metrics without a ``sku`` label, read before and after a strategy.

    Strategies run one after the other, so the difference is the strategy's own.
    """
    totals = {
        REPLAY: sample(registry, REPLAY, {"operation": IDEMPOTENT_OPERATION}),
        STALE: sample(registry, STALE, {"cache": CACHE_NAME}),
        UNSAFE_RMW: sample(registry, UNSAFE_RMW, {"table": STOCK_TABLE}),
        DEADLOCK: sample(registry, DEADLOCK, {"table": STOCK_TABLE}),
        LOCK_EXPIRED: sample(registry, LOCK_EXPIRED, {"lock": lock}),
        LOCK_NOT_OWNED: sample(registry, LOCK_NOT_OWNED, {"lock": lock}),
        LOCK_EXTEND_FAILED: sample(registry, LOCK_EXTEND_FAILED, {"lock": lock}),
        LOCK_RETRIES: sample(registry, LOCK_RETRIES, {"lock": lock}),
        f"{LOCK_RATIO}_count": sample(registry, f"{LOCK_RATIO}_count", {"lock": lock}),
        f"{LOCK_RATIO}_sum": sample(registry, f"{LOCK_RATIO}_sum", {"lock": lock}),
    }
    for outcome in ("acquired", "timeout", "error"):
        labels = {"lock": lock, "outcome": outcome}
        totals[f"{LOCK_WAIT}_count:{outcome}"] = sample(registry, f"{LOCK_WAIT}_count", labels)
        totals[f"{LOCK_WAIT}_sum:{outcome}"] = sample(registry, f"{LOCK_WAIT}_sum", labels)
    return totals


def percentile_ms(values: list[float], q: float) -> float:
    """Nearest-rank percentile, in milliseconds, rounded to 0.1 ms."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return round(ordered[rank - 1] * 1000, 1)


# --- the result --------------------------------------------------------------------------------


def strategy_result(
    lab: LabRun,
    name: str,
    sku: str,
    product_id: int,
    tally: Tally,
    wall: float,
    durations_before: dict[str, float],
    before: dict[str, float],
    samples: list[tuple[float, int]],
) -> StrategyResult:
    registry, config = lab.registry, lab.config
    db = count_in_db(lab.side, product_id)
    success = int(sample(registry, SUCCESS, {"sku": sku, "strategy": name}))
    conflicts = {
        reason: int(sample(registry, CONFLICT, {"sku": sku, "reason": reason}))
        for reason in catalog.CONFLICT_REASONS
    }
    conflict_total = sum(conflicts.values())
    negative = int(sample(registry, NEGATIVE, {"sku": sku}))
    durations_after = durations(registry)
    observed = {k: int(durations_after[k] - durations_before[k]) for k in durations_after}
    errors = observed["error"]
    after = unlabelled_totals(registry, name)
    delta = {key: after[key] - before[key] for key in after}
    replays = int(delta[REPLAY])
    stale = int(delta[STALE])
    unsafe_rmw = int(delta[UNSAFE_RMW]) if lab.detector else None
    metrics = {
        SUCCESS: success,
        CONFLICT: conflict_total,
        NEGATIVE: negative,
        DURATION_COUNT: sum(observed.values()),
        REPLAY: replays,
        STALE: stale,
    }
    if unsafe_rmw is not None:
        metrics[UNSAFE_RMW] = unsafe_rmw
    deadlocks = int(delta[DEADLOCK])
    extra_checks: list[tuple[bool, str]] = []
    if name == "deadlock" and lab.detector:
        metrics[DEADLOCK] = deadlocks
        extra_checks.append(
            (
                deadlocks == conflicts.get("deadlock", 0),
                f"{DEADLOCK} rose by {deadlocks} for {conflicts.get('deadlock', 0)}"
                " reservations refused with SQLSTATE 40P01",
            )
        )
    unpublished = 0
    if name == "outbox":
        events, unpublished = count_outbox(lab.side, sku)
        extra_checks.append(
            (events == db.orders, f"{events} outbox events for {db.orders} paid orders")
        )
    locks: dict[str, float] = {}
    lock_checks: tuple[tuple[bool, str], ...] = ()
    if name in REDIS_STRATEGIES:
        locks = lock_figures(delta)
        metrics.update(
            {
                LOCK_EXPIRED: int(locks["expired_while_held"]),
                LOCK_NOT_OWNED: int(locks["release_not_owned"]),
                LOCK_EXTEND_FAILED: int(locks["extend_failures"]),
                LOCK_RETRIES: int(locks["acquire_retries"]),
                f"{LOCK_WAIT}_count": int(
                    locks["acquired"] + locks["acquire_timeouts"] + locks["acquire_errors"]
                ),
            }
        )
        asked = metrics[f"{LOCK_WAIT}_count"]
        lock_checks = (
            (
                asked == tally.locked,
                f"{LOCK_WAIT}_count rose by {asked} for {tally.locked} reservations that"
                " asked for the lock",
            ),
        )

    checks = (
        (
            success == db.orders,
            f"{SUCCESS} = {success} but the database holds {db.orders} orders",
        ),
        (
            negative == db.negative_writes,
            f"{NEGATIVE} = {negative} but the database holds {db.negative_writes}"
            " negative stock writes",
        ),
        (
            success + conflict_total + errors == tally.reservations,
            f"success {success} + conflicts {conflict_total} + errors {errors}"
            f" != {tally.reservations} reservations",
        ),
        (
            metrics[DURATION_COUNT] == tally.reservations,
            f"{DURATION_COUNT} rose by {metrics[DURATION_COUNT]} for"
            f" {tally.reservations} reservations",
        ),
        (
            replays == tally.replays,
            f"{REPLAY} rose by {replays} for {tally.replays} resubmits answered from the"
            " idempotency record",
        ),
        (
            stale == tally.stale_hits,
            f"{STALE} rose by {stale} for {tally.stale_hits} decisions the database contradicted",
        ),
        *lock_checks,
        *extra_checks,
    )
    mismatches = tuple(message for ok, message in checks if not ok)
    return StrategyResult(
        strategy=name,
        sku=sku,
        stock_initial=config.stock,
        buyers=config.buyers,
        sold=db.units,
        orders=db.orders,
        oversold=max(0, db.units - config.stock),
        # Units sold that the stock column never saw go: each one is an overwritten update.
        lost_updates=max(0, db.units - (config.stock - db.final_stock)),
        final_stock=db.final_stock,
        conflicts={reason: n for reason, n in conflicts.items() if n},
        errors=errors,
        negative_writes=db.negative_writes,
        p50_ms=percentile_ms(tally.latencies, 0.50),
        p99_ms=percentile_ms(tally.latencies, 0.99),
        wall_s=round(wall, 3),
        metrics=metrics,
        db=db,
        consistent=not mismatches,
        mismatches=mismatches,
        first_error=tally.first_error,
        reservations=tally.reservations,
        resubmitted=tally.resubmitted,
        replays=replays,
        stale_cache_hits=stale,
        unsafe_read_modify_write=unsafe_rmw,
        locks=locks,
        samples=tuple(samples),
        notes=_notes(lab, name),
        deadlocks=deadlocks,
        outbox_unpublished=unpublished,
    )


def lock_figures(delta: Mapping[str, float]) -> dict[str, float]:
    acquired = delta[f"{LOCK_WAIT}_count:acquired"]
    ratios = delta[f"{LOCK_RATIO}_count"]
    waited = sum(delta[f"{LOCK_WAIT}_sum:{o}"] for o in ("acquired", "timeout", "error"))
    asked = sum(delta[f"{LOCK_WAIT}_count:{o}"] for o in ("acquired", "timeout", "error"))
    return {
        "acquired": int(acquired),
        "acquire_timeouts": int(delta[f"{LOCK_WAIT}_count:timeout"]),
        "acquire_errors": int(delta[f"{LOCK_WAIT}_count:error"]),
        "acquire_retries": int(delta[LOCK_RETRIES]),
        "acquire_wait_ms_mean": round(1000 * waited / asked, 3) if asked else 0.0,
        "expired_while_held": int(delta[LOCK_EXPIRED]),
        "release_not_owned": int(delta[LOCK_NOT_OWNED]),
        "extend_failures": int(delta[LOCK_EXTEND_FAILED]),
        "hold_ratio_mean": round(delta[f"{LOCK_RATIO}_sum"] / ratios, 3) if ratios else 0.0,
    }


def _notes(lab: LabRun, name: str) -> tuple[str, ...]:
    config = lab.config
    if name == "for_update" and lab.engine.dialect.name == "sqlite":
        return ("SQLite has no SELECT ... FOR UPDATE: BEGIN IMMEDIATE takes the write lock first",)
    if name == "naive_lock":
        return (
            f"SET NX PX {config.naive_lock_ttl_s * 1000:g} ms around {config.work_ms:g} ms of"
            " work, DEL without checking the token",
        )
    if name == "redlock":
        ttl = f"TTL {config.redlock_ttl_s:g} s, extended only while owned before the write"
        if config.redlock_impl == "pottery":
            return (f"pottery Redlock on one Redis master, retries with jitter, {ttl}",)
        return (
            "the lab's owned lock (SetNxLock): token, jittered retries,"
            f" compare-and-delete release, {ttl}",
        )
    if name == "retry_no_key":
        return (f"{config.retries:.0%} of the buyers resubmit; no idempotency store",)
    if name == "retry_idempotent":
        return (f"{config.retries:.0%} of the buyers resubmit; answered by idempotency key",)
    if name == "stale_cache":
        return (f"availability read from a cache refreshed every {config.cache_refresh_ms:g} ms",)
    if name == "outbox":
        return ("order and outbox event in one transaction; the publisher stalls part-way",)
    if name == "deadlock":
        return ("a bundle of two SKUs locked FOR UPDATE in opposite orders",)
    return ()
