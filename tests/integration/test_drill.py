"""`stocksentry drill` against the lab's HTTP shop on real PostgreSQL and MariaDB: each
verdict both ways, the stock restored, the refusal, exit 3 when the database goes away,
the JUnit file parsed."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from dbs import Db
from privateredis import PrivateRedis, free_port
from prom import Prometheus
from stocksentry.exporter.cli import main
from stocksentry.exporter.lab.config import LabConfig
from stocksentry.exporter.lab.serve import DRILL_SKU, drill_file, serve_shop

pytestmark = pytest.mark.integration

#: The stock the SKU holds before a drill: the drill must leave it so.
BEFORE = 3


@pytest.fixture
def shop(db: Db) -> Iterator[tuple[int, Any]]:
    """The lab's HTTP shop on a fresh database, ``LAB-DRILL`` at stock ``BEFORE``."""
    with serve_shop(db.url, LabConfig(concurrency=12, work_ms=5.0)) as (port, served):
        set_stock(db, BEFORE)
        yield port, served


def set_stock(db: Db, stock: int) -> None:
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = :s WHERE sku = :sku"),
            {"s": stock, "sku": DRILL_SKU},
        )
    engine.dispose()


def read_shop(db: Db, sku: str = DRILL_SKU) -> tuple[int, int]:
    """The SKU's stock, and how many orders the shop holds in all."""
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        stock = conn.execute(
            sa.text("SELECT available_stock FROM products WHERE sku = :sku"), {"sku": sku}
        ).scalar_one()
        orders = conn.execute(sa.text("SELECT count(*) FROM orders")).scalar_one()
    engine.dispose()
    return int(stock), int(orders)


def write_config(tmp_path: Path, port: int, url: str, **replace: tuple[str, str]) -> Path:
    """The drill file ``--serve`` writes, with text replaced (``old=new``)."""
    text = drill_file(port, url)
    for old, new in replace.values():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "drill.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def drill(
    capsys: pytest.CaptureFixture[str], config: Path, endpoint: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    port = config.read_text().split("127.0.0.1:", 1)[1].split("/", 1)[0]
    status = main(
        [
            "drill",
            "--config",
            str(config),
            "--checkout-url",
            f"http://127.0.0.1:{port}/checkout/{endpoint}",
            "--format",
            "json",
            *extra,
        ]
    )
    out = capsys.readouterr().out
    return status, json.loads(out)


def scenario(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["scenarios"] if s["name"] == name)


