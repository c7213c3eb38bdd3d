"""``stocksentry timeline``: rebuild per-SKU and per-order timelines from logs, flag double-sells.

The input is log lines, one event a line, in any mix of three shapes:

* stocksentry's own JSON lines (``event``, ``timestamp``, ``sku``, ``request_id`` ...);
* other JSON loggers: the time under ``ts``, ``time`` or ``@timestamp`` (ISO-8601 or epoch
  seconds / milliseconds), the event name under ``msg`` or ``message`` (which may itself
  hold ``key=value`` pairs), extras optionally nested under ``fields``, ``extra`` or
  ``context``;
* plain ``key=value`` lines such as ``[10:00:00.101] request_id=R1 sku=EGG-01 stock_check
  available=1``: a leading ``[time]`` or ISO timestamp, and a bare word among the pairs
  is the event name.

Events are put in timestamp order (stable on ties: file order, then line order) and run
through three detectors, each keeping only compact per-SKU state:

``lost_update``
    two successful ``stock_update`` events on one SKU written from the same old value
    (``from``), or a write made from a value that another request had already replaced
    inside the writer's own ``stock_check`` -> ``stock_update`` window;
``duplicate_execution``
    one idempotency key or payment reference that reserved (successful ``stock_update``)
    or paid (``payment_callback result=paid``, ``order_paid``) more than once;
``stale_read``
    a ``stock_check`` that saw another value than the ``to`` of the latest successful
    ``stock_update`` already logged for the SKU.

Example::

    >>> lines = [
    ...     "[10:00:00.101] request_id=R1 sku=EGG-01 stock_check available=1",
    ...     "[10:00:00.103] request_id=R2 sku=EGG-01 stock_check available=1",
    ...     "[10:00:00.120] request_id=R1 sku=EGG-01 stock_update from=1 to=0 success=true",
    ...     "[10:00:00.121] request_id=R2 sku=EGG-01 stock_update from=1 to=0 success=true",
    ... ]
    >>> report = analyse(read_events(lines, source="seeds.log"))
    >>> [finding.headline for finding in report.findings]
    ['LOST UPDATE sku=EGG-01: R1 and R2 both wrote from=1 to=0 at 10:00:00.120/.121']
    >>> report.findings[0].lines
    ['seeds.log:3', 'seeds.log:4']
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import gzip
import heapq
import io
import json
import math
import os
import re
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal, NamedTuple, TextIO, cast

FindingKind = Literal["lost_update", "duplicate_execution", "stale_read"]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: Events shown per SKU and per order unless ``--limit`` says otherwise (0: all).
DEFAULT_LIMIT = 50
#: Seconds of timestamp disorder inside one input that are put back in order.
DEFAULT_REORDER_WINDOW = 60.0
#: Events held per input while reordering, whatever the window says.
REORDER_BUFFER = 20_000
#: SKUs and orders that get a timeline of their own; the events of later ones are counted.
MAX_GROUPS = 1_000
#: Distinct recent ``from`` values remembered per SKU for the same-old-value rule.
RECENT_FROMS = 64
#: Requests with a ``stock_check`` and no ``stock_update`` yet, over all SKUs.
OPEN_CHECKS = 100_000
#: Idempotency keys and payment references remembered (first use of each); the oldest are
#: forgotten beyond this, so a duplicate further apart than that many keys goes unseen.
MAX_KEYS = 500_000
#: Requests named in one finding; more are counted, not listed.
FINDING_PARTICIPANTS = 1_000
#: Unparsable lines whose position is reported.
SKIPPED_EXAMPLES = 5

_KIND_TITLES: dict[FindingKind, str] = {
    "lost_update": "LOST UPDATE",
    "duplicate_execution": "DUPLICATE EXECUTION",
    "stale_read": "STALE READ",
}


# --- events ------------------------------------------------------------------------------


@dataclass(slots=True)
class Event:
    """One parsed log line.

    ``ts`` is seconds since the epoch when the line carried a date (``dated``), else
    seconds since midnight of an unknown day. The correlation keys have their own
    attributes; every other key of the line is in ``fields``. ``source`` and ``lineno``
    say where the line came from (set by :func:`read_events`).

    Example::

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
        for key in _ID_KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.fields:
            out["details"] = self.fields
        return out


_ID_KEYS = ("sku", "request_id", "idempotency_key", "order_id", "payment_reference", "trace_id")

# Other spellings of the keys the detectors read, as other loggers and apps write them.
_CANONICAL = {
    "requestId": "request_id",
    "requestID": "request_id",
    "req_id": "request_id",
    "x_request_id": "request_id",
    "idempotencyKey": "idempotency_key",
    "idem_key": "idempotency_key",
    "orderId": "order_id",
    "orderID": "order_id",
    "paymentReference": "payment_reference",
    "paymentRef": "payment_reference",
    "payment_ref": "payment_reference",
    "SKU": "sku",
    "productId": "product_id",
    "traceId": "trace_id",
    "traceID": "trace_id",
    "old_stock": "from",
    "from_stock": "from",
    "new_stock": "to",
    "to_stock": "to",
    "available_stock": "available",
}
_TIME_KEYS = ("timestamp", "ts", "time", "@timestamp", "datetime", "asctime")
_NAME_KEYS = ("event", "msg", "message")
_CANONICAL_KEYS = frozenset(_CANONICAL)
# Keys that say nothing about the stock: not kept in the event's fields.
_DROP_KEYS = frozenset(
    {
        "level",
        "lvl",
        "severity",
        "levelname",
        "log.level",
        "logger",
        "logger_name",
        "span_id",
        "spanId",
    }
)
_CONTAINERS = frozenset({"fields", "extra", "context", "ctx", "Properties", "attributes"})
_LEVEL_WORDS = frozenset(
    {"TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "WARNING", "ERROR", "CRITICAL", "FATAL"}
)
_MAX_NAME = 80


# --- time --------------------------------------------------------------------------------

_ISO = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?\s*(Z|z|[+-]\d\d:?\d\d)?\Z"
)
_TIME_OF_DAY = re.compile(r"(\d\d?):(\d\d):(\d\d)(?:[.,](\d+))?\Z")
_DATE_ONLY = re.compile(r"\d{4}-\d\d-\d\d\Z")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?\Z")
_INT = re.compile(r"-?\d{1,18}\Z")

_epoch_cache: dict[str, int] = {}
_SCALE = (1.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0, 1_000_000.0)


def _fraction(digits: str | None) -> float:
    if not digits:
        return 0.0
    return int(digits[:6]) / _SCALE[min(len(digits), 6)]


