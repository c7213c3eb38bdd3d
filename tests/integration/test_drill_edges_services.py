"""The drill's and the freeze's untested paths, through the CLI and the webhook over HTTP,
on real PostgreSQL, MariaDB and Redis: a checkout nobody answers or that refuses every
request, a reset request that fails, the drill SKU gone mid-drill, a table the database
lacks, a monitor that is off or answers something else, a bad exporter config for
``freeze``, webhook bodies over the limits."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from dbs import Db, postgresql
from privateredis import free_port
from pytest_aiohttp import AiohttpClient
from services import REDIS_URL
from stocksentry.exporter.cli import main
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.config.containment import WEBHOOK_PATH
from stocksentry.exporter.containment.webhook import MAX_ALERTS, Containment
from stocksentry.exporter.lab.config import LabConfig
from stocksentry.exporter.lab.serve import DRILL_SKU, serve_shop
from stocksentry.exporter.server import ServerSettings, create_app
from stocksentry.instrumentation.freezeview import freeze_sku, read_frozen
from test_drill import read_shop, scenario, set_stock, write_config

pytestmark = pytest.mark.integration

#: The stock the SKU holds before a drill: the drill must leave it so, or say it did not.
BEFORE = 3


@pytest.fixture
def pg(pg_database: str) -> Db:
    """PostgreSQL only: for the paths where the database's kind makes no difference."""
    return postgresql(pg_database)


@pytest.fixture
def shop(db: Db) -> Iterator[tuple[int, Any]]:
    """The lab's HTTP shop on a fresh database of each kind, the SKU at ``BEFORE``."""
    with serve_shop(db.url, LabConfig(concurrency=8)) as served:
        set_stock(db, BEFORE)
        yield served


@pytest.fixture
def pg_shop(pg: Db) -> Iterator[tuple[int, Any]]:
    """The lab's HTTP shop on PostgreSQL, the SKU at ``BEFORE``."""
    with serve_shop(pg.url, LabConfig(concurrency=8)) as served:
        set_stock(pg, BEFORE)
        yield served


def run_json(
    capsys: pytest.CaptureFixture[str], config: Path, *extra: str
) -> tuple[int, dict[str, Any], str]:
    """``stocksentry drill --format json``: exit status, the report, stderr."""
    status = main(["drill", "--config", str(config), "--format", "json", "--yes", *extra])
    captured = capsys.readouterr()
    return status, json.loads(captured.out), captured.err


# --- a checkout that never sells: never a pass --------------------------------------------


