"""``stocksentry timeline``: parsing, ordering, the three detectors, output and exit status."""

from __future__ import annotations

import argparse
import contextvars
import doctest
import gzip
import importlib
import io
import json
import pkgutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from stocksentry.exporter.investigate import timeline
from stocksentry.exporter.investigate.timeline import (
    Event,
    OrderedEvents,
    ReadStats,
    analyse,
    parse_line,
    read_events,
    run_timeline,
)
from stocksentry.instrumentation import Sentry
from timelinecli import parse_args, run, run_json

DATA = Path(__file__).resolve().parent.parent / "data" / "timeline"
SEEDS = DATA / "seeds.log"
SEED_HEADLINE = "LOST UPDATE sku=EGG-01: R1 and R2 both wrote from=1 to=0 at 10:00:00.120/.121"


def report_of(path: Path, **options: Any) -> timeline.Report:
    with path.open(encoding="utf-8") as lines:
        return analyse(read_events(lines, path.name), **options)


# --- the incident's four log lines: two requests both write from=1 to=0 --------------------------


def test_seed_lines_parse_as_written() -> None:
    events = [parse_line(line) for line in SEEDS.read_text().splitlines()]

    assert [(e.name, e.request_id, e.sku, e.fields) for e in events if e is not None] == [
        ("stock_check", "R1", "EGG-01", {"available": 1}),
        ("stock_check", "R2", "EGG-01", {"available": 1}),
        ("stock_update", "R1", "EGG-01", {"from": 1, "to": 0, "success": True}),
        ("stock_update", "R2", "EGG-01", {"from": 1, "to": 0, "success": True}),
    ]
    first = events[0]
    assert first is not None
    assert (first.dated, first.has_time, round(first.ts, 3)) == (False, True, 36000.101)


def test_seed_lines_give_exactly_one_lost_update_naming_r1_and_r2() -> None:
    report = report_of(SEEDS)

    assert [(f.kind, f.sku, f.requests, f.lines) for f in report.findings] == [
        ("lost_update", "EGG-01", ["R1", "R2"], ["seeds.log:3", "seeds.log:4"])
    ]
    assert report.findings[0].headline == SEED_HEADLINE


def test_seed_file_table_puts_the_finding_first_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, str(SEEDS))

    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == "stocksentry timeline: 4 events from 4 lines"
    # The per-SKU summary opens the report.
    assert lines[2:5] == [
        "SUMMARY BY SKU (1 SKU with findings)",
        "    SKU     FINDINGS       UNITS  FIRST         LAST",
        "    EGG-01  1 lost update      1  10:00:00.120  10:00:00.121",
    ]
    assert lines[6] == "FINDINGS: 1 lost update"
    assert lines[7] == f"  {SEED_HEADLINE}"
    assert lines[8] == f"      lines: {SEEDS}:3, {SEEDS}:4"
    assert lines[10:] == [
        "SKU EGG-01 (4 events)",
        "    TIME          REQUEST  EVENT         DETAILS",
        "    10:00:00.101  R1       stock_check   available=1",
        "    10:00:00.103  R2       stock_check   available=1",
        "  ! 10:00:00.120  R1       stock_update  from=1 to=0 success=true",
        "  ! 10:00:00.121  R2       stock_update  from=1 to=0 success=true",
    ]


# --- clean and unsafe logs -------------------------------------------------------------------


def test_clean_sequential_log_has_no_findings_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, str(DATA / "clean.jsonl"))

    assert (status, err) == (0, "")
    assert (
        "No findings: no lost update, oversell into negative stock, duplicate execution, "
        "stale read or lock expiry." in out
    )
    assert "SUMMARY BY SKU" not in out
    assert "stocksentry timeline: 12 events from 12 lines, 2026-11-29 (times UTC)" in out
    assert "ORDER O-1 (4 events)" in out
    assert "ORDER O-2 (2 events)" in out
    # A replayed payment callback and an idempotency replay are the safe path.
    assert "result=replay" in out


def test_duplicate_idempotency_key_reserving_twice() -> None:
    report = report_of(DATA / "duplicate_key.jsonl")

    assert [(f.kind, f.sku, f.requests, f.lines) for f in report.findings] == [
        (
            "duplicate_execution",
            "EGG-02",
            ["R1", "R7"],
            ["duplicate_key.jsonl:2", "duplicate_key.jsonl:4"],
        )
    ]
    assert report.findings[0].detail == (
        "idempotency_key=K1 reserved 2 times: R1 at 10:00:00.110, R7 at 10:00:03.010"
    )


