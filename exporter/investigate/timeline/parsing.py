"""Parsing log lines into events: JSON of any logger, ``key=value`` lines, field aliases.

The input is log lines, one event a line, in any mix of three shapes:

* stocksentry's own JSON lines (``event``, ``timestamp``, ``sku``, ``request_id`` ...);
* other JSON loggers: the time under ``ts``, ``time`` or ``@timestamp`` (ISO-8601 or epoch
  seconds / milliseconds), the event name under ``msg`` or ``message`` (which may itself
  hold ``key=value`` pairs), extras optionally nested under ``fields``, ``extra`` or
  ``context``;
* plain ``key=value`` lines such as ``[10:00:00.101] request_id=R1 sku=EGG-01 stock_check
  available=1``: a leading ``[time]`` or ISO timestamp, and a bare word among the pairs
  is the event name.

Other spellings of the keys the detectors read (``requestId``, ``old_stock`` ...) are
mapped to stocksentry's own (:data:`ALIASES`).

A line with an absurd value in any field is skipped and counted like an unparsable one,
never a traceback: a timestamp outside the years 1 to 9999 (``"timestamp": 1e30``), NaN
or an infinity anywhere, a stock number (``from``, ``to``, ``available``, ``stock``,
``qty``) beyond ±2**63, an id that is a list, an object or a boolean, JSON nested deeper
than :data:`~.limits.MAX_DEPTH` levels, a line longer than :data:`~.limits.MAX_LINE`.

Longer than 500 lines on purpose: stocksentry's own flat JSON lines (nearly all of a big
input) are read in one pass by ``_flat_event``, which must give exactly what the general
path gives; it stays beside that path so that a change to one is seen next to the other.
"""

from __future__ import annotations

import importlib
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from .limits import MAX_DEPTH, MAX_ID, MAX_LINE, MAX_NUMBER, SKIPPED_EXAMPLES
from .model import AVAILABLE, FROM, ID_KEYS, QTY, STOCK, TO, Event
from .times import UTC_MILLIS as _UTC_MILLIS
from .times import Stamp, parse_time_text, parse_time_value, utc_millis

__all__ = ["ALIASES", "ReadStats", "parse_line", "read_events"]

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
_ID_KEYS: Final = (
    "sku",
    "product_id",
    "request_id",
    "idempotency_key",
    "order_id",
    "payment_reference",
    "trace_id",
)
_NUMBER_KEYS: Final = (FROM, TO, AVAILABLE, STOCK, QTY)
# A time written as a number, in text: what parse_time_value reads as epoch seconds.
_NUMBER_TEXT: Final = re.compile(r"-?\d+(?:\.\d+)?\Z")
_INT = re.compile(r"-?\d{1,18}\Z")
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
    if _INT.match(raw):
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


def _absurd_stamp(stamp: Stamp | None) -> bool:
    if stamp is None:
        return False
    ts, dated = stamp
    if not math.isfinite(ts):
        return True
    return dated and not _MIN_EPOCH <= ts <= _MAX_EPOCH


_ID_KEY_SET: Final = frozenset(_ID_KEYS)
_NUMBER_KEY_SET: Final = frozenset(_NUMBER_KEYS)
# Values that can be neither NaN, an infinity nor nested: a line of only these (nearly
# every line) needs no walk through its values.
_FLAT_TYPES: Final = frozenset({str, int, bool, type(None)})


