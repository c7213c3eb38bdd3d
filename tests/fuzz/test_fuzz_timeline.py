"""timeline's parsers on hostile log lines: an Event or a skip, never an exception.

``parse_line`` is fed JSON objects of any loggers' shape (ids, times and names of every
type and size), ``key=value`` lines, bracketed and ISO timestamps, and plain noise; the
whole pipeline (``read_events``, ``analyse``, the table and the JSON report) is fed
lines built the same way, so an absurd value cannot get past the parser and crash later.
"""

from __future__ import annotations

import json
from typing import Any

from fuzzing import any_text, examples, hostile_text
from hypothesis import given
from hypothesis import strategies as st
from stocksentry.exporter.contract.spec import CORRELATION_FIELDS
from stocksentry.exporter.investigate.timeline import (
    Event,
    ReadStats,
    analyse,
    format_table,
    parse_line,
    read_events,
)
from stocksentry.exporter.investigate.timeline.incidents import Write
from stocksentry.exporter.investigate.timeline.parsing import decode_object

_KEYS = [
    "event",
    "msg",
    "message",
    "timestamp",
    "ts",
    "time",
    "@timestamp",
    "sku",
    "SKU",
    "product_id",
    "request_id",
    "requestId",
    "idempotency_key",
    "order_id",
    "payment_reference",
    "trace_id",
    "from",
    "to",
    "old_stock",
    "new_stock",
    "available",
    "success",
    "level",
    "fields",
    "extra",
    "context",
]
#: Epoch values far past any calendar.
ABSURD_TIMES: list[float | str] = [1e30, 1e300, -1e30, "1e30"]
_NAMES = ["stock_check", "stock_update", "payment_callback", "order_paid", "x"]
_TIMES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from(
        [
            "2026-11-29T13:41:14.262Z",
            "2026-11-29 20:41:14,262+07:00",
            "9999-12-31T23:59:59.999999-23:59",
            "0001-01-01T00:00:00+14:00",
            "10:00:00.101",
            "99:99:99",
            "1e30",
            "-1",
            "1795959674262",
            "NaN",
        ]
    ),
    any_text.map(lambda t: t[:40]),
)
_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(),
    st.sampled_from(_NAMES),
    any_text.map(lambda t: t[:200]),
)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_KEYS), inner, max_size=4)
    ),
    max_leaves=10,
)


@st.composite
def _json_line(draw: st.DrawFn, times: st.SearchStrategy[Any] = _TIMES) -> str:
    record: dict[str, Any] = draw(
        st.dictionaries(st.sampled_from(_KEYS), _json_values, max_size=10)
    )
    if draw(st.booleans()):
        record[draw(st.sampled_from(["timestamp", "ts", "time", "@timestamp"]))] = draw(times)
    if draw(st.booleans()):
        record[draw(st.sampled_from(["event", "msg"]))] = draw(st.sampled_from(_NAMES))
        record.setdefault("sku", draw(st.sampled_from(["A", "B"])))
        record.setdefault("request_id", draw(st.sampled_from(["R1", "R2"])))
    # allow_nan: Python's loggers write NaN and Infinity, and the parser reads them.
    text = json.dumps(record, allow_nan=True, ensure_ascii=draw(st.booleans()))
    prefix = draw(st.sampled_from(["", "2026-11-29T13:41:14.262Z stdout F ", "junk "]))
    return prefix + text


_kv_values = st.one_of(
    st.sampled_from(_NAMES),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    any_text.map(lambda t: json.dumps(t[:60])),
    st.text("abc'\"=\\ []{}", max_size=20),
)


@st.composite
def _kv_line(draw: st.DrawFn) -> str:
    parts: list[str] = []
    stamp = draw(st.one_of(st.none(), _TIMES.map(str)))
    if stamp is not None:
        parts.append(draw(st.sampled_from(["[{}]", "{}"])).format(stamp))
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            parts.append(f"{draw(st.sampled_from(_KEYS))}={draw(_kv_values)}")
        else:
            parts.append(draw(st.sampled_from([*_NAMES, "INFO", "2026-11-29", "13:41:14"])))
    return " ".join(parts)


_lines = st.one_of(_json_line(), _kv_line(), hostile_text)
# Lines with absurd epoch values, which once aborted the whole report.
_absurd_lines = st.one_of(_json_line(st.one_of(_TIMES, st.sampled_from(ABSURD_TIMES))), _lines)


