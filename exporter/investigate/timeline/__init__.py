"""``stocksentry timeline``: rebuild per-SKU and per-order timelines from logs, flag double-sells.

The input is log lines, one event a line: stocksentry's own JSON, other JSON loggers, or
plain ``key=value`` lines (:mod:`.parsing`). Events are put in timestamp order (stable on
ties: file order, then line order; :mod:`.ordering`) and run through the detectors,
each keeping only compact per-SKU state (:mod:`.analysis`); each finding names its cause:
``lost_update``, ``oversell_negative_stock``, ``duplicate_execution``, ``stale_read`` or
``lock_expiry``, and the report opens with a summary per SKU. The report is a table for humans
(:mod:`.report`) or JSON (:meth:`Report.to_dict`); :mod:`.command` is the subcommand.

One module per role:

- :mod:`.limits`: the default limit, the reorder window and the memory bounds;
- :mod:`.times`: timestamps (ISO-8601, epoch numbers, times of day) and their rendering;
- :mod:`.model`: :class:`Event`, :class:`Finding`, :class:`Report`, the limits, and the
  names timeline reads from the log event catalog;
- :mod:`.parsing`: log lines into events; :mod:`.ordering`: merging inputs in time order;
- :mod:`.incidents` and :mod:`.analysis`: the detectors and the causes; :mod:`.keys`: the
  memory of idempotency keys and payment references;
- :mod:`.report`: the table; :mod:`.command`: ``add_timeline_parser``, ``run_timeline``.

The names below are loaded on first use: ``stocksentry``'s parser imports
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
    from .limits import (
        DEFAULT_LIMIT,
        DEFAULT_REORDER_WINDOW,
        FINDING_PARTICIPANTS,
        MAX_GROUPS,
        MAX_KEYS,
        OPEN_CHECKS,
        RECENT_FROMS,
        REORDER_BUFFER,
        SKIPPED_EXAMPLES,
    )
    from .model import Event, Finding, FindingKind, Report, TimeFormat
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
    "DEFAULT_LIMIT": "limits",
    "DEFAULT_REORDER_WINDOW": "limits",
    "FINDING_PARTICIPANTS": "limits",
    "MAX_GROUPS": "limits",
    "MAX_KEYS": "limits",
    "OPEN_CHECKS": "limits",
    "RECENT_FROMS": "limits",
    "REORDER_BUFFER": "limits",
    "SKIPPED_EXAMPLES": "limits",
    "Event": "model",
    "Finding": "model",
    "FindingKind": "model",
    "Report": "model",
    "TimeFormat": "model",
    "OrderedEvents": "ordering",
    "ReadStats": "parsing",
    "parse_line": "parsing",
    "read_events": "parsing",
    "format_table": "report",
    "format_time": "times",
}
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
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
