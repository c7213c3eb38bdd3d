"""The lab on an 80-column terminal: a live bar per strategy, and a summary that fits.

:class:`LiveProgress` draws one progress bar per strategy on stderr with rich (on a TTY;
elsewhere it writes one line per finished strategy, as
:class:`~stocksentry.exporter.lab.progress.StderrProgress` does).
:func:`format_summary` is the final report in at most ``width`` columns: what the
database holds (counted by SQL), then what caught each strategy (the lab's metrics, the
exporter's probes, the alerts Prometheus evaluated), then the details, wrapped.

Example::

    print(format_summary(config, results, notes=["alerts: ..."], width=80))
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from .config import LabConfig, StrategyResult
from .names import SAFE_STRATEGIES
from .progress import Progress, StderrProgress
from .report_text import caught_lines, info_lines, setup_lines

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["LiveProgress", "alert_cell", "format_summary", "signal_cell"]

#: The summary's width: a default terminal.
WIDTH = 80


def _console(width: int, file: TextIO | None = None) -> Console:
    from rich.console import Console

    return Console(
        file=file if file is not None else io.StringIO(),
        width=width,
        color_system=None,
        emoji=False,
        highlight=False,
        soft_wrap=False,
    )


def _render(width: int, *items: Any) -> str:
    out = io.StringIO()
    console = _console(width, out)
    for item in items:
        console.print(item)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def signal_cell(result: StrategyResult) -> str:
    """What the lab's own metrics flagged, in a few words."""
    parts = []
    if result.oversold:
        parts.append(f"oversold {result.oversold}")
    if result.lost_updates:
        parts.append(f"lost updates {result.lost_updates}")
    if result.negative_writes:
        parts.append(f"negative writes {result.negative_writes}")
    locks = result.locks
    if locks and locks.get("expired_while_held"):
        parts.append(f"lock expired {int(locks['expired_while_held'])}")
    if locks and locks.get("release_not_owned"):
        parts.append(f"foreign DEL {int(locks['release_not_owned'])}")
    if result.db.duplicate_orders:
        parts.append(f"dup orders {result.db.duplicate_orders}")
    if result.stale_cache_hits:
        parts.append(f"stale hits {result.stale_cache_hits}")
    if result.deadlocks:
        parts.append(f"deadlocks {result.deadlocks}")
    if result.outbox_unpublished:
        parts.append(f"unpublished {result.outbox_unpublished}")
    if result.unsafe_read_modify_write:
        parts.append(f"unsafe rmw {result.unsafe_read_modify_write}")
    if result.replays:
        parts.append(f"replays {result.replays}")
    return ", ".join(parts) or "-"


def _probe_cell(result: StrategyResult) -> str:
    probes = result.probes
    if not probes:
        return "-"
    names = {
        "stock_oversold_units": "oversold",
        "stock_negative_inventory_units": "negative",
        "stock_duplicate_order_keys": "dup keys",
        "stock_outbox_lag_seconds": "outbox lag s",
        "stock_outbox_pending_events": "pending",
        "stock_db_lock_waiters": "waiters",
    }
    parts = [f"{short} {probes[name]:.3g}" for name, short in names.items() if probes.get(name)]
    return ", ".join(parts) or "0"


def alert_cell(result: StrategyResult, evaluated: bool) -> str:
    """The alerts of a strategy's sale: name, state, seconds after the first oversell."""
    if not evaluated:
        return "not evaluated"
    if not result.alerts:
        return "none"
    lines = []
    for name, alert in result.alerts.items():
        state = "FIRING" if alert["state"] == "firing" else "pending"
        lines.append(f"{name} {state} +{alert['after_s']:g}s")
    return "\n".join(lines)