def _parse_time_text(text: str) -> tuple[float, bool] | None:
    """An ISO-8601 date-time (UTC unless it says otherwise) or a bare time of day."""
    if len(text) == 24 and text[23] == "Z" and text[19] == ".":
        # Fast path for stocksentry's own "2026-11-29T13:41:14.262Z".
        base = _epoch_cache.get(text[:19])
        millis = text[20:23]
        if base is not None and millis.isdigit():
            return base + int(millis) / 1000, True
    match = _ISO.match(text)
    if match is not None:
        prefix = text[:19]
        base = _epoch_cache.get(prefix)
        if base is None:
            year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
            if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 24 and minute <= 59):
                return None
            if second > 60:
                return None
            base = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
            if len(_epoch_cache) > 4096:
                _epoch_cache.clear()
            _epoch_cache[prefix] = base
        value = base + _fraction(match.group(7))
        zone = match.group(8)
        if zone and zone not in ("Z", "z"):
            sign = -1 if zone[0] == "-" else 1
            digits = zone[1:].replace(":", "")
            value -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return value, True
    match = _TIME_OF_DAY.match(text)
    if match is not None:
        hour, minute, second = int(match.group(1)), int(match.group(2)), int(match.group(3))
        if hour > 23 or minute > 59 or second > 60:
            return None
        return hour * 3600 + minute * 60 + second + _fraction(match.group(4)), False
    return None


def _parse_time_value(value: object) -> tuple[float, bool] | None:
    """A JSON time value: text as :func:`_parse_time_text`, or epoch s / ms / us / ns."""
    if isinstance(value, str):
        text = value.strip()
        parsed = _parse_time_text(text)
        if parsed is not None or not _NUMBER.match(text):
            return parsed
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    if seconds > 1e17:
        seconds /= 1e9
    elif seconds > 1e14:
        seconds /= 1e6
    elif seconds > 1e11:
        seconds /= 1e3
    return seconds, True


def format_time(ts: float, dated: bool, *, with_date: bool = True) -> str:
    """Render a timestamp: ISO-8601 UTC with milliseconds, or ``HH:MM:SS.mmm``.

    Example::

        >>> format_time(1795959674.262, True)
        '2026-11-29T13:41:14.262Z'
        >>> format_time(1795959674.262, True, with_date=False)
        '13:41:14.262'
        >>> format_time(36000.101, False)
        '10:00:00.101'
    """
    millis = round(ts * 1000)
    seconds, millis = divmod(millis, 1000)
    if dated:
        pattern = "%Y-%m-%dT%H:%M:%S" if with_date else "%H:%M:%S"
        text = time.strftime(pattern, time.gmtime(seconds)) + f".{millis:03d}"
        return text + "Z" if with_date else text
    day, seconds = divmod(seconds, 86400)
    hours, rest = divmod(seconds, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{millis:03d}"
    return f"{text} (+{day}d)" if day else text


# --- parsing -----------------------------------------------------------------------------

_KV_TOKEN = re.compile(
    r"(?P<key>[A-Za-z_@][\w.@/-]*)=(?P<val>\"(?:[^\"\\]|\\.)*\"|'[^']*'|\S*)"
    r"|(?P<word>\"(?:[^\"\\]|\\.)*\"|\S+)"
)
_NAME_WORD = re.compile(r"[A-Za-z_][\w.-]*\Z")


def _kv_value(raw: str) -> Any:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        if raw[0] == '"':
            try:
                return json.loads(raw)
            except ValueError:
                pass
        return raw[1:-1]
    lowered = raw.lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    if _INT.match(raw):
        return int(raw)
    return raw


def _parse_pairs(
    text: str, start: int = 0
) -> tuple[str | None, tuple[float, bool] | None, dict[str, Any]]:
    """Event name (first bare word), leading timestamp and the ``key=value`` pairs."""
    name: str | None = None
    stamp: tuple[float, bool] | None = None
    pairs: dict[str, Any] = {}
    pending_date: str | None = None
    for match in _KV_TOKEN.finditer(text, start):
        key = match.group("key")
        if key is not None:
            pairs[key] = _kv_value(match.group("val"))
            continue
        word = match.group("word")
        if stamp is None and not pairs and name is None:
            # Leading timestamp: "2026-11-29T10:00:00Z", "10:00:00.101" or a date and a time.
            if pending_date is not None:
                stamp = _parse_time_text(f"{pending_date}T{word}")
                pending_date = None
                if stamp is not None:
                    continue
            if _DATE_ONLY.match(word):
                pending_date = word
                continue
            stamp = _parse_time_text(word)
            if stamp is not None:
                continue
        if name is None and word.upper() not in _LEVEL_WORDS and _NAME_WORD.match(word):
            name = word
    return name, stamp, pairs


def _text_id(value: object) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def _id_value(value: object) -> str | None:
    if type(value) is str:
        return value or None
    return None if value is None else _text_id(value)


def _make_event(
    name: str, stamp: tuple[float, bool] | None, record: dict[str, Any], used: tuple[str, ...]
) -> Event:
    """Build the event; ``record`` (a dict of the caller's own) becomes its ``fields``."""
    fields = record
    pop = fields.pop
    for key in used:
        pop(key, None)
    keys = fields.keys()
    if not keys.isdisjoint(_CANONICAL_KEYS):
        for raw_key in keys & _CANONICAL_KEYS:
            fields.setdefault(_CANONICAL[raw_key], pop(raw_key))
    if not keys.isdisjoint(_DROP_KEYS):
        for key in keys & _DROP_KEYS:
            del fields[key]
    sku = _id_value(pop("sku", None))
    if sku is None and "product_id" in fields:
        sku = _text_id(fields["product_id"])
    return Event(
        name.strip()[:_MAX_NAME],
        stamp[0] if stamp is not None else 0.0,
        stamp[1] if stamp is not None else True,
        stamp is not None,
        sku,
        _id_value(pop("request_id", None)),
        _id_value(pop("idempotency_key", None)),
        _id_value(pop("order_id", None)),
        _id_value(pop("payment_reference", None)),
        _id_value(pop("trace_id", None)),
        fields,
    )


def _from_mapping(record: dict[str, Any], stamp: tuple[float, bool] | None) -> Event | None:
    if not record.keys().isdisjoint(_CONTAINERS):
        merged: dict[str, Any] = {}
        for key, value in record.items():
            if key in _CONTAINERS and isinstance(value, dict):
                for inner_key, inner_value in value.items():
                    merged.setdefault(str(inner_key), inner_value)
        for key, value in record.items():
            if not (key in _CONTAINERS and isinstance(value, dict)):
                merged[key] = value
        record = merged
    used: tuple[str, ...] = ()
    name: str | None = None
    event = record.get("event")
    if isinstance(event, str) and event.strip():
        name = event
        used = ("event",)
    else:
        for key in ("msg", "message"):
            message = record.get(key)
            if isinstance(message, str) and message.strip():
                used = (key,)
                name = message
                if "=" in message:
                    # "request_id=R1 sku=EGG-01 stock_check available=1" inside msg.
                    word, message_stamp, pairs = _parse_pairs(message)
                    if pairs and word is not None:
                        name = word
                        record = {**pairs, **record}
                        stamp = stamp or message_stamp
                break
    if name is None:
        return None
    found = _find_time(record)
    if found is not None:
        stamp, time_key = found
        used = (*used, time_key)
    return _make_event(name, stamp, record, used)


def _find_time(record: dict[str, Any]) -> tuple[tuple[float, bool], str] | None:
    """The first time key of ``record`` that parses, and its value."""
    for key in _TIME_KEYS:
        if key in record:
            parsed = _parse_time_value(record[key])
            if parsed is not None:
                return parsed, key
    return None


def _from_text(text: str) -> Event | None:
    start = 0
    stamp: tuple[float, bool] | None = None
    if text[0] == "[":
        end = text.find("]", 1, 66)
        if end > 0:
            stamp = _parse_time_text(text[1:end].strip())
            start = end + 1
    name, leading, pairs = _parse_pairs(text, start)
    if not pairs:
        return None
    stamp = stamp or leading
    used: tuple[str, ...] = ()
    if name is None:
        for key in _NAME_KEYS:
            value = pairs.get(key)
            if isinstance(value, str) and value.strip():
                name, used = value, (key,)
                break
    if name is None:
        return None
    found = _find_time(pairs)
    if found is not None:
        used = (*used, found[1])
        stamp = stamp or found[0]
    return _make_event(name, stamp, pairs, used)


_decoder = json.JSONDecoder()


def _decode_object(text: str) -> dict[str, Any] | None:
    """The JSON object that is all of ``text`` (already stripped), else ``None``."""
    try:
        value, end = _decoder.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    return value if end == len(text) and isinstance(value, dict) else None


def _parse_stripped(text: str) -> Event | None:
    if text[0] == "{":
        record = _decode_object(text)
        return None if record is None else _from_mapping(record, None)
    brace = text.find("{")
    if brace > 0 and text[-1] == "}":
        # A JSON line behind a prefix: "2026-11-29T13:41:14.262Z stdout F {...}".
        record = _decode_object(text[brace:])
        if record is not None:
            prefix = text[:brace].split()
            stamp = _parse_time_text(prefix[0]) if prefix else None
            return _from_mapping(record, stamp)
    return _from_text(text)


def parse_line(text: str) -> Event | None:
    """Parse one log line; ``None`` for a blank or unparsable line.

    JSON objects need an event name (``event``, ``msg`` or ``message``); ``key=value``
    lines need at least one pair and a bare word or ``event=``/``msg=`` for the name.

    Example::

        >>> event = parse_line(
        ...     "[10:00:00.120] request_id=R1 sku=EGG-01 stock_update from=1 to=0 success=true")
        >>> event.name, event.request_id, event.fields
        ('stock_update', 'R1', {'from': 1, 'to': 0, 'success': True})
        >>> parse_line('{"ts": 1795959674.5, "msg": "order_paid", "orderId": "O-1"}').order_id
        'O-1'
        >>> parse_line("Traceback (most recent call last):") is None
        True
    """
    text = text.strip()
    if not text:
        return None
    return _parse_stripped(text)


@dataclass(slots=True)
class ReadStats:
    """Lines read and unparsable lines skipped, over every input."""

    lines: int = 0
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)

    def skip(self, source: str, lineno: int) -> None:
        """Count one unparsable line, remembering the position of the first few."""
        self.skipped += 1
        if len(self.skipped_examples) < SKIPPED_EXAMPLES:
            self.skipped_examples.append(f"{source}:{lineno}")


