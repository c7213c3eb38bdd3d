"""What timeline works with: the event of one log line, a finding, the report.

The names of the events and fields timeline reads come from the log event catalog
(:mod:`stocksentry.instrumentation.events`): a renamed one breaks the import here, not a
timeline that silently finds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from stocksentry.instrumentation.events import (
    INVENTORY_NEGATIVE,
    LOCK_EXPIRED_WHILE_HELD,
    LOCK_RELEASE_NOT_OWNED,
    ORDER_PAID,
    PAYMENT_CALLBACK,
    STOCK_CHECK,
    STOCK_UPDATE,
    UNSAFE_READ_MODIFY_WRITE,
    LogEvent,
)

from ...commandline import ExitCode
from .limits import MAX_KEYS
from .times import format_time

#: The cause a finding names (its ``kind`` in the JSON output, and its ``cause``).
FindingKind = Literal[
    "lost_update",
    "oversell_negative_stock",
    "duplicate_execution",
    "stale_read",
    "lock_expiry",
    "unsafe_read_modify_write",
]
#: Renders a timestamp of the report (with or without the date, as the report needs).
TimeFormat = Callable[[float], str]


#: Each cause's title, and its plural as the report counts them ("2 lock expiries"), in
#: the order the summary lists them.
KIND_NAMES: dict[FindingKind, tuple[str, str]] = {
    "lost_update": ("LOST UPDATE", "lost updates"),
    "oversell_negative_stock": ("OVERSELL INTO NEGATIVE STOCK", "oversells into negative stock"),
    "duplicate_execution": ("DUPLICATE EXECUTION", "duplicate executions"),
    "stale_read": ("STALE READ", "stale reads"),
    "lock_expiry": ("LOCK EXPIRY", "lock expiries"),
    "unsafe_read_modify_write": ("UNSAFE READ-MODIFY-WRITE", "unsafe read-modify-writes"),
}
#: Every cause, in the order the summary lists them.
CAUSES: Final[tuple[FindingKind, ...]] = tuple(KIND_NAMES)


# --- what timeline reads of the log event catalog ----------------------------------------


def _field(event: LogEvent, name: str) -> str:
    if name not in event.fields:
        raise LookupError(f"the log event {event.name} has no field {name!r}")
    return name


STOCK_CHECK_EVENT: Final = STOCK_CHECK.name
STOCK_UPDATE_EVENT: Final = STOCK_UPDATE.name
PAYMENT_CALLBACK_EVENT: Final = PAYMENT_CALLBACK.name
ORDER_PAID_EVENT: Final = ORDER_PAID.name
INVENTORY_NEGATIVE_EVENT: Final = INVENTORY_NEGATIVE.name
LOCK_EXPIRED_EVENT: Final = LOCK_EXPIRED_WHILE_HELD.name
LOCK_NOT_OWNED_EVENT: Final = LOCK_RELEASE_NOT_OWNED.name
UNSAFE_RMW_EVENT: Final = UNSAFE_READ_MODIFY_WRITE.name
NEGATIVE_STOCK: Final = _field(INVENTORY_NEGATIVE, "stock")
LOCK: Final = _field(LOCK_EXPIRED_WHILE_HELD, "lock")
HELD_S: Final = _field(LOCK_EXPIRED_WHILE_HELD, "held_s")
TTL_S: Final = _field(LOCK_EXPIRED_WHILE_HELD, "ttl_s")
RMW_REASON: Final = _field(UNSAFE_READ_MODIFY_WRITE, "reason")
RMW_CODE: Final = _field(UNSAFE_READ_MODIFY_WRITE, "code")
RMW_KEY: Final = _field(UNSAFE_READ_MODIFY_WRITE, "key")
#: What the SQL detector says of a read-modify-write whose lock ran out before the write.
LOCK_EXPIRED_REASON: Final = "lock expired"
AVAILABLE: Final = _field(STOCK_CHECK, "available")
FROM: Final = _field(STOCK_UPDATE, "from")
TO: Final = _field(STOCK_UPDATE, "to")
SUCCESS: Final = _field(STOCK_UPDATE, "success")
REASON: Final = _field(STOCK_UPDATE, "reason")
QTY: Final = _field(STOCK_UPDATE, "qty")
RESULT: Final = _field(PAYMENT_CALLBACK, "result")
#: The ``result`` of a payment callback that took the money (the others: replay, failed).
PAID: Final = "paid"
#: What other apps log the stock they read under (stocksentry writes ``available``), and
#: the error of a failed write: not fields of the catalog, read all the same.
STOCK: Final = "stock"
ERROR: Final = "error"


@dataclass(slots=True)
class Event:
    """One parsed log line.

    ``ts`` is seconds since the epoch when the line carried a date (``dated``), else
    seconds since midnight of an unknown day. The correlation keys have their own
    attributes; every other key of the line is in ``fields``. ``source`` and ``lineno``
    say where the line came from (set by :func:`read_events`).

    Example::

        >>> from stocksentry.exporter.investigate.timeline import parse_line
        >>> event = parse_line('{"event": "stock_check", "sku": "EGG-01", "available": 1,'
        ...                    ' "request_id": "R1", "timestamp": "2026-11-29T13:41:14.262Z"}')
        >>> event.name, event.sku, event.request, event.fields
        ('stock_check', 'EGG-01', 'R1', {'available': 1})
        >>> format_time(event.ts, event.dated)
        '2026-11-29T13:41:14.262Z'
    """

    name: str
    ts: float = 0.0
    dated: bool = True
    has_time: bool = False
    sku: str | None = None
    request_id: str | None = None
    idempotency_key: str | None = None
    order_id: str | None = None
    payment_reference: str | None = None
    trace_id: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    source: str = "<input>"
    lineno: int = 0
    file_index: int = 0

    @property
    def request(self) -> str | None:
        """Who did it: the request id, else the idempotency key, else the trace id."""
        return self.request_id or self.idempotency_key or self.trace_id

    @property
    def line(self) -> str:
        """Where it was logged, as ``source:lineno``."""
        return f"{self.source}:{self.lineno}"

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data (``None`` keys left out)."""
        out: dict[str, Any] = {
            "time": format_time(self.ts, self.dated) if self.has_time else None,
            "event": self.name,
            "line": self.line,
        }
        for key in ID_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.fields:
            out["details"] = self.fields
        return out


