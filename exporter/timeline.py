"""``stocksentry timeline``: moved to :mod:`stocksentry.exporter.investigate.timeline`.

This module keeps the old import path working; it re-exports the public names.

Example::

    >>> from stocksentry.exporter.timeline import analyse, read_events
    >>> report = analyse(read_events(["[10:00:00.101] request_id=R1 sku=A stock_check x=1"]))
    >>> report.events, report.findings
    (1, [])
"""

from __future__ import annotations

from .investigate.timeline import (
    DEFAULT_LIMIT,
    DEFAULT_REORDER_WINDOW,
    FINDING_PARTICIPANTS,
    MAX_GROUPS,
    MAX_KEYS,
    OPEN_CHECKS,
    RECENT_FROMS,
    REORDER_BUFFER,
    SKIPPED_EXAMPLES,
    Event,
    Finding,
    FindingKind,
    InputError,
    OrderedEvents,
    ReadStats,
    Report,
    TimeFormat,
    add_timeline_parser,
    analyse,
    format_table,
    format_time,
    parse_line,
    read_events,
    run_timeline,
)

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_REORDER_WINDOW",
    "FINDING_PARTICIPANTS",
    "MAX_GROUPS",
    "MAX_KEYS",
    "OPEN_CHECKS",
    "RECENT_FROMS",
    "REORDER_BUFFER",
    "SKIPPED_EXAMPLES",
    "Event",
    "Finding",
    "FindingKind",
    "InputError",
    "OrderedEvents",
    "ReadStats",
    "Report",
    "TimeFormat",
    "add_timeline_parser",
    "analyse",
    "format_table",
    "format_time",
    "parse_line",
    "read_events",
    "run_timeline",
]