def read_events(
    lines: Iterable[str],
    source: str = "<input>",
    *,
    file_index: int = 0,
    stats: ReadStats | None = None,
) -> Iterator[Event]:
    """Parse lines lazily into events numbered ``source:lineno``.

    Blank lines are ignored, unparsable ones counted in ``stats``. A line without a
    timestamp takes the time of the line before it; times of day that jump back by more
    than 12 hours are taken as the next day.

    Example::

        >>> stats = ReadStats()
        >>> events = list(read_events(["[23:59:59.900] a=1 x", "junk", "[00:00:00.100] a=2 y"],
        ...                           "app.log", stats=stats))
        >>> [(e.name, e.line, round(e.ts, 1)) for e in events], stats.skipped_examples
        ([('x', 'app.log:1', 86399.9), ('y', 'app.log:3', 86400.1)], ['app.log:2'])
    """
    stats = stats if stats is not None else ReadStats()
    last_ts = 0.0
    last_dated = True
    day_offset = 0.0
    last_clock: float | None = None
    lineno = 0
    for lineno, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        event = _parse_stripped(text)
        if event is None:
            stats.skip(source, lineno)
            continue
        event.source = source
        event.lineno = lineno
        event.file_index = file_index
        if not event.has_time:
            event.ts = last_ts
            event.dated = last_dated
        elif not event.dated:
            clock = event.ts + day_offset
            if last_clock is not None and clock < last_clock - 43200:
                day_offset += 86400
                clock += 86400
            event.ts = last_clock = clock
        last_ts = event.ts
        last_dated = event.dated
        yield event
    stats.lines += lineno


# --- ordering ----------------------------------------------------------------------------


def _order_key(event: Event) -> tuple[float, int, int]:
    return (event.ts, event.file_index, event.lineno)