ID_KEYS: Final = (
    "sku",
    "request_id",
    "idempotency_key",
    "order_id",
    "payment_reference",
    "trace_id",
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that went wrong: its kind, SKU, the requests involved and the evidence.

    Example::

        >>> finding = Finding("stale_read", "EGG-01", ["R1", "R3"],
        ...                   "R3 read available=1 at 10:00:00.130 after R1 wrote to=0", ["a:3"])
        >>> finding.headline
        'STALE READ sku=EGG-01: R3 read available=1 at 10:00:00.130 after R1 wrote to=0'
    """

    kind: FindingKind
    sku: str | None
    requests: list[str]
    detail: str
    lines: list[str]
    #: Orders of the events involved (used by ``--order``; not in :meth:`to_dict`).
    orders: tuple[str, ...] = ()
    #: Units of stock the finding is about (see docs/timeline.md, "Causes").
    units: int = 0
    #: The time of its first and last evidence line, as the report writes times.
    first: str | None = None
    last: str | None = None
    #: The same two times as timestamps (for the summary; not in :meth:`to_dict`).
    span: tuple[float, float] | None = None

    @property
    def cause(self) -> FindingKind:
        """The cause the finding names (the same as ``kind``)."""
        return self.kind

    @property
    def headline(self) -> str:
        """One line for humans: kind, SKU and detail."""
        where = f" sku={self.sku}" if self.sku is not None else ""
        return f"{KIND_NAMES[self.kind][0]}{where}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data."""
        return {
            "kind": self.kind,
            "cause": self.kind,
            "sku": self.sku,
            "requests": self.requests,
            "detail": self.detail,
            "lines": self.lines,
            "units": self.units,
            "first": self.first,
            "last": self.last,
        }


@dataclass(slots=True)
class SkuSummary:
    """One row of the per-SKU summary the report opens with."""

    sku: str | None
    #: Findings per cause, in :data:`CAUSES` order (causes without one left out).
    causes: dict[FindingKind, int]
    units: int
    first: str | None
    last: str | None

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return {
            "sku": self.sku,
            "findings": self.causes,
            "units": self.units,
            "first": self.first,
            "last": self.last,
        }


def summarise(findings: list[Finding], fmt: TimeFormat) -> list[SkuSummary]:
    """The per-SKU summary of ``findings``, times written with ``fmt``: the SKUs with the
    most units first, then by SKU.

    Example::

        >>> rows = summarise([Finding("lost_update", "A", ["R1", "R2"], "...", [], units=1,
        ...                           span=(1.0, 2.0))], lambda ts: f"{ts:g}")
        >>> rows[0].to_dict()
        {'sku': 'A', 'findings': {'lost_update': 1}, 'units': 1, 'first': '1', 'last': '2'}
    """
    rows: dict[str | None, tuple[dict[FindingKind, int], list[int], list[float]]] = {}
    for finding in findings:
        causes, units, stamps = rows.setdefault(finding.sku, ({}, [0], []))
        causes[finding.kind] = causes.get(finding.kind, 0) + 1
        units[0] += finding.units
        if finding.span is not None:
            stamps.extend(finding.span)
    out = [
        SkuSummary(
            sku,
            {cause: causes[cause] for cause in CAUSES if cause in causes},
            units[0],
            fmt(min(stamps)) if stamps else None,
            fmt(max(stamps)) if stamps else None,
        )
        for sku, (causes, units, stamps) in rows.items()
    ]
    return sorted(out, key=lambda row: (-row.units, row.sku or ""))


@dataclass(slots=True)
class Report:
    """What :func:`analyse` found, and the timelines it kept.

    ``skus`` and ``orders`` hold at most ``limit`` events each (``more`` counts the rest);
    ``skipped_lines`` and ``lines`` come from :class:`ReadStats` when the caller has them.
    """

    findings: list[Finding] = field(default_factory=list)
    #: The per-SKU summary of :attr:`findings` (see :func:`summarise`).
    summary: list[SkuSummary] = field(default_factory=list)
    skus: dict[str, list[Event]] = field(default_factory=dict)
    orders: dict[str, list[Event]] = field(default_factory=dict)
    skus_more: dict[str, int] = field(default_factory=dict)
    orders_more: dict[str, int] = field(default_factory=dict)
    #: Events of SKUs and orders beyond :data:`MAX_GROUPS`, analysed but not kept.
    ungrouped_events: int = 0
    events: int = 0
    lines: int = 0
    late_events: int = 0
    #: Oldest keys dropped from the duplicate-execution memory (see :data:`MAX_KEYS`).
    keys_forgotten: int = 0
    #: How many keys that memory held (``analyse(max_keys=...)``), for the report's note.
    keys_limit: int = MAX_KEYS
    skipped_lines: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    #: Whether the dated events span more than one UTC day (times then show the date).
    show_date: bool = False
    #: The UTC day of the dated events when they all fall on one, e.g. ``2026-11-29``.
    day: str | None = None
    #: Events a detector read (a stock check or write, a payment, a lock or SQL warning).
    stock_events: int = 0
    #: Findings shown (``--limit``; 0: all): the others count in the summary, the
    #: FINDINGS line and the exit status, and :attr:`findings_more` says how many.
    limit: int = 0

    @property
    def shown_findings(self) -> list[Finding]:
        """The findings the report lists, at most :attr:`limit` of them."""
        return self.findings[: self.limit] if self.limit else self.findings

    @property
    def findings_more(self) -> int:
        """The findings beyond :attr:`limit`, not listed."""
        return len(self.findings) - len(self.shown_findings)

    @property
    def exit_code(self) -> ExitCode:
        """:attr:`ExitCode.FINDINGS` (1) when there is a finding; else
        :attr:`ExitCode.INCOMPLETE` (3) when no line was a stock event (nothing was
        analysed: not an all-clear); else :attr:`ExitCode.OK`."""
        if self.findings:
            return ExitCode.FINDINGS
        return ExitCode.OK if self.stock_events else ExitCode.INCOMPLETE

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the ``--format json`` output).

        Example::

            >>> sorted(Report().to_dict())  # doctest: +NORMALIZE_WHITESPACE
            ['events', 'findings', 'keys_forgotten', 'late_events', 'lines', 'more',
             'orders', 'skipped_examples', 'skipped_lines', 'skus', 'stock_events',
             'summary']
        """
        return {
            "summary": [row.to_dict() for row in self.summary],
            "findings": [finding.to_dict() for finding in self.shown_findings],
            "skus": {sku: [e.to_dict() for e in events] for sku, events in self.skus.items()},
            "orders": {o: [e.to_dict() for e in events] for o, events in self.orders.items()},
            "more": {
                "skus": self.skus_more,
                "orders": self.orders_more,
                "findings": self.findings_more,
            },
            "skipped_lines": self.skipped_lines,
            "skipped_examples": self.skipped_examples,
            "events": self.events,
            "stock_events": self.stock_events,
            "lines": self.lines,
            "late_events": self.late_events,
            "keys_forgotten": self.keys_forgotten,
        }
