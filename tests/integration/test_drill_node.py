"""`stocksentry drill` against the Node.js checkout of tests/node (no stocksentry code in
it): the read-then-write version oversells under the burst, the redlock version does not.
The drill takes its request as the app does (query parameters, an empty body) and reads
the shop's tables through the default schema mapping."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from polling import http_ok, wait_until
from privateredis import PrivateRedis, free_port
from processes import stop
from services import PG_SERVER
from stocksentry.exporter.cli import main
from test_node_app import NODE_DIR, install_node_modules

pytestmark = pytest.mark.integration

SKU = "EGG-DRILL"
BEFORE = 4


@pytest.fixture
def node_shop() -> Iterator[tuple[str, dict[str, str]]]:
    """A fresh database with the app's schema and the drill SKU, and app.js running
    unlocked and with redlock; yields the database URL and each strategy's base URL."""
    install_node_modules()
    name = f"stocksentry_drill_node_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database_url = PG_SERVER.rpartition("/")[0] + f"/{name}"
    apps: list[subprocess.Popen[bytes]] = []
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute((NODE_DIR / "schema.sql").read_text())
            conn.execute(
                "INSERT INTO products (sku, available_stock, initial_stock) VALUES (%s, %s, %s)",
                (SKU, BEFORE, BEFORE),
            )
        with PrivateRedis() as private_redis:
            urls = {}
            for strategy in ("unlocked", "redlock"):
                port = free_port()
                env = {
                    **os.environ,
                    "PORT": str(port),
                    "DATABASE_URL": database_url,
                    "REDIS_URL": private_redis.url,
                    "STRATEGY": strategy,
                    "LOCK_TTL_S": "2",
                    "WORK_MS": "30",
                    "METRICS": "off",
                }
                app = subprocess.Popen(
                    [shutil.which("node") or "node", "app.js"],
                    cwd=NODE_DIR,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                apps.append(app)
                urls[strategy] = f"http://127.0.0.1:{port}"
                wait_until(
                    lambda app=app, port=port: (
                        app.poll() is not None or http_ok(f"http://127.0.0.1:{port}/healthz")
                    ),
                    timeout=20,
                    message="app.js listening",
                )
                assert app.poll() is None
            yield database_url, urls
    finally:
        for app in apps:
            stop(app)
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_node_read_then_write_fails_the_burst_redlock_passes(
    node_shop: tuple[str, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database_url, urls = node_shop
    config = tmp_path / "drill.yaml"
    config.write_text(
        f"""\
target:
  checkout:
    url: {urls["unlocked"]}/checkout?sku={{sku}}&request_id={{request_id}}
  success:
    status: [200]
    json_field: ok
  timeout: 60s
database:
  url: {database_url}
drill:
  sku: {SKU}
  stock: 5
  requests: 20
  concurrency: 20
  scenarios: [burst]
""",
        encoding="utf-8",
    )
    verdicts = {}
    for strategy, url in urls.items():
        checkout = f"{url}/checkout?sku={{sku}}&request_id={{request_id}}"
        status = main(
            [
                "drill",
                "--config",
                str(config),
                "--yes",
                "--format",
                "json",
                "--checkout-url",
                checkout,
            ]
        )
        report = json.loads(capsys.readouterr().out)
        verdicts[strategy] = (status, report["scenarios"][0])
    status, burst = verdicts["unlocked"]
    assert status == 1
    assert burst["successes"] > burst["stock"] == 5
    assert burst["oversold"] > 0
    status, burst = verdicts["redlock"]
    assert status == 0, burst
    assert (burst["successes"], burst["final_stock"], burst["units_sold"]) == (5, 0, 5)
    with psycopg.connect(database_url) as conn:
        stock = conn.execute(
            "SELECT available_stock FROM products WHERE sku = %s", (SKU,)
        ).fetchone()
    assert stock == (BEFORE,)