class OrderedEvents:
    """Events of several inputs merged in timestamp order, in bounded memory.

    Each input is put back in order within ``window`` seconds (and at most
    ``buffer`` events held); inputs are then merged, ties going to the earlier input and
    line. An event that arrives later than that is passed on as soon as it is seen and
    counted in :attr:`late`.

    Example::

        >>> a = read_events(["[10:00:02] k=1 b", "[10:00:01] k=1 a"], "a.log")
        >>> b = read_events(["[10:00:01.5] k=1 c"], "b.log", file_index=1)
        >>> [e.name for e in OrderedEvents([a, b])]
        ['a', 'c', 'b']
    """

    def __init__(
        self,
        streams: Sequence[Iterable[Event]],
        window: float = DEFAULT_REORDER_WINDOW,
        buffer: int = REORDER_BUFFER,
    ) -> None:
        self.streams = streams
        self.window = window
        self.buffer = max(buffer, 1)
        #: Events that came out of order by more than the window allowed.
        self.late = 0

    def _reorder(self, stream: Iterable[Event]) -> Iterator[Event]:
        # Lines already in order (nearly all) wait in a FIFO run; only lines older than the
        # newest one seen go through the heap. Out comes the smaller head of the two, once
        # it is `window` seconds older than the newest line, or when too many wait.
        run: deque[Event] = deque()
        heap: list[tuple[float, int, Event]] = []
        push, pop = heapq.heappush, heapq.heappop
        window, buffer = self.window, self.buffer
        newest = -math.inf
        waiting = 0
        for event in stream:
            ts = event.ts
            if ts >= newest:
                run.append(event)
                newest = ts
            else:
                push(heap, (ts, event.lineno, event))
            waiting += 1
            limit = newest - window
            while waiting:
                if heap:
                    head_ts, head_line, head = heap[0]
                    if run:
                        first = run[0]
                        if first.ts < head_ts or (
                            first.ts == head_ts and first.lineno < head_line
                        ):
                            head, head_ts = first, first.ts
                else:
                    head = run[0]
                    head_ts = head.ts
                if head_ts > limit and waiting <= buffer:
                    break
                if run and head is run[0]:
                    run.popleft()
                else:
                    pop(heap)
                waiting -= 1
                yield head
        while run or heap:
            if heap and (not run or (heap[0][0], heap[0][1]) < (run[0].ts, run[0].lineno)):
                yield pop(heap)[2]
            else:
                yield run.popleft()

    def __iter__(self) -> Iterator[Event]:
        parts = [self._reorder(stream) for stream in self.streams]
        merged: Iterable[Event] = parts[0]
        if len(parts) > 1:
            merged = heapq.merge(*parts, key=_order_key)
        newest = -math.inf
        for event in merged:
            ts = event.ts
            if ts < newest:
                self.late += 1
            else:
                newest = ts
            yield event


