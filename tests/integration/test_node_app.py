"""A Node.js checkout with no stocksentry code, caught by the sidecar alone.

tests/node/app.js is written like the incident's service: a read-then-write of the stock
(pg), a naive ``SET lock NX EX`` (ioredis) whose holder works longer than the TTL and runs
``DEL`` in ``finally``, and a redlock version that extends its owned lease. It runs
against a database of its own on the real PostgreSQL and a private redis-server, with the
sidecar (database probes and the lock watcher) scraped by a real Prometheus evaluating the
project's rules:

- the naive lock's expiry and the foreign release fire StockLockExpiredWhileHeld and
  StockLockReleaseNotOwned from the watcher's series, the oversell fires StockOversold
  from the probes, and ``stocksentry timeline`` over the app's stdout flags the lost
  updates;
- the redlock version raises none of the lock alerts;
- the app's prom-client metrics pass ``stocksentry check-metrics``; a deliberately wrong
  variant fails it, naming the metric.

The npm install runs once from the committed lock file (``npm ci``, bounded in time) into
tests/node/node_modules (gitignored), and is skipped while the lock file is unchanged.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from exportercli import CLI, write_exporter_config
from polling import http_ok, wait_until
from privateredis import PrivateRedis, free_port
from processes import stop
from prom import Prometheus
from prometheus_client.parser import text_string_to_metric_families
from services import PG_SERVER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
RULES = ROOT / "alert_rules" / "stocksentry.rules.yml"
#: The naive lock's lease and the work done under it: the work outlives the lease.
LOCK_TTL_S = 1
WORK_MS = 1300
LOCK_ALERTS = ("StockLockExpiredWhileHeld", "StockLockReleaseNotOwned")
NPM_TIMEOUT_S = 300


def install_node_modules() -> None:
    """``npm ci`` from the committed lock file, unless node_modules already matches it."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError("node and npm are needed for the Node.js tests (Node 20)")
    digest = hashlib.sha256((NODE_DIR / "package-lock.json").read_bytes()).hexdigest()
    stamp = NODE_DIR / "node_modules" / ".stocksentry-lock-sha256"
    # `make test` runs test files on several workers, and `npm ci` starts by deleting
    # node_modules: one install at a time, the stamp checked under the same lock.
    with open(NODE_DIR / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and stamp.read_text() == digest:
            return
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
            timeout=NPM_TIMEOUT_S,
            capture_output=True,
        )
        stamp.write_text(digest)


@dataclass
class Shop:
    """Everything one module run shares: database, Redis, sidecar, Prometheus."""

    database_url: str
    redis: PrivateRedis
    sidecar_port: int
    prometheus: Prometheus
    tmp: Path
    apps: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def add_product(self, sku: str, stock: int) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO products (sku, available_stock, initial_stock) VALUES (%s, %s, %s)",
                (sku, stock, stock),
            )

    def start_app(self, strategy: str, metrics: str = "off") -> tuple[str, Path]:
        """Start app.js; returns its base URL and the file its stdout (logs) goes to."""
        port = free_port()
        log = self.tmp / f"app-{strategy}-{metrics}-{port}.log"
        env = {
            **os.environ,
            "PORT": str(port),
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis.url,
            "STRATEGY": strategy,
            "LOCK_TTL_S": str(LOCK_TTL_S),
            "WORK_MS": str(WORK_MS),
            "METRICS": metrics,
        }
        with log.open("wb") as out:
            process = subprocess.Popen(
                [shutil.which("node") or "node", "app.js"],
                cwd=NODE_DIR,
                env=env,
                stdout=out,
                stderr=subprocess.PIPE,
            )
        self.apps.append(process)
        url = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: process.poll() is not None or http_ok(f"{url}/healthz"),
            timeout=20,
            message="app.js listening",
        )
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        return url, log