def test_duplicate_payment_reference_paid_twice() -> None:
    # Two callbacks with result=paid for PAY-9; order_paid for the same payment and a
    # callback marked replay are not counted as more payments.
    report = report_of(DATA / "duplicate_payment.jsonl")

    assert [(f.kind, f.sku, f.requests, f.lines) for f in report.findings] == [
        (
            "duplicate_execution",
            "EGG-03",
            ["O-9"],
            ["duplicate_payment.jsonl:2", "duplicate_payment.jsonl:4"],
        )
    ]
    assert report.findings[0].detail == (
        "payment_reference=PAY-9 paid 2 times (payment_callback result=paid): "
        "O-9 at 10:00:10.000, O-9 at 10:00:40.000"
    )


def test_order_paid_twice_is_a_duplicate_too() -> None:
    lines = [
        '{"event": "order_paid", "sku": "A", "order_id": "O-1", "payment_reference": "P-1",'
        ' "timestamp": "2026-11-29T10:00:00.000Z"}',
        '{"event": "order_paid", "sku": "A", "order_id": "O-2", "payment_reference": "P-1",'
        ' "timestamp": "2026-11-29T10:00:01.000Z"}',
    ]
    report = analyse(read_events(lines, "pay.log"))

    assert [(f.kind, f.requests, f.detail) for f in report.findings] == [
        (
            "duplicate_execution",
            ["O-1", "O-2"],
            "payment_reference=P-1 paid 2 times (order_paid): O-1 at 10:00:00.000, "
            "O-2 at 10:00:01.000",
        )
    ]


def test_stale_read() -> None:
    report = report_of(DATA / "stale_read.log")

    assert [(f.kind, f.sku, f.requests, f.lines) for f in report.findings] == [
        ("stale_read", "EGG-04", ["R1", "R2"], ["stale_read.log:2", "stale_read.log:3"])
    ]
    assert report.findings[0].headline == (
        "STALE READ sku=EGG-04: R2 read available=2 at 10:00:00.150 "
        "after R1 wrote to=1 at 10:00:00.110"
    )


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param(
            [
                # R2's write (3 -> 2) is logged after R3's read of 2: newer, not older.
                "[10:00:00.100] request_id=R1 sku=A stock_update from=4 to=3 success=true",
                "[10:00:00.200] request_id=R3 sku=A stock_check available=2",
                "[10:00:00.210] request_id=R2 sku=A stock_update from=3 to=2 success=true",
                # Same millisecond as the write: the log does not order them.
                "[10:00:00.210] request_id=R4 sku=A stock_check available=3",
            ],
            id="a read of a newer value or at the same instant is not stale",
        ),
        pytest.param(
            [
                # A wrote 5 -> 4 first but its line came after B's 4 -> 3 (threads logging
                # late).
                "[10:00:00.100] request_id=A sku=S stock_check available=5",
                "[10:00:00.105] request_id=B sku=S stock_check available=4",
                "[10:00:00.108] request_id=B sku=S stock_update from=4 to=3 success=true",
                "[10:00:00.110] request_id=A sku=S stock_update from=5 to=4 success=true",
                "[10:00:00.120] request_id=C sku=S stock_check available=3",
            ],
            id="writes logged out of chain order are not a lost update",
        ),
        pytest.param(
            [
                "[10:00:00.100] request_id=R1 sku=A stock_update from=1 to=0 success=true",
                "[10:00:00.110] request_id=R2 sku=A stock_update success=false"
                " reason=out_of_stock",
                "[10:00:05.000] request_id=ops sku=A stock_update from=0 to=1 success=true",
                "[10:00:06.000] request_id=R3 sku=A stock_update from=1 to=0 success=true",
            ],
            id="failed updates and restocks are not lost updates",
        ),
    ],
)
def test_no_finding(lines: list[str]) -> None:
    assert analyse(read_events(lines)).findings == []