def test_checkout_nobody_listens_on_is_unverified_not_a_pass(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong port: every checkout is refused at connect. Nothing sold, so nothing was
    tested: both scenarios unverified (exit 3), not the all-clear "no oversell"."""
    port, _ = pg_shop
    config = write_config(tmp_path, port, pg.raw_url)
    closed = f"http://127.0.0.1:{free_port()}/checkout"
    status, report, _ = run_json(capsys, config, "--checkout-url", closed)
    assert status == 3, report
    assert report["verdict"] == "unverified"
    for name in ("burst", "retry"):
        result = scenario(report, name)
        assert result["verdict"] == "unverified", result
        assert "sold nothing" in result["unverified"]
    assert scenario(report, "burst")["errors"] == 50
    assert read_shop(pg) == (BEFORE, 0)


def test_checkout_refusing_every_request_is_unverified_in_every_report(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong path: the shop answers 404 to all. The terminal report (with its progress
    bars on stderr), the JUnit file and the HTML page all say not verified."""
    port, _ = pg_shop
    config = write_config(tmp_path, port, pg.raw_url)
    junit, page = tmp_path / "drill.xml", tmp_path / "drill.html"
    url = f"http://127.0.0.1:{port}/checkout/no_such_strategy"
    argv = ["drill", "--config", str(config), "--yes", "--checkout-url", url]
    status = main([*argv, "--scenario", "burst", "--junit", str(junit), "--report", str(page)])
    captured = capsys.readouterr()
    assert status == 3
    assert "verdict: UNVERIFIED (1 of 1 scenarios could not be judged: not a pass)" in captured.out
    assert "not verified: the burst sold nothing" in captured.out
    assert "burst UNVERIFIED 0/50 succeeded" in " ".join(captured.out.split())
    assert max(len(line) for line in captured.out.splitlines()) <= 80
    assert "stocksentry drill" in captured.err  # the progress, shown without -q
    assert "<error" in junit.read_text(encoding="utf-8")
    assert "UNVERIFIED" in page.read_text(encoding="utf-8").upper()
    assert read_shop(pg) == (BEFORE, 0)


def test_callbacks_refused_are_unverified_and_a_checkout_first_is_sent(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = pg_shop
    config = write_config(
        tmp_path, port, pg.raw_url, callback=("/callback/unsafe", "/callback/nope")
    )
    status, report, _ = run_json(capsys, config, "--scenario", "duplicate_callback")
    result = scenario(report, "duplicate_callback")
    assert status == 3, report
    assert result["verdict"] == "unverified"
    assert result["accepted"] == 0

    # A shop whose callback pays the order its checkout made (the lab's check-then-insert
    # finds it): the checkout goes first, and the deliveries order nothing more.
    config = write_config(
        tmp_path,
        port,
        pg.raw_url,
        after_checkout=(
            "  stale_threshold:",
            "  callback_after_checkout: true\n  stale_threshold:",
        ),
    )
    url = f"http://127.0.0.1:{port}/checkout/atomic"
    argv = ("--scenario", "duplicate_callback", "--checkout-url", url)
    status, report, _ = run_json(capsys, config, *argv)
    result = scenario(report, "duplicate_callback")
    assert status == 0, report
    # One order per payment reference: the checkout's, the callbacks found it.
    assert (result["duplicated_keys"], result["units_sold"]) == (0, 5)
    assert read_shop(pg)[0] == BEFORE


def test_stale_availability_that_cannot_sell_out_or_be_read_is_unverified(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = pg_shop
    live = ("availability/stale_cache", "availability/atomic")
    config = write_config(tmp_path, port, pg.raw_url, live=live)
    refused = f"http://127.0.0.1:{port}/checkout/no_such_strategy"
    args = ("--scenario", "stale_availability")
    status, report, _ = run_json(capsys, config, *args, "--checkout-url", refused)
    result = scenario(report, "stale_availability")
    assert status == 3, report
    assert "did not sell out a stock of 10" in result["unverified"]

    # A field the availability answer does not hold: unreadable, not "sold out".
    field = ("  availability:\n", "  availability:\n    json_field: in_stock\n")
    config = write_config(tmp_path, port, pg.raw_url, live=live, field=field)
    text = config.read_text()
    status, report, _ = run_json(capsys, config, *args, "--checkout-url", refused)
    assert status == 3, report
    assert (
        "without a usable 'in_stock' field" in scenario(report, "stale_availability")["unverified"]
    )

    # A number (the units shown) instead of a flag: above zero is available.
    config.write_text(text.replace("json_field: in_stock", "json_field: stock"), "utf-8")
    url = f"http://127.0.0.1:{port}/checkout/atomic"
    status, report, _ = run_json(capsys, config, *args, "--checkout-url", url)
    assert status == 0, report
    assert scenario(report, "stale_availability")["stale_window_ms"] is not None
    assert read_shop(pg)[0] == BEFORE


# --- the reset and the database -----------------------------------------------------------


def test_a_failing_reset_request_is_unverified_and_the_stock_not_restored_is_said(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = pg_shop
    reset = (
        "  success:",
        f"  reset:\n    method: PUT\n    url: http://127.0.0.1:{port}/no_such_stock\n"
        '    body: \'{"sku": "{sku}", "stock": {qty}}\'\n  success:',
    )
    config = write_config(tmp_path, port, pg.raw_url, reset=reset)
    status, report, err = run_json(capsys, config, "--scenario", "burst")
    assert status == 3
    assert "the shop's reset request failed: status 404" in scenario(report, "burst")["unverified"]
    assert "could NOT be restored" in report["restored"]
    assert "warning: the stock of LAB-DRILL could NOT be restored to 3" in err
    assert read_shop(pg) == (BEFORE, 0)

    # A reset that answers 200 but sets nothing: the stock read back says so.
    config = write_config(
        tmp_path,
        port,
        pg.raw_url,
        reset=(reset[0], reset[1].replace("PUT", "GET").replace("/no_such_stock", "/metrics")),
    )
    status, report, _ = run_json(capsys, config, "--scenario", "burst")
    assert status == 3
    assert "the stock was set to 10 but reads 3" in scenario(report, "burst")["unverified"]
    assert read_shop(pg) == (BEFORE, 0)


def test_the_drill_sku_gone_mid_drill_is_unverified_and_not_restored(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone renames the drill SKU during the burst: the verdict cannot be read, and the
    stock cannot be put back: both said, neither a crash."""
    port, served = shop
    config = write_config(tmp_path, port, db.raw_url)
    checkout = served.checkout
    renamed = threading.Event()

    def rename_then_checkout(*args: Any) -> Any:
        if not renamed.is_set():
            renamed.set()
            with served.engine.begin() as conn:
                conn.execute(
                    sa.text("UPDATE products SET sku = 'RENAMED' WHERE sku = :sku"),
                    {"sku": DRILL_SKU},
                )
        return checkout(*args)

    served.checkout = rename_then_checkout
    url = f"http://127.0.0.1:{port}/checkout/atomic"
    status, report, err = run_json(capsys, config, "--scenario", "burst", "--checkout-url", url)
    assert status == 3, report
    assert "product 'LAB-DRILL' is gone" in scenario(report, "burst")["unverified"]
    assert "could NOT be restored" in err


def test_no_such_product_is_exit_2_and_nothing_sent(
    db: Db, shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = shop
    config = write_config(tmp_path, port, db.raw_url, sku=(f"sku: {DRILL_SKU}", "sku: NO-SUCH"))
    assert main(["drill", "--config", str(config), "--yes", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no product 'NO-SUCH'" in err
    assert read_shop(db) == (BEFORE, 0)


@pytest.mark.parametrize("table", ["products", "orders"])
def test_a_table_the_database_lacks_is_unverified_nothing_sent(
    db: Db,
    shop: tuple[int, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    table: str,
) -> None:
    port, _ = shop
    mapping = ("schema:\n", f"schema:\n  {table}:\n    table: no_such_{table}\n")
    config = write_config(tmp_path, port, db.raw_url, mapping=mapping)
    if table == "orders":  # one orders section: the mapping of its table and its key
        text = config.read_text().replace("  orders:\n    idempotency_key", "    idempotency_key")
        config.write_text(text, encoding="utf-8")
    status, report, err = run_json(capsys, config)
    assert status == 3, report
    assert [s["verdict"] for s in report["scenarios"]] == ["unverified", "unverified"]
    assert f"no_such_{table}" in report["restored"]
    assert "cannot verify" in err
    assert read_shop(db) == (BEFORE, 0)


def test_junit_that_cannot_be_written_is_one_line(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = pg_shop
    config = write_config(tmp_path, port, pg.raw_url)
    where = tmp_path / "no_such_dir" / "drill.xml"
    url = f"http://127.0.0.1:{port}/checkout/atomic"
    argv = ["drill", "--config", str(config), "--yes", "-q", "--scenario", "burst"]
    assert main([*argv, "--checkout-url", url, "--junit", str(where)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--junit: cannot write {where}: No such file or directory" in err


# --- the monitoring -----------------------------------------------------------------------


class Monitor:
    """A little HTTP server answering fixed ``(status, body)`` per path: a /metrics page
    without stocksentry's metrics, a page that is not Prometheus's, a wrong alerts API."""

    def __init__(self, pages: dict[str, tuple[int, bytes]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name for it
                status, body = pages.get(self.path, (404, b"not found"))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass  # quiet: pytest shows stderr of failures

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def monitor() -> Iterator[Monitor]:
    pages = {
        "/plain": (200, b"# TYPE up gauge\nup 1\n"),
        "/garbage": (200, b"this is { not prometheus\n"),
        "/api/v1/alerts": (200, b'{"status": "success", "data": {"nothing": []}}'),
    }
    server = Monitor(pages)
    yield server
    server.close()


@pytest.mark.parametrize(
    ("watch", "failure"),
    [
        ("metrics_url: {monitor}/missing", "the monitor is off: {monitor}/missing answered 404"),
        ("metrics_url: {monitor}/plain", "the monitor is off: no stocksentry metrics at"),
        (
            "metrics_url: {monitor}/garbage",
            "the monitor is off: {monitor}/garbage is not a Prometheus text page",
        ),
        (
            "prometheus_url: {monitor}",
            "the alerts cannot be read: {monitor}/api/v1/alerts did not answer Prometheus's",
        ),
    ],
    ids=["404", "no-stocksentry-metrics", "not-prometheus", "not-an-alerts-document"],
)
def test_a_monitor_that_is_off_or_unreadable_fails_observability(
    pg: Db,
    pg_shop: tuple[int, Any],
    monitor: Monitor,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    watch: str,
    failure: str,
) -> None:
    port, _ = pg_shop
    config = write_config(
        tmp_path,
        port,
        pg.raw_url,
        watch=(f"metrics_url: http://127.0.0.1:{port}/metrics", watch.format(monitor=monitor.url)),
    )
    status, report, _ = run_json(capsys, config, "--scenario", "observability")
    result = scenario(report, "observability")
    assert status == 1, report
    assert result["verdict"] == "fail"
    assert result["failures"][0].startswith(failure.format(monitor=monitor.url)), result


def test_observability_in_the_terminal_report_names_what_was_seen(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = pg_shop
    config = write_config(tmp_path, port, pg.raw_url)
    argv = ["drill", "--config", str(config), "--yes", "-q"]
    assert main([*argv, "--scenario", "observability"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "observability PASS nothing to see; monitor on, lock waits" in out

    # The scenarios run in the order given: the burst first, then what the monitor saw.
    url = f"http://127.0.0.1:{port}/checkout/unsafe"
    scenarios = ("--scenario", "burst", "--scenario", "observability")
    assert main([*argv, *scenarios, "--checkout-url", url]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "observability PASS oversell: stock_unsafe_read_modify_write_total" in out
    assert read_shop(pg)[0] == BEFORE


# --- freeze: the exporter config, and the webhook's limits --------------------------------


def test_freeze_with_a_bad_exporter_config_is_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text(f"containment:\n  url: {REDIS_URL}\n  mode: sometimes\n")
    assert main(["freeze", "EGG-01", "--reason", "r", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{config}:3: containment.mode" in err


Sidecar = Callable[..., Awaitable[tuple[Any, str]]]


@pytest.fixture
def sidecar(aiohttp_client: AiohttpClient, redis_prefix: str) -> Sidecar:
    """Builds the sidecar's app with a containment section of the given extra lines;
    returns the client and the freeze key template."""

    async def build(*lines: str) -> tuple[Any, str]:
        template = redis_prefix + "freeze:{sku}"
        head = [f"  url: {REDIS_URL}", f"  key_template: '{template}'"]
        config = parse_config("containment:\n" + "\n".join([*head, *lines]) + "\n")
        assert config.containment is not None
        containment = Containment(config.containment)
        app = create_app(
            ServerSettings(listen_address="127.0.0.1", port=0),
            collectors=[containment],
            background=[containment.cleanup_ctx],
            routes=containment.routes(),
        )
        return await aiohttp_client(app), template

    return build


def frozen(template: str) -> list[str]:
    store = redis.Redis.from_url(REDIS_URL)
    try:
        return sorted(read_frozen(store, template))
    finally:
        store.close()


async def test_a_chunked_body_over_the_limit_is_413_and_freezes_nothing(
    sidecar: Sidecar,
) -> None:
    """No Content-Length to refuse it by: the limit holds while the body is read."""
    client, template = await sidecar("  mode: enforce", "  max_body_bytes: 1024")

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"alerts": [{"labels": {"alertname": "StockOversold", "sku": "EGG-01"}}'
        for _ in range(64):
            yield b" " * 1024
        yield b"]}"

    response = await client.post(WEBHOOK_PATH, data=chunks())
    assert response.status == 413
    assert "over the limit of 1024 bytes" in (await response.json())["error"]
    assert frozen(template) == []


async def test_too_many_alerts_in_one_body_is_413(sidecar: Sidecar) -> None:
    client, template = await sidecar("  mode: enforce")
    alert = {"labels": {"alertname": "StockOversold", "sku": "EGG-01"}}
    response = await client.post(WEBHOOK_PATH, json={"alerts": [alert] * (MAX_ALERTS + 1)})
    assert response.status == 413
    assert f"{MAX_ALERTS + 1} alerts in one notification" in (await response.json())["error"]
    assert frozen(template) == []


async def test_dry_run_with_unfreeze_on_resolved_lifts_nothing(sidecar: Sidecar) -> None:
    client, template = await sidecar("  unfreeze_on_resolved: true")
    store = redis.Redis.from_url(REDIS_URL)
    freeze_sku(store, "EGG-01", reason="auto", source="alert", ttl=60, key_template=template)
    store.close()
    labels = {"alertname": "StockOversold", "sku": "EGG-01"}
    response = await client.post(
        WEBHOOK_PATH, json={"alerts": [{"status": "resolved", "labels": labels}]}
    )
    assert response.status == 200
    expected = {"alert": "StockOversold", "sku": "EGG-01", "action": "dry_run"}
    assert (await response.json())["results"] == [expected]
    assert frozen(template) == ["EGG-01"]


def test_a_freeze_without_a_login_name_still_freezes(
    redis_prefix: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container user with no passwd entry (an arbitrary UID): the freeze goes on, by
    nobody named, rather than failing with a traceback."""
    import getpass

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 1000640000")

    monkeypatch.setattr(getpass, "getuser", no_user)
    template = redis_prefix + "f:{sku}"
    argv = ["freeze", "EGG-01", "--reason", "r", "--redis-url", REDIS_URL]
    assert main([*argv, "--key-template", template]) == 0
    assert capsys.readouterr().out == "EGG-01: frozen until unfrozen: r\n"
    store = redis.Redis.from_url(REDIS_URL)
    assert read_frozen(store, template)["EGG-01"].by == ""
    store.close()


def test_retry_and_callbacks_without_a_key_column_are_unverified(
    pg: Db, pg_shop: tuple[int, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, _ = pg_shop
    unmapped = (
        "  orders:\n    idempotency_key: idempotency_key",
        "  orders:\n    idempotency_key: null\n    external_ref: null",
    )
    config = write_config(tmp_path, port, pg.raw_url, unmapped=unmapped)
    args = ("--scenario", "retry", "--scenario", "duplicate_callback")
    status, report, _ = run_json(capsys, config, *args)
    assert status == 3
    assert "nor external_ref is mapped" in scenario(report, "retry")["unverified"]
    assert "external_ref mapped" in scenario(report, "duplicate_callback")["unverified"]
    assert read_shop(pg) == (BEFORE, 0)