def _checkout(url: str, sku: str, request_id: str) -> int:
    request = urllib.request.Request(
        f"{url}/checkout?sku={sku}&request_id={request_id}", method="POST", data=b""
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def buy(url: str, sku: str, buyers: int) -> list[int]:
    """``buyers`` concurrent checkouts of ``sku``; their HTTP statuses."""
    with ThreadPoolExecutor(buyers) as pool:
        futures = [pool.submit(_checkout, url, sku, f"{sku}-R{n}") for n in range(1, buyers + 1)]
        return sorted(f.result() for f in futures)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    install_node_modules()
    tmp = tmp_path_factory.mktemp("node-shop")
    name = f"stocksentry_node_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    database_url = PG_SERVER.rpartition("/")[0] + f"/{name}"
    sidecar: subprocess.Popen[bytes] | None = None
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute((NODE_DIR / "schema.sql").read_text())
        with PrivateRedis() as private_redis:
            port = free_port()
            more = f"""
sku_guard:
  promo_skus: [EGG-01, MILK-01]
lock_watch:
  url: {private_redis.url}
  patterns: ["lock:product:{{sku}}"]
  configure_notifications: true
"""
            config = write_exporter_config(tmp, port, more=more)
            sidecar_log = (tmp / "sidecar.log").open("wb")
            sidecar = subprocess.Popen(
                [*CLI, "exporter", "--config", str(config)],
                env={**os.environ, "STOCKSENTRY_DATABASE_URL": database_url},
                stdout=sidecar_log,
                stderr=subprocess.STDOUT,
            )
            wait_until(
                lambda: sidecar.poll() is not None or http_ok(f"http://127.0.0.1:{port}/readyz"),
                timeout=30,
                message="sidecar ready",
            )
            assert sidecar.poll() is None, (tmp / "sidecar.log").read_text()
            with Prometheus(
                targets={"stocksentry": [f"127.0.0.1:{port}"]}, rule_files=[RULES]
            ) as prometheus:
                prometheus.wait_for_targets_up("stocksentry")
                prometheus.wait_for("stocksentry_lockwatch_connected == 1")
                shop = Shop(database_url, private_redis, port, prometheus, tmp)
                try:
                    yield shop
                finally:
                    for app in shop.apps:
                        stop(app)
    finally:
        if sidecar is not None:
            stop(sidecar)
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _alerts(prometheus: Prometheus, name: str, **labels: str) -> list[dict[str, Any]]:
    return [
        a
        for a in prometheus.alerts(state="firing")
        if a["labels"]["alertname"] == name
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


class FirstExpiry:
    """Records the wall time of the first ``expired`` notification of one key."""

    def __init__(self, url: str, key: str) -> None:
        self.at: float | None = None
        self._client = redis.Redis.from_url(url)
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(f"__keyspace@0__:{key}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and self.at is None:
            message = self._pubsub.get_message(timeout=0.2)
            if message is not None and message["data"] == b"expired":
                self.at = time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()
        self._client.close()


def _metric(prometheus: Prometheus, expr: str) -> float:
    result = prometheus.query(expr)
    return float(result[0]["value"][1]) if result else 0.0


def test_redlock_version_raises_no_lock_alert(shop: Shop) -> None:
    shop.add_product("MILK-01", 2)
    url, _ = shop.start_app("redlock")
    statuses = buy(url, "MILK-01", 4)
    # Owned, extended leases serialise the buyers: two sold, two refused, no oversell.
    assert statuses == [200, 200, 409, 409]
    lock = 'lock="lock:product:MILK-01"'
    prometheus = shop.prometheus
    prometheus.wait_for(f"stock_lock_acquisitions_total{{{lock}}} >= 4", timeout=15)
    # Several evaluations after the last release: the series are there, at zero.
    time.sleep(3)
    assert _metric(prometheus, f"stock_lock_expired_while_held_total{{{lock}}}") == 0
    assert _metric(prometheus, f"stock_lock_release_not_owned_total{{{lock}}}") == 0
    assert (
        _metric(
            prometheus,
            f"histogram_quantile(1, sum by (le) (rate(stock_lock_hold_ratio_bucket{{{lock}}}[1m])))",  # noqa: E501
        )
        <= 1.0
    )
    for name in LOCK_ALERTS:
        assert _alerts(prometheus, name, lock="lock:product:MILK-01") == []
    assert _alerts(prometheus, "StockOversold", sku="MILK-01") == []


def test_naive_lock_is_alerted_by_the_watcher_and_the_oversell_by_the_probes(
    shop: Shop, record_property: Callable[[str, object], None]
) -> None:
    shop.add_product("EGG-01", 2)
    url, log = shop.start_app("naive", metrics="contract")
    first_expiry = FirstExpiry(shop.redis.url, "lock:product:EGG-01")
    prometheus = shop.prometheus
    try:
        # The alert is watched while the buyers are still in checkout.
        with ThreadPoolExecutor(1) as background:
            buying = background.submit(buy, url, "EGG-01", 4)
            firing = wait_until(
                lambda: _alerts(
                    prometheus, "StockLockExpiredWhileHeld", lock="lock:product:EGG-01"
                ),
                timeout=20,
                message="StockLockExpiredWhileHeld firing",
            )
            seen_at = time.time()
            # Every buyer got in: the lock did not exclude them; 4 units of 2 were sold.
            assert buying.result(timeout=60) == [200, 200, 200, 200]
        assert first_expiry.at is not None
    finally:
        first_expiry.close()
    active_at = dt.datetime.fromisoformat(firing[0]["activeAt"].replace("Z", "+00:00")).timestamp()
    delay = active_at - first_expiry.at
    record_property("expired_lease_to_alert_active_s", round(delay, 2))
    record_property("expired_lease_to_alert_seen_s", round(seen_at - first_expiry.at, 2))
    print(
        f"\nfirst expired lease -> StockLockExpiredWhileHeld active {delay:.2f} s, "
        f"seen firing by the test {seen_at - first_expiry.at:.2f} s"
    )
    wait_until(
        lambda: _alerts(prometheus, "StockLockReleaseNotOwned", lock="lock:product:EGG-01"),
        timeout=20,
        message="StockLockReleaseNotOwned firing",
    )
    wait_until(
        lambda: _alerts(prometheus, "StockOversold", sku="EGG-01"),
        timeout=20,
        message="StockOversold firing",
    )
    # The probe's figure is the database's: paid units beyond the allocation of 2.
    with psycopg.connect(shop.database_url) as conn:
        row = conn.execute(
            "SELECT sum(i.quantity) - min(p.initial_stock) FROM order_items i "
            "JOIN orders o ON o.id = i.order_id JOIN products p ON p.id = i.product_id "
            "WHERE p.sku = 'EGG-01' AND o.status = 'PAID'"
        ).fetchone()
    assert row is not None
    assert row[0] == 2
    wait_until(
        lambda: _metric(prometheus, 'stock_oversold_units{sku="EGG-01"}'),
        timeout=10,
        accept=lambda units: units == row[0],
        message="stock_oversold_units equal to the SQL ground truth",
    )
    # The redlock SKU stayed quiet while the naive one fired.
    for name in LOCK_ALERTS:
        assert _alerts(prometheus, name, lock="lock:product:MILK-01") == []

    # The timeline over the app's own stdout flags the lost updates.
    done = subprocess.run(
        [*CLI, "timeline", str(log), "--sku", "EGG-01", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    lost = [f for f in report["findings"] if f["kind"] == "lost_update"]
    assert lost, report["findings"]
    assert {f["sku"] for f in lost} == {"EGG-01"}

    # The same app's prom-client metrics follow the contract.
    check = subprocess.run(
        [*CLI, "check-metrics", f"{url}/metrics"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "conforms to the metric contract" in check.stdout


def _sidecar_sample(shop: Shop, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{shop.sidecar_port}/metrics") as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _at(event: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_the_naive_lock_cascade_is_counted_link_by_link(shop: Shop) -> None:
    """Eight buyers through the naive lock: after the first expiry, each holder's DEL
    removes the next holder's lock and the next buyer takes it at once. The app's log says
    whose lock each DEL removed (the truth); the sidecar's watcher, outside, counts the
    links whose DEL came within the first half of the victim's lease (what keyspace
    notifications can show, docs/lockwatch.md) — more than the first one."""
    sku, buyers = "CASCADE-01", 8
    lock = f"lock:product:{sku}"
    shop.add_product(sku, 100)
    url, log = shop.start_app("naive")
    assert buy(url, sku, buyers) == [200] * buyers
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    acquired = {
        e["token"]: _at(e) for e in events if e["event"] == "lock_acquired" and e["sku"] == sku
    }
    released = [e for e in events if e["event"] == "lock_released" and e["sku"] == sku]
    foreign = [e for e in released if e["deleted_other"]]
    held = sorted(round(_at(e) - acquired[e["deleted"]], 3) for e in foreign)
    early = [h for h in held if h < 0.5 * LOCK_TTL_S]
    wait_until(
        lambda: _sidecar_sample(shop, "stock_lock_acquisitions_total", lock=lock),
        timeout=15,
        accept=lambda n: n == buyers,
        message="every acquisition seen by the watcher",
    )
    time.sleep(0.5)  # the last DEL's notification
    counted = _sidecar_sample(shop, "stock_lock_release_not_owned_total", lock=lock)
    expired = _sidecar_sample(shop, "stock_lock_expired_while_held_total", lock=lock)
    print(
        f"\nnaive lock cascade, {buyers} buyers (TTL {LOCK_TTL_S} s, work {WORK_MS} ms): "
        f"{len(foreign)} foreign DELs in truth (victim's lease age at the DEL: {held} s), "
        f"{len(early)} within half the TTL; watcher counted {counted:g} release(s) not "
        f"owned and {expired:g} expiries"
    )
    # A cascade: more early links than the one right after the first expiry.
    assert len(early) >= 2
    # Every early link counted, nothing else: a DEL at the end of the victim's lease looks
    # like its own release. (Lease ages fall near 0.3 s and 1 s, far from the 0.5 s
    # boundary; the bounds allow 50 ms of clock difference between the app and Redis.)
    assert len([h for h in held if h < 0.45 * LOCK_TTL_S]) <= counted
    assert counted <= len([h for h in held if h < 0.55 * LOCK_TTL_S])


def test_a_wrong_prom_client_variant_fails_check_metrics_naming_the_metric(shop: Shop) -> None:
    shop.add_product("SOLD-OUT", 0)
    shop.add_product("BREAD-01", 5)
    url, _ = shop.start_app("unlocked", metrics="wrong")
    assert buy(url, "BREAD-01", 1) == [200]
    assert buy(url, "SOLD-OUT", 1) == [409]
    check = subprocess.run(
        [*CLI, "check-metrics", f"{url}/metrics", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 1, check.stdout + check.stderr
    problems = {(p["kind"], p["metric"]) for p in json.loads(check.stdout)["problems"]}
    assert problems == {
        ("mistyped", "stock_orders_paid_total"),
        ("unbounded", "stock_reservation_conflict_total"),
    }
    text = subprocess.run(
        [*CLI, "check-metrics", f"{url}/metrics"], capture_output=True, text=True, timeout=60
    )
    assert text.returncode == 1
    assert "MISTYPED  stock_orders_paid_total: declared gauge" in text.stdout
    assert "reason='sold_out' not one of out_of_stock" in text.stdout


#: The exporter dashboard's lock watcher row, and its variables as Grafana fills them.
WATCHER_PANELS = (
    "Lock watcher subscribed",
    "Keyspace notification flags",
    "Lock notifications",
    "Lock acquisitions, expiries and foreign releases",
    "Leases the watcher lost",
)
VARIABLES = {
    "__rate_interval": "1m",
    "__range": "5m",
    "__interval": "1s",
    "cluster": ".*",
    "namespace": ".*",
    "job": "stocksentry",
}


def test_the_dashboards_lock_watcher_row_shows_the_watchers_series(shop: Shop) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from dashboards import lint

    board = json.loads((ROOT / "dashboards" / "stocksentry-exporter.json").read_text())
    panels = {p["title"]: p for p in lint.iter_panels(board) if p["title"] in WATCHER_PANELS}
    assert sorted(panels) == sorted(WATCHER_PANELS)
    queries = [
        (title, target["refId"], lint.substitute(target["expr"], VARIABLES))
        for title, panel in panels.items()
        for target in panel["targets"]
    ]

    def empty() -> list[tuple[str, str]]:
        return [(title, ref) for title, ref, expr in queries if not shop.prometheus.query(expr)]

    wait_until(empty, accept=lambda found: found == [], timeout=30, interval=0.5)