def test_write_over_a_value_another_request_replaced_is_a_lost_update() -> None:
    # R2 decided on a cached 3 while R1 had moved the stock from 5 to 4 in R2's window.
    lines = [
        "[10:00:00.100] request_id=R2 sku=A stock_check available=3",
        "[10:00:00.110] request_id=R1 sku=A stock_check available=5",
        "[10:00:00.120] request_id=R1 sku=A stock_update from=5 to=4 success=true",
        "[10:00:00.130] request_id=R2 sku=A stock_update from=3 to=2 success=true",
    ]
    report = analyse(read_events(lines, "w.log"))

    assert [(f.kind, f.requests, f.lines) for f in report.findings] == [
        ("lost_update", ["R1", "R2"], ["w.log:1", "w.log:3", "w.log:4"])
    ]
    assert report.findings[0].detail == (
        "R2 wrote from=3 to=2 at 10:00:00.130 over R1's write to=4 at 10:00:00.120, "
        "which came after R2 read available=3 at 10:00:00.100"
    )


def test_three_writers_from_one_value_make_one_finding() -> None:
    lines = [f"[10:00:00.1{n}0] request_id=R{n} sku=A stock_check available=1" for n in (1, 2, 3)]
    lines += [
        f"[10:00:00.2{n}0] request_id=R{n} sku=A stock_update from=1 to=0 success=true"
        for n in (1, 2, 3)
    ]
    report = analyse(read_events(lines))

    assert [(f.kind, f.requests, f.detail) for f in report.findings] == [
        (
            "lost_update",
            ["R1", "R2", "R3"],
            "R1, R2 and R3 all wrote from=1 to=0 at 10:00:00.210/.220/.230",
        )
    ]


def test_a_log_given_twice_is_not_a_duplicate_execution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Overlapping rotated files or a shipper that delivered lines twice.
    clean = str(DATA / "clean.jsonl")
    status, out, _ = run(capsys, clean, clean)

    assert status == 0
    assert "No findings" in out
    assert "stocksentry timeline: 24 events from 24 lines" in out


def test_key_memory_is_bounded_and_says_what_it_forgot() -> None:
    lines = [
        f"[10:00:0{n}] request_id=R{n} idempotency_key={key} sku=A stock_update"
        f" from={9 - n} to={8 - n} success=true"
        for n, key in enumerate(["K1", "K2", "K3", "K1", "K3"])
    ]
    report = analyse(read_events(lines), max_keys=2)

    # K1 was forgotten when K3 came, so its second use is not seen; K3's is.
    assert [(f.kind, f.requests) for f in report.findings] == [
        ("duplicate_execution", ["R2", "R4"])
    ]
    assert report.keys_forgotten == 2
    assert "note: 2 idempotency keys / payment references were forgotten" in (
        timeline.format_table(report)
    )


# --- ordering ----------------------------------------------------------------------------------


def test_out_of_order_timestamps_are_sorted() -> None:
    report = report_of(DATA / "out_of_order.jsonl")

    assert [(e.name, e.request_id, e.lineno) for e in report.skus["EGG-01"]] == [
        ("stock_check", "R1", 2),
        ("stock_check", "R2", 4),
        ("stock_update", "R1", 3),
        ("stock_update", "R2", 1),
    ]
    assert [(f.kind, f.requests) for f in report.findings] == [("lost_update", ["R1", "R2"])]
    assert report.late_events == 0


def test_files_are_merged_by_time_with_ties_in_file_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "a.log"
    second = tmp_path / "b.log"
    first.write_text(
        "[10:00:00.101] request_id=R1 sku=EGG-01 stock_check available=1\n"
        "[10:00:00.121] request_id=R1 sku=EGG-01 stock_update from=1 to=0 success=true\n"
    )
    second.write_text(
        "[10:00:00.101] request_id=R2 sku=EGG-01 stock_check available=1\n"
        "[10:00:00.120] request_id=R2 sku=EGG-01 stock_update from=1 to=0 success=true\n"
    )
    status, data = run_json(capsys, str(second), str(first))

    assert status == 1
    assert [(e["line"], e["time"]) for e in data["skus"]["EGG-01"]] == [
        (f"{second}:1", "10:00:00.101"),
        (f"{first}:1", "10:00:00.101"),
        (f"{second}:2", "10:00:00.120"),
        (f"{first}:2", "10:00:00.121"),
    ]
    assert [(f["kind"], f["requests"]) for f in data["findings"]] == [
        ("lost_update", ["R2", "R1"])
    ]