# --- findings ----------------------------------------------------------------------------


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

    @property
    def headline(self) -> str:
        """One line for humans: kind, SKU and detail."""
        where = f" sku={self.sku}" if self.sku is not None else ""
        return f"{_KIND_TITLES[self.kind]}{where}: {self.detail}"

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data."""
        return {
            "kind": self.kind,
            "sku": self.sku,
            "requests": self.requests,
            "detail": self.detail,
            "lines": self.lines,
        }


class _Write(NamedTuple):
    """A successful stock write (or a paid order), as little as the detectors need.

    A tuple of plain values, so the garbage collector stops tracking it: hundreds of
    thousands of them (one per idempotency key) cost no collector time.
    """

    name: str | None
    frm: int | None
    to: int | None
    ts: float
    source: str
    lineno: int
    order_id: str | None

    @property
    def line(self) -> str:
        return f"{self.source}:{self.lineno}"

    def same_record(self, other: _Write) -> bool:
        # The same line delivered twice (log shipper retry, overlapping rotated files).
        return (
            self.name == other.name
            and self.ts == other.ts
            and self.frm == other.frm
            and self.to == other.to
        )


class _Check(NamedTuple):
    available: int | None
    ts: float
    source: str
    lineno: int

    @property
    def line(self) -> str:
        return f"{self.source}:{self.lineno}"


TimeFormat = Callable[[float], str]


def _names(names: Sequence[str], extra: int = 0) -> str:
    shown = list(names[:5])
    rest = len(names) - len(shown) + extra
    if rest:
        return f"{', '.join(shown)} and {rest} more"
    if len(shown) == 1:
        return shown[0]
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


def _join_times(stamps: Sequence[float], fmt: TimeFormat, extra: int = 0) -> str:
    """``10:00:00.120/.121``: later times drop the part they share with the one before."""
    parts: list[str] = []
    previous = ""
    for ts in stamps[:5]:
        text = fmt(ts)
        dot = text.find(".")
        if previous and dot > 0 and text[:dot] == previous[:dot]:
            parts.append(text[dot:])
        else:
            parts.append(text)
        previous = text
    rest = len(stamps) - len(parts) + extra
    return "/".join(parts) + (f" (+{rest} more)" if rest else "")


def _unique(values: Iterable[str | None]) -> list[str]:
    return list(dict.fromkeys(value for value in values if value is not None))


class _Incident:
    """A finding being built while the stream goes on; rendered at the end."""

    kind: FindingKind = "lost_update"

    def __init__(self, sku: str | None) -> None:
        self.sku = sku
        self.dropped = 0

    def finding(self, fmt: TimeFormat) -> Finding:
        raise NotImplementedError

    def _participants(self) -> list[_Write]:
        raise NotImplementedError

    def _make(
        self,
        requests: list[str],
        detail: str,
        lines: list[str],
        more_orders: Iterable[str | None] = (),
    ) -> Finding:
        orders = _unique([*(write.order_id for write in self._participants()), *more_orders])
        return Finding(self.kind, self.sku, requests, detail, lines, tuple(orders))


class _SameFrom(_Incident):
    kind: FindingKind = "lost_update"

    def __init__(self, sku: str, frm: int, first: _Write, second: _Write) -> None:
        super().__init__(sku)
        self.frm = frm
        self.writes = [first, second]

    def add(self, write: _Write) -> None:
        if any(write.same_record(old) for old in self.writes[-4:]):
            return
        if len(self.writes) < FINDING_PARTICIPANTS:
            self.writes.append(write)
        else:
            self.dropped += 1

    def _participants(self) -> list[_Write]:
        return self.writes

    def finding(self, fmt: TimeFormat) -> Finding:
        writes = self.writes
        names = [write.name or "?" for write in writes]
        word = "both" if len(writes) + self.dropped == 2 else "all"
        targets = _unique(str(write.to) for write in writes if write.to is not None)
        wrote = f"from={self.frm}"
        if len(targets) == 1:
            wrote += f" to={targets[0]}"
        elif targets:
            wrote += f" (to={', '.join(targets)})"
        detail = (
            f"{_names(names, self.dropped)} {word} wrote {wrote} at "
            f"{_join_times([write.ts for write in writes], fmt, self.dropped)}"
        )
        return self._make(_unique(names), detail, [write.line for write in writes])


class _Overwrite(_Incident):
    kind: FindingKind = "lost_update"

    def __init__(self, sku: str, previous: _Write, write: _Write, check: _Check) -> None:
        super().__init__(sku)
        self.previous = previous
        self.write = write
        self.check = check

    def _participants(self) -> list[_Write]:
        return [self.previous, self.write]

    def finding(self, fmt: TimeFormat) -> Finding:
        previous, write, check = self.previous, self.write, self.check
        who, other = write.name or "?", previous.name or "?"
        read = f"available={check.available}" if check.available is not None else "the stock"
        detail = (
            f"{who} wrote from={write.frm} to={write.to} at {fmt(write.ts)} over {other}'s "
            f"write to={previous.to} at {fmt(previous.ts)}, which came after {who} read "
            f"{read} at {fmt(check.ts)}"
        )
        return self._make(_unique([other, who]), detail, [check.line, previous.line, write.line])


class _StaleRead(_Incident):
    kind: FindingKind = "stale_read"

    def __init__(self, sku: str, write: _Write) -> None:
        super().__init__(sku)
        self.write = write
        self.reads: list[tuple[str | None, int, float, str, str | None]] = []

    def add(
        self, name: str | None, available: int, ts: float, line: str, order: str | None
    ) -> None:
        if len(self.reads) < FINDING_PARTICIPANTS:
            self.reads.append((name, available, ts, line, order))
        else:
            self.dropped += 1

    def _participants(self) -> list[_Write]:
        return [self.write]

    def finding(self, fmt: TimeFormat) -> Finding:
        write, reads = self.write, self.reads
        names = [name or "?" for name, *_ in reads]
        values = _unique(str(available) for _, available, *_ in reads)
        what = "available=" + "/".join(values)
        verb = "read" if len(reads) + self.dropped == 1 else "all read"
        detail = (
            f"{_names(names, self.dropped)} {verb} {what} at "
            f"{_join_times([ts for _, _, ts, _, _ in reads], fmt, self.dropped)} after "
            f"{write.name or '?'} wrote to={write.to} at {fmt(write.ts)}"
        )
        return self._make(
            _unique([write.name, *names]),
            detail,
            [write.line, *(read[3] for read in reads)],
            (read[4] for read in reads),
        )


class _Duplicate(_Incident):
    kind: FindingKind = "duplicate_execution"

    def __init__(
        self, sku: str | None, what: str, how: str, first: _Write, second: _Write
    ) -> None:
        super().__init__(sku)
        self.what = what
        self.how = how
        self.writes = [first, second]

    def add(self, write: _Write) -> None:
        if any(write.same_record(old) for old in self.writes[-4:]):
            return
        if len(self.writes) < FINDING_PARTICIPANTS:
            self.writes.append(write)
        else:
            self.dropped += 1

    def _participants(self) -> list[_Write]:
        return self.writes

    def finding(self, fmt: TimeFormat) -> Finding:
        writes = self.writes
        count = len(writes) + self.dropped
        each = ", ".join(f"{write.name or '?'} at {fmt(write.ts)}" for write in writes[:5])
        if count > 5:
            each += f" and {count - 5} more"
        detail = f"{self.what} {count} times{self.how}: {each}"
        names = _unique(write.name for write in writes)
        return self._make(names, detail, [write.line for write in writes])


# --- analysis ----------------------------------------------------------------------------


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and _INT.match(value.strip()):
        return int(value)
    return None


def _truthy(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "yes", "ok", "1", "t", "y"):
            return True
        if lowered in ("false", "no", "0", "f", "n", "failed"):
            return False
    return None


class _SkuState:
    __slots__ = ("froms", "last", "stale")

    def __init__(self) -> None:
        #: The latest write, and the stale-read finding of reads that missed it.
        self.last: _Write | None = None
        self.stale: _StaleRead | None = None
        #: Recent ``from`` values -> the write (or lost update) that started from it.
        self.froms: dict[int, _Write | _SameFrom] = {}


# First letter of a key in _Analyser.keys -> (key kind, action, how).
_KEY_ROLES = {
    "R": ("idempotency_key", "reserved", ""),
    "r": ("payment_reference", "reserved", ""),
    "P": ("payment_reference", "paid", " (payment_callback result=paid)"),
    "p": ("idempotency_key", "paid", " (payment_callback result=paid)"),
    "O": ("payment_reference", "paid", " (order_paid)"),
    "o": ("idempotency_key", "paid", " (order_paid)"),
}


@dataclass(slots=True)
class Report:
    """What :func:`analyse` found, and the timelines it kept.

    ``skus`` and ``orders`` hold at most ``limit`` events each (``more`` counts the rest);
    ``skipped_lines`` and ``lines`` come from :class:`ReadStats` when the caller has them.
    """

    findings: list[Finding] = field(default_factory=list)
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
    skipped_lines: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    #: Whether the dated events span more than one UTC day (times then show the date).
    show_date: bool = False
    #: The UTC day of the dated events when they all fall on one, e.g. ``2026-11-29``.
    day: str | None = None

    @property
    def exit_code(self) -> int:
        """1 when there is a finding, else 0."""
        return EXIT_FINDINGS if self.findings else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (the ``--format json`` output).

        Example::

            >>> sorted(Report().to_dict())  # doctest: +NORMALIZE_WHITESPACE
            ['events', 'findings', 'keys_forgotten', 'late_events', 'lines', 'more',
             'orders', 'skipped_examples', 'skipped_lines', 'skus']
        """
        return {
            "findings": [finding.to_dict() for finding in self.findings],
            "skus": {sku: [e.to_dict() for e in events] for sku, events in self.skus.items()},
            "orders": {o: [e.to_dict() for e in events] for o, events in self.orders.items()},
            "more": {"skus": self.skus_more, "orders": self.orders_more},
            "skipped_lines": self.skipped_lines,
            "skipped_examples": self.skipped_examples,
            "events": self.events,
            "lines": self.lines,
            "late_events": self.late_events,
            "keys_forgotten": self.keys_forgotten,
        }


def _time_format(*, dated: bool, with_date: bool) -> TimeFormat:
    def fmt(ts: float) -> str:
        return format_time(ts, dated, with_date=with_date)

    return fmt


