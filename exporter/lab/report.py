"""What the lab's reports say (the terminal summary here, the HTML page in
:mod:`.report_html`): what ran, what the database holds, what caught each strategy."""

from __future__ import annotations

import io
import textwrap
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.secrets import mask_url

from ..dburl import shown
from .config import (
    CACHE_NAME,
    IDEMPOTENT_OPERATION,
    SAFE_STRATEGIES,
    STOCK_TABLE,
    LabConfig,
    StrategyResult,
)
from .observe import EXPORTER_FIGURES
from .progress import WIDTH
from .readback import (
    DEADLOCK,
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
    """What the metrics said about a strategy that went wrong, one line per signal
    (empty for one that did nothing wrong, or was skipped)."""
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
    if result.deadlocks:
        lines.append(
            f'{DEADLOCK}{{table="{STOCK_TABLE}"}} = {result.deadlocks}: transactions took'
            " the SKUs' row locks in opposite orders and the database aborted one of each"
            " pair"
        )
    if result.outbox_unpublished:
        lines.append(
            f"{result.outbox_unpublished} outbox events unpublished when the sale ended (the"
            f" exporter's {catalog.OUTBOX_PENDING.name})"
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
    # A socket folder travels URL-encoded in the query (?host=%2Fvar%2Frun...): shown
    # decoded, for people; the password is masked before.
    return urllib.parse.unquote(shown(config.database_url))


def describe_redis(url: str | None) -> str | None:
    """The Redis URL without its password, for people (``None`` without Redis)."""
    if url is None:
        return None
    return mask_url(url) or "the given Redis"


NO_REDIS = "none (the lock strategies are skipped)"


def setup_lines(
    config: LabConfig, *, database: str | None = None, redis: str | None = None
) -> list[str]:
    """What ran: sizes, the database and Redis (``database``/``redis`` name them instead
    of their URLs, e.g. the embedded servers), the options that cut across strategies."""
    lines = [
        f"flash-sale lab: {config.buyers} buyers, {config.stock} units of one SKU per strategy,"
        f" {config.concurrency} threads, {config.work_ms:g} ms of work between read and write",
        f"database: {database or describe_database(config)}",
        f"redis: {redis or describe_redis(config.redis_url) or NO_REDIS}",
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


def _probe_cell(result: StrategyResult) -> str:
    if not result.probes:
        return "-"
    shown = [(short, result.probes.get(name)) for name, short in EXPORTER_FIGURES.items()]
    return ", ".join(f"{short} {value:.3g}" for short, value in shown if value) or "0"


def alert_cell(result: StrategyResult, evaluated: bool) -> str:
    """The alerts of a strategy's sale: name, state, seconds after the first oversell."""
    if not evaluated:
        return "not evaluated"
    return ", ".join(alert_text(name, alert) for name, alert in result.alerts.items()) or "none"


def _truth_table(results: Sequence[StrategyResult], width: int) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    truth = Table(
        title="what the database holds (counted by SQL)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        title_justify="left",
    )
    for header in ("strategy", "sold", "over", "neg", "dup", "final", "p99 ms", "metrics"):
        truth.add_column(header, justify="left" if header == "strategy" else "right")
    for r in results:
        counts = (r.sold, r.oversold, r.negative_writes, r.db.duplicate_orders, r.final_stock)
        verdict = "= db" if r.consistent else "NO"
        truth.add_row(r.strategy, *map(str, counts), f"{r.p99_ms:.0f}", verdict)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None, emoji=False, highlight=False).print(truth)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def _caught_blocks(
    results: Sequence[StrategyResult], evaluated: bool, watched: bool, width: int
) -> list[str]:
    """Per strategy: the lab's metrics, the exporter's figures, the alerts; wrapped."""
    name_width = max((len(r.strategy) for r in results), default=8) + 2
    lines = [
        "what caught it (alerts: seconds after the first oversell, or after the start",
        "of the sale when nothing was oversold):",
    ]
    for r in results:
        if r.skipped is not None:
            continue
        rows = [("metrics", signal_cell(r))]
        if watched:
            rows.append(("exporter", _probe_cell(r)))
        rows.append(("alerts", alert_cell(r, evaluated)))
        for i, (label, text) in enumerate(rows):
            lead = (r.strategy if i == 0 else "").ljust(name_width) + f"{label:<9}"
            wrapped = textwrap.wrap(
                text, width=width - len(lead), break_on_hyphens=False, break_long_words=False
            ) or ["-"]
            lines.append(lead + wrapped[0])
            lines += [" " * len(lead) + more for more in wrapped[1:]]
    return lines


def _safe_verdict(safe: Sequence[StrategyResult]) -> str:
    """What the safe strategies' alerts did: none may fire. A pending one is said as
    pending, not raised: that is the rule's ``for:`` doing its job on real contention."""
    firing = [r.strategy for r in safe if any(a["state"] == "firing" for a in r.alerts.values())]
    pending = [
        f"{r.strategy} ({', '.join(sorted(r.alerts))})"
        for r in safe
        if r.alerts and r.strategy not in firing
    ]
    text = f"the safe strategies ({', '.join(r.strategy for r in safe)}) " + (
        "fired alerts: " + ", ".join(firing) + " (see above)" if firing else "fired no alert"
    )
    if pending:
        text += "; pending only, never firing: " + ", ".join(pending)
    return text


def format_summary(
    config: LabConfig,
    results: Sequence[StrategyResult],
    *,
    notes: Sequence[str] = (),
    evaluated: bool = False,
    watched: bool = False,
    width: int = WIDTH,
    database: str | None = None,
    redis: str | None = None,
) -> str:
    """The final report in at most ``width`` columns (rich tables, wrapped text)."""
    wrap = textwrap.TextWrapper(width=width, subsequent_indent="    ", break_on_hyphens=False)
    ran = [r for r in results if r.skipped is None]
    lines = [
        *(
            wrap.fill(line)
            for line in (*setup_lines(config, database=database, redis=redis), *notes)
        ),
        "",
        _truth_table(ran, width),
        "",
        *_caught_blocks(results, evaluated, watched, width),
        "",
        *(
            wrap.fill(f"{r.strategy}  skipped: {r.skipped}")
            for r in results
            if r.skipped is not None
        ),
        "details:",
    ]
    for r in ran:
        lines += [
            wrap.fill(f"  {r.strategy}: {line}") for line in (*caught_lines(r), *info_lines(r))
        ]

    def add(text: str) -> None:
        lines.append(wrap.fill(text))

    if evaluated and any(a["state"] == "pending" for r in ran for a in r.alerts.values()):
        add(
            "  pending: the alert's condition held, but the rule's for: duration (15 s"
            " to 1 h in alert_rules/stocksentry.rules.yml) is longer than this demo;"
            " the rules are evaluated as shipped, not shortened"
        )
    for r in ran:
        if r.strategy == "outbox" and r.outbox_unpublished:
            lag = r.probes.get("stock_outbox_lag_seconds")
            add(
                f"  outbox: {r.outbox_unpublished} of {r.orders} events unpublished (SQL)"
                + (f"; the exporter's outbox lag {lag:.1f} s" if lag is not None else "")
                + "; StockOutboxLag fires once the oldest is older than"
                " probes.outbox.max_publish_latency (30 s) on two probe runs, if the demo"
                " lasts that long"
            )
    lines.append("")
    safe = [r for r in ran if r.strategy in SAFE_STRATEGIES]
    if safe and evaluated:
        add(_safe_verdict(safe))
    add(
        "sold, over(sold), neg(ative writes), dup(licate orders) and final stock are"
        " counted by SQL; metrics = db: every metric total equals that count."
    )
    return "\n".join(lines)
