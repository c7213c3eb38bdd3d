"""The report for humans: findings first, then one table per SKU and per order.

The JSON form is :meth:`~.model.Report.to_dict`.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Literal

from .limits import MAX_GROUPS
from .model import (
    AVAILABLE,
    FROM,
    KIND_NAMES,
    QTY,
    REASON,
    RESULT,
    STOCK,
    SUCCESS,
    TO,
    Event,
    FindingKind,
    Report,
)
from .times import format_time

_FIRST_DETAILS = (FROM, TO, AVAILABLE, SUCCESS, REASON, RESULT, QTY, STOCK)
_MAX_DETAILS = 120
_NO_FINDINGS = (
    "No findings: no lost update, oversell into negative stock, duplicate execution, "
    "stale read or lock expiry."
)
_MAX_CELL = 36
# What timeline reads, for the report of a log in which it found none of it.
_NOTHING_READ = (
    "Nothing analysed: no line is a stock event timeline reads (stock_check, stock_update, "
    "inventory_negative, payment_callback, order_paid, unsafe_read_modify_write, lock "
    "events), so this is no all-clear. docs/other-languages.md says what to log."
)


def _value_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), default=str)
    text = str(value)
    return json.dumps(text) if (not text or any(c.isspace() for c in text)) else text


def _details(event: Event, context: Literal["sku", "order"]) -> str:
    fields = event.fields
    parts = [f"{key}={_value_text(fields[key])}" for key in _FIRST_DETAILS if key in fields]
    parts += [
        f"{key}={_value_text(value)}"
        for key, value in fields.items()
        if key not in _FIRST_DETAILS and key != "product_id"
    ]
    other = ("order", event.order_id) if context == "sku" else ("sku", event.sku)
    extra = (other, ("key", event.idempotency_key), ("payment", event.payment_reference))
    parts += [f"{label}={value}" for label, value in extra if value is not None]
    text = " ".join(parts)
    return text if len(text) <= _MAX_DETAILS else text[: _MAX_DETAILS - 1] + "…"


def _cell(text: str | None) -> str:
    if not text:
        return "-"
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _counted(count: int, cause: FindingKind) -> str:
    if count == 1:
        return f"1 {KIND_NAMES[cause][0].lower()}"
    return f"{count} {KIND_NAMES[cause][1]}"


def _summary(report: Report) -> list[str]:
    """The per-SKU summary the report opens with: SKU, findings by cause, units, times."""
    rows = [("SKU", "FINDINGS", "UNITS", "FIRST", "LAST")]
    for row in report.summary[:MAX_GROUPS]:
        causes = ", ".join(_counted(n, cause) for cause, n in row.causes.items())
        rows.append((_cell(row.sku), causes, str(row.units), row.first or "-", row.last or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    out = [f"SUMMARY BY SKU ({_plural(len(report.summary), 'SKU')} with findings)"]
    for sku, causes, units, first, last in rows:
        out.append(
            f"    {sku:<{widths[0]}}  {causes:<{widths[1]}}  {units:>{widths[2]}}  "
            f"{first:<{widths[3]}}  {last}".rstrip()
        )
    if len(report.summary) > MAX_GROUPS:
        out.append(f"    … {len(report.summary) - MAX_GROUPS} more SKUs")
    return out


def format_table(report: Report) -> str:
    """The report for humans: findings first, then one table per SKU and per order.

    Example::

        >>> lines = ["[10:00:00.101] request_id=R1 sku=EGG-01 stock_check available=1"]
        >>> from stocksentry.exporter.investigate.timeline import analyse, read_events
        >>> print(format_table(analyse(read_events(lines, "a.log"))))
        ... # doctest: +NORMALIZE_WHITESPACE
        stocksentry timeline: 1 event
        <BLANKLINE>
        No findings: no lost update, oversell into negative stock, duplicate execution,
        stale read or lock expiry.
        <BLANKLINE>
        SKU EGG-01 (1 event)
            TIME          REQUEST  EVENT        DETAILS
            10:00:00.101  R1       stock_check  available=1
    """
    out: list[str] = []
    head = f"stocksentry timeline: {_plural(report.events, 'event')}"
    if report.lines:
        head += f" from {_plural(report.lines, 'line')}"
    if report.day is not None:
        head += f", {report.day} (times UTC)"
    elif report.show_date:
        head += " (times UTC)"
    out.append(head)
    if report.skipped_lines:
        examples = ", ".join(report.skipped_examples)
        if report.skipped_lines > len(report.skipped_examples):
            examples += ", …"
        out.append(f"skipped {_plural(report.skipped_lines, 'unparsable line')}: {examples}")
    if report.late_events:
        out.append(
            f"warning: {_plural(report.late_events, 'event')} arrived out of order beyond the "
            "reorder window and were analysed late (see --reorder-window)"
        )
    if report.keys_forgotten:
        out.append(
            f"note: {_plural(report.keys_forgotten, 'idempotency key')} / payment references "
            f"were forgotten to bound memory (over {report.keys_limit:,}); a duplicate "
            "further apart than that is not seen"
        )
    out.append("")
    if report.findings:
        out.extend(_summary(report))
        out.append("")
        counts = Counter(finding.kind for finding in report.findings)
        summary = ", ".join(_counted(n, cause) for cause, n in counts.items())
        writes = sum(len(f.requests) for f in report.findings if f.kind == "lost_update")
        out.append(f"FINDINGS: {summary}")
        if writes > 2 * counts.get("lost_update", 0):
            # The lab and the metrics count writes; a finding groups them (said when a
            # group holds more than the pair of writes one lost update takes).
            out.append(
                f"    (a finding is one group of writes: the lost updates hold "
                f"{_plural(writes, 'request')} that wrote)"
            )
        for finding in report.shown_findings:
            out.append(f"  {finding.headline}")
            out.append(f"      lines: {', '.join(finding.lines[:10])}")
            if len(finding.lines) > 10:
                out[-1] += f" … {len(finding.lines) - 10} more"
        if report.findings_more:
            out.append(
                f"  … {_plural(report.findings_more, 'more finding')} (raise --limit to see them)"
            )
    elif not report.stock_events:
        out.append(_NOTHING_READ)
    else:
        out.append(_NO_FINDINGS)
    flagged = {line for finding in report.findings for line in finding.lines}
    with_date = report.show_date
    groups: tuple[tuple[str, dict[str, list[Event]], dict[str, int]], ...] = (
        ("SKU", report.skus, report.skus_more),
        ("ORDER", report.orders, report.orders_more),
    )
    for title, table, more in groups:
        context: Literal["sku", "order"] = "sku" if title == "SKU" else "order"
        for key, events in table.items():
            total = len(events) + more.get(key, 0)
            out.append("")
            out.append(f"{title} {key} ({_plural(total, 'event')})")
            rows = [("TIME", "REQUEST", "EVENT", "DETAILS", " ")]
            for event in events:
                when = (
                    format_time(event.ts, event.dated, with_date=with_date)
                    if event.has_time
                    else "-"
                )
                mark = "!" if event.line in flagged else " "
                rows.append(
                    (when, _cell(event.request), _cell(event.name), _details(event, context), mark)
                )
            widths = [max(len(row[i]) for row in rows) for i in range(3)]
            for when, who, what, details, mark in rows:
                out.append(
                    f"  {mark} {when:<{widths[0]}}  {who:<{widths[1]}}  {what:<{widths[2]}}  "
                    f"{details}".rstrip()
                )
            if more.get(key):
                out.append(f"    … {more[key]} more (raise --limit to see them)")
    if report.ungrouped_events:
        out.append("")
        out.append(
            f"… {_plural(report.ungrouped_events, 'event')} of further SKUs and orders not "
            f"shown (over {MAX_GROUPS} of each); focus with --sku or --order"
        )
    return "\n".join(out)
