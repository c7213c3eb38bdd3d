"""The lab's text report: the side-by-side table and what the metrics caught.

Example::

    results = run_lab(config)
    print(format_report(config, results))   # set-up lines, the table, what caught it
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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

__all__ = [
    "Column",
    "caught_lines",
    "columns_for",
    "describe_database",
    "describe_redis",
    "format_report",
    "format_table",
    "info_lines",
    "setup_lines",
]


def _conflict_text(conflicts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in conflicts.items()) or "-"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the table: its header, how a row's cell reads, and its alignment."""

    header: str
    cell: Callable[[StrategyResult], str]
    left: bool = False


def columns_for(results: Sequence[StrategyResult]) -> list[Column]:
    """The table's columns: the fixed ones, and those the run has something to say in."""
    ran = [r for r in results if r.skipped is None]

    def lock_cell(key: str) -> Callable[[StrategyResult], str]:
        return lambda r: str(int(r.locks[key])) if r.locks else "-"

    columns = [
        Column("strategy", lambda r: r.strategy, left=True),
        Column("stock", lambda r: str(r.stock_initial)),
        Column("buyers", lambda r: str(r.buyers)),
        Column("sold", lambda r: str(r.sold)),
        Column("oversold", lambda r: str(r.oversold)),
        Column("final stock", lambda r: str(r.final_stock)),
        Column(
            "conflicts",
            lambda r: _conflict_text(r.conflicts) + (f", error {r.errors}" if r.errors else ""),
            left=True,
        ),
        Column("negative writes", lambda r: str(r.negative_writes)),
    ]
    if any(r.locks for r in ran):
        columns += [
            Column("lock expired", lock_cell("expired_while_held")),
            Column("not owned", lock_cell("release_not_owned")),
        ]
    if any(r.resubmitted for r in ran):
        columns += [
            Column("replays", lambda r: str(r.replays)),
            Column("dup orders", lambda r: str(r.duplicate_orders)),
        ]
    if any(STALE in r.metrics and r.stale_cache_hits for r in ran):
        columns.append(Column("stale hits", lambda r: str(r.stale_cache_hits)))
    if any(r.unsafe_read_modify_write is not None for r in ran):
        columns.append(
            Column(
                "unsafe rmw",
                lambda r: (
                    "-" if r.unsafe_read_modify_write is None else str(r.unsafe_read_modify_write)
                ),
            )
        )
    columns += [
        Column("p50 ms", lambda r: f"{r.p50_ms:.1f}"),
        Column("p99 ms", lambda r: f"{r.p99_ms:.1f}"),
        Column("metrics = db", lambda r: "yes" if r.consistent else "NO", left=True),
    ]
    return columns


def format_table(results: list[StrategyResult]) -> str:
    """The side-by-side report, one row per strategy; a skipped one says why.

    Columns for lock metrics, replays and duplicate orders, stale cache hits and unsafe
    read-modify-writes appear when the run has them.
    """
    columns = columns_for(results)
    headers = tuple(c.header for c in columns)
    rows = [tuple(c.cell(r) for c in columns) for r in results if r.skipped is None]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    widths[0] = max([widths[0], *(len(r.strategy) for r in results)])

    def render(row: tuple[str, ...]) -> str:
        cells = (
            cell.ljust(widths[i]) if columns[i].left else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    lines = [render(headers), rule]
    rendered = iter(rows)
    for result in results:
        if result.skipped is not None:
            lines.append(f"{result.strategy.ljust(widths[0])}  skipped: {result.skipped}")
        else:
            lines.append(render(next(rendered)))
    return "\n".join(lines)


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


def format_report(config: LabConfig, results: list[StrategyResult]) -> str:
    """The whole text report: what ran, the table, and what the metrics caught."""
    lines = [*setup_lines(config), "", format_table(results), "", "what caught it:"]
    width = max((len(r.strategy) for r in results), default=0)
    for result in results:
        if result.skipped is None:
            refused = sum(result.conflicts.values())
            caught = caught_lines(result) or [
                f"nothing to catch: sold {result.sold} of {result.stock_initial},"
                f" {refused} refused"
                + (f" as {', '.join(result.conflicts)}" if result.conflicts else "")
            ]
        else:
            caught = []
        for i, line in enumerate([*caught, *info_lines(result)]):
            lines.append(f"  {(result.strategy if i == 0 else ''):<{width}}  {line}")
    lines += [
        "",
        "sold, oversold, final stock, negative writes and duplicate orders are counted by SQL",
        "in the database; metrics = db: every metric total of the strategy equals that count.",
    ]
    return "\n".join(lines)