def test_lines_beyond_the_reorder_window_are_counted_late() -> None:
    # By the time "a" comes, "c" is newer than "b" by more than the window: "b" is out.
    lines = ["[10:00:10.000] k=1 b", "[10:00:12.000] k=1 c", "[10:00:00.000] k=1 a"]
    ordered = OrderedEvents([read_events(lines)], window=1.0)

    assert [e.name for e in ordered] == ["b", "a", "c"]
    assert ordered.late == 1
    assert [e.name for e in OrderedEvents([read_events(lines)], window=60.0)] == ["a", "b", "c"]


def test_times_of_day_after_midnight_follow_the_day_before() -> None:
    lines = ["[23:59:59.900] k=1 late", "[00:00:00.100] k=1 early"]
    events = list(OrderedEvents([read_events(lines)]))

    assert [e.name for e in events] == ["late", "early"]
    assert timeline.format_time(events[1].ts, False) == "00:00:00.100 (+1d)"


# --- garbage -----------------------------------------------------------------------------------


def test_garbage_lines_are_skipped_counted_and_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = DATA / "garbage.log"
    stats = ReadStats()
    with path.open(encoding="utf-8", errors="replace") as lines:
        events = list(read_events(lines, "garbage.log", stats=stats))

    assert [e.lineno for e in events] == [2, 5, 9, 11]
    assert (stats.lines, stats.skipped) == (13, 7)
    assert stats.skipped_examples == [f"garbage.log:{n}" for n in (1, 3, 6, 7, 8)]

    status, out, err = run(capsys, str(path))
    assert (status, err) == (1, "")
    assert out.splitlines()[1] == (
        f"skipped 7 unparsable lines: {path}:1, {path}:3, {path}:6, {path}:7, {path}:8, …"
    )
    assert SEED_HEADLINE in out


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        '{"event": "stock_check", "sku": ',
        '{"event": "x"} trailing',
        "[1, 2, 3]",
        '{"level": "info"}',
        "[10:00:00.110] words only",
        "=== separator ===",
        "[" * 10_000,
        "{" * 10_000,
        '{"a":' * 100_000,
        "\x00\x01\ufffd",
    ],
)
def test_parse_line_returns_none_for_garbage(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize("line", ["", "   ", "\n"])
def test_parse_line_returns_none_for_blank_lines(line: str) -> None:
    assert parse_line(line) is None


# --- other loggers -----------------------------------------------------------------------------


def test_other_json_loggers_and_logfmt_are_understood() -> None:
    report = report_of(DATA / "other_loggers.jsonl")

    assert [(e.name, e.request, e.fields.get("from"), e.line) for e in report.skus["EGG-05"]] == [
        ("stock_check", "R1", None, "other_loggers.jsonl:1"),
        ("stock_check", "R2", None, "other_loggers.jsonl:2"),
        ("stock_update", "R1", 1, "other_loggers.jsonl:3"),
        ("stock_update", "R2", 1, "other_loggers.jsonl:4"),
        ("order_created", "R1", None, "other_loggers.jsonl:5"),
        ("cache set", None, None, "other_loggers.jsonl:6"),
    ]
    assert [timeline.format_time(e.ts, e.dated) for e in report.skus["EGG-05"]] == [
        "2026-11-29T10:00:00.101Z",  # pino: epoch milliseconds
        "2026-11-29T10:00:00.103Z",  # ECS: @timestamp, key=value pairs in message
        "2026-11-29T10:00:00.120Z",  # tracing: +07:00 offset, fields nested
        "2026-11-29T10:00:00.121Z",  # epoch seconds, old_stock/new_stock
        "2026-11-29T10:00:00.200Z",  # "date time,ms LEVEL logger: event k=v"
        "2026-11-29T10:00:00.300Z",  # logfmt with quoted msg
    ]
    assert [(f.kind, f.requests) for f in report.findings] == [("lost_update", ["R1", "R2"])]


def test_stocksentry_json_line_fields() -> None:
    event = parse_line(
        '{"sku": "EGG-01", "strategy": "unsafe", "qty": 1, "success": true, "from": 1, '
        '"to": 0, "request_id": "R1", "idempotency_key": "K1", "trace_id": "ab", '
        '"span_id": "cd", "event": "stock_update", "level": "info", "logger": "stocksentry",'
        ' "timestamp": "2026-11-29T13:41:14.262Z"}'
    )

    assert event == Event(
        "stock_update",
        1795959674.262,
        True,
        True,
        "EGG-01",
        "R1",
        "K1",
        None,
        None,
        "ab",
        {"strategy": "unsafe", "qty": 1, "success": True, "from": 1, "to": 0},
    )


# --- output ------------------------------------------------------------------------------------


def test_json_output_shape(capsys: pytest.CaptureFixture[str]) -> None:
    status, data = run_json(capsys, str(DATA / "duplicate_payment.jsonl"))

    assert status == 1
    assert set(data) == {
        "summary",
        "findings",
        "skus",
        "orders",
        "skipped_lines",
        "skipped_examples",
        "more",
        "events",
        "stock_events",
        "lines",
        "late_events",
        "keys_forgotten",
    }
    path = str(DATA / "duplicate_payment.jsonl")
    assert data["findings"] == [
        {
            "kind": "duplicate_execution",
            "cause": "duplicate_execution",
            "sku": "EGG-03",
            "requests": ["O-9"],
            "detail": "payment_reference=PAY-9 paid 2 times (payment_callback result=paid): "
            "O-9 at 10:00:10.000, O-9 at 10:00:40.000",
            "lines": [f"{path}:2", f"{path}:4"],
            "units": 1,
            "first": "10:00:10.000",
            "last": "10:00:40.000",
        }
    ]
    assert data["summary"] == [
        {
            "sku": "EGG-03",
            "findings": {"duplicate_execution": 1},
            "units": 1,
            "first": "10:00:10.000",
            "last": "10:00:40.000",
        }
    ]
    assert list(data["skus"]) == ["EGG-03"]
    assert list(data["orders"]) == ["O-9"]
    assert data["skus"]["EGG-03"][1] == {
        "time": "2026-11-29T10:00:10.000Z",
        "event": "payment_callback",
        "line": f"{path}:2",
        "sku": "EGG-03",
        "order_id": "O-9",
        "payment_reference": "PAY-9",
        "details": {"result": "paid"},
    }
    assert (data["skipped_lines"], data["events"], data["lines"]) == (0, 5, 5)
    assert data["more"] == {"skus": {}, "orders": {}, "findings": 0}


def test_limit_keeps_the_first_events_and_counts_the_rest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, str(DATA / "clean.jsonl"), "--limit", "2")

    assert status == 0
    assert "SKU EGG-01 (11 events)" in out
    assert "    … 9 more (raise --limit to see them)" in out
    _, data = run_json(capsys, str(DATA / "clean.jsonl"), "--limit", "2")
    assert len(data["skus"]["EGG-01"]) == 2
    assert data["more"] == {"skus": {"EGG-01": 9}, "orders": {"O-1": 2}, "findings": 0}


