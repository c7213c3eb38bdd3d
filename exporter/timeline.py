"""``stocksentry timeline``: moved to :mod:`stocksentry.exporter.investigate.timeline`.

This module keeps the old import path working: it offers the same public names, loaded
on first use as the package loads them (so that ``from stocksentry.exporter.timeline
import add_timeline_parser`` stays light).

Example::

    >>> from stocksentry.exporter.timeline import analyse, read_events
    >>> report = analyse(read_events(["[10:00:00.101] request_id=R1 sku=A stock_check x=1"]))
    >>> report.events, report.findings
    (1, [])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .investigate import timeline as _package
from .investigate.timeline.command import InputError, add_timeline_parser, run_timeline

if TYPE_CHECKING:
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
        OrderedEvents,
        ReadStats,
        Report,
        TimeFormat,
        analyse,
        format_table,
        format_time,
        parse_line,
        read_events,
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


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_package, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