@examples(800)
@given(_absurd_lines)
def test_a_line_is_an_event_or_a_skip(line: str) -> None:
    event = parse_line(line)
    assert event is None or isinstance(event, Event)


@examples(300)
@given(st.lists(_absurd_lines, max_size=12))
def test_lines_through_the_whole_report_never_raise(lines: list[str]) -> None:
    stats = ReadStats()
    report = analyse(read_events(lines, "fuzz.log", stats=stats))
    assert stats.lines + 0 <= len(lines)
    format_table(report)
    json.dumps(report.to_dict())


# --- the project's own lines: what json reads -------------------------------------------

_OWN_KEYS = (
    "sku",
    "strategy",
    "available",
    "from",
    "to",
    "qty",
    "success",
    "reason",
    *CORRELATION_FIELDS,
    "level",
    "logger",
    "result",
    "product_id",
    "orderId",
)
_own_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.text("a", min_size=500, max_size=600),
    st.lists(st.integers(), max_size=2),
)
_own_stamps = st.one_of(
    st.builds(
        "2026-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}.{:03d}Z".format,
        st.integers(1, 12),
        st.integers(1, 31),
        st.integers(0, 25),
        st.integers(0, 61),
        st.integers(0, 61),
        st.integers(0, 999),
    ),
    any_text.map(lambda t: t[:30]),
    st.floats(),
)


@st.composite
def _own_line(draw: st.DrawFn) -> str:
    record: dict[str, Any] = {
        "event": draw(
            st.one_of(
                st.sampled_from(["stock_check", "stock_update", "payment_callback"]),
                st.text(max_size=10),
                st.integers(),
            )
        )
    }
    if draw(st.booleans()):
        record["timestamp"] = draw(_own_stamps)
    for key in draw(st.lists(st.sampled_from(_OWN_KEYS), max_size=8, unique=True)):
        record[key] = draw(_own_values)
    return json.dumps(record, ensure_ascii=draw(st.booleans()))


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


@examples(1500)
@given(st.one_of(_own_line(), _json_line(), _lines))
def test_a_line_decodes_as_json_reads_it(line: str) -> None:
    """The result is json's, NaN, infinities, huge integers and lone surrogates included."""
    text = line.strip()
    assert repr(decode_object(text)) == repr(_json_object(text)), line


@examples(300)
@given(_own_line())
def test_the_projects_own_lines_read_as_parsed(line: str) -> None:
    """A line read from a file is the line parsed, numbered where it was read."""
    stats = ReadStats()
    events = list(read_events([line], "own.log", file_index=2, stats=stats))
    event = parse_line(line)
    if event is None:
        assert events == []
        assert stats.skipped == 1
    else:
        event.source, event.lineno, event.file_index = "own.log", 1, 2
        assert events == [event]


def test_the_projects_own_lines_parse() -> None:
    """Not a vacuous agreement: a line as ``configure_logging`` writes it is an event."""
    line = (
        '{"event": "stock_update", "timestamp": "2026-11-29T13:41:14.262Z", "sku": "A",'
        ' "from": 1, "to": 0, "success": true, "request_id": "R1"}'
    )
    event = parse_line(line)
    assert event is not None
    assert (event.name, event.sku, event.request_id, event.fields) == (
        "stock_update",
        "A",
        "R1",
        {"from": 1, "to": 0, "success": True},
    )


# --- the packed first writes read back as the writes they were ----------------------------

_writes = st.builds(
    lambda name, frm, to, ts, source, lineno: (name, frm, to, ts, source, lineno),
    st.text(max_size=40),
    st.one_of(st.none(), st.integers(-(2**63), 2**63)),
    st.one_of(st.none(), st.integers(-(2**63), 2**63)),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.integers(0, 2**40),
)


@examples(1500)
@given(st.lists(_writes, min_size=1, max_size=6))
def test_a_packed_write_reads_back_as_itself(writes: list[tuple[Any, ...]]) -> None:
    """The remembered first writes are held as one string each: packing, then unpacking,
    gives the very same write (names with spaces, -0.0, infinities, huge stock numbers)."""
    sources: list[str] = []
    for name, frm, to, ts, source, lineno in writes:
        write = Write(name, frm, to, ts, source, lineno, None)
        sources.append(source)
        back = Write.unpack(write.pack(len(sources) - 1), sources)
        assert back == write
        assert repr(back.ts) == repr(ts)
