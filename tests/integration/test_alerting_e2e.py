"""End to end: the lab oversells, the real rules fire, the example routing pages on-call.

Everything runs for real, on loopback, with short intervals:

- a webhook receiver of the test's own (aiohttp, in a thread with its own event loop) that
  records each delivery, the moment it arrived, and the receiver it was meant for: one
  path per Alertmanager receiver, ``/hook/<receiver>``;
- Alertmanager with a copy of ``alert_rules/alertmanager.example.yml``: its route tree and
  inhibit rules as they are, each receiver's integrations replaced by a webhook to
  ``/hook/<receiver>``, and ``group_wait`` / ``group_interval`` cut to 1 s;
- Prometheus (``prom.py``) with the real rules, rendered by ``alert_rules/render.py`` with
  a Grafana address (so the alerts carry their ``dashboard_url``), scraping
  and evaluating every second: the lab as job ``stocksentry-lab``, the exporter as job
  ``stocksentry``;
- ``stocksentry exporter`` probing the lab's PostgreSQL database every 0.5 s, with the
  products' ``initial_stock`` mapped as the allocation;
- ``stocksentry demo``, the flash-sale lab: 200 buyers, 40 units.

The unsafe strategy (``check_then_decrement``) must page on-call with StockNegativeInventory,
StockOversold and StockNegativeWrite, with exact labels, through the receiver the example
routes critical checkout alerts to. The seconds from the lab's start, from its start of
selling and from its first negative write to each page are printed (run pytest with ``-s``) and
written to ``detection-delays.json`` in the test's tmp path; they are held under a generous
bound, not benchmarked. The safe strategies (``atomic``, ``for_update``) must leave every
alert quiet, in Prometheus and at the receiver.

Each failure mode of the lab fires its own alert (``test_each_failure_mode_fires_its_own_alert``,
one fresh stack per mode): the alerts it must fire, the ones allowed alongside (consequences
of the same failure), the SKU they name, and the seconds from the start of selling to each
alert's firing, which ``benchmarks/alert_delays.py`` repeats and tabulates. The redlock
strategy (a read-modify-write writing the computed value, inside the lab's owned lock or
pottery's Redlock) and the idempotent retry fire nothing, like atomic and FOR UPDATE, and
the detector's ``stock_unsafe_read_modify_write_total`` stays 0.

A burst of negative writes between two scrapes, a series first scraped at its full count,
is exactly what the lab produces, and the rules' newborn-series half (alert_rules/
README.md, "Counters born at their full count") counts it when, a window (5 minutes)
earlier, its target was scraped successfully, or Prometheus was scraping other targets and
this one is new. The test's Prometheus is seconds old: it has no ``up`` of any target from
5 minutes ago, which the guard cannot tell from a Prometheus that restarts after a gap, so
it counts no newborn series at all, on an old target or a new one. A checkout app in
production has been scraped for hours before its sale: so Prometheus starts with twenty
minutes of ``up`` = 1 history for the lab's target, backfilled with promtool, and the lab's
newborn series count as on a target scraped 5 (10, 15) minutes ago. Nothing else is
backfilled.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from aiohttp import web
from exportercli import ALLOCATION, CLI, write_exporter_config
from polling import WaitTimeout, http_ok, wait_until
from processes import stop
from prom import Prometheus, free_port, openmetrics_history

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The rules as a shop renders them with its Grafana address (alert_rules/render.py).
GRAFANA = "https://grafana.shop.example"
AM_EXAMPLE = ROOT / "alert_rules" / "alertmanager.example.yml"

LAB_JOB = "stocksentry-lab"
EXPORTER_JOB = "stocksentry"  # the job the health alerts select on
UNSAFE_SKU = "LAB-CHECK_THEN_DECREMENT"
#: Seconds an alert may take from the lab's start to the receiver: a bound that catches a
#: broken pipeline, far above the few seconds it takes (1 s scrapes, evaluations, group_wait).
DETECTION_BOUND_S = 60.0
#: How long the lab keeps serving /metrics after its sale; the test stops it sooner.
LAB_LINGER_S = 120
#: Evaluations that must pass over the safe lab's final data before "nothing fired" counts.
QUIET_EVALUATIONS = 5
#: The test copy's group_wait and group_interval (the example's are 10 s to 5 m).
AM_GROUP_TIMING = "1s"


# --- the webhook receiver -------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One webhook call from Alertmanager."""

    receiver: str  # from the path, /hook/<receiver>
    at: float  # time.time() on arrival
    payload: dict[str, Any]