def test_burst_unsafe_oversells_atomic_does_not(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    config = write_config(tmp_path, port, db.raw_url)
    status, report = drill(capsys, config, "unsafe", "--yes", "--scenario", "burst")
    burst = scenario(report, "burst")
    assert status == 1
    assert report["verdict"] == "fail"
    assert burst["passed"] is False
    assert burst["stock"] == 10
    assert burst["successes"] > 10
    assert burst["oversold"] > 0
    assert any("successes exceed the stock" in f for f in burst["failures"])
    assert read_shop(db)[0] == BEFORE

    status, report = drill(capsys, config, "atomic", "--yes", "--scenario", "burst")
    burst = scenario(report, "burst")
    assert status == 0, report
    assert report["verdict"] == "pass"
    assert burst["passed"] is True
    assert (burst["successes"], burst["final_stock"], burst["oversold"]) == (10, 0, 0)
    assert burst["units_sold"] == 10
    assert read_shop(db)[0] == BEFORE

    # The terminal report: the four answers first, 80 columns at most.
    url = f"http://127.0.0.1:{port}/checkout/unsafe"
    status = main(["drill", "--config", str(config), "--yes", "-q", "--checkout-url", url])
    text = capsys.readouterr().out
    assert status == 1
    assert text.startswith("How many checkouts succeeded?")
    assert "Did successes exceed the stock?               YES, oversold by" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert text.rstrip().endswith("verdict: FAIL (2 of 2 scenarios failed)")


def test_refuses_without_yes_and_touches_nothing(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    config = write_config(tmp_path, port, db.raw_url)
    status = main(["drill", "--config", str(config)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert "refusing to run without --yes" in err
    assert f"127.0.0.1:{port}/checkout/unsafe" in err
    assert read_shop(db) == (BEFORE, 0)


def test_junit_has_one_case_per_scenario(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    config = write_config(tmp_path, port, db.raw_url)
    junit = tmp_path / "drill.xml"
    page = tmp_path / "drill.html"
    status, _report = drill(
        capsys, config, "atomic", "--yes", "--junit", str(junit), "--report", str(page)
    )
    text = page.read_text(encoding="utf-8")
    assert "<svg" in text
    assert "How many checkouts succeeded?" in text
    assert "<script" not in text
    assert "duplicate orders per idempotency_key" in text
    assert status == 1  # atomic sells once per request: the retry scenario fails
    # Our own file, just written.
    suite = ET.parse(junit).getroot().find("testsuite")  # noqa: S314
    assert suite is not None
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == {"burst", "retry"}
    assert cases["burst"].find("failure") is None
    failure = cases["retry"].find("failure")
    assert failure is not None
    assert "duplicate orders" in (failure.get("message") or "")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")


class Proxy:
    """A TCP relay to the database that can be cut: the database going away mid-drill."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.sockets: list[socket.socket] = []
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for each in (src, dst):
                with contextlib.suppress(OSError):
                    each.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut.set()
        self.listener.close()
        for each in self.sockets:
            with contextlib.suppress(OSError):
                each.shutdown(socket.SHUT_RDWR)
            each.close()


def test_database_gone_mid_drill_is_unverified_exit_3(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, served = shop
    url = sa.make_url(db.raw_url)
    proxy = Proxy(url.host or "127.0.0.1", url.port or (5432 if db.name == "postgresql" else 3306))
    through = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    config = write_config(tmp_path, port, through)
    checkout = served.checkout

    def cut_then_checkout(*args: Any) -> Any:
        # The first checkout of the burst cuts the drill's way to the database.
        proxy.close()
        return checkout(*args)

    served.checkout = cut_then_checkout
    try:
        status, report = drill(capsys, config, "atomic", "--yes", "--scenario", "burst")
    finally:
        proxy.close()
    assert status == 3
    assert report["verdict"] == "unverified"
    burst = scenario(report, "burst")
    assert burst["passed"] is False
    assert burst["verdict"] == "unverified"
    assert "database" in burst["unverified"]


@pytest.mark.parametrize(
    ("name", "unsafe", "safe", "count", "failure"),
    [
        (
            "retry",
            ("retry_no_key", {}),
            ("retry_idempotent", {}),
            ("intents", 10),
            "duplicate orders per idempotency_key",
        ),
        (
            "duplicate_callback",
            ("atomic", {}),
            ("atomic", {"callback": ("/callback/unsafe", "/callback/idempotent")}),
            ("payments", 5),
            "duplicate paid orders per external_ref",
        ),
    ],
    ids=["retry", "duplicate_callback"],
)
def test_keyed_unsafe_orders_twice_idempotent_once(
    db: Db,
    shop: tuple[int, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    unsafe: tuple[str, dict[str, tuple[str, str]]],
    safe: tuple[str, dict[str, tuple[str, str]]],
    count: tuple[str, int],
    failure: str,
) -> None:
    """Every intent (retry) or payment callback sent twice: the shop that ignores the key
    orders each twice, the idempotent one once."""
    port, _ = shop
    (endpoint, replace), (figure, sent) = unsafe, count
    config = write_config(tmp_path, port, db.raw_url, **replace)
    status, report = drill(capsys, config, endpoint, "--yes", "--scenario", name)
    result = scenario(report, name)
    assert status == 1
    assert result["passed"] is False
    assert result["duplicated_keys"] == result[figure] == sent
    assert any(failure in f for f in result["failures"])

    endpoint, replace = safe
    config = write_config(tmp_path, port, db.raw_url, **replace)
    status, report = drill(capsys, config, endpoint, "--yes", "--scenario", name)
    result = scenario(report, name)
    assert status == 0, report
    assert (result["passed"], result["duplicated_keys"], result["units_sold"]) == (True, 0, sent)
    assert read_shop(db)[0] == BEFORE


def test_stale_availability_cache_fails_live_passes(
    db: Db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The cache is refreshed every 6 s: after the sell-out it says "available" until the
    # next refresh, far past the file's 500 ms threshold even when the one-at-a-time
    # sell-out is slow on a loaded machine (it must take under 5.5 s of the 6), and the
    # first "available" after the reset still comes within the drill's 10 s patience.
    with serve_shop(db.url, LabConfig(concurrency=8, cache_refresh_ms=6000)) as (port, _):
        config = write_config(tmp_path, port, db.raw_url)
        status, report = drill(
            capsys, config, "atomic", "--yes", "--scenario", "stale_availability"
        )
        stale = scenario(report, "stale_availability")
        assert status == 1, report
        assert stale["passed"] is False
        assert stale["stale_answers"] > 0
        assert "availability" in stale["failures"][0]

        config = write_config(
            tmp_path, port, db.raw_url, live=("availability/stale_cache", "availability/atomic")
        )
        status, report = drill(
            capsys, config, "atomic", "--yes", "--scenario", "stale_availability"
        )
        stale = scenario(report, "stale_availability")
        assert status == 0, report
        assert stale["stale_window_ms"] <= stale["threshold_ms"]


def test_observability_sees_the_oversell_not_the_duplicates(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    config = write_config(tmp_path, port, db.raw_url)
    args = ("--yes", "--scenario", "burst", "--scenario", "observability")
    status, report = drill(capsys, config, "unsafe", *args)
    seen = scenario(report, "observability")
    assert status == 1
    # The app's SQL detector counts the unsafe read-modify-writes: the oversell is seen.
    assert seen["passed"] is True
    assert seen["caused"] == ["oversell"]
    assert "stock_unsafe_read_modify_write_total" in seen["seen"]["oversell"]

    args = ("--yes", "--scenario", "retry", "--scenario", "observability")
    status, report = drill(capsys, config, "retry_no_key", *args)
    seen = scenario(report, "observability")
    # Duplicate orders show only in the exporter's probe, not in the app's /metrics.
    assert seen["passed"] is False
    assert seen["caused"] == ["duplicate_orders"]
    assert "stock_duplicate_order_keys" in seen["failures"][0]

    status, report = drill(capsys, config, "retry_idempotent", *args)
    assert status == 0, report
    assert scenario(report, "observability")["caused"] == []


def test_locust_master_and_two_workers_give_the_same_verdicts(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    config = write_config(tmp_path, port, db.raw_url)
    args = ("--yes", "--scenario", "burst", "--engine", "locust", "--workers", "2")
    status, report = drill(capsys, config, "unsafe", *args)
    burst = scenario(report, "burst")
    assert status == 1, report
    assert burst["engine"] == "locust"
    assert burst["requests"] == 50
    assert burst["successes"] > burst["stock"] == 10
    assert any("successes exceed the stock" in f for f in burst["failures"])

    status, report = drill(capsys, config, "atomic", *args)
    burst = scenario(report, "burst")
    assert status == 0, report
    assert (burst["engine"], burst["successes"], burst["final_stock"]) == ("locust", 10, 0)
    assert burst["successes"] + burst["refused"] + burst["errors"] == 50
    assert read_shop(db)[0] == BEFORE


def test_redis_locks_naive_oversells_redlock_does_not(
    db: Db, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with PrivateRedis() as private_redis:
        lab = LabConfig(concurrency=12, work_ms=5.0, redis_url=private_redis.url)
        with serve_shop(db.url, lab) as (port, served):
            assert {"naive_lock", "redlock"} <= set(served.served)
            set_stock(db, BEFORE)
            config = write_config(tmp_path, port, db.raw_url)
            status, report = drill(capsys, config, "naive_lock", "--yes", "--scenario", "burst")
            burst = scenario(report, "burst")
            # The lock's TTL (80 % of the work) runs out under its holder: the next buyer
            # reads the stock before the first one wrote it.
            assert status == 1, report
            assert burst["oversold"] > 0

            status, report = drill(capsys, config, "redlock", "--yes", "--scenario", "burst")
            burst = scenario(report, "burst")
            assert status == 0, report
            assert (burst["successes"], burst["final_stock"]) == (10, 0)
            assert read_shop(db)[0] == BEFORE


def test_database_unreachable_from_the_start_is_unverified_in_json_and_junit(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    url = sa.make_url(db.raw_url).set(host="127.0.0.1", port=free_port())
    config = write_config(tmp_path, port, url.render_as_string(hide_password=False))
    junit = tmp_path / "drill.xml"
    status, report = drill(capsys, config, "atomic", "--yes", "--junit", str(junit))
    assert status == 3
    assert report["verdict"] == "unverified"
    assert [s["verdict"] for s in report["scenarios"]] == ["unverified", "unverified"]
    suite = ET.parse(junit).getroot().find("testsuite")  # noqa: S314 - our own file
    assert suite is not None
    assert suite.get("errors") == "2"
    assert read_shop(db) == (BEFORE, 0)

    # confirm: true in the file stands for --yes: the same run, not a refusal.
    config.write_text(config.read_text() + "confirm: true\n", encoding="utf-8")
    status, report = drill(capsys, config, "atomic")
    assert status == 3
    assert report["verdict"] == "unverified"


def test_reset_through_the_shops_own_request(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    reset = (
        "  success:",
        f"  reset:\n    method: PUT\n    url: http://127.0.0.1:{port}/stock\n"
        '    body: \'{"sku": "{sku}", "stock": {qty}}\'\n  success:',
    )
    config = write_config(tmp_path, port, db.raw_url, reset=reset)
    status, report = drill(capsys, config, "atomic", "--yes", "--scenario", "burst")
    burst = scenario(report, "burst")
    assert status == 0, report
    assert (burst["successes"], burst["final_stock"]) == (10, 0)
    # Restored by the same request: stock and allocation back to what the drill found.
    assert report["restored"] == f"restored the stock of {DRILL_SKU} to {BEFORE}"
    assert read_shop(db)[0] == BEFORE
    # PUT /stock sets the allocation as well: the stock went through the shop's request.
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        allocation = conn.execute(
            sa.text("SELECT initial_stock FROM products WHERE sku = :sku"), {"sku": DRILL_SKU}
        ).scalar_one()
    engine.dispose()
    assert allocation == BEFORE


def test_observability_reads_the_alerts_prometheus_fired(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    rules = Path(__file__).resolve().parents[2] / "alert_rules" / "stocksentry.rules.yml"
    with Prometheus(targets={"shop": [f"127.0.0.1:{port}"]}, rule_files=[rules]) as prom:
        prom.wait_for_targets_up("shop")
        # The counter at zero is scraped before the drill makes it grow.
        prom.wait_for("stock_unsafe_read_modify_write_total")
        watch = (
            f"  metrics_url: http://127.0.0.1:{port}/metrics\n  wait: 2s",
            f"  prometheus_url: {prom.url}\n  wait: 60s",
        )
        config = write_config(tmp_path, port, db.raw_url, watch=watch)
        args = ("--yes", "--scenario", "burst", "--scenario", "observability")
        status, report = drill(capsys, config, "unsafe", *args)
    seen = scenario(report, "observability")
    assert status == 1
    assert seen["passed"] is True, seen
    assert "StockUnsafeReadModifyWrite" in seen["seen"]["oversell"]
    assert "StockUnsafeReadModifyWrite" in seen["alerts"]
