"""The lab's report as one self-contained HTML page with inline SVG charts: no script and
no external asset, so it can be mailed or opened from a CI artefact as it is."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata

from .config import LabConfig, StrategyResult
from .report import alert_cell, alert_text, caught_lines, info_lines, setup_lines, signal_cell

#: One colour per strategy, in the report's order (red for unsafe alone): as many as the
#: lab has strategies and one more, so no two lines of a chart share a colour.
_PALETTE = (
    "#d62728",  # red
    "#ff7f0e",  # orange
    "#9467bd",  # purple
    "#2ca02c",  # green
    "#1f77b4",  # blue
    "#17becf",  # cyan
    "#8c564b",  # brown
    "#e377c2",  # pink
    "#bcbd22",  # olive
    "#7f7f7f",  # grey
    "#393b79",  # navy
    "#637939",  # moss
)
#: The page style the lab's and the drill's reports share; each adds its own rules.
BASE_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; }
code { font-size: 0.92em; background: #f4f4f4; padding: 1px 3px; overflow-wrap: anywhere; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg { display: block; max-width: 100%; height: auto; }
"""
#: The page's own rules, after BASE_CSS.
_CSS = """
body { max-width: 1240px; } th, td { text-align: right; }
th:first-child, td:first-child, th.left, td.left { text-align: left; }
tr.bad td { background: #fdecea; } tr.skipped td { color: #888; font-style: italic; }
ul.caught li { margin: 0.2em 0; }
/* At 1,280 px the whole table shows: the long text cells wrap and the headers break;
   narrower, it scrolls in its own box (the page never does) and the charts shrink. */
* { box-sizing: border-box; }
.wide { max-width: 100%; overflow-x: auto; }
.wide table { font-size: 13px; }
th { vertical-align: bottom; }
td.left { min-width: 8em; max-width: 19em; }
td { vertical-align: top; } td:first-child { white-space: nowrap; } wbr { display: none; }
p.note { background: #fff4e5; border-left: 4px solid #d62728; padding: 6px 10px; }
@media (max-width: 900px) {
  .wide table { font-size: 12px; } th, td { padding: 3px 4px; } td.left { min-width: 6em; }
  td:first-child { white-space: normal; } wbr { display: inline; }
}
p.made { color: #555; }
"""


def esc(text: object) -> str:
    """``text`` escaped for HTML text and attribute values."""
    return html.escape(str(text), quote=True)


def svg_open(width: int, height: int, label: str) -> str:
    """The opening tag of an inline SVG chart of that size, named ``label``."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="{label}">'
    )


def _swatch(x: float, y: float, color: str, text: str) -> str:
    """A legend entry: a coloured square and its (escaped) text."""
    return (
        f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}"/>'
        f'<text x="{x + 16}" y="{y + 10}">{esc(text)}</text>'
    )


def _row_label(y: float, height: float, color: str, name: str) -> str:
    """A strategy's row in a bar chart: its colour marker and its name, centred on it."""
    return (
        f'<rect x="0" y="{y + 2}" width="6" height="{height - 4}" fill="{color}"/>'
        f'<text x="12" y="{y + height / 2 + 4:.0f}">{esc(name)}</text>'
    )


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first, last = math.floor(low / step), math.floor(high / step + 1e-9)
    return [round(n * step, 10) for n in range(first, last + 1)]


def _thin(samples: Sequence[tuple[float, int]], limit: int = 400) -> Sequence[tuple[float, int]]:
    if len(samples) <= limit:
        return samples
    step = len(samples) / limit
    return [*(samples[int(i * step)] for i in range(limit)), samples[-1]]


