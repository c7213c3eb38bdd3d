"""`stocksentry timeline` on the lab's own logs: findings for unsafe, none for the safe ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from exportercli import CLI, run_demo

pytestmark = pytest.mark.integration


def lab_log(tmp_path: Path, strategy: str) -> Path:
    log = tmp_path / f"{strategy}.jsonl"
    options = ("--sqlite", "--strategy", strategy, "--buyers", "120", "--stock", "30")
    run_demo(*options, "--log-file", str(log))
    return log


def timeline(log: Path) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [*CLI, "timeline", str(log), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_unsafe_lab_logs_show_lost_updates(tmp_path: Path) -> None:
    status, report = timeline(lab_log(tmp_path, "unsafe"))
    assert status == 1
    findings = report["findings"]
    assert isinstance(findings, list)
    lost = [f for f in findings if f["kind"] == "lost_update"]
    assert lost, findings
    assert {f["sku"] for f in lost} == {"LAB-UNSAFE"}
    # Written values computed in the app never go below zero: no oversell into negative.
    # The SQL integration's warnings of those unlocked read-modify-writes are findings.
    causes = {f["cause"] for f in findings}
    assert {"lost_update", "unsafe_read_modify_write"} <= causes
    assert causes <= {"lost_update", "stale_read", "unsafe_read_modify_write"}
    unsafe = [f for f in findings if f["cause"] == "unsafe_read_modify_write"]
    assert {f["sku"] for f in unsafe} == {"LAB-UNSAFE"}
    assert report["skipped_lines"] == 0
    (row,) = report["summary"]
    assert (row["sku"], row["findings"]["lost_update"]) == ("LAB-UNSAFE", len(lost))


def test_relative_decrements_below_zero_are_named_an_oversell(tmp_path: Path) -> None:
    # check_then_decrement: a stale check, then `stock = stock - 1`: no update is lost,
    # the stock goes below zero; the writes logged out of their order are no lost update.
    log = lab_log(tmp_path, "check_then_decrement")
    status, report = timeline(log)
    assert status == 1
    findings = report["findings"]
    assert isinstance(findings, list)
    causes = [f["cause"] for f in findings]
    assert causes.count("oversell_negative_stock") == 1, causes
    assert "lost_update" not in causes
    (oversell,) = [f for f in findings if f["cause"] == "oversell_negative_stock"]
    assert oversell["sku"] == "LAB-CHECK_THEN_DECREMENT"
    assert oversell["units"] > 0
    # Its evidence opens with the lines that logged the stock below zero: a write, or a
    # check that read the stock after a concurrent write had taken it below zero (which of
    # the two the log holds first depends on the run's interleaving).
    lines = log.read_text("utf-8").splitlines()
    first = json.loads(lines[int(oversell["lines"][0].rpartition(":")[2]) - 1])
    assert first["event"] in ("stock_update", "inventory_negative", "stock_check")
    assert min(first.get("to", 0), first.get("stock", 0), first.get("available", 0)) < 0


@pytest.mark.parametrize("strategy", ["atomic", "for_update"])
def test_safe_lab_logs_show_nothing(tmp_path: Path, strategy: str) -> None:
    status, report = timeline(lab_log(tmp_path, strategy))
    assert report["findings"] == []
    assert status == 0
    assert report["skipped_lines"] == 0
