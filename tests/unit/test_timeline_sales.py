"""timeline on the day: no all-clear from a log it could not read, the SQL detector's
warnings as findings, a relative-decrement app named an oversell (not lost updates), and
``--limit`` bounding the findings listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from stocksentry.exporter.investigate.timeline import analyse, read_events
from timelinecli import run, run_json

# The incident's own checkout logs with console.log: nothing a stock event.
CONSOLE_LOG = [
    "Lock acquired by User 17 for Product 8891",
    "Processing payment for order 5512...",
    "Lock released for Product 8891",
]


def test_a_log_without_stock_events_is_incomplete_not_an_all_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "console.log"
    path.write_text("\n".join(CONSOLE_LOG * 4) + "\n")

    status, out, _ = run(capsys, str(path))

    assert status == 3
    assert out.splitlines()[0] == "stocksentry timeline: 0 events from 12 lines"
    assert "skipped 12 unparsable lines" in out
    assert "Nothing analysed: no line is a stock event timeline reads" in out
    assert "No findings" not in out
    status, data = run_json(capsys, str(path))
    assert (status, data["lines"], data["events"], data["stock_events"]) == (3, 12, 0, 0)


def test_events_that_are_no_stock_events_are_incomplete_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.log"
    path.write_text('{"event": "http_request", "sku": "EGG-01", "ts": 1764669600}\n')

    status, data = run_json(capsys, str(path))

    assert (status, data["events"], data["stock_events"], data["findings"]) == (3, 1, 0, [])


def rmw(request: str, ts: str, key: str = "EGG-01") -> str:
    return json.dumps(
        {
            "event": "unsafe_read_modify_write",
            "table": "products",
            "key_column": "sku",
            "key": key,
            "code": "shop/checkout.py:88",
            "function": "reserve",
            "read_locked": False,
            "request_id": request,
            "timestamp": f"2026-12-02T05:54:{ts}Z",
        }
    )


def test_the_sql_detectors_unsafe_read_modify_write_lines_are_a_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "app.log"
    path.write_text("\n".join([rmw("R1", "01.000"), rmw("R2", "01.500")]) + "\n")

    status, data = run_json(capsys, str(path))

    assert status == 1
    assert [(f["cause"], f["sku"], f["requests"], f["lines"]) for f in data["findings"]] == [
        ("unsafe_read_modify_write", "EGG-01", ["R1", "R2"], [f"{path}:1", f"{path}:2"])
    ]
    assert data["findings"][0]["detail"] == (
        "2 writes of a value computed from an unlocked read (shop/checkout.py:88) by R1 and "
        "R2 at 05:54:01.000/.500"
    )


def sale(*, relative: bool, stock: int = 50, buyers: int = 300, wave: int = 20) -> list[str]:
    """A flash sale's lines: ``wave`` buyers read the stock, then one write lands, for as
    many distinct values as it takes; then every other write. Each buyer logs the value it
    read and that minus one. ``relative`` runs ``stock = stock - 1`` (the database goes
    below zero, the app never logs it); otherwise ``stock = :computed`` (writes overwrite
    each other and the database holds the last value written)."""
    db = stock
    reads: list[tuple[str, int]] = []
    lines: list[str] = []
    tick = 0

    def line(text: str) -> None:
        nonlocal tick
        tick += 1
        lines.append(f"[10:00:{tick // 1000:02d}.{tick % 1000:03d}] {text}")

    def write(name: str, seen: int) -> None:
        nonlocal db
        db = db - 1 if relative else seen - 1
        line(f"request_id={name} sku=EGG-01 stock_update from={seen} to={seen - 1} success=true")

    for n in range(buyers):
        name = f"R{n}"
        line(f"request_id={name} sku=EGG-01 stock_check available={db}")
        reads.append((name, db))
        if n % wave == wave - 1 and len(reads) > 1:
            write(*reads.pop(0))
    for name, seen in reads:
        write(name, seen)
    return lines


def test_a_relative_decrement_app_is_named_an_oversell_not_lost_updates() -> None:
    report = analyse(read_events(sale(relative=True), "shop.log"))

    assert [(f.cause, f.sku, f.units) for f in report.findings] == [
        ("oversell_negative_stock", "EGG-01", 250)
    ]
    assert report.findings[0].detail.startswith(
        "the writes sold 300 units where the stock read was at most 50: 250 more than there "
        "was, the last 250 writes ("
    )


def test_writes_of_computed_values_over_each_other_stay_lost_updates() -> None:
    report = analyse(read_events(sale(relative=False), "shop.log"))

    # The first wave read 50, every later buyer 49 (each write put 49 back): two values,
    # and every write after the first from each sold a unit the stock never lost.
    assert [(f.cause, f.units, len(f.requests)) for f in report.findings] == [
        ("lost_update", 19, 20),
        ("lost_update", 279, 280),
    ]


def test_limit_bounds_the_findings_listed_not_those_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shop.log"
    # The computed-value sale on five SKUs: two lost updates each.
    path.write_text(
        "\n".join(
            line.replace("sku=EGG-01", f"sku=EGG-0{n}")
            for n in range(1, 6)
            for line in sale(relative=False)
        )
        + "\n"
    )

    status, out, _ = run(capsys, str(path), "--limit", "3")

    assert status == 1
    assert "FINDINGS: 10 lost updates" in out
    assert (
        "(a finding is one group of writes: the lost updates hold 1500 requests that wrote)" in out
    )
    assert sum(line.startswith("  LOST UPDATE") for line in out.splitlines()) == 3
    assert "  … 7 more findings (raise --limit to see them)" in out
    status, data = run_json(capsys, str(path), "--limit", "3")
    assert (len(data["findings"]), data["more"]["findings"]) == (3, 7)
    assert [row["findings"] for row in data["summary"]] == [{"lost_update": 2}] * 5