class _Analyser:
    def __init__(
        self,
        *,
        limit: int,
        max_groups: int,
        skus: frozenset[str] | None,
        order: str | None,
        request: str | None,
    ) -> None:
        self.limit = limit
        self.max_groups = max_groups
        self.sku_filter = skus
        self.order_filter = order
        self.request_filter = request
        self.report = Report()
        self.state: dict[str, _SkuState] = {}
        self.checks: dict[tuple[str, str], _Check] = {}
        #: "<role letter><sku>\x1f<key>" -> the first write with that key, or the duplicate.
        self.keys: dict[str, _Write | _Duplicate] = {}
        self.keep_orders = order is not None
        self.incidents: list[_Incident] = []
        self.order_requests: set[str] = set()
        self.min_day = math.inf
        self.max_day = -math.inf

    # --- per event ---

    def feed(self, event: Event) -> None:
        if self.sku_filter is not None and event.sku not in self.sku_filter:
            return
        self.report.events += 1
        if event.dated and event.has_time:
            day = event.ts // 86400
            if day < self.min_day:
                self.min_day = day
            if day > self.max_day:
                self.max_day = day
        name = event.name
        if name == "stock_check":
            self._stock_check(event)
        elif name == "stock_update":
            self._stock_update(event)
        elif name == "payment_callback":
            if event.fields.get("result") == "paid":
                self._paid(event)
        elif name == "order_paid":
            self._paid(event)
        self._keep(event)

    def _keep(self, event: Event) -> None:
        wanted = self.request_filter
        if wanted is not None and wanted not in (
            event.request_id,
            event.idempotency_key,
            event.request,
        ):
            return
        order = self.order_filter
        if order is not None:
            if event.order_id != order:
                return
            if event.request is not None:
                self.order_requests.add(event.request)
        report, limit = self.report, self.limit
        sku, order_id = event.sku, event.order_id
        # Inline fast path: a full timeline only counts (most events of a big log).
        if sku is not None:
            rows = report.skus.get(sku)
            if rows is not None and 0 < limit <= len(rows):
                report.skus_more[sku] = report.skus_more.get(sku, 0) + 1
            else:
                self._group(report.skus, report.skus_more, sku, event)
        if order_id is not None:
            rows = report.orders.get(order_id)
            if rows is not None and 0 < limit <= len(rows):
                report.orders_more[order_id] = report.orders_more.get(order_id, 0) + 1
            else:
                self._group(report.orders, report.orders_more, order_id, event)

    def _group(
        self, groups: dict[str, list[Event]], more: dict[str, int], key: str, event: Event
    ) -> None:
        rows = groups.get(key)
        if rows is None:
            if self.max_groups and len(groups) >= self.max_groups:
                self.report.ungrouped_events += 1
                return
            rows = groups[key] = []
        if self.limit and len(rows) >= self.limit:
            more[key] = more.get(key, 0) + 1
        else:
            rows.append(event)

    def _sku(self, sku: str) -> _SkuState:
        state = self.state.get(sku)
        if state is None:
            state = self.state[sku] = _SkuState()
        return state

    def _stock_check(self, event: Event) -> None:
        sku = event.sku
        if sku is None:
            return
        fields = event.fields
        available = _as_int(fields.get("available", fields.get("stock")))
        request = event.request
        state = self.state.get(sku)
        last = state.last if state is not None else None
        if request is not None:
            if last is not None and last.name == request and last.ts == event.ts:
                # The request's own write, logged in the same instant: no window to open.
                return
            checks = self.checks
            key = (sku, request)
            checks.pop(key, None)
            checks[key] = _Check(available, event.ts, event.source, event.lineno)
            if len(checks) > OPEN_CHECKS:
                del checks[next(iter(checks))]
        if (
            state is None
            or last is None
            or available is None
            or last.to is None
            or available == last.to
            or (request is not None and last.name == request)
            or event.ts == last.ts
        ):
            # Same value, own write, or a tie: a read logged in the same instant as the
            # write is not ordered against it by the log, so it is not called stale.
            return
        # Older means on the side the write came from (above it, for a sale); a value on
        # the other side is newer: a write whose line has not been read yet.
        decreasing = last.frm is None or last.frm >= last.to
        if (available > last.to) != decreasing:
            return
        incident = state.stale
        if incident is None:
            incident = state.stale = _StaleRead(sku, last)
            self.incidents.append(incident)
        incident.add(request, available, event.ts, event.line, event.order_id)

    def _stock_update(self, event: Event) -> None:
        sku = event.sku
        if sku is None:
            return
        fields = event.fields
        request = event.request
        check = self.checks.pop((sku, request), None) if request is not None else None
        success = _truthy(fields.get("success"))
        if success is None:
            success = "reason" not in fields and "error" not in fields
        if not success:
            return
        frm = _as_int(fields.get("from"))
        to = _as_int(fields.get("to"))
        if frm is None and check is not None:
            frm = check.available
        order_id = event.order_id if self.keep_orders else None
        write = _Write(request, frm, to, event.ts, event.source, event.lineno, order_id)
        state = self._sku(sku)
        if event.idempotency_key is not None:
            self._count(f"R{sku}\x1f{event.idempotency_key}", sku, write)
        if event.payment_reference is not None:
            self._count(f"r{sku}\x1f{event.payment_reference}", sku, write)

        same_from = False
        if frm is not None:
            froms = state.froms
            seen = froms.pop(frm, None)
            if seen is None:
                froms[frm] = write
                if len(froms) > RECENT_FROMS:
                    del froms[next(iter(froms))]
            elif isinstance(seen, _SameFrom):
                seen.add(write)
                froms[frm] = seen
                same_from = True
            elif seen.same_record(write):
                froms[frm] = seen
                return
            else:
                incident = _SameFrom(sku, frm, seen, write)
                self.incidents.append(incident)
                froms[frm] = incident
                same_from = True
            if to is not None and to > frm:
                # A restock: values below it may legitimately be written from again.
                froms.clear()

        last = state.last
        if last is not None and frm is not None and to is not None and last.to is not None:
            chained_before = last.frm is not None and to == last.frm and frm != last.to
            if (
                not same_from
                and check is not None
                and last.name != request
                and last.ts >= check.ts
                and frm != last.to
                and not chained_before
            ):
                self.incidents.append(_Overwrite(sku, last, write, check))
            if chained_before:
                # Logged after a write that started from its result: the later state stays.
                return
        state.last = write
        state.stale = None

    def _paid(self, event: Event) -> None:
        order_id = event.order_id
        name = event.request or order_id
        if not self.keep_orders:
            order_id = None
        write = _Write(name, None, None, event.ts, event.source, event.lineno, order_id)
        sku = event.sku
        where = sku or ""
        callback = event.name == "payment_callback"
        if event.payment_reference is not None:
            role = "P" if callback else "O"
            self._count(f"{role}{where}\x1f{event.payment_reference}", sku, write)
        if event.idempotency_key is not None:
            role = "p" if callback else "o"
            self._count(f"{role}{where}\x1f{event.idempotency_key}", sku, write)

    def _count(self, key: str, sku: str | None, write: _Write) -> None:
        keys = self.keys
        first = keys.get(key)
        if first is None:
            keys[key] = write
            if len(keys) > MAX_KEYS:
                del keys[next(iter(keys))]
                self.report.keys_forgotten += 1
        elif isinstance(first, _Duplicate):
            first.add(write)
        elif not first.same_record(write):
            kind, action, how = _KEY_ROLES[key[0]]
            value = key.partition("\x1f")[2]
            incident = _Duplicate(sku, f"{kind}={value} {action}", how, first, write)
            self.incidents.append(incident)
            keys[key] = incident

    # --- the end ---

    def finish(self) -> Report:
        report = self.report
        report.show_date = self.max_day > self.min_day
        if self.max_day == self.min_day:
            report.day = time.strftime("%Y-%m-%d", time.gmtime(self.min_day * 86400))
        fmt = _time_format(dated=self.max_day >= self.min_day, with_date=report.show_date)
        findings = [incident.finding(fmt) for incident in self.incidents]
        if self.request_filter is not None:
            findings = [f for f in findings if self.request_filter in f.requests]
        if self.order_filter is not None:
            order, related = self.order_filter, self.order_requests
            findings = [f for f in findings if order in f.orders or related & set(f.requests)]
        report.findings = findings
        return report