def _svg_stock(results: Sequence[StrategyResult], colors: Mapping[str, str]) -> str:
    """Stock over time, one line per strategy, with the zero line."""
    points = [p for r in results for p in r.samples]
    if not points:
        return "<p>No samples.</p>"
    legend = {
        r.strategy: f"{r.strategy} (final {r.final_stock}"
        + (f", sold {r.sold} of {r.stock_initial})" if r.oversold else ")")
        for r in results
    }
    right = 40 + 7 * max(len(text) for text in legend.values())
    height, left, top, bottom = 320, 56, 22, 40
    width = 560 + right
    plot_w, plot_h = width - left - right, height - top - bottom
    t_max = max(t for t, _ in points) or 1.0
    y_low = float(min(0, *(v for _, v in points)))
    y_high = float(max(1, *(v for _, v in points), *(r.stock_initial for r in results)))
    y_ticks = _nice_ticks(y_low, y_high)
    y_low, y_high = min(y_low, y_ticks[0]), max(y_high, y_ticks[-1])
    x_ticks = [t for t in _nice_ticks(0, t_max) if t <= t_max * 1.0001]

    def x(t: float) -> float:
        return left + plot_w * t / t_max

    def y(v: float) -> float:
        return top + plot_h * (y_high - v) / (y_high - y_low)

    out = [svg_open(width, height, "stock over time")]
    for v in y_ticks:
        # The zero line is the one that matters: dark and dashed; the others light.
        style = 'stroke="#444" stroke-dasharray="4 3"' if v == 0 else 'stroke="#e5e5e5"'
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" {style}/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>'
        )
    for t in x_ticks:
        out.append(
            f'<text x="{x(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{t:g}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle">'
        f'seconds since the sale opened</text><text x="{left - 6}" y="12" text-anchor="end">'
        "stock</text>"
    )
    for i, result in enumerate(results):
        color = colors[result.strategy]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in _thin(result.samples))
        out.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}">'
            f"<title>{esc(result.strategy)}</title></polyline>"
        )
        out.append(_swatch(width - right + 14, top + 5 + 18 * i, color, legend[result.strategy]))
    out.append("</svg>")
    return "".join(out)


def _stock_notes(results: Sequence[StrategyResult]) -> str:
    """What the stock chart cannot show: a line that stays up while the strategy sold past
    its stock (lost updates wrote stale values back), the gap being the oversell."""
    notes = []
    for r in results:
        if not r.oversold:
            continue
        arithmetic = r.stock_initial - r.sold
        if r.final_stock > arithmetic:
            notes.append(
                f"{r.strategy} sold {r.sold} of {r.stock_initial} units, yet its line ends at"
                f" {r.final_stock}, not at {arithmetic}: lost updates wrote stale values back"
                " over each other, so the stock column hid the sale. The gap is the"
                f" oversell, {r.oversold} units sold past the stock (counted from the orders"
                " by SQL), which no stock line shows."
            )
        else:
            notes.append(
                f"{r.strategy} sold {r.sold} of {r.stock_initial} units: its line goes"
                f" {-r.final_stock} below zero, the oversell the orders count is {r.oversold}."
            )
    return "".join(f"<p class=note>{esc(text)}</p>" for text in notes)


def _svg_outcomes(results: Sequence[StrategyResult], colors: Mapping[str, str]) -> str:
    """Stacked bars per strategy: sold within stock, oversold, refused, errors, replays."""
    segments: tuple[tuple[str, str, Callable[[StrategyResult], int]], ...] = (
        ("sold within stock", "#2ca02c", lambda r: min(r.sold, r.stock_initial)),
        ("oversold", "#d62728", lambda r: r.oversold),
        ("refused", "#bbbbbb", lambda r: sum(r.conflicts.values())),
        ("errors", "#333333", lambda r: r.errors),
        ("replayed", "#1f77b4", lambda r: r.replays),
    )
    label_w, bar_h, gap, top = 170, 22, 10, 34
    width = 760
    plot_w = width - label_w - 60
    height = top + len(results) * (bar_h + gap) + 10
    total = max((sum(f(r) for _, _, f in segments) for r in results), default=1) or 1
    out = [svg_open(width, height, "outcomes per strategy")]
    lx = label_w
    for name, color, _ in segments:
        out.append(_swatch(lx, 6, color, name))
        lx += 24 + 7 * len(name)
    for i, result in enumerate(results):
        y0 = top + i * (bar_h + gap)
        out.append(_row_label(y0 + 2, bar_h - 4, colors[result.strategy], result.strategy))
        x0 = float(label_w)
        for name, color, f in segments:
            n = f(result)
            if not n:
                continue
            w = plot_w * n / total
            out.append(
                f'<rect x="{x0:.1f}" y="{y0}" width="{w:.1f}" height="{bar_h}" fill="{color}">'
                f"<title>{name}: {n}</title></rect>"
            )
            if w > 28:
                out.append(
                    f'<text x="{x0 + w / 2:.1f}" y="{y0 + bar_h / 2 + 4:.0f}"'
                    f' text-anchor="middle" style="fill:#fff">{n}</text>'
                )
            x0 += w
    out.append("</svg>")
    return "".join(out)


