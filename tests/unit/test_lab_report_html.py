"""The lab's HTML report on the incident's figures (no service): every strategy its own
colour, the unsafe line's gap said in words, deadlocks caught, a readable database line."""

from __future__ import annotations

import dataclasses
import re

from stocksentry.exporter.lab.config import STRATEGY_NAMES, DbFigures, LabConfig, StrategyResult
from stocksentry.exporter.lab.report_html import format_html

#: The embedded PostgreSQL's URL: its socket folder travels URL-encoded in the query.
CONFIG = LabConfig(
    database_url="postgresql+psycopg://postgres@/postgres?host=%2Ftmp%2Fstocksentry-x%2Fpgdata"
)


def sale() -> list[StrategyResult]:
    """Every strategy sells the 100 units; unsafe sells 500 and its stock ends at 91 (lost
    updates), deadlock's buyers deadlock 483 times and StockDeadlocksIncreasing fires."""
    results = []
    for i, name in enumerate(STRATEGY_NAMES):
        result = dataclasses.replace(
            StrategyResult.skip(CONFIG, name, "x"),
            skipped=None,
            started_at=1000.0 + 20 * i,
            ended_at=1012.0 + 20 * i,
            sold=100,
            orders=100,
            db=DbFigures(100, 100, 0, 0),
            samples=tuple((t * 0.2, max(0, 100 - 2 * t)) for t in range(60)),
        )
        if name == "unsafe":
            result = dataclasses.replace(
                result,
                sold=500,
                orders=500,
                oversold=400,
                lost_updates=409,
                final_stock=91,
                metrics={"stock_reservation_success_total": 500},
                samples=tuple((t * 0.2, 100 - t % 10) for t in range(60)),
            )
        if name == "deadlock":
            result = dataclasses.replace(
                result,
                deadlocks=483,
                conflicts={"deadlock": 483},
                alerts={"StockDeadlocksIncreasing": {"state": "firing", "after_s": 31.0}},
            )
        results.append(result)
    return results


def section(page: str, title: str) -> str:
    start = page.index(f"<h3>{title}</h3>")
    return page[start : page.index("</ul>", start)]


def test_every_strategy_has_a_colour_of_its_own() -> None:
    page = format_html(CONFIG, sale())
    stock = page[page.index("<h2>Stock over time</h2>") : page.index("<h2>Outcomes")]
    lines = re.findall(r'<polyline fill="none" stroke="(#[0-9a-f]{6})"', stock)
    assert len(lines) == len(STRATEGY_NAMES) == 11
    assert len(set(lines)) == len(lines), lines
    assert lines[0] == "#d62728"  # red is unsafe's alone
    assert lines.count("#d62728") == 1


def test_the_unsafe_line_s_gap_is_said_to_be_the_oversell() -> None:
    page = format_html(CONFIG, sale())
    assert "unsafe (final 91, sold 500 of 100)" in page
    (note,) = re.findall(r"<p class=note>(.*?)</p>", page)
    assert note.startswith("unsafe sold 500 of 100 units, yet its line ends at 91, not at -400")
    assert "The gap is the oversell, 400 units sold past the stock" in note


def test_deadlocks_are_caught_not_nothing_to_catch() -> None:
    page = format_html(CONFIG, sale())
    deadlock = section(page, "deadlock")
    assert "nothing to catch" not in deadlock
    assert "stock_db_deadlock_total{table=&quot;products&quot;} = 483" in deadlock
    assert "alert StockDeadlocksIncreasing FIRING +31s" in deadlock
    assert "nothing to catch: sold 100 of 100" in section(page, "atomic")


def test_the_database_line_shows_the_socket_path_decoded() -> None:
    page = format_html(CONFIG, sale())
    assert (
        "<li>database: postgresql+psycopg://postgres@/postgres?host=/tmp/stocksentry-x/pgdata"
        in page
    )
    assert "%2F" not in page
    named = format_html(CONFIG, sale(), database="embedded PostgreSQL 16.4 (pgserver)")
    assert "<li>database: embedded PostgreSQL 16.4 (pgserver)</li>" in named


def test_the_table_wraps_instead_of_scrolling_at_1280_px() -> None:
    page = format_html(CONFIG, sale())
    css = page[page.index("<style>") : page.index("</style>")]
    assert "max-width: 1240px" in css  # the page's width inside a 1,280 px window
    assert re.search(r"td\.left \{[^}]*max-width: 19em", css)  # long cells wrap
