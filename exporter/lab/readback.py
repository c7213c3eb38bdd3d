"""What the lab reads back after a strategy's run: the registry's totals and SQL's truth,
compared by :func:`strategy_result`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import Engine
from stocksentry.instrumentation import catalog

from .config import (
    CACHE_NAME,
    IDEMPOTENT_OPERATION,
    REDIS_STRATEGIES,
    STOCK_TABLE,
    DbFigures,
    StrategyResult,
)

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


def _row(engine: Engine, sql: str, **params: object) -> sa.Row[Any]:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).one()


def count_in_db(engine: Engine, product_id: int) -> DbFigures:
    """The ground truth: paid orders, units and negative writes by SQL, and the stock."""
    orders, units, negative = _row(
        engine,
        "SELECT COUNT(DISTINCT o.id), COALESCE(SUM(oi.quantity), 0),"
        " COALESCE(SUM(CASE WHEN oi.stock_after < 0 THEN 1 ELSE 0 END), 0)"
        " FROM order_items oi JOIN orders o ON o.id = oi.order_id"
        " WHERE oi.product_id = :pid AND o.status = 'PAID'",
        pid=product_id,
    )
    keys, extra = _row(
        engine,
        "SELECT COUNT(*), COALESCE(SUM(n - 1), 0) FROM (SELECT o.idempotency_key, COUNT(*) AS n"
        " FROM order_items oi JOIN orders o ON o.id = oi.order_id"
        " WHERE oi.product_id = :pid AND o.status = 'PAID'"
        " GROUP BY o.idempotency_key HAVING COUNT(*) > 1) d",
        pid=product_id,
    )
    stock = read_stock_by_id(engine, product_id)
    return DbFigures(int(orders), int(units), int(negative), stock, int(keys), int(extra))


def read_stock_by_id(engine: Engine, product_id: int) -> int:
    sql = "SELECT available_stock FROM products WHERE id = :pid"
    return int(_row(engine, sql, pid=product_id)[0])


#: The metrics without a ``sku`` label, by their labels (``lock`` is the strategy's name).
UNLABELLED = {
    REPLAY: {"operation": IDEMPOTENT_OPERATION},
    STALE: {"cache": CACHE_NAME},
    UNSAFE_RMW: {"table": STOCK_TABLE},
    DEADLOCK: {"table": STOCK_TABLE},
}
#: The lock counters a result shows as they rose, and the series read per lock.
LOCK_COUNTERS = (LOCK_EXPIRED, LOCK_NOT_OWNED, LOCK_EXTEND_FAILED, LOCK_RETRIES)
LOCK_SERIES = (*LOCK_COUNTERS, f"{LOCK_RATIO}_count", f"{LOCK_RATIO}_sum")
LOCK_OUTCOMES = ("acquired", "timeout", "error")


def sample(registry: CollectorRegistry, name: str, labels: Mapping[str, str]) -> float:
    return registry.get_sample_value(name, dict(labels)) or 0.0


def unlabelled_totals(registry: CollectorRegistry, lock: str) -> dict[str, float]:
    """Totals of the series without a ``sku`` label, read before and after a strategy:
    strategies run one after the other, so the difference is the strategy's own."""
    totals = {name: sample(registry, name, labels) for name, labels in UNLABELLED.items()}
    totals.update({name: sample(registry, name, {"lock": lock}) for name in LOCK_SERIES})
    for outcome in catalog.OUTCOMES:
        labels = {"outcome": outcome}
        totals[f"{DURATION_COUNT}:{outcome}"] = sample(registry, DURATION_COUNT, labels)
    for outcome in LOCK_OUTCOMES:
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


