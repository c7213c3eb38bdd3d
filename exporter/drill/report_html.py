"""``--report FILE.html``: the drill as one self-contained page (inline SVG, no script, no
external asset), in the lab report's style: the verdict and the incident's four answers,
each scenario with its failures, successes against the stock, the latency histogram and
the burst's timeline."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from ..lab.report_html import BASE_CSS, esc, svg_open
from .report import answers, overall
from .scenarios import ScenarioResult

__all__ = ["format_html"]

#: The page's own rules, after the lab report's BASE_CSS.
_CSS = """
body { max-width: 1000px; } th, td { text-align: left; }
tr.fail td { background: #fdecea; } tr.unverified td { background: #fff4e0; }
.verdict-pass { color: #2ca02c; } .verdict-fail, .verdict-unverified { color: #d62728; }
"""
_GOOD, _BAD, _STOCK = "#2ca02c", "#d62728", "#1f77b4"
#: Latency buckets' upper bounds, in seconds (the last is everything slower).
_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, math.inf)


def _bars(results: Sequence[ScenarioResult]) -> str:
    """Per scenario: what sold (or succeeded) against what it may sell."""
    rows = []
    for r in results:
        f = r.figures
        if r.name == "burst" and "successes" in f:
            rows.append(("burst: successes", f["successes"], f["stock"]))
            if "units_sold" in f:
                rows.append(("burst: units paid", f["units_sold"], f["stock"]))
        elif r.name in ("retry", "duplicate_callback") and "units_sold" in f:
            allowed = f.get("intents", f.get("payments", 0))
            rows.append((f"{r.name}: units paid", f["units_sold"], allowed))
    if not rows:
        return "<p>No scenario sold anything.</p>"
    top = max(max(v, s) for _, v, s in rows) or 1
    width, left, bar = 720, 190, 22
    body = []
    for i, (name, value, allowed) in enumerate(rows):
        y = 10 + i * (bar + 12)
        scale = (width - left - 60) / top
        color = _BAD if value > allowed else _GOOD
        body.append(f'<text x="0" y="{y + 15}">{esc(name)}</text>')
        body.append(
            f'<rect x="{left}" y="{y}" width="{value * scale:.1f}" height="{bar}"'
            f' fill="{color}"><title>{value}</title></rect>'
        )
        body.append(
            f'<line x1="{left + allowed * scale:.1f}" x2="{left + allowed * scale:.1f}"'
            f' y1="{y - 3}" y2="{y + bar + 3}" stroke="{_STOCK}" stroke-width="3"/>'
        )
        body.append(f'<text x="{left + value * scale + 6:.1f}" y="{y + 15}">{value}</text>')
    height = 20 + len(rows) * (bar + 12)
    legend = (
        f'<p>Bars: units (red when beyond the limit); <span style="color:{_STOCK}">blue'
        " line</span>: the stock (burst) or the intents (retries).</p>"
    )
    return (
        svg_open(width, height, "successes against the stock") + "".join(body) + "</svg>" + legend
    )


def _histogram(results: Sequence[ScenarioResult]) -> str:
    latencies = [x for r in results for x in r.latencies]
    if not latencies:
        return "<p>No response was read.</p>"
    counts = [0] * len(_BOUNDS)
    for x in latencies:
        counts[next(i for i, bound in enumerate(_BOUNDS) if x <= bound)] += 1
    width, height, base = 720, 200, 170
    step = (width - 40) / len(_BOUNDS)
    top = max(counts)
    body = []
    for i, (bound, count) in enumerate(zip(_BOUNDS, counts, strict=True)):
        h = 140 * count / top
        x = 30 + i * step
        label = "slower" if math.isinf(bound) else f"≤{bound * 1000:g} ms"
        body.append(
            f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{step - 8:.1f}" height="{h:.1f}"'
            f' fill="{_STOCK}"><title>{count}</title></rect>'
        )
        body.append(f'<text x="{x:.1f}" y="{base + 14}">{esc(label)}</text>')
        if count:
            body.append(f'<text x="{x:.1f}" y="{base - h - 4:.1f}">{count}</text>')
    return svg_open(width, height, "latency histogram") + "".join(body) + "</svg>"


def _timeline(results: Sequence[ScenarioResult]) -> str:
    burst = next((r for r in results if r.name == "burst" and r.timeline), None)
    if burst is None:
        return "<p>The burst did not run.</p>"
    start = min(t for t, _ in burst.timeline)
    span = max(t for t, _ in burst.timeline) - start or 1e-3
    width, height = 720, 120
    body = [f'<line x1="20" x2="{width - 20}" y1="60" y2="60" stroke="#999"/>']
    # The sales the stock covers in green, those beyond it in red, in the order answered.
    covered = int(burst.figures.get("stock", 0)) // max(1, int(burst.figures.get("qty", 1)))
    sales = 0
    for t, ok in sorted(burst.timeline):
        x = 20 + (width - 40) * (t - start) / span
        sales += ok
        color = (_GOOD if sales <= covered else _BAD) if ok else "#999"
        # Answers a moment apart would hide each other: each a little lower than the last.
        y = 28 + (sales % 4) * 7 if ok else 76 + (len(body) % 3) * 6
        body.append(f'<circle cx="{x:.1f}" cy="{y}" r="4" fill="{color}"/>')
    body.append(
        '<text x="20" y="20">sales (top: green within the stock, red beyond it) and'
        " refusals (bottom, grey), as answered</text>"
    )
    body.append(f'<text x="{width - 120}" y="112">{span * 1000:.1f} ms in all</text>')
    return svg_open(width, height, "burst timeline") + "".join(body) + "</svg>"


def format_html(
    results: Sequence[ScenarioResult],
    *,
    target: dict[str, str],
    restored: str | None,
    command: str,
) -> str:
    """The page."""
    verdict = overall(results)
    made = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        f"<!doctype html><html lang=en><head><meta charset=utf-8><style>{BASE_CSS}{_CSS}</style>",
        f"<title>stocksentry drill: {esc(verdict)}</title></head><body>",
        f"<h1>stocksentry drill: <span class=verdict-{verdict}>{verdict.upper()}</span></h1>",
        f"<p><code>{esc(command)}</code><br>{esc(made)}</p>",
        f"<p>Checkout <code>{esc(target['checkout'])}</code>, database"
        f" <code>{esc(target['database'])}</code>, SKU <code>{esc(target['sku'])}</code>.</p>",
        "<table>",
        *(f"<tr><th>{esc(q)}</th><td>{esc(a)}</td></tr>" for q, a in answers(results)),
        "</table><h2>Scenarios</h2><table><tr><th>scenario</th><th>verdict</th>"
        "<th>what failed</th></tr>",
    ]
    for r in results:
        parts.append(
            f"<tr class={r.verdict}><td>{esc(r.name)}</td><td>{r.verdict}</td><td>"
            + "<br>".join(esc(line) for line in r.notes)
            + "</td></tr>"
        )
    parts += [
        "</table>",
        "<h2>Successes against the stock</h2>",
        _bars(results),
        "<h2>Latency (last byte sent to response read)</h2>",
        _histogram(results),
        "<h2>The burst</h2>",
        _timeline(results),
    ]
    if restored:
        parts.append(f"<p>{esc(restored)}</p>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