class WebhookReceiver:
    """An aiohttp server on 127.0.0.1 (a free port) in a thread with its own event loop."""

    def __init__(self) -> None:
        self.port = 0
        self._deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="webhook-receiver", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"webhook receiver did not start: {self._error!r}")

    def _run(self) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_post("/hook/{receiver}", self._hook)
        runner = web.AppRunner(app, access_log=None)
        try:
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
            self.port = int(runner.addresses[0][1])
        except BaseException as exc:  # handed to start(), which raises it
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(runner.cleanup())
            loop.close()

    async def _hook(self, request: web.Request) -> web.Response:
        payload = await request.json()
        with self._lock:
            self._deliveries.append(Delivery(request.match_info["receiver"], time.time(), payload))
        return web.Response(text="ok")

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def wait_for(
        self, check: Callable[[list[Delivery]], bool], timeout: float, what: str
    ) -> list[Delivery]:
        return wait_until(
            self.deliveries,
            accept=check,
            timeout=timeout,
            message=lambda got: f"{what}: not seen; got {_summary(got)}",
        )


def _summary(deliveries: Sequence[Delivery]) -> list[tuple[str, str, dict[str, str]]]:
    return [
        (d.receiver, a["status"], a["labels"]) for d in deliveries for a in d.payload["alerts"]
    ]


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    hook.start()
    try:
        yield hook
    finally:
        hook.stop()


# --- Alertmanager with the example's routes -------------------------------------------------


