"""The lab's final report on an 80-column terminal (rich tables, wrapped text): what the
database holds (counted by SQL), what caught each strategy (the lab's metrics, the
exporter's probes, the alerts Prometheus evaluated), then the details."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence

from .config import SAFE_STRATEGIES, LabConfig, StrategyResult
from .observe import EXPORTER_FIGURES
from .progress import WIDTH
from .report_text import alert_text, caught_lines, info_lines, setup_lines, signal_cell


def _probe_cell(result: StrategyResult) -> str:
    probes = result.probes
    if not probes:
        return "-"
    parts = [
        f"{short} {probes[name]:.3g}"
        for name, short in EXPORTER_FIGURES.items()
        if probes.get(name)
    ]
    return ", ".join(parts) or "0"


def alert_cell(result: StrategyResult, evaluated: bool) -> str:
    """The alerts of a strategy's sale: name, state, seconds after the first oversell."""
    if not evaluated:
        return "not evaluated"
    return "\n".join(alert_text(name, alert) for name, alert in result.alerts.items()) or "none"


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
        truth.add_row(
            r.strategy,
            str(r.sold),
            str(r.oversold),
            str(r.negative_writes),
            str(r.db.duplicate_orders),
            str(r.final_stock),
            f"{r.p99_ms:.0f}",
            "= db" if r.consistent else "NO",
        )
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
        rows.append(("alerts", alert_cell(r, evaluated).replace("\n", ", ")))
        for i, (label, text) in enumerate(rows):
            lead = (r.strategy if i == 0 else "").ljust(name_width) + f"{label:<9}"
            wrapped = textwrap.wrap(
                text,
                width=width - len(lead),
                break_on_hyphens=False,
                break_long_words=False,
            ) or ["-"]
            lines.append(lead + wrapped[0])
            lines += [" " * len(lead) + more for more in wrapped[1:]]
    return lines


def _safe_verdict(safe: Sequence[StrategyResult]) -> str:
    """What the safe strategies' alerts did: none may fire. A pending alert (its condition
    held for less than the rule's ``for:``) is said as pending, not as raised: that is the
    ``for:`` doing its job on real contention (fifty checkouts waiting on one row lock)."""
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
    if evaluated and any(a["state"] == "pending" for r in ran for a in r.alerts.values()):
        lines.append(
            wrap.fill(
                "  pending: the alert's condition held, but the rule's for: duration (15 s"
                " to 1 h in alert_rules/stocksentry.rules.yml) is longer than this demo;"
                " the rules are evaluated as shipped, not shortened"
            )
        )
    for r in ran:
        if r.strategy == "outbox" and r.outbox_unpublished:
            lag = r.probes.get("stock_outbox_lag_seconds")
            lines.append(
                wrap.fill(
                    f"  outbox: {r.outbox_unpublished} of {r.orders} events unpublished (SQL)"
                    + (f"; the exporter's outbox lag {lag:.1f} s" if lag is not None else "")
                    + "; StockOutboxLag fires once the oldest is older than"
                    " probes.outbox.max_publish_latency (30 s) on two probe runs, if the demo"
                    " lasts that long"
                )
            )
    lines.append("")
    safe = [r for r in ran if r.strategy in SAFE_STRATEGIES]
    if safe and evaluated:
        lines.append(wrap.fill(_safe_verdict(safe)))
    lines.append(
        wrap.fill(
            "sold, over(sold), neg(ative writes), dup(licate orders) and final stock are"
            " counted by SQL; metrics = db: every metric total equals that count."
        )
    )
    return "\n".join(lines)