def analyse(
    events: Iterable[Event],
    *,
    limit: int = DEFAULT_LIMIT,
    skus: Iterable[str] | None = None,
    order: str | None = None,
    request: str | None = None,
    reorder_window: float | None = DEFAULT_REORDER_WINDOW,
    max_groups: int = MAX_GROUPS,
) -> Report:
    """Run the detectors over ``events`` and keep the timelines to show.

    Events are first put in timestamp order within ``reorder_window`` seconds (``None``:
    trust the order given, as :class:`OrderedEvents` output is). ``skus`` restricts the
    whole analysis to those SKUs; ``order`` and ``request`` keep only that order's or
    request's events in the timelines and only the findings that involve it. ``limit``
    events are kept per SKU and per order (0: all), for at most ``max_groups`` of each.

    Example::

        >>> log = [
        ...     '{"event": "stock_update", "sku": "A", "from": 3, "to": 2, "success": true,'
        ...     ' "idempotency_key": "K1", "request_id": "R1", "ts": "2026-11-29T10:00:00Z"}',
        ...     '{"event": "stock_update", "sku": "A", "from": 2, "to": 1, "success": true,'
        ...     ' "idempotency_key": "K1", "request_id": "R1b", "ts": "2026-11-29T10:00:02Z"}',
        ... ]
        >>> report = analyse(read_events(log))
        >>> [(f.kind, f.requests) for f in report.findings]
        [('duplicate_execution', ['R1', 'R1b'])]
        >>> report.findings[0].detail
        'idempotency_key=K1 reserved 2 times: R1 at 10:00:00.000, R1b at 10:00:02.000'
    """
    analyser = _Analyser(
        limit=max(limit, 0),
        max_groups=max(max_groups, 0),
        skus=frozenset(skus) if skus is not None else None,
        order=order,
        request=request,
    )
    ordered: Iterable[Event] = events
    if reorder_window is not None and not isinstance(events, OrderedEvents):
        ordered = OrderedEvents([events], reorder_window)
    feed = analyser.feed
    for event in ordered:
        feed(event)
    report = analyser.finish()
    if isinstance(ordered, OrderedEvents):
        report.late_events = ordered.late
    return report


# --- output ------------------------------------------------------------------------------

_FIRST_DETAILS = ("from", "to", "available", "success", "reason", "result", "qty", "stock")
_MAX_DETAILS = 120
_MAX_CELL = 36


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
    if context == "sku":
        extra = (("order", event.order_id), ("key", event.idempotency_key))
    else:
        extra = (("sku", event.sku), ("key", event.idempotency_key))
    parts += [f"{label}={value}" for label, value in extra if value is not None]
    if event.payment_reference is not None:
        parts.append(f"payment={event.payment_reference}")
    text = " ".join(parts)
    return text if len(text) <= _MAX_DETAILS else text[: _MAX_DETAILS - 1] + "…"


def _cell(text: str | None) -> str:
    if not text:
        return "-"
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 1] + "…"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def format_table(report: Report) -> str:
    """The report for humans: findings first, then one table per SKU and per order.

    Example::

        >>> lines = ["[10:00:00.101] request_id=R1 sku=EGG-01 stock_check available=1"]
        >>> print(format_table(analyse(read_events(lines, "a.log"))))  # doctest: +ELLIPSIS
        stocksentry timeline: 1 event
        <BLANKLINE>
        No findings: no lost update, duplicate execution or stale read.
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
            f"were forgotten to bound memory (over {MAX_KEYS:,}); a duplicate further apart "
            "than that is not seen"
        )
    out.append("")
    if report.findings:
        counts: dict[str, int] = {}
        for finding in report.findings:
            title = _KIND_TITLES[finding.kind].lower()
            counts[title] = counts.get(title, 0) + 1
        summary = ", ".join(_plural(n, title) for title, n in counts.items())
        out.append(f"FINDINGS: {summary}")
        for finding in report.findings:
            out.append(f"  {finding.headline}")
            out.append(f"      lines: {', '.join(finding.lines[:10])}")
            if len(finding.lines) > 10:
                out[-1] += f" … {len(finding.lines) - 10} more"
    else:
        out.append("No findings: no lost update, duplicate execution or stale read.")
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


# --- the command -------------------------------------------------------------------------


class InputError(Exception):
    """An input that cannot be read; the message names it."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class _Input:
    """One opened input: its label, a text stream and what to release afterwards."""

    __slots__ = ("_raw", "label", "stream")

    def __init__(self, label: str, stream: TextIO, raw: IO[bytes] | None) -> None:
        self.label = label
        self.stream = stream
        self._raw = raw

    def close(self) -> None:
        if self._raw is None:
            # stdin: detach, so the wrapper never closes the process's stdin.
            if isinstance(self.stream, io.TextIOWrapper):
                self.stream.detach()
            return
        self.stream.close()
        self._raw.close()