def _svg_latency(results: Sequence[StrategyResult], colors: Mapping[str, str]) -> str:
    """p50 and p99 reservation latency per strategy, in milliseconds."""
    label_w, bar_h, gap, top = 170, 12, 12, 26
    width = 760
    plot_w = width - label_w - 90
    height = top + len(results) * (2 * bar_h + gap) + 10
    longest = max((r.p99_ms for r in results), default=1.0) or 1.0
    out = [
        svg_open(width, height, "latency p50 and p99"),
        _swatch(label_w, 6, "#9ecae1", "p50"),
        _swatch(label_w + 60, 6, "#3182bd", "p99 (ms, reservation)"),
    ]
    for i, result in enumerate(results):
        y0 = top + i * (2 * bar_h + gap)
        out.append(_row_label(y0, 2 * bar_h, colors[result.strategy], result.strategy))
        bars = ((result.p50_ms, "#9ecae1"), (result.p99_ms, "#3182bd"))
        for j, (value, color) in enumerate(bars):
            w = max(1.0, plot_w * value / longest)
            yy = y0 + j * bar_h
            out.append(
                f'<rect x="{label_w}" y="{yy}" width="{w:.1f}" height="{bar_h - 1}"'
                f' fill="{color}"/><text x="{label_w + w + 4:.1f}" y="{yy + bar_h - 2}">'
                f"{value:.1f}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _conflict_cell(r: StrategyResult) -> str:
    parts = [f"{reason} {n}" for reason, n in r.conflicts.items()]
    if r.errors:
        parts.append(f"error {r.errors}")
    return ", ".join(parts) or "-"


#: The table's columns: header, how a row's cell reads, and whether it is left-aligned.
_COLUMNS: tuple[tuple[str, Callable[[StrategyResult], object], bool], ...] = (
    ("strategy", lambda r: r.strategy, True),
    ("stock", lambda r: r.stock_initial, False),
    ("buyers", lambda r: r.buyers, False),
    ("sold", lambda r: r.sold, False),
    ("oversold", lambda r: r.oversold, False),
    ("final stock", lambda r: r.final_stock, False),
    ("conflicts", _conflict_cell, True),
    ("negative writes", lambda r: r.negative_writes, False),
    ("what the metrics flagged", signal_cell, True),
    ("p50 ms", lambda r: f"{r.p50_ms:.1f}", False),
    ("p99 ms", lambda r: f"{r.p99_ms:.1f}", False),
    ("metrics = db", lambda r: "yes" if r.consistent else "NO", True),
)


def _html_table(results: Sequence[StrategyResult]) -> str:
    head = "".join(
        f"<th{' class=left' if left else ''}>{esc(header)}</th>" for header, _, left in _COLUMNS
    )
    rows = []
    for r in results:
        if r.skipped is not None:
            rows.append(
                f'<tr class="skipped"><td>{esc(r.strategy)}</td>'
                f'<td class="left" colspan="{len(_COLUMNS) - 1}">'
                f"skipped: {esc(r.skipped)}</td></tr>"
            )
            continue
        bad = r.oversold or r.negative_writes or not r.consistent or r.db.duplicate_orders
        # A long strategy name may break after its underscores in a narrow window.
        cells = "".join(
            f"<td{' class=left' if left else ''}>{esc(cell(r)).replace('_', '_<wbr>')}</td>"
            for _, cell, left in _COLUMNS
        )
        rows.append(f"<tr{' class=bad' if bad else ''}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _alerts_table(results: Sequence[StrategyResult]) -> str:
    """The alerts Prometheus evaluated, per strategy (none when it did not run)."""
    if not any(r.alerts or r.probes for r in results):
        return ""
    rows = []
    for r in results:
        probes = ", ".join(f"{name} {value:g}" for name, value in r.probes.items() if value)
        rows.append(
            f"<tr><td>{esc(r.strategy)}</td><td class=left>{esc(alert_cell(r, True))}</td>"
            f"<td class=left><code>{esc(probes or '-')}</code></td></tr>"
        )
    return (
        "<h2>Alerts and the exporter's probes</h2><p>Alert times are seconds after the"
        " strategy's first oversell, or after the start of its sale when it oversold"
        " nothing.</p><div class=wide><table><thead><tr><th>strategy</th><th class=left>alerts"
        " (Prometheus)</th><th class=left>exporter</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def format_html(
    config: LabConfig,
    results: list[StrategyResult],
    *,
    command: str | None = None,
    notes: Sequence[str] = (),
    database: str | None = None,
    redis: str | None = None,
) -> str:
    """The report as one self-contained HTML page (no script, no external asset): the
    table, three charts, what caught each strategy. ``command`` is the command line that
    made the page; ``notes`` are extra set-up lines; ``database``/``redis`` name them
    instead of their URLs (the embedded servers), as in the terminal summary."""
    ran = [r for r in results if r.skipped is None]
    colors = {r.strategy: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(results)}
    caught = []
    for r in results:
        alerts = [f"alert {alert_text(name, a)}" for name, a in r.alerts.items()]
        lines = [*caught_lines(r), *alerts] or (
            [f"nothing to catch: sold {r.sold} of {r.stock_initial}"] if r.skipped is None else []
        )
        items = "".join(f"<li><code>{esc(line)}</code></li>" for line in lines)
        items += "".join(f"<li>{esc(line)}</li>" for line in info_lines(r))
        caught.append(f"<h3>{esc(r.strategy)}</h3><ul class=caught>{items}</ul>")
    try:
        version = metadata.version("stocksentry")
    except metadata.PackageNotFoundError:
        version = "unknown"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    setup = "".join(
        f"<li>{esc(line)}</li>"
        for line in (*setup_lines(config, database=database, redis=redis), *notes)
    )
    made = f"stocksentry {esc(version)}, {esc(stamp)}"
    if command is not None:
        made += f"<br>command: <code>{esc(command)}</code>"
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<title>stocksentry flash-sale lab</title>"
        f"<style>{BASE_CSS}{_CSS}</style></head><body>"
        f"<h1>stocksentry flash-sale lab</h1><p class=made>{made}</p><ul>{setup}</ul>"
        f"<div class=wide>{_html_table(results)}</div>"
        "<p>sold, oversold, final stock, negative writes and duplicate orders are counted by"
        " SQL in the database; metrics = db: every metric total equals that count.</p>"
        "<h2>Stock over time</h2>"
        f"{_svg_stock(ran, colors)}{_stock_notes(ran)}"
        "<h2>Outcomes per strategy</h2>"
        f"{_svg_outcomes(ran, colors)}"
        "<h2>Reservation latency</h2>"
        f"{_svg_latency(ran, colors)}"
        "<h2>What caught it</h2>"
        f"{''.join(caught)}"
        f"{_alerts_table(ran)}"
        "</body></html>\n"
    )
