"""Parsing log lines into events: JSON of any logger, ``key=value`` lines, field aliases.

The shapes read (stocksentry's own JSON, other JSON loggers, plain ``key=value`` lines)
and the absurd values that make a line skipped and counted, never a traceback, are listed
in docs/timeline.md ("Input"). Other spellings of the keys the detectors read
(``requestId``, ``old_stock`` ...) are mapped to stocksentry's own (:data:`ALIASES`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from .limits import MAX_DEPTH, MAX_ID, MAX_LINE, MAX_NUMBER, SKIPPED_EXAMPLES
from .model import AVAILABLE, FROM, ID_KEYS, QTY, STOCK, TO, Event
from .selling import INT
from .times import NUMBER, Stamp, parse_time_text, parse_time_value

#: Other spellings of the keys the detectors read, as other loggers and apps write them.
ALIASES: Final = {
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
    "old_stock": FROM,
    "from_stock": FROM,
    "new_stock": TO,
    "to_stock": TO,
    "available_stock": AVAILABLE,
}
_TIME_KEYS = ("timestamp", "ts", "time", "@timestamp", "datetime", "asctime")
_NAME_KEYS = ("event", "msg", "message")
_CANONICAL_KEYS = frozenset(ALIASES)
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
# The seconds since the epoch of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: a
# timestamp outside them cannot be shown as a date (and is no log's).
_MIN_EPOCH: Final = -62135596800.0
_MAX_EPOCH: Final = 253402300799.0
_NUMBER_KEYS: Final = frozenset({FROM, TO, AVAILABLE, STOCK, QTY})
_NUMBERS: Final = (int, float)
# Values that can be neither NaN, an infinity nor nested: a line of only these (nearly
# every line) needs no walk through its values.
_FLAT_TYPES: Final = frozenset({str, int, bool, type(None)})
_DATE_ONLY = re.compile(r"\d{4}-\d\d-\d\d\Z")


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
    if INT.match(raw):
        return int(raw)
    return raw


def _parse_pairs(text: str, start: int = 0) -> tuple[str | None, Stamp | None, dict[str, Any]]:
    """Event name (first bare word), leading timestamp and the ``key=value`` pairs."""
    name: str | None = None
    stamp: Stamp | None = None
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
                stamp = parse_time_text(f"{pending_date}T{word}")
                pending_date = None
                if stamp is not None:
                    continue
            if _DATE_ONLY.match(word):
                pending_date = word
                continue
            stamp = parse_time_text(word)
            if stamp is not None:
                continue
        if name is None and word.upper() not in _LEVEL_WORDS and _NAME_WORD.match(word):
            name = word
    return name, stamp, pairs


class _AbsurdError(ValueError):
    """A value that makes its line skipped (see :func:`_absurd_fields`)."""


def _text_id(value: object) -> str | None:
    """An id as text (``None``: none); an id that is not a string or a finite number, or
    is longer than ``MAX_ID``, raises :class:`_AbsurdError`."""
    if type(value) is str:
        if len(value) > MAX_ID:
            raise _AbsurdError
        return value or None
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return str(value)
    if value is None:
        return None
    raise _AbsurdError


def _absurd_fields(fields: dict[str, Any]) -> bool:
    """Whether a value of ``fields`` (the ids already taken out) would break the analysis
    or the report: NaN or an infinity anywhere, nesting deeper than ``MAX_DEPTH``, a
    stock number beyond ``MAX_NUMBER``."""
    for key in fields.keys() & _NUMBER_KEYS:
        value = fields[key]
        # A bool is an int, and within the bounds.
        if isinstance(value, _NUMBERS) and not -MAX_NUMBER <= value <= MAX_NUMBER:
            return True
    values = fields.values()
    if _FLAT_TYPES.issuperset(map(type, values)):
        return False
    # Iterative, so that the check itself never recurses as deep as the line is nested.
    stack: list[tuple[Any, int]] = [(value, 1) for value in values]
    while stack:
        value, depth = stack.pop()
        if type(value) is float:
            if not math.isfinite(value):
                return True
        elif type(value) is dict:
            if depth > MAX_DEPTH:
                return True
            stack.extend((item, depth + 1) for item in value.values())
        elif type(value) is list:
            if depth > MAX_DEPTH:
                return True
            stack.extend((item, depth + 1) for item in value)
    return False


def _make_event(
    name: str, stamp: Stamp | None, record: dict[str, Any], used: tuple[str, ...]
) -> Event | None:
    """Build the event, ``record`` (the caller's own) its ``fields``; ``None`` when a
    value is absurd: the line is skipped."""
    if stamp is not None:
        ts, dated = stamp
        if not math.isfinite(ts) or (dated and not _MIN_EPOCH <= ts <= _MAX_EPOCH):
            return None
    fields = record
    pop = fields.pop
    for key in used:
        pop(key, None)
    keys = fields.keys()
    if not keys.isdisjoint(_CANONICAL_KEYS):
        for raw_key in keys & _CANONICAL_KEYS:
            fields.setdefault(ALIASES[raw_key], pop(raw_key))
    for key in _DROP_KEYS:
        pop(key, None)
    try:
        sku, request_id, idempotency_key, order_id, reference, trace_id = [
            _text_id(pop(id_key, None)) for id_key in ID_KEYS
        ]
        product = _text_id(fields.get("product_id"))
    except _AbsurdError:
        return None
    if _absurd_fields(fields):
        return None
    return Event(
        name.strip()[:_MAX_NAME],
        stamp[0] if stamp is not None else 0.0,
        stamp[1] if stamp is not None else True,
        stamp is not None,
        sku if sku is not None else product,
        request_id,
        idempotency_key,
        order_id,
        reference,
        trace_id,
        fields,
    )


def _from_mapping(record: dict[str, Any], stamp: Stamp | None) -> Event | None:
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


def _find_time(record: dict[str, Any]) -> tuple[Stamp, str] | None:
    """The stamp of the first time key of ``record`` that parses, and that key.

    A number that is no time (negative, NaN, 10**400, or such a number as text) gives an
    infinite stamp, which :func:`_make_event` refuses: the line is skipped instead of
    taking the time of the line before it.
    """
    for key in _TIME_KEYS:
        if key in record:
            value = record[key]
            parsed = parse_time_value(value)
            if parsed is not None:
                return parsed, key
            if _is_number(value):
                return (math.inf, True), key
    return None


def _is_number(value: object) -> bool:
    if isinstance(value, str):
        return NUMBER.match(value.strip()) is not None
    return isinstance(value, int | float) and not isinstance(value, bool)


def _from_text(text: str) -> Event | None:
    start = 0
    stamp: Stamp | None = None
    if text[0] == "[":
        end = text.find("]", 1, 66)
        if end > 0:
            stamp = parse_time_text(text[1:end].strip())
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


def decode_object(text: str) -> dict[str, Any] | None:
    """The JSON object that is all of ``text`` (already stripped), else ``None``.

    What :mod:`json` reads, NaN and infinities included.

    Example::

        >>> decode_object('{"a": NaN, "b": 12345678901234567890123}')
        {'a': nan, 'b': 12345678901234567890123}
        >>> decode_object('[1]') is None, decode_object('{"a": 1} x') is None
        (True, True)
    """
    try:
        value, end = _decoder.raw_decode(text)
    except (ValueError, RecursionError):
        return None
    return value if end == len(text) and isinstance(value, dict) else None


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
    if len(text) > MAX_LINE and _too_long(text):
        return None
    text = text.strip()
    if not text:
        return None
    if text[0] == "{":
        record = decode_object(text)
        return None if record is None else _from_mapping(record, None)
    brace = text.find("{")
    if brace > 0 and text[-1] == "}":
        # A JSON line behind a prefix: "2026-11-29T13:41:14.262Z stdout F {...}".
        record = decode_object(text[brace:])
        if record is not None:
            prefix = text[:brace].split()
            stamp = parse_time_text(prefix[0]) if prefix else None
            return _from_mapping(record, stamp)
    return _from_text(text)


def _too_long(line: str) -> bool:
    """Whether ``line``, without its line break, is longer than ``MAX_LINE``."""
    return len(line.rstrip("\r\n")) > MAX_LINE


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

    Blank lines are ignored, unparsable ones counted in ``stats``, and so are lines
    longer than :data:`~.limits.MAX_LINE` characters and lines with an absurd value
    (see docs/timeline.md). A line without a timestamp takes the time of the line before
    it; times of day that jump back by more than 12 hours are taken as the next day.

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
        event = parse_line(raw)
        if event is None:
            # Blank lines are no log lines; too long ones are.
            if raw.strip() or _too_long(raw):
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