def _open_input(path: str) -> _Input:
    """Open one input as text: ``-`` is stdin; gzip by ``.gz`` suffix or magic bytes."""
    if path == "-":
        buffer: IO[bytes] | None = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            return _Input("<stdin>", sys.stdin, None)
        binary: IO[bytes] = buffer
        peek = getattr(buffer, "peek", None)
        if callable(peek) and bytes(peek(2))[:2] == b"\x1f\x8b":
            binary = cast(IO[bytes], gzip.GzipFile(fileobj=buffer, mode="rb"))
        text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
        return _Input("<stdin>", text, None)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by _Input.close
    except OSError as exc:
        raise InputError(f"cannot read {path}: {_describe(exc)}") from None
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise InputError(f"cannot read {path}: {_describe(exc)}") from None
    binary = raw
    if path.endswith(".gz") or magic == b"\x1f\x8b":
        binary = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    return _Input(path, io.TextIOWrapper(binary, encoding="utf-8", errors="replace"), raw)


def _lines_of(label: str, stream: TextIO) -> Iterator[str]:
    try:
        yield from stream
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        raise InputError(f"cannot read {label}: {_describe(exc)}") from None


@dataclass(frozen=True, slots=True)
class _Options:
    paths: list[str]
    skus: list[str] | None
    order: str | None
    request: str | None
    form: str
    limit: int
    window: float


def _options(args: argparse.Namespace) -> _Options:
    paths = getattr(args, "logfile", None)
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise InputError("no LOGFILE given")
    skus = getattr(args, "sku", None)
    if isinstance(skus, str):
        skus = [skus]
    form = getattr(args, "format", "table") or "table"
    if form not in ("table", "json"):
        raise InputError(f"unknown --format {form!r} (choose table or json)")
    limit = getattr(args, "limit", DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InputError(f"--limit must be a whole number >= 0, got {limit!r}")
    window = getattr(args, "reorder_window", DEFAULT_REORDER_WINDOW)
    if not isinstance(window, (int, float)) or not 0 <= window < math.inf:
        raise InputError(f"--reorder-window must be a number of seconds >= 0, got {window!r}")
    return _Options(
        list(paths),
        list(skus) if skus else None,
        getattr(args, "order", None),
        getattr(args, "request", None),
        form,
        limit,
        float(window),
    )


def _say(stream: TextIO, text: str) -> None:
    stream.write(text + "\n")
    stream.flush()


def run_timeline(args: argparse.Namespace) -> int:
    """Run ``stocksentry timeline``: print the report; 1 with findings, 0 without, 2 on bad input.

    Reads every ``args.logfile`` (``-`` for stdin) at once, merged in timestamp order.
    Errors are one line on stderr, never a traceback.

    Example::

        parser = argparse.ArgumentParser()
        add_timeline_parser(parser.add_subparsers())
        args = parser.parse_args(["timeline", "app.log.gz", "--sku", "EGG-01"])
        raise SystemExit(run_timeline(args))
    """
    err = sys.stderr
    try:
        options = _options(args)
    except InputError as exc:
        _say(err, f"stocksentry timeline: error: {exc}")
        return EXIT_USAGE
    opened: list[_Input] = []
    stats = ReadStats()
    try:
        streams: list[Iterator[Event]] = []
        for index, path in enumerate(options.paths):
            source = _open_input(path)
            opened.append(source)
            lines = _lines_of(source.label, source.stream)
            streams.append(read_events(lines, source.label, file_index=index, stats=stats))
        ordered = OrderedEvents(streams, options.window)
        report = analyse(
            ordered,
            limit=options.limit,
            skus=options.skus,
            order=options.order,
            request=options.request,
            reorder_window=None,
        )
    except InputError as exc:
        _say(err, f"stocksentry timeline: error: {exc}")
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say(err, "stocksentry timeline: interrupted")
        return EXIT_INTERRUPTED
    finally:
        for source in opened:
            # Closing a half-read input must not hide the report.
            with contextlib.suppress(OSError, ValueError):
                source.close()
    report.lines = stats.lines
    report.skipped_lines = stats.skipped
    report.skipped_examples = stats.skipped_examples
    if options.form == "json":
        text = json.dumps(report.to_dict(), indent=2, default=str)
    else:
        text = format_table(report)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # `stocksentry timeline big.log | head`: the reader left, which is not our error.
        # Point stdout at devnull so the interpreter's final flush does not fail either.
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return report.exit_code


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def add_timeline_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``timeline`` subcommand; it runs :func:`run_timeline`.

    Sets both ``func`` and ``handler`` defaults, whichever the caller dispatches on.

    Example::

        >>> parser = argparse.ArgumentParser(prog="stocksentry")
        >>> add_timeline_parser(parser.add_subparsers(dest="command"))
        >>> args = parser.parse_args(["timeline", "a.log", "-", "--format", "json"])
        >>> args.logfile, args.format, args.limit, args.func is run_timeline
        (['a.log', '-'], 'json', 50, True)
    """
    timeline = subparsers.add_parser(
        "timeline",
        help="rebuild per-SKU / per-order timelines from logs and flag lost updates",
        description=(
            "Read JSON-lines or key=value logs, put the events in timestamp order and print "
            "them per SKU and per order, after the findings: lost updates (two writes from "
            "the same old stock, or a write over one its request never read), duplicate "
            "executions (one idempotency key or payment reference reserving or paying "
            "twice) and stale reads. Exit status 1 when there is a finding, 0 when none, "
            "2 on bad input."
        ),
    )
    timeline.add_argument(
        "logfile",
        nargs="+",
        metavar="LOGFILE",
        help="log file; '-' reads stdin; gzip (.gz) is decompressed",
    )
    timeline.add_argument(
        "--sku",
        action="append",
        metavar="SKU",
        help="analyse and show only this SKU (repeatable)",
    )
    timeline.add_argument("--order", metavar="ID", help="show only this order's events")
    timeline.add_argument("--request", metavar="ID", help="show only this request's events")
    timeline.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (table)"
    )
    timeline.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"events shown per SKU and per order, 0 for all ({DEFAULT_LIMIT})",
    )
    timeline.add_argument(
        "--reorder-window",
        type=_seconds,
        default=DEFAULT_REORDER_WINDOW,
        metavar="SECONDS",
        help="timestamp disorder within one file that is put back in order "
        f"({DEFAULT_REORDER_WINDOW:g})",
    )
    timeline.set_defaults(func=run_timeline, handler=run_timeline)