def _truth_table(results: Sequence[StrategyResult]) -> Table:
    from rich import box
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
        if r.skipped is not None:
            continue
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
    return truth


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
    lines = [
        wrap.fill(line) for line in (*setup_lines(config, database=database, redis=redis), *notes)
    ]
    body = [
        _render(width, _truth_table(results)),
        "",
        *_caught_blocks(results, evaluated, watched, width),
        "",
    ]
    skipped = [f"{r.strategy}  skipped: {r.skipped}" for r in results if r.skipped is not None]
    details = ["details:"]
    for r in results:
        if r.skipped is not None:
            continue
        for line in [*caught_lines(r), *info_lines(r)]:
            details.append(wrap.fill(f"  {r.strategy}: {line}"))
    if evaluated and any(a["state"] == "pending" for r in results for a in r.alerts.values()):
        details.append(
            wrap.fill(
                "  pending: the alert's condition held, but the rule's for: duration (15 s"
                " to 1 h in alert_rules/stocksentry.rules.yml) is longer than this demo;"
                " the rules are evaluated as shipped, not shortened"
            )
        )
    for r in results:
        if r.strategy == "outbox" and r.skipped is None and r.outbox_unpublished:
            lag = r.probes.get("stock_outbox_lag_seconds")
            details.append(
                wrap.fill(
                    f"  outbox: {r.outbox_unpublished} of {r.orders} events unpublished (SQL)"
                    + (f"; the exporter's outbox lag {lag:.1f} s" if lag is not None else "")
                    + "; StockOutboxLag fires once the oldest is older than"
                    " probes.outbox.max_publish_latency (30 s) on two probe runs, if the demo"
                    " lasts that long"
                )
            )
    safe = [r for r in results if r.skipped is None and r.strategy in SAFE_STRATEGIES]
    verdict = []
    if safe and evaluated:
        verdict.append(wrap.fill(_safe_verdict(safe)))
    return "\n".join(
        [
            *lines,
            "",
            *body,
            *[wrap.fill(line) for line in skipped],
            *details,
            "",
            *verdict,
            wrap.fill(
                "sold, over(sold), neg(ative writes), dup(licate orders) and final stock are"
                " counted by SQL; metrics = db: every metric total equals that count."
            ),
        ]
    )


class LiveProgress:
    """One progress bar per strategy on an 80-column terminal (rich), on stderr.

    Not on a TTY it falls back to one line per finished strategy. Call :meth:`close`
    at the end (also on error) to give the terminal back.
    """

    def __init__(
        self,
        stream: TextIO,
        strategies: Sequence[str],
        *,
        total: int,
        header: Sequence[str] = (),
    ) -> None:
        self._fallback: StderrProgress | None = None
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if not tty:
            self._fallback = StderrProgress(stream, tty=False, header=tuple(header))
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._console = Console(file=stream, width=min(WIDTH, Console(file=stream).width))
        self._header = tuple(header)
        self._bars = Progress(
            TextColumn("{task.description:<20}"),
            BarColumn(bar_width=20),
            TextColumn("{task.completed:>5.0f}/{task.total:<5.0f}"),
            TextColumn("{task.fields[sold]}"),
            TextColumn("{task.fields[secs]}"),
            console=self._console,
            transient=False,
            refresh_per_second=8,
        )
        self._tasks = {
            name: self._bars.add_task(name, total=total, start=False, sold="", secs="")
            for name in strategies
        }

    def start(self, database: str) -> None:
        if self._fallback is not None:
            self._fallback.start(database)
            return
        for line in (*self._header, f"flash-sale lab on {database}:"):
            self._console.print(line, soft_wrap=True, highlight=False)
        self._bars.start()

    def _show(self, p: Progress) -> None:
        task = self._tasks.get(p.strategy)
        if task is None:
            task = self._tasks[p.strategy] = self._bars.add_task(
                p.strategy, total=p.total, sold="", secs=""
            )
        self._bars.start_task(task)
        self._bars.update(
            task,
            total=p.total,
            completed=p.done,
            sold=f"sold {p.sold:>5}",
            secs=f"{p.elapsed_s:5.1f} s",
        )

    def update(self, progress: Progress) -> None:
        if self._fallback is not None:
            return
        self._show(progress)

    def finish(self, progress: Progress) -> None:
        if self._fallback is not None:
            self._fallback.finish(progress)
            return
        self._show(progress)
        self._bars.stop_task(self._tasks[progress.strategy])

    def close(self) -> None:
        if self._fallback is None:
            self._bars.stop()