def _routes(route: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield route
    for child in route.get("routes", []):
        yield from _routes(child)


def derive_alertmanager_config(example: dict[str, Any], hook_base: str) -> dict[str, Any]:
    """The example config, pointed at the test's receiver.

    Kept as they are: the route tree (matchers, receivers, group_by, repeat_interval,
    nesting) and the inhibit rules. Replaced: each receiver's integrations (PagerDuty,
    Slack) by one webhook to ``<hook_base>/hook/<receiver name>``; the example's "null"
    receiver, which sends nowhere, gets one too, so that the test sees every routing
    decision. Shortened, in this test copy only: every ``group_wait`` and
    ``group_interval`` to 1 s (the example's 10 s to 5 m would make the test wait minutes
    for its first notification).
    """
    config = copy.deepcopy(example)
    for route in _routes(config["route"]):
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = AM_GROUP_TIMING
    config["receivers"] = [
        {
            "name": receiver["name"],
            "webhook_configs": [
                {"url": f"{hook_base}/hook/{receiver['name']}", "send_resolved": False}
            ],
        }
        for receiver in example["receivers"]
    ]
    return config


def _without_timing(route: dict[str, Any]) -> dict[str, Any]:
    trimmed = {k: v for k, v in route.items() if k not in ("group_wait", "group_interval")}
    if "routes" in route:
        trimmed["routes"] = [_without_timing(child) for child in route["routes"]]
    return trimmed


def oncall_pager(example: dict[str, Any]) -> str:
    """The receiver the example pages checkout's critical alerts to, read from its routes."""
    (checkout,) = [r for r in example["route"]["routes"] if r["matchers"] == ['team="checkout"']]
    (critical,) = [r for r in checkout["routes"] if r["matchers"] == ['severity="critical"']]
    return str(critical["receiver"])


@cache
def example_receiver(labels: frozenset[tuple[str, str]]) -> str:
    """Where the unmodified example routes an alert with ``labels``, according to amtool."""
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.fail("amtool is not on PATH: `make tools` installs it")
    done = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={AM_EXAMPLE}"]
        + [f"{k}={v}" for k, v in sorted(labels)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture
def alertmanager(tmp_path: Path, receiver: WebhookReceiver) -> Iterator[str]:
    """Alertmanager with the derived config; yields its ``host:port``."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.fail("Alertmanager is not on PATH: `make tools` installs it")
    example = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    config = derive_alertmanager_config(example, receiver.base)
    # The copy is the example, but for integrations and timing.
    assert _without_timing(config["route"]) == _without_timing(example["route"])
    assert config["inhibit_rules"] == example["inhibit_rules"]
    assert [r["name"] for r in config["receivers"]] == [r["name"] for r in example["receivers"]]
    work = tmp_path / "alertmanager"
    work.mkdir()
    config_file = work / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    port = free_port()
    with (work / "alertmanager.log").open("w") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.path={work}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_http_ok(
                f"http://127.0.0.1:{port}/-/ready",
                process,
                lambda: (work / "alertmanager.log").read_text(),
            )
            yield f"127.0.0.1:{port}"
        finally:
            stop(process)


def _wait_http_ok(
    url: str, process: subprocess.Popen[Any], log: Callable[[], str], timeout: float = 20
) -> None:
    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"{url} not ready (exit {process.poll()}):\n{log()}")
        return http_ok(url)

    try:
        wait_until(ready, timeout=timeout, interval=0.1)
    except WaitTimeout:
        pytest.fail(f"{url} not ready (exit {process.poll()}):\n{log()}")


def _am_alerts(address: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://{address}/api/v2/alerts", timeout=5) as response:
        return list(json.load(response))


# --- the lab and the exporter ---------------------------------------------------------------


class Processes:
    """Child processes with their output in files; all stopped at the end of the test."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self._running: list[tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = []

    def start(
        self, name: str, args: Sequence[str], env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        out = (self.work / f"{name}.out").open("wb")
        err = (self.work / f"{name}.err").open("wb")
        process = subprocess.Popen(list(args), env=env, stdout=out, stderr=err)
        self._running.append((process, out, err))
        return process

    def output(self, name: str) -> str:
        return (self.work / f"{name}.out").read_text(encoding="utf-8", errors="replace")

    def errors(self, name: str) -> str:
        return (self.work / f"{name}.err").read_text(encoding="utf-8", errors="replace")

    def tails(self, lines: int = 15) -> str:
        """The end of every process's stderr, for a failure message."""
        return "\n".join(
            f"--- {path.name}\n"
            + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            for path in sorted(self.work.glob("*.err"))
        )

    def stop_all(self) -> None:
        for process, out, err in reversed(self._running):
            stop(process)
            out.close()
            err.close()
        self._running.clear()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    group = Processes(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


#: The exporter's schema section: the allocation and the outbox.
SCHEMA = ALLOCATION + "  outbox:\n    id: id\n"


def lab_args(
    database: str, strategies: str, port: int, log_file: Path, stock: int = 40
) -> list[str]:
    return [
        *CLI,
        "demo",
        "--database",
        database,
        "--strategy",
        strategies,
        "--buyers",
        "200",
        "--stock",
        str(stock),
        "--metrics-port",
        str(port),
        "--linger",
        str(LAB_LINGER_S),
        "--quiet",
        "--format",
        "json",
        "--log-file",
        str(log_file),
    ]


def wait_for_report(
    processes: Processes, lab: subprocess.Popen[bytes], timeout: float = 60
) -> dict[str, dict[str, Any]]:
    """The lab's JSON report (printed after the sale, before it lingers), by strategy."""

    def report() -> dict[str, dict[str, Any]] | None:
        try:
            return {r["strategy"]: r for r in json.loads(processes.output("lab"))}
        except ValueError:
            if lab.poll() is not None:
                pytest.fail(
                    f"the lab gave no report (exit {lab.poll()}):\n{processes.errors('lab')}"
                )
            return None

    try:
        found = wait_until(report, accept=lambda r: r is not None, timeout=timeout, interval=0.1)
    except WaitTimeout:
        pytest.fail(f"the lab gave no report (exit {lab.poll()}):\n{processes.errors('lab')}")
    assert found is not None
    return found


def log_time(log_file: Path, event: str) -> float:
    """Unix time of the first ``event`` line in the lab's JSON log."""
    with log_file.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("event") == event:
                return datetime.fromisoformat(record["timestamp"]).timestamp()
    raise AssertionError(f"no {event} in {log_file}")


@dataclass
class Stack:
    prom: Prometheus
    exporter: str  # host:port
    lab: str  # host:port


@pytest.fixture
def stack(
    tmp_path: Path,
    pg_database: str,
    alertmanager: str,
    processes: Processes,
) -> Iterator[Stack]:
    """The exporter on the fresh database and Prometheus scraping it and the lab's port."""
    env = {**os.environ, "STOCKSENTRY_DATABASE_URL": pg_database}
    exporter_port, lab_port = free_port(), free_port()
    exporter = f"127.0.0.1:{exporter_port}"
    lab = f"127.0.0.1:{lab_port}"
    config = write_exporter_config(tmp_path, exporter_port, SCHEMA)
    processes.start("exporter", [*CLI, "exporter", "--config", str(config)], env)
    # Without it the fresh Prometheus has no up of any target 5 minutes ago, and the rules'
    # newborn half counts nothing (see the module docstring). Twenty minutes: the longest
    # window of a counter alert's newborn half is StockUnsafeReadModifyWrite's 15 minutes.
    now = time.time()
    history = openmetrics_history(
        {f'up{{instance="{lab}",job="{LAB_JOB}"}}': 1}, start=now - 1200, end=now - 2
    )
    rules = tmp_path / "stocksentry.rules.yml"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "alert_rules" / "render.py"),
            "--dashboard-url-base",
            GRAFANA,
            "--runbook-url-base",
            "https://runbooks.example.com/stocksentry",
            "-o",
            str(rules),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with Prometheus(
        targets={EXPORTER_JOB: [exporter], LAB_JOB: [lab]},
        rule_files=[rules],
        alertmanager=alertmanager,
        history=history,
    ) as prom:
        prom.wait_for_targets_up(EXPORTER_JOB, timeout=30)
        yield Stack(prom, exporter, lab)


def settle(prom: Prometheus) -> None:
    """Wait until every rule group has evaluated the present several times, then for
    Alertmanager's group_wait and group_interval to send anything."""
    settled = time.time()

    def evaluated_since() -> bool:
        return all(
            datetime.fromisoformat(group["lastEvaluation"].replace("Z", "+00:00")).timestamp()
            > settled + QUIET_EVALUATIONS
            for group in prom.rules()
        )

    wait_until(evaluated_since, timeout=30, interval=0.25, message="rule groups evaluating")
    time.sleep(2.5)  # group_wait + group_interval (1 s each) and a margin


def _rules_healthy(prom: Prometheus) -> None:
    unhealthy = [
        (rule["name"], rule["health"], rule.get("lastError"))
        for group in prom.rules()
        for rule in group["rules"]
        if rule["health"] != "ok"
    ]
    assert unhealthy == []


def _labels(alert: dict[str, Any]) -> frozenset[tuple[str, str]]:
    return frozenset(alert["labels"].items())


# --- the tests ------------------------------------------------------------------------------


def test_unsafe_strategy_pages_oncall(
    tmp_path: Path,
    pg_database: str,
    receiver: WebhookReceiver,
    processes: Processes,
    stack: Stack,
) -> None:
    example = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    pager = oncall_pager(example)
    expected = {
        "StockNegativeInventory": {
            "alertname": "StockNegativeInventory",
            "severity": "critical",
            "team": "checkout",
            "sku": UNSAFE_SKU,
        },
        "StockOversold": {
            "alertname": "StockOversold",
            "severity": "critical",
            "team": "checkout",
            "sku": UNSAFE_SKU,
        },
        "StockNegativeWrite": {
            "alertname": "StockNegativeWrite",
            "severity": "critical",
            "team": "checkout",
            "sku": UNSAFE_SKU,
        },
    }
    log_file = tmp_path / "lab.log"
    env = {**os.environ}

    lab_started = time.time()
    lab = processes.start(
        "lab",
        lab_args(pg_database, "check_then_decrement", int(stack.lab.rpartition(":")[2]), log_file),
        env,
    )

    def paged(deliveries: list[Delivery]) -> bool:
        seen = {
            frozenset(a["labels"].items())
            for d in deliveries
            if d.receiver == pager
            for a in d.payload["alerts"]
        }
        return all(frozenset(labels.items()) in seen for labels in expected.values())

    try:
        deliveries = receiver.wait_for(paged, timeout=DETECTION_BOUND_S, what="the three pages")
    except AssertionError as exc:
        firing = [a["labels"] for a in stack.prom.alerts()]
        raise AssertionError(f"{exc}\nPrometheus alerts: {firing}\n{processes.tails()}") from None
    report = wait_for_report(processes, lab)["check_then_decrement"]
    assert report["oversold"] > 0, report
    assert report["final_stock"] < 0, report

    # Each alert arrived at the pager, firing, exactly as the rules label it; whatever else
    # arrived went where the unmodified example routes its labels.
    first: dict[str, float] = {}
    for delivery in deliveries:
        assert delivery.payload["receiver"] == delivery.receiver
        for alert in delivery.payload["alerts"]:
            assert alert["status"] == "firing", alert
            # amtool lists every receiver of a route that continues (the freeze webhook's).
            routed = example_receiver(_labels(alert)).split(",")
            assert delivery.receiver in routed, alert["labels"]
            name = alert["labels"]["alertname"]
            if name in expected:
                assert alert["labels"] == expected[name]
                assert pager in routed
            if name in expected and delivery.receiver == pager:
                first.setdefault(name, delivery.at)
    oversold = next(
        a
        for d in deliveries
        for a in d.payload["alerts"]
        if a["labels"] == expected["StockOversold"]
    )
    assert re.fullmatch(
        rf"SKU {UNSAFE_SKU} is oversold by \d+ unit\(s\)\.", oversold["annotations"]["summary"]
    )
    assert oversold["annotations"]["dashboard_url"] == (
        f"{GRAFANA}/d/stocksentry-sku?var-sku={UNSAFE_SKU}"
    )

    # Prometheus agrees, and every rule evaluates without error.
    firing = {_labels(a) for a in stack.prom.alerts(state="firing")}
    for labels in expected.values():
        assert frozenset(labels.items()) in firing
    _rules_healthy(stack.prom)

    # Which half of StockNegativeWrite counted it: when a scrape caught the series before
    # the burst was over (at 0, primed, or mid-burst), increase() sees it rise; a series
    # first scraped at its full count is the newborn half's. (Without the backfilled up
    # history, the latter is a missed page: the fresh Prometheus has no up of any target
    # 5 minutes ago, which the guard takes for Prometheus having been away.)
    (samples,) = stack.prom.query(f'stock_inventory_negative_total{{sku="{UNSAFE_SKU}"}}[5m]')
    values = [float(value) for _, value in samples["values"]]
    counted_by = (
        f"increase() (first scraped at {values[0]:g}, then {values[-1]:g})"
        if values[-1] > values[0]
        else f"the newborn half (first scraped at its full count, {values[0]:g})"
    )

    sale_started = log_time(log_file, "stock_check")
    first_negative = log_time(log_file, "inventory_negative")
    delays = {
        name: {
            "from_lab_start_s": round(at - lab_started, 3),
            "from_selling_start_s": round(at - sale_started, 3),
            "from_first_negative_write_s": round(at - first_negative, 3),
        }
        for name, at in sorted(first.items())
    }
    result = {
        "receiver": pager,
        "lab": {
            "strategy": "check_then_decrement",
            "oversold": report["oversold"],
            "negative_writes": report["negative_writes"],
            "final_stock": report["final_stock"],
            "selling_start_after_lab_start_s": round(sale_started - lab_started, 3),
            "first_negative_write_after_lab_start_s": round(first_negative - lab_started, 3),
        },
        "stock_negative_write_counted_by": counted_by,
        "detection_delays": delays,
    }
    path = tmp_path / "detection-delays.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\ndetection delay, seconds to the first webhook delivery at {pager} ({path}):")
    for name, delay in delays.items():
        print(
            f"detection delay {name}: {delay['from_lab_start_s']:.2f} s from the lab's start,"
            f" {delay['from_selling_start_s']:.2f} s from the start of selling,"
            f" {delay['from_first_negative_write_s']:.2f} s from the first negative write"
        )
    print(f"StockNegativeWrite counted by {counted_by}")

    assert sorted(delays) == sorted(expected)
    for name, delay in delays.items():
        assert 0 < delay["from_first_negative_write_s"] <= delay["from_lab_start_s"], name
        assert delay["from_lab_start_s"] < DETECTION_BOUND_S, name


def test_safe_strategies_fire_nothing(
    tmp_path: Path,
    pg_database: str,
    receiver: WebhookReceiver,
    alertmanager: str,
    processes: Processes,
    stack: Stack,
) -> None:
    strategies = ("atomic", "for_update")
    lab = processes.start(
        "lab",
        lab_args(
            pg_database,
            ",".join(strategies),
            int(stack.lab.rpartition(":")[2]),
            tmp_path / "lab.log",
        ),
        {**os.environ},
    )
    report = wait_for_report(processes, lab)
    for name in strategies:
        assert (report[name]["sold"], report[name]["oversold"], report[name]["final_stock"]) == (
            40,
            0,
            0,
        ), report[name]

    # The quiet must be about this data: Prometheus has the lab's final counters and the
    # probes' verdict on the sold-out database ...
    sold = 'sum by (sku) (stock_reservation_success_total{job="stocksentry-lab"})'
    stack.prom.wait_for(
        sold,
        lambda result: (
            {r["metric"]["sku"]: float(r["value"][1]) for r in result}
            == {f"LAB-{name.upper()}": 40.0 for name in strategies}
        ),
    )
    since = time.time()
    probes = (
        f'stocksentry_probe_last_success_timestamp_seconds{{job="{EXPORTER_JOB}",'
        f'probe=~"negative_stock|oversold"}}'
    )
    stack.prom.wait_for(
        probes,
        lambda result: len(result) == 2 and all(float(r["value"][1]) > since for r in result),
    )
    assert stack.prom.query(f'stock_inventory_negative_skus{{job="{EXPORTER_JOB}"}} > 0') == []
    assert stack.prom.query("stock_oversold_units > 0") == []

    # ... and every rule group has evaluated it several times, then Alertmanager had its
    # group_wait and group_interval to send anything.
    settle(stack.prom)

    _rules_healthy(stack.prom)
    pending = sorted(a["labels"]["alertname"] for a in stack.prom.alerts(state="pending"))
    print(f"\nsafe strategies {', '.join(strategies)}: pending alerts {pending or 'none'}")
    assert stack.prom.query('ALERTS{alertstate="firing"}') == []
    assert stack.prom.alerts(state="firing") == []
    assert _am_alerts(alertmanager) == []
    assert _summary(receiver.deliveries()) == []
    assert lab.poll() is None, "the lab stopped serving before the end"


# --- each failure mode fires its own alert ---------------------------------------------------

#: The Redis of the lock strategies; a database number of its own, away from other tests'
#: keys (the lab deletes its stocksentry-lab: keys at the end).
LAB_REDIS = os.environ.get("STOCKSENTRY_TEST_LAB_REDIS", "redis://127.0.0.1:6379/11")
#: When set, each failure-mode run appends one JSON line (mode, alert, seconds) to this
#: file: benchmarks/alert_delays.py runs the tests repeatedly and tabulates the lines.
DELAYS_FILE = os.environ.get("STOCKSENTRY_ALERT_DELAYS_FILE", "")
#: Alerts any failure mode may bring along, since every one of them makes buyers fail or
#: queue: the SLO's fast burn (a short, intense burst is a large share of a quiet
#: shop's hour) and the conflict spike.
COMMON_COFIRING = frozenset({"CheckoutErrorBudgetBurnFast", "StockReservationConflictSpike"})


def first_sale(log_file: Path) -> float:
    """Unix time of the lab's first stock line (a check, or an update with no check)."""
    with log_file.open(encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("event") in ("stock_check", "stock_update"):
                return datetime.fromisoformat(record["timestamp"]).timestamp()
    raise AssertionError(f"no stock_check or stock_update in {log_file}")


@dataclass(frozen=True)
class FailureMode:
    """A lab strategy that breaks one invariant, the alerts that must name it, and those
    allowed to fire alongside (a consequence of the same failure, never a false alarm)."""

    strategy: str
    alerts: tuple[str, ...]
    allowed: frozenset[str] = frozenset()
    redis: bool = False
    #: Seconds the run may take from the lab's start to the last expected alert.
    bound: float = DETECTION_BOUND_S
    #: The lab's stock (of 200 buyers, 50 at a time).
    stock: int = 40


FAILURE_MODES: dict[str, FailureMode] = {
    # Check, then decrement without a guard: stock below zero, units sold twice.
    "negative_write": FailureMode(
        "check_then_decrement",
        ("StockNegativeWrite", "StockNegativeInventory", "StockOversold"),
        frozenset({"StockUnsafeReadModifyWrite"}),
    ),
    # Read, compute in the app, write back: lost updates, more sold than stocked.
    "lost_update": FailureMode(
        "unsafe",
        ("StockUnsafeReadModifyWrite", "StockOversold"),
        frozenset({"StockNegativeWrite", "StockNegativeInventory"}),
    ),
    # A Redis lock whose TTL is shorter than the work under it.
    "lock_expiry": FailureMode(
        "naive_lock",
        ("StockLockExpiredWhileHeld",),
        frozenset(
            {
                "StockLockReleaseNotOwned",
                "StockUnsafeReadModifyWrite",
                "StockOversold",
                "StockNegativeWrite",
                "StockNegativeInventory",
            }
        ),
        redis=True,
    ),
    # Resubmits reserve again: two orders for one intent.
    # A resubmit reserves again right after its first attempt: with 40 units for a first
    # wave of 50 buyers, the stock can be gone before any resubmit runs (no duplicate, and
    # rightly no alert). 100 units outlast the first wave and its ten resubmits.
    "duplicate_orders": FailureMode(
        "retry_no_key",
        ("StockDuplicateOrders",),
        frozenset({"StockIdempotencyReplaySpike"}),
        stock=100,
    ),
    # Availability decided from a cache the database contradicts.
    "stale_cache": FailureMode(
        "stale_cache", ("StockStaleCacheDecisions",), frozenset({"StockCacheDrift"})
    ),
    # Two SKUs locked in opposite orders: the database aborts one transaction of each
    # pair (a deadlock outcome is a bad checkout, so the fast burn may come along).
    "deadlocks": FailureMode(
        "deadlock", ("StockDeadlocksIncreasing",), bound=2 * DETECTION_BOUND_S
    ),
    # The publisher stalls: events stay unpublished beyond the publish latency (30 s).
    "outbox_stuck": FailureMode("outbox", ("StockOutboxLag",), bound=DETECTION_BOUND_S + 30),
}


def _first_firing(
    prom: Prometheus, mode: FailureMode, until: float
) -> tuple[dict[str, float], dict[str, set[frozenset[tuple[str, str]]]]]:
    """Poll Prometheus's alerts until every expected one fires (or ``until``): the first
    time each alert name was seen firing, and every firing alert's label sets."""
    first: dict[str, float] = {}
    seen: dict[str, set[frozenset[tuple[str, str]]]] = {}
    while time.time() < until:
        now = time.time()
        for alert in prom.alerts(state="firing"):
            name = alert["labels"]["alertname"]
            first.setdefault(name, now)
            seen.setdefault(name, set()).add(_labels(alert))
        if all(name in first for name in mode.alerts):
            break
        time.sleep(0.25)
    return first, seen


def _why_not_fired(
    stack: Stack, lab: subprocess.Popen[bytes], log_file: Path, missing: Sequence[str]
) -> str:
    """What a failure message needs to tell a slow stack from a blind probe: the lab's
    state and last lines, the scrape targets' health, every probe's up and last success,
    the stock_ series the exporter serves, and the missing alerts' states."""
    out = [f"lab: {'running' if lab.poll() is None else f'exited {lab.returncode}'}"]
    try:
        # The lab's JSON report (SQL truth: sold, oversold, duplicate orders), once printed.
        out.append("lab report: " + log_file.with_name("lab.out").read_text()[-1500:])
    except OSError as exc:
        out.append(f"lab report: {exc}")
    try:
        out += ["lab log: " + line for line in log_file.read_text().splitlines()[-5:]]
    except OSError as exc:
        out.append(f"lab log: {exc}")
    try:
        for target in stack.prom.targets_status():
            out.append(
                f"target {target['labels'].get('job')}: {target['health']}"
                f" {target.get('lastError') or ''}"
            )
        for expr in (
            "stocksentry_probe_up",
            "time() - stocksentry_probe_last_success_timestamp_seconds",
            f'{{__name__=~"stock_.*", job="{EXPORTER_JOB}"}} != 0',
        ):
            for sample in stack.prom.query(expr)[:40]:
                labels = {k: v for k, v in sample["metric"].items() if k not in ("instance",)}
                out.append(f"{expr[:40]}: {labels} = {sample['value'][1]}")
        out += [
            f"alert {a['labels']['alertname']}: {a['state']}"
            for a in stack.prom.alerts()
            if a["labels"]["alertname"] in missing
        ]
    except Exception as exc:  # the diagnosis must never hide the failure it explains
        out.append(f"prometheus: {exc!r}")
    return "\n".join(out)


@pytest.mark.parametrize("mode_name", sorted(FAILURE_MODES))
def test_each_failure_mode_fires_its_own_alert(
    mode_name: str, tmp_path: Path, pg_database: str, processes: Processes, stack: Stack
) -> None:
    """One failure mode per run, on a fresh stack: its alerts fire, named for its SKU
    where they carry one, nothing outside the allowed co-firing set fires, and the
    seconds from the start of selling (the violations come within the first burst) to
    each alert's firing are recorded."""
    mode = FAILURE_MODES[mode_name]
    log_file = tmp_path / "lab.log"
    args = lab_args(
        pg_database, mode.strategy, int(stack.lab.rpartition(":")[2]), log_file, mode.stock
    )
    if mode.redis:
        args += ["--redis", LAB_REDIS]
    lab_started = time.time()
    lab = processes.start("lab", args, {**os.environ})
    first, seen = _first_firing(stack.prom, mode, until=lab_started + mode.bound)
    missing = [name for name in mode.alerts if name not in first]
    assert missing == [], (
        f"{mode_name}: {missing} did not fire within {mode.bound:.0f} s; fired: {sorted(first)}"
        f"\n{_why_not_fired(stack, lab, log_file, missing)}\n{processes.tails()}"
    )
    # The deadlock scenario's sale takes tens of seconds on a loaded machine.
    report = wait_for_report(processes, lab, timeout=180)[mode.strategy]
    sale_started = first_sale(log_file)
    if mode_name == "duplicate_orders":
        assert report["duplicate_orders"] > 0, report  # what the alert was about

    unexpected = set(first) - set(mode.alerts) - mode.allowed - COMMON_COFIRING
    assert unexpected == set(), f"{mode_name}: unexpected alerts {sorted(unexpected)}"
    sku = f"LAB-{mode.strategy.upper()}"
    for name, label_sets in seen.items():
        for labels in label_sets:
            got = dict(labels).get("sku")
            assert got in (None, sku), f"{name} names {got}, not the failing {sku}"
    for name in ("StockNegativeInventory", "StockOversold", "StockDuplicateOrders"):
        if name in mode.alerts:
            assert any(dict(labels).get("sku") == sku for labels in seen[name]), name
    _rules_healthy(stack.prom)

    delays = {name: round(first[name] - sale_started, 3) for name in mode.alerts}
    lines = [
        {
            "mode": mode_name,
            "strategy": mode.strategy,
            "alert": name,
            "seconds": delay,
            "cofiring": sorted(set(first) - set(mode.alerts)),
            "report": {k: report.get(k) for k in ("sold", "oversold", "final_stock")},
        }
        for name, delay in delays.items()
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (tmp_path / "alert-delays.jsonl").write_text(text, encoding="utf-8")
    if DELAYS_FILE:
        with open(DELAYS_FILE, "a", encoding="utf-8") as out:
            out.write(text)
    for name, delay in delays.items():
        print(f"\n{mode_name} ({mode.strategy}) -> {name}: {delay:.2f} s from selling start")
        assert 0 < delay < mode.bound, name


#: The detector's counter (catalog.UNSAFE_READ_MODIFY_WRITE), as the lab serves it.
UNSAFE_RMW = "stock_unsafe_read_modify_write_total"


@pytest.mark.parametrize("impl", ["lab", "pottery"])
def test_redlock_and_idempotent_retry_fire_nothing(
    impl: str,
    tmp_path: Path,
    pg_database: str,
    receiver: WebhookReceiver,
    alertmanager: str,
    processes: Processes,
    stack: Stack,
) -> None:
    """An owned Redis lock with a read-modify-write inside (redlock: the lab's owned
    ``SET NX`` lock, or pottery's Redlock) and the idempotent retry: correct, so the
    detector counts nothing, no alert fires and nothing reaches Alertmanager.

    redlock reads the stock, checks it, works, and writes the value it computed
    (``SET available_stock = :computed``), as the unsafe strategy does: only the lock
    keeps it from losing updates, so the quiet of StockUnsafeReadModifyWrite is the
    detector telling a valid lock from none."""
    strategies = ("redlock", "retry_idempotent")
    lab = processes.start(
        "lab",
        [
            *lab_args(
                pg_database,
                ",".join(strategies),
                int(stack.lab.rpartition(":")[2]),
                tmp_path / "lab.log",
            ),
            "--redis",
            LAB_REDIS,
            "--redlock-impl",
            impl,
        ],
        {**os.environ},
    )
    report = wait_for_report(processes, lab)
    for name in strategies:
        item = report[name]
        assert (item["sold"], item["oversold"], item["lost_updates"], item["final_stock"]) == (
            40,
            0,
            0,
            0,
        ), item
        # The lab runs with the SQLAlchemy integration: its detector saw every statement.
        assert item["unsafe_read_modify_write"] == 0, item
    assert report["redlock"]["locks"]["acquired"] == 200, report["redlock"]["locks"]
    assert report["redlock"]["locks"]["expired_while_held"] == 0
    sold = 'sum by (sku) (stock_reservation_success_total{job="stocksentry-lab"})'
    stack.prom.wait_for(
        sold,
        lambda result: (
            {r["metric"]["sku"]: float(r["value"][1]) for r in result}
            == {f"LAB-{name.upper()}": 40.0 for name in strategies}
        ),
    )
    # The counter is scraped (primed at 0 for the stock table) and stayed 0.
    rmw = stack.prom.query(f'{UNSAFE_RMW}{{job="{LAB_JOB}"}}')
    assert rmw, f"{UNSAFE_RMW} not scraped from the lab"
    assert [float(r["value"][1]) for r in rmw] == [0.0] * len(rmw), rmw
    settle(stack.prom)
    _rules_healthy(stack.prom)
    pending = sorted(a["labels"]["alertname"] for a in stack.prom.alerts(state="pending"))
    print(f"\nsafe strategies {', '.join(strategies)} ({impl}): pending {pending or 'none'}")
    assert "StockUnsafeReadModifyWrite" not in pending
    assert stack.prom.query('ALERTS{alertstate="firing"}') == []
    assert stack.prom.alerts(state="firing") == []
    assert _am_alerts(alertmanager) == []
    assert _summary(receiver.deliveries()) == []
    assert lab.poll() is None, "the lab stopped serving before the end"