def _absurd_fields(fields: dict[str, Any]) -> bool:
    """Whether a value of ``fields`` would break the analysis or the report: NaN or an
    infinity anywhere, nesting deeper than ``MAX_DEPTH``, an id that is not a string or
    a number or is longer than ``MAX_ID``, a stock number beyond ``MAX_NUMBER``."""
    keys = fields.keys()
    for key in keys & _ID_KEY_SET:
        value = fields[key]
        if value is not None and (
            type(value) not in (str, int, float) or (type(value) is str and len(value) > MAX_ID)
        ):
            return True
    for key in keys & _NUMBER_KEY_SET:
        value = fields[key]
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and not -MAX_NUMBER <= value <= MAX_NUMBER
        ):
            return True
    values = fields.values()
    if set(map(type, values)) <= _FLAT_TYPES:
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
    """Build the event; ``record`` (a dict of the caller's own) becomes its ``fields``.

    ``None`` when a value is absurd (see the module's docstring): the line is skipped.
    """
    if _absurd_stamp(stamp):
        return None
    fields = record
    pop = fields.pop
    for key in used:
        pop(key, None)
    keys = fields.keys()
    if not keys.isdisjoint(_CANONICAL_KEYS):
        for raw_key in keys & _CANONICAL_KEYS:
            fields.setdefault(ALIASES[raw_key], pop(raw_key))
    if not keys.isdisjoint(_DROP_KEYS):
        for key in keys & _DROP_KEYS:
            del fields[key]
    if _absurd_fields(fields):
        return None
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
    """The first time key of ``record`` that parses, and its value.

    A number that is no time (negative, NaN, an infinity, 10**400, or such a number as
    text) is an absurd value: it gives an infinite stamp, which :func:`_make_event`
    refuses, so the line is skipped instead of taking the time of the line before it.
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
        return _NUMBER_TEXT.match(value.strip()) is not None
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
_raw_decode = _decoder.raw_decode


def _fast_decoder() -> Callable[[str], Any] | None:
    """orjson's ``loads`` when the ``timeline`` extra installed it, else ``None``.

    Only the one-pass reader of stocksentry's own lines uses it (about 1.4 µs less per
    line than ``json``, a seventh of a big run). It is stricter than ``json`` (no NaN,
    no lone surrogates, integers beyond 64 bits as floats), and every line it refuses or
    reads differently (a float is never a flat line's value) goes to the general path,
    which is ``json``'s: what a line means does not depend on it.
    """
    try:
        module = importlib.import_module("orjson")
    except ImportError:
        return None
    loads: Callable[[str], Any] = module.loads
    return loads


_fast_loads = _fast_decoder()
# Keys after which a line needs the general path: renamed, nested or a second sku.
_SLOW_KEYS: Final = _CANONICAL_KEYS | _CONTAINERS | {"product_id"}
_ID_TYPES: Final = frozenset({str, type(None)})
_STAMPS: dict[str, Stamp] = {}
_STAMPS_SIZE: Final = 4096


class _Shape(NamedTuple):
    """What the keys of a flat line (in their order) say of how to read it: where its
    values are in ``(*record.values(), None)``, and which keys are no field."""

    #: Where the event's name and its timestamp are.
    name_at: int
    time_at: int
    #: The keys deleted from the record: name, time, ids and the dropped ones.
    removed: tuple[str, ...]
    #: Where its stock numbers are, to check their range.
    numbers_at: tuple[int, ...]
    #: The six ids (sku, request, idempotency key, order, payment reference, trace), an
    #: absent one taken from the ``None`` at the end.
    ids_of: Callable[[tuple[Any, ...]], tuple[Any, ...]]


#: The keys of recent lines -> their :class:`_Shape` (``None``: the general path's).
#: A logger writes a few shapes of line, so that this is a handful of entries; only
#: lines of at most ``_SHAPE_LINE`` characters are remembered, so that it stays small.
_SHAPES: dict[tuple[str, ...], _Shape | None] = {}
_SHAPES_SIZE: Final = 1024
_SHAPE_LINE: Final = 4096
_UNKNOWN: Final = _Shape(0, 0, (), (), tuple)


def _shape(keys: tuple[str, ...], text: str) -> _Shape | None:
    """The :class:`_Shape` of a line with these keys; ``None`` when the general path
    reads it (a renamed, nested or second-SKU key, or no ``event`` or ``timestamp``)."""
    if not _SLOW_KEYS.isdisjoint(keys) or "event" not in keys or "timestamp" not in keys:
        shape = None
    else:
        at = {key: index for index, key in enumerate(keys)}
        none = len(keys)
        shape = _Shape(
            at["event"],
            at["timestamp"],
            tuple(
                key
                for key in keys
                if key in _DROP_KEYS or key in ID_KEYS or key in ("event", "timestamp")
            ),
            tuple(at[key] for key in keys if key in _NUMBER_KEY_SET),
            operator.itemgetter(*(at.get(key, none) for key in ID_KEYS)),
        )
    if len(text) > _SHAPE_LINE:
        return shape
    if len(_SHAPES) >= _SHAPES_SIZE:
        _SHAPES.clear()
    _SHAPES[keys] = shape
    return shape


def _flat_event(text: str, source: str, lineno: int, file_index: int) -> Event | None:
    """The event of one of stocksentry's own JSON lines, read in one pass; else ``None``.

    The lines ``configure_logging`` writes (an ``event``, a ``timestamp`` such as
    ``2026-11-29T13:41:14.262Z``, ids that are text, values of plain types, no renamed or
    nested keys) are nearly all of a big input. This reads them as :func:`_from_mapping`
    would, without its passes for aliases, containers and other time keys. Any other
    line, including every line with an absurd value, gives ``None``: the caller then
    parses it the general way, so what a line means never depends on this function.
    The event comes numbered (``source``, ``lineno``, ``file_index``), dated and timed.
    What its keys say (where its name, time, ids and numbers are, which keys to drop) is
    worked out once per shape of line (:func:`_shape`), not again for each line.
    """
    try:
        if _fast_loads is None:
            record, end = _raw_decode(text)
            if end != len(text):
                return None
        else:
            # The whole text or an error (orjson's errors are ValueErrors).
            record = _fast_loads(text)
    except (ValueError, RecursionError):
        return None
    if type(record) is not dict:
        return None
    keys = tuple(record)
    shape = _SHAPES.get(keys, _UNKNOWN)
    if shape is _UNKNOWN:
        shape = _shape(keys, text)
    if shape is None:
        return None
    values = (*record.values(), None)
    # issuperset(iterator) tests each type without building a set of them.
    if not _FLAT_TYPES.issuperset(map(type, values)):
        return None
    name_at, time_at, removed, numbers_at, ids_of = shape
    name, stamp_text = values[name_at], values[time_at]
    if type(name) is not str or type(stamp_text) is not str:
        return None
    # Consecutive lines mostly share their millisecond: the stamps of recent texts.
    stamp = _STAMPS.get(stamp_text)
    if stamp is None:
        if len(stamp_text) != 24 or not _UTC_MILLIS.match(stamp_text):
            return None
        stamp = utc_millis(stamp_text)
        if stamp is None:
            return None
        if len(_STAMPS) >= _STAMPS_SIZE:
            _STAMPS.clear()
        _STAMPS[stamp_text] = stamp
    name = name.strip()
    if not name:
        return None
    for index in numbers_at:
        value = values[index]
        if type(value) is int and not -MAX_NUMBER <= value <= MAX_NUMBER:
            return None
    ids = ids_of(values)
    if not _ID_TYPES.issuperset(map(type, ids)):
        return None
    # No id of a line this short can be longer than MAX_ID.
    if len(text) > MAX_ID and any(value is not None and len(value) > MAX_ID for value in ids):
        return None
    for key in removed:
        del record[key]
    sku, request_id, idempotency_key, order_id, payment_reference, trace_id = ids
    return Event(
        name[:_MAX_NAME],
        stamp[0],
        True,
        True,
        sku or None,
        request_id or None,
        idempotency_key or None,
        order_id or None,
        payment_reference or None,
        trace_id or None,
        record,
        source,
        lineno,
        file_index,
    )


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
            stamp = parse_time_text(prefix[0]) if prefix else None
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
    if len(text) > MAX_LINE and _too_long(text):
        return None
    text = text.strip()
    if not text:
        return None
    return _parse_stripped(text)


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
    (see the module's docstring). A line without a
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
    flat_event = _flat_event
    parse_stripped = _parse_stripped
    for lineno, raw in enumerate(lines, 1):
        if len(raw) > MAX_LINE and _too_long(raw):
            stats.skip(source, lineno)
            continue
        text = raw.strip()
        if not text:
            continue
        if text[0] == "{":
            event = flat_event(text, source, lineno, file_index)
            if event is not None:
                # Dated and timed: nothing of the line before it to take.
                last_ts = event.ts
                last_dated = True
                yield event
                continue
        event = parse_stripped(text)
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
