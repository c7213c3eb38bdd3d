"""Hostile timeline input: an absurd value in any field is a skipped, counted line (never a
traceback, never exit 1, which means "finding"); inputs that never end or are not logs
cannot grow or hang the run.

Memory bounds are asserted with RLIMIT_AS (and CPU with RLIMIT_CPU) in a child process,
never with wall-clock comparisons.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stocksentry.exporter.investigate.timeline import ReadStats, parse_line, read_events
from stocksentry.exporter.investigate.timeline.command import add_timeline_parser
from stocksentry.exporter.investigate.timeline.limits import MAX_DEPTH, MAX_LINE
from timelinecli import run

SAFETY_TIMEOUT = 120

#: A well-formed stock check that follows every hostile line: the run must still read it.
GOOD = {
    "event": "stock_check",
    "timestamp": 1795959670.0,
    "sku": "EGG-01",
    "request_id": "R-good",
    "available": 1,
}


def _update(**fields: Any) -> dict[str, Any]:
    return {
        "event": "stock_update",
        "timestamp": 1795959674.0,
        "sku": "EGG-01",
        "request_id": "R1",
        "from": 1,
        "to": 0,
        **fields,
    }


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# Each line is JSON text (some not expressible through json.dumps: NaN, huge numbers).
ABSURD_LINES = {
    "timestamp-1e30": json.dumps(_update(timestamp=1e30)),
    "timestamp-1e300-ms": json.dumps(_update(timestamp=1e300)),
    "timestamp-year-33658-as-ns": json.dumps(_update(timestamp=1e21)),
    "timestamp-nan": json.dumps(_update()).replace("1795959674.0", "NaN"),
    "timestamp-infinity": json.dumps(_update()).replace("1795959674.0", "Infinity"),
    "timestamp-1e400": json.dumps(_update()).replace("1795959674.0", "1e400"),
    "from-10**400": json.dumps(_update()).replace('"from": 1', '"from": 1' + "0" * 400),
    "to-10**400": json.dumps(_update()).replace('"to": 0', '"to": -1' + "0" * 400),
    "available-10**400": json.dumps(GOOD).replace('"available": 1', '"available": 1' + "0" * 400),
    "from-10**5000": json.dumps(_update()).replace('"from": 1', '"from": 1' + "0" * 5000),
    "from-nan": json.dumps(_update()).replace('"from": 1', '"from": NaN'),
    "available-infinity": json.dumps(GOOD).replace('"available": 1', '"available": -Infinity'),
    "available-1e400": json.dumps(GOOD).replace('"available": 1', '"available": 1e400'),
    "other-field-nan": json.dumps(_update(extra=0.5)).replace("0.5", "NaN"),
    "sku-list": json.dumps(_update(sku=["EGG-01"])),
    "request-id-object": json.dumps(_update(request_id={"id": "R1"})),
    "order-id-bool": json.dumps(_update(order_id=True)),
    "nested-order-id": json.dumps(_update(fields={"order_id": {"a": [1]}})),
    "timestamp-10**400": json.dumps(_update(timestamp=10**400)),
    "timestamp-negative": json.dumps(_update(timestamp=-5)),
    "timestamp-400-digit-text": json.dumps(_update(timestamp="9" * 400)),
    "deep-nesting": json.dumps(_update()).replace('"to": 0', f'"to": 0, "x": {_nested(5000)}'),
    "nested-past-the-limit": json.dumps(_update()).replace(
        '"to": 0', f'"to": 0, "x": {_nested(MAX_DEPTH + 1)}'
    ),
    "ten-megabyte-line": json.dumps(_update(pad="x" * 10_000_000)),
}


@pytest.mark.parametrize("name", list(ABSURD_LINES))
def test_an_absurd_value_is_a_skipped_counted_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = tmp_path / "app.log"
    path.write_text(ABSURD_LINES[name] + "\n" + json.dumps(GOOD) + "\n")

    status, out, err = run(capsys, str(path), "--format", "json")

    assert (status, err) == (0, "")
    report = json.loads(out)
    assert report["skipped_lines"] == 1
    assert report["lines"] == 2
    assert report["findings"] == []


def test_parse_line_refuses_absurd_values_without_raising() -> None:
    for name, line in ABSURD_LINES.items():
        assert parse_line(line) is None, name
    assert parse_line(json.dumps(GOOD)) is not None


def test_a_line_nested_to_the_limit_is_still_read() -> None:
    line = json.dumps(_update()).replace('"to": 0', f'"to": 0, "x": {_nested(MAX_DEPTH)}')
    event = parse_line(line)
    assert event is not None
    assert event.fields["from"] == 1


def test_a_line_of_exactly_max_line_characters_is_read() -> None:
    line = json.dumps(_update(pad=""))
    line = line.replace('"pad": ""', '"pad": "' + "x" * (MAX_LINE - len(line)) + '"')
    assert len(line) == MAX_LINE
    stats = ReadStats()
    assert len(list(read_events([line], "a.log", stats=stats))) == 1
    assert stats.skipped == 0
    stats = ReadStats()
    assert list(read_events([line + " "], "a.log", stats=stats)) == []
    assert stats.skipped == 1


@pytest.mark.parametrize("ending", ["\n", "\r\n", ""])
def test_the_command_reads_a_line_of_max_line_characters_and_skips_one_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ending: str
) -> None:
    line = json.dumps(_update(pad=""))
    line = line.replace('"pad": ""', '"pad": "' + "x" * (MAX_LINE - len(line)) + '"')
    longer = line.replace('"pad": "', '"pad": "x')
    path = tmp_path / "app.log"
    # The line break is not part of the line: "\r\n" or none at the end of the input.
    sep = ending or "\n"
    path.write_text(sep.join([line, longer, json.dumps(GOOD)]) + ending, newline="")

    status, out, err = run(capsys, str(path), "--format", "json")

    assert (status, err) == (0, "")
    report = json.loads(out)
    assert (report["lines"], report["skipped_lines"]) == (3, 1)
    assert report["skipped_examples"] == [f"{path}:2"]


def test_dates_before_1970_and_up_to_year_9999_are_kept() -> None:
    for stamp in ("1969-07-20T20:17:40Z", "9999-12-31T23:59:59Z", "0001-01-01T00:00:00Z"):
        event = parse_line(json.dumps(_update(timestamp=stamp)))
        assert event is not None, stamp
        assert event.dated


def test_numeric_ids_are_still_ids() -> None:
    event = parse_line(json.dumps(_update(order_id=1234, request_id=7.5)))
    assert event is not None
    assert (event.order_id, event.request_id) == ("1234", "7.5")


def test_a_device_as_log_input_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "/dev/zero")
    assert (status, out) == (2, "")
    assert err == (
        "stocksentry timeline: error: cannot read /dev/zero: it is a character device, "
        "not a log file or a pipe\n"
    )


def _limits(cpu_seconds: int, memory: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return apply


def _timeline_child(
    *argv: str, stdin: int | None = None, cpu: int = 60, memory: int = 512 * 1024 * 1024
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stocksentry.exporter", "timeline", *argv],
        stdin=stdin,
        preexec_fn=_limits(cpu, memory),
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT,
        check=False,
    )


def test_dev_zero_on_stdin_ends_with_exit_2_in_bounded_memory() -> None:
    # Once read until memory ran out (a MemoryError near 2 GB): now a line is never held
    # beyond MAX_LINE characters, and 64 MiB without a line break is not a log.
    with open("/dev/zero", "rb") as zero:
        result = _timeline_child("-", stdin=zero.fileno())
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr == (
        "stocksentry timeline: error: cannot read <stdin>: line 1 has no end in 64 MiB; "
        "not a log\n"
    )


def test_a_fifo_without_writer_reads_as_an_empty_input(tmp_path: Path) -> None:
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    result = _timeline_child(str(fifo), "--format", "json")
    # Read at once, without blocking; nothing in it, so exit 3: nothing was analysed.
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["lines"] == 0


def test_many_long_lines_are_skipped_in_bounded_memory(tmp_path: Path) -> None:
    # 20 lines of 10 MB each (200 MB): each is skipped without being held whole.
    path = tmp_path / "big.log"
    with path.open("w") as out:
        for _ in range(20):
            out.write('{"event": "stock_check", "pad": "' + "x" * 10_000_000 + '"}\n')
        out.write(json.dumps(GOOD) + "\n")
    result = _timeline_child(str(path), "--format", "json", memory=384 * 1024 * 1024)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert (report["lines"], report["skipped_lines"]) == (21, 20)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**500), max_value=10**500)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_KEYS = st.sampled_from(
    [
        "timestamp",
        "ts",
        "time",
        "@timestamp",
        "sku",
        "request_id",
        "order_id",
        "idempotency_key",
        "payment_reference",
        "from",
        "to",
        "available",
        "qty",
        "stock",
        "fields",
        "extra",
        "msg",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_KEYS, _JSON, max_size=8), st.sampled_from(["stock_check", "stock_update"]))
def test_any_json_values_are_read_or_skipped_never_raised(
    record: dict[str, Any], name: str
) -> None:
    record = {"event": name, **record}
    line = json.dumps(record, allow_nan=True)
    stats = ReadStats()
    events = list(read_events([line, json.dumps(GOOD)], "a.log", stats=stats))
    assert len(events) + stats.skipped == 2
    for event in events:
        assert math.isfinite(event.ts)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(_KEYS, _JSON, min_size=1, max_size=6))
def test_the_command_never_fails_on_any_json_values(
    tmp_path_factory: pytest.TempPathFactory, record: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("log") / "app.log"
    lines = [json.dumps({"event": "stock_update", **record}, allow_nan=True), json.dumps(GOOD)]
    path.write_text("\n".join(lines) + "\n")
    parser = argparse.ArgumentParser(prog="stocksentry")
    add_timeline_parser(parser.add_subparsers(dest="command", required=True))
    for form in ("table", "json"):
        args = parser.parse_args(["timeline", str(path), "--format", form])
        # 0 or 1 (a finding); never 2 for a readable file, never an exception.
        with open(os.devnull, "w") as sink:
            saved, sys.stdout = sys.stdout, sink
            try:
                status = args.func(args)
            finally:
                sys.stdout = saved
        assert status in (0, 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet="ab{}\r é", max_size=12),
            st.sampled_from(["x" * 30, "y" * 41]),  # longer than the cut below
        ),
        max_size=12,
    ),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.booleans(),
    st.integers(min_value=1, max_value=9),
)
def test_lines_read_in_chunks_are_the_lines_of_the_input(
    lines: list[str], ending: str, last_ending: bool, chunk: int
) -> None:
    """Whatever the chunk boundaries: the lines ``readline`` would give, without their
    break, each cut to MAX_LINE + 1 characters (MAX_LINE made 32 here)."""
    import io

    from stocksentry.exporter.investigate.timeline import command

    text = ending.join(lines) + (ending if last_ending and lines else "")
    stream = io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8", newline=None)
    got = list(command.read_lines("t.log", stream, chunk=chunk, max_line=32))
    expected = [
        line.removesuffix("\n")[:33]
        for line in io.StringIO(text.replace("\r\n", "\n").replace("\r", "\n"))
    ]
    assert got == expected