def strategy_result(
    lab: LabRun,
    name: str,
    sku: str,
    product_id: int,
    tally: Tally,
    timing: tuple[float, float],
    before: dict[str, float],
    samples: list[tuple[float, int]],
) -> StrategyResult:
    registry, config = lab.registry, lab.config
    started_at, wall = timing
    db = count_in_db(lab.side, product_id)
    success = int(sample(registry, SUCCESS, {"sku": sku, "strategy": name}))
    conflicts = {
        reason: int(sample(registry, CONFLICT, {"sku": sku, "reason": reason}))
        for reason in catalog.CONFLICT_REASONS
    }
    conflict_total = sum(conflicts.values())
    negative = int(sample(registry, NEGATIVE, {"sku": sku}))
    after = unlabelled_totals(registry, name)
    delta = {key: after[key] - before[key] for key in after}
    observed = {o: int(delta[f"{DURATION_COUNT}:{o}"]) for o in catalog.OUTCOMES}
    errors = observed["error"]
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
    checks = [
        (success == db.orders, f"{SUCCESS} = {success} but the database holds {db.orders} orders"),
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
    ]
    locks: dict[str, float] = {}
    if name in REDIS_STRATEGIES:
        locks = lock_figures(delta)
        asked = int(locks["acquired"] + locks["acquire_timeouts"] + locks["acquire_errors"])
        metrics.update({counter: int(delta[counter]) for counter in LOCK_COUNTERS})
        metrics[f"{LOCK_WAIT}_count"] = asked
        checks.append(
            (
                asked == tally.locked,
                f"{LOCK_WAIT}_count rose by {asked} for {tally.locked} reservations that"
                " asked for the lock",
            )
        )
    deadlocks = int(delta[DEADLOCK])
    if name == "deadlock" and lab.detector:
        metrics[DEADLOCK] = deadlocks
        refused = conflicts.get("deadlock", 0)
        checks.append(
            (
                deadlocks == refused,
                f"{DEADLOCK} rose by {deadlocks} for {refused} reservations refused with"
                " SQLSTATE 40P01",
            )
        )
    unpublished = 0
    if name == "outbox":
        # The SKU's outbox events, and how many are still unpublished.
        sql = (
            "SELECT COUNT(*), COALESCE(SUM(CASE WHEN published_at IS NULL THEN 1 ELSE 0 END), 0)"
            " FROM outbox WHERE sku = :sku"
        )
        events, unpublished = map(int, _row(lab.side, sql, sku=sku))
        checks.append((events == db.orders, f"{events} outbox events for {db.orders} paid orders"))
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
        started_at=round(started_at, 3),
        ended_at=round(started_at + wall, 3),
        first_oversell_at=tally.first_oversell_at,
        first_refused_at=tally.first_refused_at,
    )


def lock_figures(delta: Mapping[str, float]) -> dict[str, float]:
    asked = {o: int(delta[f"{LOCK_WAIT}_count:{o}"]) for o in LOCK_OUTCOMES}
    total = sum(asked.values())
    waited = sum(delta[f"{LOCK_WAIT}_sum:{o}"] for o in LOCK_OUTCOMES)
    ratios = delta[f"{LOCK_RATIO}_count"]
    return {
        "acquired": asked["acquired"],
        "acquire_timeouts": asked["timeout"],
        "acquire_errors": asked["error"],
        "acquire_retries": int(delta[LOCK_RETRIES]),
        "acquire_wait_ms_mean": round(1000 * waited / total, 3) if total else 0.0,
        "expired_while_held": int(delta[LOCK_EXPIRED]),
        "release_not_owned": int(delta[LOCK_NOT_OWNED]),
        "extend_failures": int(delta[LOCK_EXTEND_FAILED]),
        "hold_ratio_mean": round(delta[f"{LOCK_RATIO}_sum"] / ratios, 3) if ratios else 0.0,
    }


def _notes(lab: LabRun, name: str) -> tuple[str, ...]:
    config = lab.config
    owned = (
        "pottery Redlock on one Redis master, retries with jitter"
        if config.redlock_impl == "pottery"
        else "the lab's owned lock (SetNxLock): token, jittered retries,"
        " compare-and-delete release"
    )
    notes = {
        "naive_lock": f"SET NX PX {config.naive_lock_ttl_s * 1000:g} ms around"
        f" {config.work_ms:g} ms of work, DEL without checking the token",
        "redlock": f"{owned}, TTL {config.redlock_ttl_s:g} s, extended only while owned"
        " before the write",
        "retry_no_key": f"{config.retries:.0%} of the buyers resubmit; no idempotency store",
        "retry_idempotent": f"{config.retries:.0%} of the buyers resubmit; answered by"
        " idempotency key",
        "stale_cache": "availability read from a cache refreshed every"
        f" {config.cache_refresh_ms:g} ms",
        "outbox": "order and outbox event in one transaction; the publisher stalls part-way",
        "deadlock": "a bundle of two SKUs locked FOR UPDATE in opposite orders",
    }
    if name == "for_update" and lab.engine.dialect.name == "sqlite":
        return ("SQLite has no SELECT ... FOR UPDATE: BEGIN IMMEDIATE takes the write lock first",)
    return (notes[name],) if name in notes else ()