# --- filters -----------------------------------------------------------------------------------


def test_sku_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both.log"
    both.write_text(SEEDS.read_text() + (DATA / "stale_read.log").read_text())

    status, data = run_json(capsys, str(both), "--sku", "EGG-04")
    assert status == 1
    assert list(data["skus"]) == ["EGG-04"]
    assert [(f["kind"], f["sku"]) for f in data["findings"]] == [("stale_read", "EGG-04")]

    status, data = run_json(capsys, str(both), "--sku", "EGG-01", "--sku", "EGG-04")
    assert sorted(data["skus"]) == ["EGG-01", "EGG-04"]
    assert len(data["findings"]) == 2

    # Nothing of that SKU in the logs: nothing analysed, which is no all-clear.
    status, data = run_json(capsys, str(both), "--sku", "NOPE")
    assert (status, data["skus"], data["findings"], data["events"]) == (3, {}, [], 0)


def test_order_filter(capsys: pytest.CaptureFixture[str]) -> None:
    status, data = run_json(capsys, str(DATA / "clean.jsonl"), "--order", "O-2")

    assert status == 0
    assert list(data["orders"]) == ["O-2"]
    assert [e["event"] for e in data["skus"]["EGG-01"]] == ["stock_update", "payment_callback"]

    status, data = run_json(capsys, str(DATA / "duplicate_payment.jsonl"), "--order", "O-9")
    assert (status, len(data["findings"])) == (1, 1)
    status, data = run_json(capsys, str(DATA / "duplicate_payment.jsonl"), "--order", "O-1")
    assert (status, data["findings"], data["orders"]) == (0, [], {})


