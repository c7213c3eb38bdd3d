"""What every report of the lab says: the table's columns, what caught each strategy,
what went right, and what ran (the terminal summary and the HTML page both use these)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from stocksentry.instrumentation import catalog

from ..dburl import shown
from .config import CACHE_NAME, IDEMPOTENT_OPERATION, STOCK_TABLE, LabConfig, StrategyResult
from .readback import (
    LOCK_EXPIRED,
    LOCK_NOT_OWNED,
    NEGATIVE,
    REPLAY,
    STALE,
    SUCCESS,
    UNSAFE_RMW,
)


def signal_cell(result: StrategyResult) -> str:
    """What the lab's own metrics flagged, in a few words."""
    locks = result.locks
    figures = (
        ("oversold", result.oversold),
        ("lost updates", result.lost_updates),
        ("negative writes", result.negative_writes),
        ("lock expired", locks.get("expired_while_held", 0)),
        ("foreign DEL", locks.get("release_not_owned", 0)),
        ("dup orders", result.db.duplicate_orders),
        ("stale hits", result.stale_cache_hits),
        ("deadlocks", result.deadlocks),
        ("unpublished", result.outbox_unpublished),
        ("unsafe rmw", result.unsafe_read_modify_write),
        ("replays", result.replays),
    )
    return ", ".join(f"{label} {int(n)}" for label, n in figures if n) or "-"


def caught_lines(result: StrategyResult) -> list[str]:
    """What the metrics said about a strategy that went wrong, one line per signal.

    Oversold and negative stock (counted against the database), a lock that expired
    under its holder or was released by a holder that no longer owned it, duplicate
    orders per idempotency key, stale cache decisions, unsafe read-modify-writes seen in
    the SQL. Empty for a strategy that did none of these (and for a skipped one).
    """
    if result.skipped is not None:
        return []
    sku = result.sku
    lines = []
    if result.oversold:
        line = (
            f'{SUCCESS}{{sku="{sku}"}} = {result.metrics[SUCCESS]} > stock'
            f" {result.stock_initial}: oversold {result.oversold}"
        )
        if result.lost_updates:
            line += f" ({result.lost_updates} lost updates)"
        lines.append(line)
    if result.negative_writes or result.metrics.get(NEGATIVE):
        lines.append(
            f'{NEGATIVE}{{sku="{sku}"}} = {result.metrics[NEGATIVE]}:'
            f" writes left the stock below zero (final stock {result.final_stock})"
        )
    locks = result.locks
    if locks and (locks["expired_while_held"] or locks["release_not_owned"]):
        lock = f'{{lock="{result.strategy}"}}'
        lines.append(
            f"{LOCK_EXPIRED}{lock} = {int(locks['expired_while_held'])},"
            f" {LOCK_NOT_OWNED}{lock} = {int(locks['release_not_owned'])}:"
            " the lock's TTL ran out under the work, and holders released locks they no"
            " longer owned"
        )
    if result.db.duplicate_orders:
        lines.append(
            f"duplicate orders per idempotency key (SQL, the exporter's"
            f" {catalog.DUPLICATE_ORDER_KEYS.name}) = {result.db.duplicate_keys} keys,"
            f" {result.db.duplicate_orders} extra orders;"
            f' {REPLAY}{{operation="{IDEMPOTENT_OPERATION}"}} = {result.replays}'
        )
    elif result.strategy == "retry_no_key":
        # A resubmit reserves right after its first attempt: when the first wave alone
        # sells the stock out, no resubmit finds a unit and the scenario shows nothing.
        lines.append(
            "no duplicate order this run: every resubmit found the stock sold out; give"
            " --stock more units than --concurrency buyers to leave room for them"
        )
    if result.stale_cache_hits:
        lines.append(
            f'{STALE}{{cache="{CACHE_NAME}"}} = {result.stale_cache_hits}: the cache said'
            " available, the database said sold out"
        )
    if result.unsafe_read_modify_write:
        lines.append(
            f'{UNSAFE_RMW}{{table="{STOCK_TABLE}"}} = {result.unsafe_read_modify_write}:'
            " stock read without a lock, written back as a value computed in the app"
        )
    return lines


def info_lines(result: StrategyResult) -> list[str]:
    """What went right and is worth seeing: replays, lock waits, and the strategy's notes."""
    if result.skipped is not None:
        return [f"skipped: {result.skipped}"]
    lines = []
    if result.replays:
        lines.append(
            f'{REPLAY}{{operation="{IDEMPOTENT_OPERATION}"}} = {result.replays}: resubmits'
            " answered from the stored result, no second reservation"
        )
    locks = result.locks
    if locks:
        lines.append(
            f"lock: {int(locks['acquired'])} acquired, mean wait"
            f" {locks['acquire_wait_ms_mean']:g} ms, {int(locks['acquire_retries'])} retries,"
            f" mean hold/TTL {locks['hold_ratio_mean']:g}"
            + (
                f", {int(locks['extend_failures'])} extension failures"
                if locks["extend_failures"]
                else ""
            )
        )
    lines += [f"note: {note}" for note in result.notes]
    return lines


def describe_database(config: LabConfig) -> str:
    """Where the lab runs, for people: the URL without its password, or the SQLite default."""
    if config.database_url is None:
        return "embedded SQLite (temporary file)"
    return shown(config.database_url)


def describe_redis(config: LabConfig) -> str | None:
    """The Redis URL without its password, for people (``None`` without Redis)."""
    if config.redis_url is None:
        return None
    return re.sub(r"(//[^:@/]*):[^@/]*@", r"\1:***@", config.redis_url)


def setup_lines(
    config: LabConfig, *, database: str | None = None, redis: str | None = None
) -> list[str]:
    """What ran: sizes, the database and Redis (``database``/``redis`` name them instead
    of their URLs, e.g. the embedded servers), the options that cut across strategies."""
    lines = [
        f"flash-sale lab: {config.buyers} buyers, {config.stock} units of one SKU per strategy,"
        f" {config.concurrency} threads, {config.work_ms:g} ms of work between read and write",
        f"database: {database or describe_database(config)}",
        f"redis: {redis or describe_redis(config) or 'none (the lock strategies are skipped)'}",
    ]
    if config.retries:
        lines.append(
            f"retries: {config.retries:.0%} of the buyers submit the same intent twice,"
            f" idempotency {'on' if config.idempotency else 'OFF'}"
        )
    if config.stale_cache:
        backend = "a Redis key" if config.redis_url else "an in-process value"
        lines.append(
            f"stale cache: the decision reads {backend} refreshed every"
            f" {config.cache_refresh_ms:g} ms"
        )
    return lines


def alert_text(name: str, alert: Mapping[str, Any]) -> str:
    """One alert of a strategy: its name, state and seconds after the first oversell."""
    state = "FIRING" if alert["state"] == "firing" else "pending"
    return f"{name} {state} +{alert['after_s']:g}s"
