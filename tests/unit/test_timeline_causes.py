"""``stocksentry timeline`` names the cause of each finding, with its evidence lines, and
opens the report with a per-SKU summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from stocksentry.exporter.investigate.timeline import analyse, read_events
from stocksentry.instrumentation import Sentry
from timelinecli import run, run_json

DATA = Path(__file__).resolve().parent.parent / "data" / "timeline"
NEGATIVE = DATA / "negative_stock.jsonl"
LOCK = DATA / "lock_expiry.jsonl"


def at(path: Path, *numbers: int) -> list[str]:
    return [f"{path}:{number}" for number in numbers]


def findings_of(capsys: pytest.CaptureFixture[str], path: Path) -> list[dict[str, Any]]:
    status, data = run_json(capsys, str(path))
    assert status == 1
    findings: list[dict[str, Any]] = data["findings"]
    return findings


# --- oversell into negative stock ---------------------------------------------------------


def test_relative_decrements_below_zero_are_an_oversell_not_a_lost_update(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Six buyers without a lock read 4 and each logged from=4 to=3 (what it believed);
    # the decrements were relative, and the real stock, logged below zero, reached -2.
    findings = findings_of(capsys, NEGATIVE)

    assert [(f["kind"], f["cause"], f["sku"]) for f in findings] == [
        ("oversell_negative_stock", "oversell_negative_stock", "EGG-06")
    ]
    (finding,) = findings
    assert finding["requests"] == ["R5", "R6", "R1", "R2", "R3", "R4"]
    # The two lines below zero, then the six writes from the same value.
    assert finding["lines"] == at(NEGATIVE, 12, 14, 7, 8, 9, 10, 11, 13)
    assert finding["units"] == 2
    assert finding["detail"].startswith("the stock went below zero, down to -2: 2 lines below")
    assert "relative decrements that each took a unit, not lost updates" in finding["detail"]
    assert "lost update" not in json.dumps(finding["kind"])


def test_negative_stock_table_names_the_oversell(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, str(NEGATIVE))

    assert status == 1
    assert "FINDINGS: 1 oversell into negative stock" in out
    assert "OVERSELL INTO NEGATIVE STOCK sku=EGG-06: the stock went below zero" in out
    assert "LOST UPDATE" not in out


def test_writes_logging_the_real_stock_below_zero_are_an_oversell() -> None:
    # A relative decrement logging what the database returned: from=1 to=0, then 0 to -1
    # and -1 to -2 written by buyers who had read 1 (no update lost, the stock negative).
    lines = [
        "[10:00:00.100] request_id=R1 sku=EGG-08 stock_check available=1",
        "[10:00:00.101] request_id=R2 sku=EGG-08 stock_check available=1",
        "[10:00:00.102] request_id=R3 sku=EGG-08 stock_check available=1",
        "[10:00:00.110] request_id=R1 sku=EGG-08 stock_update from=1 to=0 success=true",
        "[10:00:00.112] request_id=R3 sku=EGG-08 stock_update from=-1 to=-2 success=true",
        "[10:00:00.111] request_id=R2 sku=EGG-08 stock_update from=0 to=-1 success=true",
    ]
    report = analyse(read_events(lines, "a.log"))

    assert [(f.kind, f.units) for f in report.findings] == [("oversell_negative_stock", 2)]
    (finding,) = report.findings
    assert finding.lines[:2] == ["a.log:6", "a.log:5"]
    assert finding.detail.startswith("the stock went below zero, down to -2")


def test_stocksentrys_own_negative_write_line_is_the_oversells_evidence(
    app_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = Sentry(registry=CollectorRegistry(), log=True, trace=False)
    for number, stock in enumerate((1, 0), 1):
        with app.reservation(
            "EGG-09", strategy="check_then_decrement", request_id=f"R{number}"
        ) as r:
            r.stock_check(available=1)
            r.success(old_stock=stock, new_stock=stock - 1)

    findings = findings_of(capsys, app_log)

    # R2's check read available=1 after R1 wrote to=0: a stale read too when the clock
    # ticked a millisecond in between (in one millisecond the log does not order them).
    assert {f["cause"] for f in findings} <= {"oversell_negative_stock", "stale_read"}
    oversells = [f for f in findings if f["cause"] == "oversell_negative_stock"]
    assert [(f["sku"], f["units"]) for f in oversells] == [("EGG-09", 1)]
    lines = app_log.read_text("utf-8").splitlines()
    evidence = [lines[int(where.rpartition(":")[2]) - 1] for where in oversells[0]["lines"]]
    # The write to -1 and stocksentry's own inventory_negative line.
    assert [json.loads(line)["event"] for line in evidence] == [
        "stock_update",
        "inventory_negative",
    ]


def test_negative_lines_without_a_request_still_name_the_oversell() -> None:
    # What the SQL integration logs when it sees the real stock outside any request id.
    lines = [
        "[10:00:00.100] request_id=R1 sku=EGG-13 stock_update from=50 to=49 success=true",
        "[10:00:00.101] request_id=R2 sku=EGG-13 stock_update from=50 to=49 success=true",
        "[10:00:00.102] sku=EGG-13 inventory_negative stock=-38",
    ]
    report = analyse(read_events(lines, "a.log"))

    assert [(f.kind, f.units, f.requests) for f in report.findings] == [
        ("oversell_negative_stock", 38, ["R1", "R2"])
    ]
    assert report.findings[0].detail.startswith(
        "the stock went below zero, down to -38: 1 line below zero (10:00:00.102); "
        "R1 and R2 wrote from=50 at 10:00:00.100/.101"
    )
    assert report.findings[0].lines == ["a.log:3", "a.log:1", "a.log:2"]


def test_a_check_that_read_below_zero_is_the_oversells_evidence() -> None:
    lines = ["[10:00:00.100] request_id=R1 sku=EGG-09 stock_check available=-1"]
    report = analyse(read_events(lines, "a.log"))

    assert [(f.kind, f.units, f.lines) for f in report.findings] == [
        ("oversell_negative_stock", 1, ["a.log:1"])
    ]


def test_a_write_without_from_starts_from_its_requests_check() -> None:
    lines = [
        "[10:00:00.100] request_id=R1 sku=A stock_check available=1",
        "[10:00:00.101] request_id=R2 sku=A stock_check available=1",
        "[10:00:00.120] request_id=R1 sku=A stock_update to=0 success=true",
        "[10:00:00.121] request_id=R2 sku=A stock_update to=0 success=true",
    ]
    report = analyse(read_events(lines, "a.log"))

    assert [f.headline for f in report.findings] == [
        "LOST UPDATE sku=A: R1 and R2 both wrote from=1 to=0 at 10:00:00.120/.121"
    ]


def test_a_restock_between_a_lost_update_and_a_negative_stock_keeps_them_apart() -> None:
    lines = [
        "[10:00:00.100] request_id=R1 sku=EGG-10 stock_update from=2 to=1 success=true",
        "[10:00:00.101] request_id=R2 sku=EGG-10 stock_update from=2 to=1 success=true",
        "[10:00:01.000] request_id=S1 sku=EGG-10 stock_update from=1 to=10 success=true",
        "[10:00:02.000] sku=EGG-10 inventory_negative stock=-1",
    ]
    report = analyse(read_events(lines, "a.log"))

    assert [(f.kind, f.lines) for f in report.findings] == [
        ("lost_update", ["a.log:1", "a.log:2"]),
        ("oversell_negative_stock", ["a.log:4"]),
    ]


# --- lock expiry --------------------------------------------------------------------------


def test_a_lost_update_under_an_expired_lock_is_a_lock_expiry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    findings = findings_of(capsys, LOCK)

    assert [(f["kind"], f["cause"], f["sku"], f["requests"]) for f in findings] == [
        ("lock_expiry", "lock_expiry", "EGG-07", ["R1", "R2"])
    ]
    (finding,) = findings
    # The lock lines first (expired while held, released not owned), then the two writes.
    assert finding["lines"] == at(LOCK, 6, 7, 5, 8)
    assert finding["detail"].startswith(
        "the lock stock:EGG-07 expired while R1 held it (held 6.001 s, ttl 5 s)"
    )
    assert finding["detail"].endswith("R1 and R2 both wrote from=5 to=4 at 10:00:06.000/.500")
    assert finding["units"] == 1


def test_the_sql_detectors_lock_expired_reason_is_lock_expiry_evidence() -> None:
    rmw = (
        '{"event": "unsafe_read_modify_write", "table": "products", "key": "EGG-11", '
        '"lock": "stock", "reason": "lock expired before the write", "request_id": "R2", '
        '"timestamp": "2026-11-29T10:00:00.115Z"}'
    )
    lines = [
        "[10:00:00.100] request_id=R1 sku=EGG-11 stock_update from=3 to=2 success=true",
        rmw,
        "[10:00:00.120] request_id=R2 sku=EGG-11 stock_update from=3 to=2 success=true",
    ]
    report = analyse(read_events(lines, "a.log"))

    assert [(f.kind, f.lines) for f in report.findings] == [
        ("lock_expiry", ["a.log:2", "a.log:1", "a.log:3"]),
        ("unsafe_read_modify_write", ["a.log:2"]),
    ]
    assert report.findings[0].detail.startswith(
        "R2 wrote under the lock stock: lock expired before the write"
    )


def test_a_lock_event_of_another_request_does_not_turn_a_lost_update_into_lock_expiry() -> None:
    lock = (
        '{"event": "lock_expired_while_held", "lock": "stock", "held_s": 7, "ttl_s": 5, '
        '"request_id": "R9", "timestamp": "2026-11-29T10:00:00.105Z"}'
    )
    lines = [
        "[10:00:00.100] request_id=R1 sku=EGG-12 stock_update from=3 to=2 success=true",
        lock,
        "[10:00:00.120] request_id=R2 sku=EGG-12 stock_update from=3 to=2 success=true",
    ]
    report = analyse(read_events(lines, "a.log"))

    assert [f.kind for f in report.findings] == ["lost_update"]


# --- the other causes keep their names; the summary ------------------------------------------


@pytest.mark.parametrize(
    ("name", "cause", "lines"),
    [
        ("seeds.log", "lost_update", [3, 4]),
        ("duplicate_key.jsonl", "duplicate_execution", [2, 4]),
        ("stale_read.log", "stale_read", [2, 3]),
    ],
)
def test_each_fixture_names_its_cause_and_evidence(
    capsys: pytest.CaptureFixture[str], name: str, cause: str, lines: list[int]
) -> None:
    path = DATA / name
    findings = findings_of(capsys, path)

    assert [(f["kind"], f["cause"]) for f in findings][:1] == [(cause, cause)]
    assert findings[0]["lines"] == at(path, *lines)


def test_summary_counts_findings_by_cause_per_sku(capsys: pytest.CaptureFixture[str]) -> None:
    status, data = run_json(capsys, str(LOCK), str(NEGATIVE))

    assert status == 1
    assert data["summary"] == [
        {
            "sku": "EGG-06",
            "findings": {"oversell_negative_stock": 1},
            "units": 2,
            "first": "10:00:00.210",
            "last": "10:00:00.260",
        },
        {
            "sku": "EGG-07",
            "findings": {"lock_expiry": 1},
            "units": 1,
            "first": "10:00:06.000",
            "last": "10:00:06.500",
        },
    ]
    # The findings in time order, whatever the order of the files.
    assert [f["sku"] for f in data["findings"]] == ["EGG-06", "EGG-07"]


def test_summary_table_opens_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, str(NEGATIVE), str(LOCK))

    assert status == 1
    lines = out.splitlines()
    assert lines[2:6] == [
        "SUMMARY BY SKU (2 SKUs with findings)",
        "    SKU     FINDINGS                        UNITS  FIRST         LAST",
        "    EGG-06  1 oversell into negative stock      2  10:00:00.210  10:00:00.260",
        "    EGG-07  1 lock expiry                       1  10:00:06.000  10:00:06.500",
    ]
    assert lines[7] == "FINDINGS: 1 oversell into negative stock, 1 lock expiry"
