"""The drill's reports: the terminal's 80 columns, JSON and JUnit XML, each opening with
the incident's four questions and their answers."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any, Final

from .scenarios import ScenarioResult

__all__ = ["answers", "format_json", "format_junit", "format_text", "overall"]

#: The width the terminal report keeps within.
WIDTH: Final = 80


def overall(results: Sequence[ScenarioResult]) -> str:
    """``fail`` when a scenario failed, else ``unverified`` when one could not be judged,
    else ``pass``: an unverified scenario is never a pass."""
    if any(r.passed is False for r in results):
        return "fail"
    if not results or any(r.passed is None for r in results):
        return "unverified"
    return "pass"


#: The incident's four questions, in the order the reports answer them.
QUESTIONS: Final = (
    "How many checkouts succeeded?",
    "Did successes exceed the stock?",
    "Is the final stock negative or inconsistent?",
    "Duplicate orders per user or payment?",
)


def answers(results: Sequence[ScenarioResult]) -> list[tuple[str, str]]:
    """The incident's four questions, each with the drill's answer."""
    found = {r.name: r for r in results}
    f = found["burst"].figures if "burst" in found else {}
    said = ["burst not run"] * 3
    if "successes" in f:
        over = f["successes"] > f["stock"] or f.get("oversold", 0) > 0
        said = [
            f"{f['successes']} of {f['requests']} (stock {f['stock']})",
            f"YES, oversold by {f['oversold']}" if over else "no",
            "not verified",
        ]
        if "final_stock" in f:
            final, sold, stock = f["final_stock"], f["units_sold"], f["stock"]
            wrong = final < 0 or final + sold != stock
            said[2] = f"{'YES' if wrong else 'no'}: final {final}, {sold} sold of {stock}"
    keyed = [found[n] for n in ("retry", "duplicate_callback") if n in found]
    parts = []
    for r in keyed:
        if r.passed is None:
            parts.append(f"{r.name}: not verified")
        elif "duplicated_keys" in r.figures:
            dup = r.figures["duplicated_keys"]
            parts.append(f"{r.name}: {f'YES, {dup} keys' if dup else 'no'}")
    said.append("; ".join(parts) if keyed else "retry not run")
    return list(zip(QUESTIONS, said, strict=True))


#: How the terminal shows each scenario's figures (any figure missing: all of them).
_SUMMARIES: Final = {
    "burst": "{successes}/{requests} succeeded, stock {stock}, sold {units_sold}, final"
    " stock {final_stock}, oversold {oversold}, arrival spread {arrival_spread_ms} ms",
    "retry": "{intents} intents sent twice: {duplicated_keys} ordered more than once"
    " ({extra_orders} extra orders), {units_sold} units sold",
    "duplicate_callback": "{payments} payments called back twice: {duplicated_keys} paid"
    " more than once ({extra_orders} extra orders), {units_sold} units sold",
    "stale_availability": "said available for {stale_window_ms} ms after the sell-out"
    " (threshold {threshold_ms} ms), {stale_answers} stale answers",
}


def _observed(figures: dict[str, Any]) -> str:
    caused = figures.get("caused", [])
    seen = figures.get("seen", {})
    if not caused:
        return f"nothing to see; monitor on, lock waits {figures.get('lock_waits', 0)}"
    parts = [
        f"{problem.replace('_', ' ')}: {', '.join(seen.get(problem, [])) or 'NOT SEEN'}"
        for problem in caused
    ]
    return "; ".join(parts) + f"; lock waits {figures.get('lock_waits', 0)}"


def _figures_line(result: ScenarioResult) -> str:
    if result.name == "observability" and "caused" in result.figures:
        return _observed(result.figures)
    template = _SUMMARIES.get(result.name)
    if template is not None:
        try:
            return template.format(**result.figures)
        except KeyError:
            pass
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in result.figures.items())


def format_text(
    results: Sequence[ScenarioResult], *, target: dict[str, str], restored: str | None
) -> str:
    """The terminal report, at most :data:`WIDTH` columns."""
    wrap = textwrap.TextWrapper(width=WIDTH, subsequent_indent="    ", break_on_hyphens=False)
    # The incident's four questions first: what a reader of the drill asks.
    lines = []
    width = max(len(q) for q, _ in answers(results)) + 1
    for question, answer in answers(results):
        text = f"{question:<{width}} {answer}"
        lines += textwrap.wrap(text, WIDTH, subsequent_indent=" " * (width + 1))
    lines.append("")
    lines += wrap.wrap(f"target: {target['checkout']}")
    lines += wrap.wrap(f"database: {target['database']}, SKU {target['sku']}")
    lines.append("")
    for result in results:
        head = f"{result.name:<19} {result.verdict.upper():<5}"
        lines += textwrap.wrap(
            f"{head} {_figures_line(result)}",
            WIDTH,
            subsequent_indent=" " * 26,
            break_on_hyphens=False,
        )
        for note in result.notes:
            lines += textwrap.wrap(note, WIDTH, initial_indent="  - ", subsequent_indent="    ")
    lines.append("")
    if restored is not None:
        lines += wrap.wrap(restored)
    verdict = overall(results)
    failed = sum(r.passed is False for r in results)
    unverified = sum(r.passed is None for r in results)
    summary = {
        "pass": f"verdict: PASS ({len(results)} scenario{'s' if len(results) != 1 else ''})",
        "fail": f"verdict: FAIL ({failed} of {len(results)} scenarios failed)",
        "unverified": f"verdict: UNVERIFIED ({unverified} of {len(results)} scenarios"
        " could not be judged: not a pass)",
    }[verdict]
    lines.append(summary)
    return "\n".join(lines) + "\n"


def format_json(
    results: Sequence[ScenarioResult], *, target: dict[str, str], restored: str | None
) -> str:
    """The ``--format json`` document."""
    document: dict[str, Any] = {
        "verdict": overall(results),
        "target": target,
        "answers": [{"question": q, "answer": a} for q, a in answers(results)],
        "scenarios": [r.to_dict() for r in results],
        "restored": restored,
    }
    return json.dumps(document, indent=2) + "\n"


def format_junit(results: Sequence[ScenarioResult], *, target: dict[str, str]) -> str:
    """JUnit XML: one test case per scenario; a failed verdict is a ``failure``, an
    unverified one an ``error`` (a CI gate stops on both)."""
    suite = ET.Element(
        "testsuite",
        name="stocksentry drill",
        tests=str(len(results)),
        failures=str(sum(r.passed is False for r in results)),
        errors=str(sum(r.passed is None for r in results)),
        skipped="0",
        time=f"{sum(sum(r.latencies) for r in results):.3f}",
    )
    properties = ET.SubElement(suite, "properties")
    for name, value in target.items():
        ET.SubElement(properties, "property", name=name, value=value)
    for result in results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname="stocksentry.drill",
            name=result.name,
            time=f"{max(result.latencies, default=0.0):.3f}",
        )
        if result.passed is False:
            failure = ET.SubElement(
                case, "failure", message=result.failures[0] if result.failures else "failed"
            )
            failure.text = "\n".join(result.failures)
        elif result.passed is None:
            error = ET.SubElement(case, "error", message=result.unverified or "not verified")
            error.text = result.unverified or "not verified"
        out = ET.SubElement(case, "system-out")
        out.text = json.dumps(result.figures, sort_keys=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
    )
