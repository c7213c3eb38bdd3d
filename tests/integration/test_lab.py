"""The flash-sale lab (`stocksentry demo`) on SQLite, real PostgreSQL, MariaDB and Redis.

The lab's claims are checked three ways: its report against the relations the strategies
must obey (unsafe and naive_lock oversell, check_then_decrement goes negative, atomic,
for_update and redlock sell exactly the stock), its metric totals against the registry it
filled, and its database figures against SQL this test runs itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
import structlog
from prom import free_port
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from stocksentry.exporter.cli import main
from stocksentry.exporter.lab import driver as lab_driver
from stocksentry.exporter.lab.config import (
    SKIPPED_WITHOUT_REDIS,
    STRATEGY_NAMES,
    LabConfig,
    StrategyResult,
)
from stocksentry.exporter.lab.progress import Progress
from stocksentry.exporter.lab.report import caught_lines
from stocksentry.exporter.lab.report_html import format_html
from stocksentry.exporter.lab.run import run_lab
from stocksentry.instrumentation import CONFLICT_REASONS, StockMetrics, catalog

pytestmark = pytest.mark.integration
SUCCESS = "stock_reservation_success_total"
CONFLICT = "stock_reservation_conflict_total"
NEGATIVE = "stock_inventory_negative_total"
DURATION_COUNT = "stock_reservation_duration_seconds_count"
REPLAY = "stock_idempotency_replay_total"
STALE = "stock_cache_stale_hit_total"
UNSAFE_RMW = "stock_unsafe_read_modify_write_total"
EXPIRED = "stock_lock_expired_while_held_total"
NOT_OWNED = "stock_lock_release_not_owned_total"
# The six checkout strategies, first in the lab's order; the scenarios (retries, stale
# cache, outbox, deadlock) are checked by test_lab_embedded.py on the embedded servers.
ALL_STRATEGIES = list(STRATEGY_NAMES[:6])
CLASSIC = ",".join(ALL_STRATEGIES)
WITHOUT_REDIS = ["unsafe", "check_then_decrement", "atomic", "for_update"]
REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
JSON_KEYS = {
    "strategy",
    "stock_initial",
    "buyers",
    "sold",
    "oversold",
    "final_stock",
    "conflicts",
    "negative_writes",
    "p50_ms",
    "p99_ms",
    "metrics",
    "db",
    "consistent",
}
# Small runs for the command-line tests: the big ones are the two default sales below.
SMALL = ["--buyers", "60", "--stock", "10", "--concurrency", "10", "--work-ms", "2", "--sqlite"]


def value(registry: CollectorRegistry, name: str, **labels: str) -> int:
    sample = registry.get_sample_value(name, labels)
    return 0 if sample is None else int(sample)


def db_truth(url: str, sku: str) -> tuple[int, int, int, int]:
    """Orders, units, negative writes and stock of ``sku``, by the test's own SQL (the
    portable kind: MySQL has no ``FILTER``)."""
    engine = sa.create_engine(url.replace("mysql://", "mysql+pymysql://", 1))
    try:
        with engine.connect() as conn:
            orders, units, negative = conn.execute(
                sa.text(
                    "SELECT COUNT(*), COALESCE(SUM(oi.quantity), 0),"
                    " COALESCE(SUM(CASE WHEN oi.stock_after < 0 THEN 1 ELSE 0 END), 0)"
                    " FROM orders o JOIN order_items oi ON oi.order_id = o.id"
                    " JOIN products p ON p.id = oi.product_id"
                    " WHERE p.sku = :sku AND o.status = 'PAID'"
                ),
                {"sku": sku},
            ).one()
            stock = conn.execute(
                sa.text("SELECT available_stock FROM products WHERE sku = :sku"), {"sku": sku}
            ).scalar_one()
    finally:
        engine.dispose()
    return int(orders), int(units), int(negative), int(stock)


def ran(results: list[StrategyResult]) -> list[StrategyResult]:
    return [r for r in results if r.skipped is None]


def check_consistent(result: StrategyResult, registry: CollectorRegistry) -> None:
    """Every metric total equals its database figure, pair by pair."""
    assert result.skipped is None
    sku, name = result.sku, result.strategy
    success = value(registry, SUCCESS, sku=sku, strategy=name)
    conflicts = {
        reason: value(registry, CONFLICT, sku=sku, reason=reason) for reason in CONFLICT_REASONS
    }
    negative = value(registry, NEGATIVE, sku=sku)

    assert result.metrics[SUCCESS] == success == result.db.orders == result.orders
    assert result.metrics[NEGATIVE] == negative == result.db.negative_writes
    assert result.metrics[CONFLICT] == sum(conflicts.values())
    assert result.conflicts == {k: v for k, v in conflicts.items() if v}
    assert result.errors == 0, result.first_error
    assert success + sum(conflicts.values()) + result.errors == result.reservations
    assert result.metrics[DURATION_COUNT] == result.reservations
    assert result.reservations == result.buyers + result.resubmitted - result.replays
    assert result.db.units == result.sold == result.orders  # one unit per buyer
    assert result.db.final_stock == result.final_stock
    assert result.mismatches == ()
    assert result.consistent is True


def check_default_sale(results: list[StrategyResult], registry: CollectorRegistry) -> None:
    """500 buyers against 100 units: what each strategy must do."""
    assert [r.strategy for r in results] == ALL_STRATEGIES
    # Without --redis the lock strategies are listed, skipped, with the reason.
    assert {r.strategy: r.skipped for r in results if r.skipped} == {
        "naive_lock": SKIPPED_WITHOUT_REDIS,
        "redlock": SKIPPED_WITHOUT_REDIS,
    }
    by_name = {r.strategy: r for r in ran(results)}
    assert list(by_name) == WITHOUT_REDIS
    for result in by_name.values():
        assert (result.stock_initial, result.buyers) == (100, 500)
        assert result.sku == f"LAB-{result.strategy.upper()}"
        check_consistent(result, registry)

    unsafe = by_name["unsafe"]
    assert unsafe.sold > 100
    assert unsafe.oversold == unsafe.sold - 100 > 0
    # It writes values computed from what it read, never below zero: the oversell hides
    # in lost updates, stock that was sold without ever leaving the stock column.
    assert unsafe.negative_writes == 0
    assert 0 <= unsafe.final_stock < 100
    assert unsafe.lost_updates == unsafe.sold - (100 - unsafe.final_stock) > 0
    assert unsafe.conflicts.get("out_of_stock", 0) == 500 - unsafe.sold

    check = by_name["check_then_decrement"]
    assert check.final_stock < 0
    assert check.negative_writes > 0
    # Relative decrements lose nothing: each unit past the stock is one write below zero.
    assert check.negative_writes == -check.final_stock == check.oversold
    assert check.sold == 100 + check.negative_writes
    assert check.lost_updates == 0
    assert check.conflicts == {"out_of_stock": 500 - check.sold}

    for safe in (by_name["atomic"], by_name["for_update"]):
        assert (safe.sold, safe.oversold, safe.final_stock) == (100, 0, 0)
        assert safe.negative_writes == 0
        assert safe.conflicts == {"out_of_stock": 400}
        expected = {
            SUCCESS: 100,
            CONFLICT: 400,
            NEGATIVE: 0,
            DURATION_COUNT: 500,
            REPLAY: 0,
            STALE: 0,
        }
        expected[UNSAFE_RMW] = 0
        assert safe.metrics == expected
    # The SQL detector flags every unsafe write, and nothing else here.
    assert unsafe.unsafe_read_modify_write is not None
    assert unsafe.unsafe_read_modify_write > 0
    assert by_name["check_then_decrement"].unsafe_read_modify_write == 0


def run_and_check(config: LabConfig, registry: CollectorRegistry) -> list[StrategyResult]:
    """Run the lab; each result's metrics agree with its figures and with the test's SQL."""
    results = run_lab(config, registry=registry)
    for result in results:
        check_consistent(result, registry)
    assert config.database_url is not None
    check_against_own_sql(config.database_url, results)
    return results


def check_against_own_sql(url: str, results: list[StrategyResult]) -> None:
    for result in ran(results):
        orders, units, negative, stock = db_truth(url, result.sku)
        assert (orders, units, negative, stock) == (
            result.db.orders,
            result.db.units,
            result.db.negative_writes,
            result.db.final_stock,
        )


# --- the defaults, on SQLite and PostgreSQL -------------------------------------------------


def test_default_sale_on_sqlite(tmp_path: Path, registry: CollectorRegistry) -> None:
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    results = run_lab(
        LabConfig(database_url=url, strategies=tuple(ALL_STRATEGIES)), registry=registry
    )
    check_default_sale(results, registry)
    check_against_own_sql(url, results)


@pytest.mark.integration
def test_default_sale_on_postgresql(pg_sqlalchemy_url: str, registry: CollectorRegistry) -> None:
    # The plain postgresql:// form the CLI accepts is turned into psycopg 3.
    plain = pg_sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)
    results = run_lab(
        LabConfig(database_url=plain, strategies=tuple(ALL_STRATEGIES)), registry=registry
    )
    check_default_sale(results, registry)
    check_against_own_sql(pg_sqlalchemy_url, results)


def test_default_sale_on_mariadb(mysql_database: str, registry: CollectorRegistry) -> None:
    # The plain mysql:// form the CLI accepts is read with PyMySQL; InnoDB at its default
    # REPEATABLE READ.
    results = run_lab(
        LabConfig(database_url=mysql_database, strategies=tuple(ALL_STRATEGIES)),
        registry=registry,
    )
    check_default_sale(results, registry)
    check_against_own_sql(mysql_database, results)


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "READ COMMITTED"])
def test_check_then_decrement_on_mariadb_at_each_isolation_level(
    mysql_database: str, registry: CollectorRegistry, isolation: str
) -> None:
    """The unguarded decrement reads the latest committed row at either level: no update is
    lost, each unit past the stock is one write below zero; the guarded ones stay exact."""
    config = LabConfig(
        database_url=mysql_database,
        buyers=80,
        stock=10,
        concurrency=20,
        work_ms=5,
        isolation_level=isolation,
        strategies=("check_then_decrement", "atomic", "for_update"),
    )
    check, atomic, for_update = run_and_check(config, registry)
    assert check.oversold > 0
    assert check.negative_writes == -check.final_stock == check.oversold
    assert check.lost_updates == 0
    for safe in (atomic, for_update):
        assert (safe.sold, safe.oversold, safe.final_stock) == (10, 0, 0), safe.strategy
        assert safe.conflicts == {"out_of_stock": 70}


def test_deadlock_scenario_on_mariadb(mysql_database: str, registry: CollectorRegistry) -> None:
    """InnoDB finds the opposite-order cycles (error 1213): counted as deadlocks, and the
    bundle is never oversold."""
    config = LabConfig(
        database_url=mysql_database,
        buyers=60,
        stock=20,
        concurrency=10,
        work_ms=5,
        strategies=("deadlock",),
    )
    (deadlock,) = run_and_check(config, registry)
    assert deadlock.skipped is None
    assert deadlock.deadlocks == deadlock.conflicts["deadlock"] > 0
    assert deadlock.metrics["stock_db_deadlock_total"] == deadlock.deadlocks
    assert (deadlock.sold, deadlock.oversold, deadlock.final_stock) == (20, 0, 0)


def test_rerun_resets_each_product(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    config = LabConfig(database_url=url, buyers=30, stock=5, concurrency=5, work_ms=1)
    run_lab(config)
    second = CollectorRegistry()
    results = run_lab(config, registry=second)
    for result in ran(results):
        check_consistent(result, second)
        # Only the second run's orders are left: the first run's were deleted.
        assert db_truth(url, result.sku)[0] == result.orders <= 30


def test_a_shop_outbox_of_another_shape_is_left_alone(tmp_path: Path) -> None:
    # The lab run on an existing shop's database: create_all keeps the shop's own outbox,
    # which has none of the lab's columns; resetting a product must not touch it.
    url = f"sqlite:///{tmp_path / 'shop.db'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE outbox (id INTEGER PRIMARY KEY, payload TEXT)")
        conn.exec_driver_sql("INSERT INTO outbox (payload) VALUES ('the shop''s own event')")
    config = LabConfig(
        database_url=url, buyers=20, stock=5, concurrency=4, work_ms=0, strategies=("atomic",)
    )
    run_lab(config)
    (result,) = run_lab(config)  # the second run resets the product made by the first
    assert (result.sold, result.consistent) == (5, True)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT payload FROM outbox").all()
    engine.dispose()
    assert [tuple(row) for row in rows] == [("the shop's own event",)]


def test_without_update_returning_reads_back_in_the_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: CollectorRegistry
) -> None:
    # Databases without UPDATE ... RETURNING take the read-back path: same figures.
    monkeypatch.setattr(lab_driver, "update_returning", lambda engine: False)
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    config = LabConfig(
        database_url=url,
        buyers=200,
        stock=40,
        concurrency=20,
        work_ms=2,
        strategies=("unsafe", "check_then_decrement", "atomic", "for_update"),
    )
    results = run_and_check(config, registry)
    unsafe, check, atomic, for_update = results
    assert unsafe.oversold > 0
    assert check.negative_writes == -check.final_stock == check.oversold
    assert (atomic.sold, atomic.final_stock, atomic.conflicts) == (40, 0, {"out_of_stock": 160})
    assert (for_update.sold, for_update.final_stock) == (40, 0)


def test_without_the_sqlalchemy_integration_the_lab_runs_without_the_detector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: CollectorRegistry
) -> None:
    # The integration's extra missing: the import fails, the detector's column goes.
    monkeypatch.setitem(sys.modules, "stocksentry.instrumentation.sqlalchemy", None)
    config = LabConfig(
        database_url=f"sqlite:///{tmp_path / 'lab.db'}",
        buyers=20,
        stock=5,
        concurrency=5,
        work_ms=1,
        strategies=("unsafe",),
    )
    [unsafe] = run_lab(config, registry=registry)
    check_consistent(unsafe, registry)
    assert unsafe.unsafe_read_modify_write is None
    assert UNSAFE_RMW not in unsafe.metrics
    assert "unsafe rmw" not in format_html(config, [unsafe])


def test_a_failure_to_instrument_the_engine_is_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a missing extra drops the detector; a bug in our own set-up raises.
    import stocksentry.instrumentation.sqlalchemy as integration

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("listener set-up broke")

    monkeypatch.setattr(integration, "instrument_sqlalchemy", broken)
    config = LabConfig(
        database_url=f"sqlite:///{tmp_path / 'lab.db'}",
        buyers=5,
        stock=1,
        concurrency=2,
        strategies=("atomic",),
    )
    with pytest.raises(RuntimeError, match="listener set-up broke"):
        run_lab(config)


def test_temporary_sqlite_file_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    results = run_lab(
        LabConfig(buyers=20, stock=5, concurrency=5, work_ms=1, strategies=tuple(ALL_STRATEGIES))
    )
    assert [r.consistent for r in results] == [True] * 6
    assert list(tmp_path.iterdir()) == []


def test_progress_reports_every_buyer(tmp_path: Path) -> None:
    class Sink:
        def __init__(self) -> None:
            self.database = ""
            self.finished: list[Progress] = []

        def start(self, database: str) -> None:
            self.database = database

        def update(self, progress: Progress) -> None:
            assert progress.done <= progress.total

        def finish(self, progress: Progress) -> None:
            self.finished.append(progress)

    sink = Sink()
    results = run_lab(
        LabConfig(buyers=20, stock=5, concurrency=5, work_ms=1, strategies=("atomic",)),
        progress=sink,
    )
    assert sink.database == "embedded SQLite (temporary file)"
    [done] = sink.finished
    assert (done.strategy, done.done, done.total) == ("atomic", 20, 20)
    assert (done.sold, done.conflicts, done.errors) == (5, 15, 0)
    assert results[0].sold == 5


# --- the command line -----------------------------------------------------------------------


def test_cli_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--strategy", CLASSIC, "--format", "json", "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    report = json.loads(out)
    assert [item["strategy"] for item in report] == ALL_STRATEGIES
    skipped = [item for item in report if item["skipped"]]
    assert skipped == [
        {"strategy": name, "sku": f"LAB-{name.upper()}", "skipped": SKIPPED_WITHOUT_REDIS}
        for name in ("naive_lock", "redlock")
    ]
    report = [item for item in report if not item["skipped"]]
    for item in report:
        assert set(item) >= JSON_KEYS, JSON_KEYS - set(item)
        assert item["stock_initial"] == 10
        assert item["buyers"] == 60
        assert set(item["metrics"]) >= {SUCCESS, CONFLICT, NEGATIVE, DURATION_COUNT}
        assert set(item["db"]) == {
            "orders",
            "units",
            "negative_writes",
            "final_stock",
            "duplicate_keys",
            "duplicate_orders",
        }
        assert item["consistent"] is True
        assert item["metrics"][SUCCESS] == item["db"]["orders"] == item["sold"]
        assert item["metrics"][NEGATIVE] == item["db"]["negative_writes"]
        assert item["metrics"][DURATION_COUNT] == 60
        assert item["oversold"] == max(0, item["sold"] - 10)
    atomic = report[2]
    assert (atomic["sold"], atomic["conflicts"]) == (10, {"out_of_stock": 50})
    assert atomic["samples"][0] == [0.0, 10]
    assert atomic["samples"][-1][1] == 0


def test_cli_table_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--strategy", "atomic,unsafe", "--strategy", "atomic"]) == 0
    out, err = capsys.readouterr()
    lines = [line.strip() for line in out.splitlines()]
    # The summary fits a default terminal.
    assert max(len(line) for line in out.splitlines()) <= 80
    header = next(line for line in lines if line.startswith("strategy ") and "sold" in line)
    for column in ("sold", "over", "neg", "dup", "final", "p99 ms", "metrics"):
        assert column in header
    rows = [line.split() for line in lines if line.startswith(("atomic ", "unsafe "))]
    # Table rows first, in the order asked for, each strategy once.
    assert [row[0] for row in rows[:2]] == ["atomic", "unsafe"]
    assert rows[0][1:6] == ["10", "0", "0", "0", "0"]
    assert rows[0][-2:] == ["=", "db"]
    assert any(line.startswith("what caught it") for line in lines)
    assert 'stock_reservation_success_total{sku="LAB-UNSAFE"} = ' in out
    # stderr is not a TTY here: one final progress line per strategy, no carriage returns.
    assert "\r" not in err
    progress = [line for line in err.splitlines() if "buyers" in line]
    assert [line.split()[0] for line in progress] == ["atomic", "unsafe"]
    assert all("60/60 buyers" in line for line in progress)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://postgres@127.0.0.1:1/nope", "cannot connect to postgresql+psycopg://"),
        ("nonsense://somewhere/db", "cannot use database URL"),
        ("::::", "cannot parse database URL"),
        ("sqlite://", "in-memory SQLite"),
    ],
)
def test_cli_bad_database_is_one_line_and_exit_2(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--database", url]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("stocksentry demo: error: ")
    assert message in err
    assert "Traceback" not in err


def test_cli_password_is_not_shown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--database", "postgresql://u:hunter2@127.0.0.1:1/db"]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err
    assert "u:***@127.0.0.1:1/db" in err


def test_cli_exit_1_when_metrics_disagree_with_the_database(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Simulate a stocksentry bug: the first successful reservation is not counted (its
    # duration still is). reservation_finished is the path every reservation ends on.
    original = StockMetrics.reservation_finished
    dropped = threading.Event()

    def lossy(
        self: StockMetrics,
        sku: str,
        strategy: str,
        outcome: str,
        seconds: float,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        if outcome == "success" and not dropped.is_set():
            dropped.set()
            self.observe(catalog.RESERVATION_DURATION, seconds, outcome, exemplar=exemplar)
            return
        original(self, sku, strategy, outcome, seconds, exemplar)

    monkeypatch.setattr(StockMetrics, "reservation_finished", lossy)
    assert main(["demo", *SMALL, "--strategy", "atomic", "--format", "json", "-q"]) == 1
    out, err = capsys.readouterr()
    [item] = json.loads(out)
    assert item["consistent"] is False
    assert item["metrics"][SUCCESS] == 9
    assert item["db"]["orders"] == 10
    assert "METRICS DO NOT MATCH THE DATABASE (atomic)" in err
    assert "stock_reservation_success_total = 9 but the database holds 10 orders" in err


def test_cli_log_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_file = tmp_path / "lab.log"
    before = structlog.get_config()
    assert main(["demo", *SMALL, "--strategy", "atomic", "-q", "--log-file", str(log_file)]) == 0
    capsys.readouterr()
    # The process-wide structlog configuration is put back afterwards.
    assert structlog.get_config()["logger_factory"] is before["logger_factory"]
    events = [json.loads(line) for line in log_file.read_text().splitlines()]
    updates = [e for e in events if e["event"] == "stock_update"]
    assert len(updates) == 60
    assert sum(e["success"] for e in updates) == 10
    assert {e["sku"] for e in events} == {"LAB-ATOMIC"}
    assert all(e["request_id"].startswith("req-") for e in updates)
    won = [e for e in updates if e["success"]]
    # Atomic writes each stock value once: from=10 to=9 ... from=1 to=0.
    assert sorted(e["to"] for e in won) == list(range(10))


def test_cli_serves_metrics_while_lingering() -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stocksentry.exporter",
            "demo",
            *SMALL,
            "--strategy",
            CLASSIC,
            "--format",
            "json",
            "--metrics-port",
            str(port),
            "--linger",
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("lingering"):
                break
        else:
            pytest.fail(f"no linger line on stderr: {seen}")
        assert f"http://127.0.0.1:{port}/metrics" in line
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    report = {item["strategy"]: item for item in json.loads(out)}
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }

    def served(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    for name, item in report.items():
        if item["skipped"]:
            continue
        sku = f"LAB-{name.upper()}"
        success = served(SUCCESS, sku=sku, strategy=name)
        assert success == item["metrics"][SUCCESS] == item["db"]["orders"]
        assert served(NEGATIVE, sku=sku) == item["metrics"][NEGATIVE]
    assert served(SUCCESS, sku="LAB-ATOMIC", strategy="atomic") == 10.0
    assert served(CONFLICT, sku="LAB-ATOMIC", reason="out_of_stock") == 50.0
    assert sum(v for (name, _), v in samples.items() if name == DURATION_COUNT) == 240.0


# --- locks, retries, stale cache, the HTML report --------------------------------------------


def redis_keys(prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return [
            *client.scan_iter(match=prefix + "*"),
            *client.scan_iter(match="redlock:" + prefix + "*"),
        ]
    finally:
        client.close()


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["postgresql", "sqlite", "mariadb"])
def test_lock_strategies_on_redis(
    backend: str,
    request: pytest.FixtureRequest,
    redis_prefix: str,
    tmp_path: Path,
    registry: CollectorRegistry,
) -> None:
    """naive_lock oversells and its lock metrics say why; the safe ones sell the stock."""
    if backend == "postgresql":
        url = request.getfixturevalue("pg_sqlalchemy_url")
    elif backend == "mariadb":
        url = request.getfixturevalue("mysql_database")
    else:
        url = f"sqlite:///{tmp_path / 'lab.db'}"
    config = LabConfig(
        database_url=url,
        redis_url=REDIS_URL,
        redis_prefix=redis_prefix,
        buyers=120,
        stock=20,
        concurrency=20,
        strategies=("naive_lock", "redlock", "for_update", "atomic"),
    )
    results = run_and_check(config, registry)
    naive, owned, for_update, atomic = results

    # The naive lock: every holder outlives the 4 ms TTL; the lock leaks, stock oversells.
    assert config.naive_lock_ttl_s == pytest.approx(0.004)
    assert naive.oversold > 0
    assert naive.sold == naive.orders > 20
    assert naive.locks["expired_while_held"] > 0
    assert naive.locks["release_not_owned"] > 0
    assert naive.locks["acquired"] == 120
    assert value(registry, EXPIRED, lock="naive_lock") == naive.locks["expired_while_held"]
    assert value(registry, NOT_OWNED, lock="naive_lock") == naive.locks["release_not_owned"]
    assert naive.metrics[EXPIRED] == naive.locks["expired_while_held"]
    assert any(EXPIRED in line for line in caught_lines(naive))

    for safe in (owned, for_update, atomic):
        assert (safe.sold, safe.oversold, safe.final_stock) == (20, 0, 0), safe.strategy
        assert safe.conflicts == {"out_of_stock": 100}
    # The owned lock never expires under its holder, and never releases another's lock.
    assert owned.locks["acquired"] == 120
    assert owned.locks["expired_while_held"] == owned.locks["release_not_owned"] == 0
    assert owned.locks["extend_failures"] == 0
    # Every hold ended within its lease (how long a hold takes is the machine's business).
    assert 0 < owned.locks["hold_ratio_mean"] <= 1.0
    assert caught_lines(owned) == []
    assert naive.unsafe_read_modify_write is not None
    assert naive.unsafe_read_modify_write > 0
    assert [r.unsafe_read_modify_write for r in (owned, for_update, atomic)] == [0, 0, 0]
    if backend == "sqlite":
        assert any("BEGIN IMMEDIATE" in note for note in for_update.notes)
    assert redis_keys(redis_prefix) == []


@pytest.mark.integration
@pytest.mark.parametrize("impl", ["lab", "pottery"])
def test_read_modify_write_under_owned_lock_is_not_flagged(
    impl: str, pg_sqlalchemy_url: str, redis_prefix: str, registry: CollectorRegistry
) -> None:
    """redlock writes the value computed from its read, as ``unsafe`` does, but inside an
    owned lock still valid at the write: exact sales, and the detector counts nothing for
    it, while it counts the very same read-modify-write without the lock in the same run."""
    config = LabConfig(
        database_url=pg_sqlalchemy_url,
        redis_url=REDIS_URL,
        redis_prefix=redis_prefix,
        buyers=80,
        stock=20,
        concurrency=16,
        redlock_impl=impl,
        strategies=("unsafe", "redlock"),
    )
    unsafe, owned = run_and_check(config, registry)
    # The control: the same statements with no lock lose updates and are flagged.
    assert unsafe.lost_updates > 0
    assert unsafe.unsafe_read_modify_write is not None
    assert unsafe.unsafe_read_modify_write > 0
    assert (owned.sold, owned.oversold, owned.lost_updates, owned.final_stock) == (20, 0, 0, 0)
    assert owned.conflicts == {"out_of_stock": 60}
    assert owned.locks["acquired"] == 80
    assert owned.locks["expired_while_held"] == owned.locks["release_not_owned"] == 0
    assert owned.unsafe_read_modify_write == 0
    assert owned.metrics[UNSAFE_RMW] == 0
    assert caught_lines(owned) == []
    assert redis_keys(redis_prefix) == []


def run_with_retries(
    tmp_path: Path, registry: CollectorRegistry, *, stock: int, idempotency: bool
) -> tuple[str, list[StrategyResult]]:
    """60 buyers, a quarter of whom resubmit, on unsafe and atomic in a SQLite file."""
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    config = LabConfig(
        database_url=url,
        buyers=60,
        stock=stock,
        concurrency=10,
        work_ms=2,
        retries=0.25,
        idempotency=idempotency,
        strategies=("unsafe", "atomic"),
    )
    return url, run_lab(config, registry=registry)


def test_retries_with_idempotency_replay_without_reserving(
    tmp_path: Path, registry: CollectorRegistry
) -> None:
    url, results = run_with_retries(tmp_path, registry, stock=10, idempotency=True)
    for result in results:
        check_consistent(result, registry)
        # Every resubmit found the stored result: 15 replays, no second reservation.
        assert (result.resubmitted, result.replays, result.reservations) == (15, 15, 60)
        assert result.db.duplicate_orders == result.db.duplicate_keys == 0
        assert result.metrics[REPLAY] == 15
        assert duplicates_by_own_sql(url, result.sku) == 0
    assert value(registry, REPLAY, operation="checkout") == 30
    assert results[1].sold == 10


def test_retries_without_idempotency_duplicate_orders(
    tmp_path: Path, registry: CollectorRegistry
) -> None:
    url, results = run_with_retries(tmp_path, registry, stock=30, idempotency=False)
    for result in results:
        check_consistent(result, registry)
        assert (result.resubmitted, result.replays, result.reservations) == (15, 0, 75)
        assert result.metrics[REPLAY] == 0
        # Each intent at most twice: every duplicated key has exactly one extra order.
        assert 0 < result.db.duplicate_orders == result.db.duplicate_keys <= 15
        assert duplicates_by_own_sql(url, result.sku) == result.db.duplicate_orders
        assert any("duplicate orders per idempotency key" in line for line in caught_lines(result))
    unsafe, atomic = results
    # The unsafe strategy never refuses: every resubmit became a second order.
    assert unsafe.db.duplicate_orders == 15
    # The atomic one still sells exactly the stock, some of it twice to the same intent.
    assert atomic.sold == 30


def duplicates_by_own_sql(url: str, sku: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT o.external_ref, COUNT(*) AS n"
                        " FROM orders o JOIN order_items oi ON oi.order_id = o.id"
                        " JOIN products p ON p.id = oi.product_id WHERE p.sku = :sku"
                        " GROUP BY o.external_ref) d"
                    ),
                    {"sku": sku},
                ).scalar_one()
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("with_redis", [False, True])
def test_stale_cache_counts_stale_hits(
    with_redis: bool, redis_prefix: str, registry: CollectorRegistry
) -> None:
    config = LabConfig(
        buyers=80,
        stock=10,
        concurrency=10,
        work_ms=2,
        stale_cache=True,
        # Longer than the sale: the cache keeps saying "available" after the last unit went.
        cache_refresh_ms=500,
        redis_url=REDIS_URL if with_redis else None,
        redis_prefix=redis_prefix,
        strategies=("atomic",),
    )
    [atomic] = run_lab(config, registry=registry)
    check_consistent(atomic, registry)
    assert (atomic.sold, atomic.oversold) == (10, 0)
    # Refused by the database after the cache said "available": counted, and logged as such.
    assert atomic.stale_cache_hits > 0
    assert atomic.stale_cache_hits == value(registry, STALE, cache="lab_stock")
    assert atomic.stale_cache_hits <= atomic.conflicts["out_of_stock"]
    assert any(STALE in line for line in caught_lines(atomic))
    if with_redis:
        assert redis_keys(redis_prefix) == []


def test_cli_lock_strategies_skipped_without_redis(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *SMALL, "--strategy", "naive_lock,atomic,redlock", "-q"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^naive_lock +skipped: needs --redis URL", out, re.MULTILINE)
    assert re.search(r"^redlock +skipped: needs --redis URL", out, re.MULTILINE)
    assert re.search(r"^ ?atomic +10 +0 +0 +0 +0 ", out, re.MULTILINE)
    assert "redis: none (the lock strategies are skipped)" in out


@pytest.mark.integration
def test_cli_html_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "lab.html"
    argv = [
        "demo",
        *["--buyers", "60", "--stock", "40", "--concurrency", "10", "--work-ms", "2"],
        "--sqlite",
        "--redis",
        REDIS_URL,
        "--strategy",
        "naive_lock,atomic",
        # Half the buyers resubmit while the stock is still there: duplicate orders.
        "--retries",
        "50%",
        "--no-idempotency",
        "--format",
        "json",
        "-q",
        "--report",
        str(report),
    ]
    assert main(argv) == 0
    items = json.loads(capsys.readouterr().out)
    assert [item["strategy"] for item in items] == ["naive_lock", "atomic"]
    assert items[0]["locks"]["expired_while_held"] > 0
    assert items[1]["locks"] == {}
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert page.count("<svg") == 3
    assert "stock over time" in page
    assert "latency" in page
    # Self-contained: no script, no external asset.
    assert "<script" not in page
    assert not re.search(r"(src|href)=", page)
    assert "stock_lock_expired_while_held_total{lock=&quot;naive_lock&quot;}" in page
    assert "duplicate orders per idempotency key" in page


def test_cli_unreachable_redis_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", *SMALL, "--redis", "redis://:sekrit@127.0.0.1:1/0", "--strategy", "naive_lock"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(
        "stocksentry demo: error: cannot connect to Redis redis://:***@127.0.0.1:1/0"
    )
    assert "sekrit" not in err


def test_cli_on_mariadb_with_isolation(
    mysql_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    small = ["--buyers", "40", "--stock", "10", "--concurrency", "10", "--work-ms", "2"]
    argv = ["demo", "--database", mysql_database, *small, "--no-watch", "--quiet"]
    argv += ["--strategy", "atomic,check_then_decrement", "--isolation", "read-committed"]
    assert main([*argv, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [item["strategy"] for item in report] == ["atomic", "check_then_decrement"]
    assert (report[0]["sold"], report[0]["oversold"]) == (10, 0)
    assert all(item["consistent"] for item in report)


def test_cli_unknown_isolation_level_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["demo", *SMALL, "--isolation", "snapshot"])
    assert exited.value.code == 2
    assert "--isolation" in capsys.readouterr().err
    with pytest.raises(ValueError, match="isolation_level"):
        LabConfig(isolation_level="SNAPSHOT")