def test_request_filter(capsys: pytest.CaptureFixture[str]) -> None:
    status, data = run_json(capsys, str(SEEDS), "--request", "R2")

    assert status == 1
    assert [(e["event"], e["request_id"]) for e in data["skus"]["EGG-01"]] == [
        ("stock_check", "R2"),
        ("stock_update", "R2"),
    ]
    assert data["findings"][0]["requests"] == ["R1", "R2"]

    status, data = run_json(capsys, str(DATA / "stale_read.log"), "--request", "R3")
    assert (status, data["findings"]) == (0, [])


# --- inputs ------------------------------------------------------------------------------------


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(SEEDS.read_bytes())))

    status, out, err = run(capsys, "-")

    assert (status, err) == (1, "")
    assert SEED_HEADLINE in out
    assert "<stdin>:3, <stdin>:4" in out


def test_gzip_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    packed = io.BufferedReader(io.BytesIO(gzip.compress(SEEDS.read_bytes())))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(packed))

    status, out, _ = run(capsys, "-")

    assert status == 1
    assert SEED_HEADLINE in out


def test_gzip_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "app.log.gz"
    packed.write_bytes(gzip.compress(SEEDS.read_bytes()))

    status, out, err = run(capsys, str(packed))

    assert (status, err) == (1, "")
    assert SEED_HEADLINE in out
    assert f"{packed}:3, {packed}:4" in out


def test_bad_file_path_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.log"

    status, out, err = run(capsys, str(SEEDS), str(missing))

    assert (status, out) == (2, "")
    assert err == (
        f"stocksentry timeline: error: cannot read {missing}: No such file or directory\n"
    )


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("dir", None, "it is a directory, not a log file or a pipe"),
        ("broken.log.gz", b"\x1f\x8b\x08\x00garbage", "cannot read"),
        ("cut.log.gz", gzip.compress(b"x" * 1000, mtime=0)[:20], "cannot read"),
    ],
)
def test_unreadable_inputs_exit_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    content: bytes | None,
    reason: str,
) -> None:
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)

    status, out, err = run(capsys, str(path))

    assert (status, out) == (2, "")
    assert err.startswith(f"stocksentry timeline: error: cannot read {path}: ")
    assert reason in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [[], ["a.log", "--limit", "-1"], ["a.log", "--format", "xml"], ["a.log", "--limit", "x"]],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(*argv)

    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_bad_namespace_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(logfile=[str(SEEDS)], format="table", limit=-5)

    assert run_timeline(args) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "stocksentry timeline: error: --limit must be a whole number >= 0, got -5\n"


def test_parser_defaults_dispatch_to_run_timeline() -> None:
    args = parse_args("a.log")

    assert args.func is run_timeline
    assert args.handler is run_timeline
    assert (args.logfile, args.sku, args.order, args.request) == (["a.log"], None, None, None)
    assert (args.format, args.limit, args.reorder_window) == ("table", 50, 60.0)


# --- logs written by stocksentry itself --------------------------------------------------------


def sentry() -> Sentry:
    return Sentry(registry=CollectorRegistry(), log=True, trace=False)


