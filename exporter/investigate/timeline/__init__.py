"""``stocksentry timeline``: rebuild per-SKU and per-order timelines from logs, flag double-sells.

Log lines (:mod:`.parsing`) are put in timestamp order (:mod:`.ordering`) and run through
the detectors (:mod:`.analysis`, :mod:`.incidents`); each finding names its cause, and the
report (:mod:`.report`, or :meth:`Report.to_dict`) opens with a summary per SKU.
:mod:`.command` is the subcommand; see docs/timeline.md.

The names below load on first use: ``stocksentry``'s parser imports
:func:`add_timeline_parser` without the analysis, which reads the log event catalog and
so brings the instrumentation (and prometheus_client) along.

Example::

    >>> from stocksentry.exporter.investigate.timeline import analyse, read_events
    >>> lines = [
    ...     "[10:00:00.101] request_id=R1 sku=EGG-01 stock_check available=1",
    ...     "[10:00:00.103] request_id=R2 sku=EGG-01 stock_check available=1",
    ...     "[10:00:00.120] request_id=R1 sku=EGG-01 stock_update from=1 to=0 success=true",
    ...     "[10:00:00.121] request_id=R2 sku=EGG-01 stock_update from=1 to=0 success=true",
    ... ]
    >>> report = analyse(read_events(lines, source="checkout.log"))
    >>> [finding.headline for finding in report.findings]
    ['LOST UPDATE sku=EGG-01: R1 and R2 both wrote from=1 to=0 at 10:00:00.120/.121']
    >>> report.findings[0].lines
    ['checkout.log:3', 'checkout.log:4']
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .analysis import analyse
    from .command import InputError, add_timeline_parser, run_timeline
    from .model import Event, Finding, Report
    from .ordering import OrderedEvents
    from .parsing import ReadStats, parse_line, read_events
    from .report import format_table
    from .times import format_time

#: Where each public name lives.
_HOMES = {
    "analyse": "analysis",
    "InputError": "command",
    "add_timeline_parser": "command",
    "run_timeline": "command",
    "Event": "model",
    "Finding": "model",
    "Report": "model",
    "OrderedEvents": "ordering",
    "ReadStats": "parsing",
    "parse_line": "parsing",
    "read_events": "parsing",
    "format_table": "report",
    "format_time": "times",
}
__all__ = [
    "Event",
    "Finding",
    "InputError",
    "OrderedEvents",
    "ReadStats",
    "Report",
    "add_timeline_parser",
    "analyse",
    "format_table",
    "format_time",
    "parse_line",
    "read_events",
    "run_timeline",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