def test_stocksentry_logs_of_two_threads_reading_1_and_writing_0(
    app_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = sentry()
    both_read = threading.Barrier(2, timeout=5)

    def buyer(request_id: str) -> None:
        with app.reservation(
            "EGG-01", strategy="unsafe", request_id=request_id, idempotency_key=f"K-{request_id}"
        ) as r:
            r.stock_check(available=1)
            both_read.wait()  # both have read 1 before either writes
            r.success(old_stock=1, new_stock=0)

    threads = [threading.Thread(target=buyer, args=(rid,)) for rid in ("R1", "R2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    status, data = run_json(capsys, str(app_log))

    assert status == 1
    assert [(f["kind"], f["sku"], sorted(f["requests"])) for f in data["findings"]] == [
        ("lost_update", "EGG-01", ["R1", "R2"])
    ]
    assert "both wrote from=1 to=0 at" in data["findings"][0]["detail"]
    assert [e["event"] for e in data["skus"]["EGG-01"]] == ["stock_check"] * 2 + [
        "stock_update"
    ] * 2
    assert data["skipped_lines"] == 0


def test_stocksentry_logs_interleaved_by_hand(
    app_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each request in a context of its own, as two tasks would be; steps in a fixed order.
    app = sentry()
    contexts = {rid: contextvars.Context() for rid in ("R1", "R2")}
    handles = {
        rid: contexts[rid].run(
            app.reservation("EGG-01", strategy="unsafe", request_id=rid).__enter__
        )
        for rid in ("R1", "R2")
    }
    for rid in ("R1", "R2"):
        contexts[rid].run(handles[rid].stock_check, 1)
    for rid in ("R1", "R2"):
        contexts[rid].run(handles[rid].success, old_stock=1, new_stock=0)
        contexts[rid].run(handles[rid].__exit__, None, None, None)

    status, out, _ = run(capsys, str(app_log))

    assert status == 1
    assert "LOST UPDATE sku=EGG-01: R1 and R2 both wrote from=1 to=0 at" in out
    assert out.count("LOST UPDATE") == 1


def test_stocksentry_logs_of_a_safe_sequential_sale(
    app_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = sentry()
    stock = 2
    for n in (1, 2, 3):
        with app.reservation(
            "EGG-01", strategy="for_update", request_id=f"R{n}", idempotency_key=f"K{n}"
        ) as r:
            r.stock_check(available=stock)
            if stock == 0:
                r.conflict("out_of_stock")
            else:
                r.success(old_stock=stock, new_stock=stock - 1)
                stock -= 1
    for n in (1, 2):
        with app.payment_callback("EGG-01", order_id=f"O-{n}", payment_reference=f"PAY-{n}"):
            pass
    with app.payment_callback("EGG-01", order_id="O-1", payment_reference="PAY-1") as callback:
        callback.replay()  # the provider sent it again; answered, not paid again
    app.record_paid_order("EGG-01", order_id="O-1", payment_reference="PAY-1")
    app.record_idempotency_replay("reserve", key="K1")

    status, data = run_json(capsys, str(app_log))

    assert status == 0
    assert data["findings"] == []
    updates = [e for e in data["skus"]["EGG-01"] if e["event"] == "stock_update"]
    assert [
        (u["request_id"], u["details"].get("from"), u["details"].get("to")) for u in updates
    ] == [
        ("R1", 2, 1),
        ("R2", 1, 0),
        ("R3", None, None),
    ]
    assert sorted(data["orders"]) == ["O-1", "O-2"]
    assert data["skipped_lines"] == 0


# --- the module's own examples -----------------------------------------------------------------


def test_docstring_examples() -> None:
    # The package and every module of it.
    modules = [timeline]
    modules += [
        importlib.import_module(f"{timeline.__name__}.{info.name}")
        for info in pkgutil.iter_modules(timeline.__path__)
    ]
    results = [doctest.testmod(module) for module in modules]

    assert [
        module.__name__ for module, result in zip(modules, results, strict=True) if result.failed
    ] == []
    assert sum(result.attempted for result in results) >= 30


def test_the_package_offers_every_name_it_lists() -> None:
    # The names load on first use: each listed name must resolve.
    for name in timeline.__all__:
        assert getattr(timeline, name) is not None
    with pytest.raises(AttributeError):
        _ = timeline.EXIT_OK


def test_the_parser_is_built_without_the_analysis() -> None:
    code = (
        "import sys, argparse\n"
        "from stocksentry.exporter.investigate.timeline.command import add_timeline_parser\n"
        "add_timeline_parser(argparse.ArgumentParser().add_subparsers())\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('prometheus_client',"
        " 'stocksentry.instrumentation', 'stocksentry.exporter.investigate.timeline.analysis')))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- no filter is a filter of every SKU --------------------------------------------


def _as_data(report: timeline.Report) -> dict[str, Any]:
    return json.loads(json.dumps(report.to_dict(), default=str))


@pytest.mark.parametrize(
    "name",
    [
        "seeds.log",
        "stale_read.log",
        "out_of_order.jsonl",
        "negative_stock.jsonl",
        "lock_expiry.jsonl",
        "duplicate_payment.jsonl",
    ],
)
def test_the_unfiltered_loop_gives_what_a_filter_of_every_sku_gives(name: str) -> None:
    """A filter that keeps every SKU (each event of these files has one) changes
    nothing: the same report, findings, timelines and counts of what was not kept."""
    path = DATA / name
    options: dict[str, Any] = {"limit": 2, "max_groups": 1}
    unfiltered = report_of(path, **options)
    every = sorted(report_of(path, limit=0).skus)
    filtered = report_of(path, skus=every, **options)
    assert unfiltered.findings
    assert unfiltered.skus_more or unfiltered.orders_more or unfiltered.ungrouped_events
    assert _as_data(unfiltered) == _as_data(filtered)
    assert unfiltered.ungrouped_events == filtered.ungrouped_events
