"""The exporter's HTTP server, in process: aiohttp's test client, no database, no binary.

The probe source is a real :class:`~stocksentry.exporter.probes.ProbeRunner` (no database
section) fed by a :class:`~stocksentry.exporter.probes.base.Probe` subclass returning
fixed families. Log rate limits run on an injected clock. What needs a real listener
(malformed requests, basic auth, TLS, SIGTERM) is in ``test_server_serving_unit.py``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families as parse_text
from pytest_aiohttp import AiohttpClient
from scraped import value
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.base import Probe
from stocksentry.exporter.server import (
    LIFECYCLE,
    RENDERER,
    RunningServer,
    ServerSettings,
    build_renderer,
    create_app,
)
from stocksentry.exporter.server.app import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_TEXT,
    wants_gzip,
    wants_openmetrics,
)
from stocksentry.exporter.server.buildinfo import build_info
from stocksentry.exporter.server.exposition import MetricsRenderer
from stocksentry.exporter.server.settings import Lifecycle

parse_openmetrics: Callable[[str], Iterable[Metric]] = (
    openmetrics_parser.text_string_to_metric_families
)

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


class FixedProbe(Probe):
    """Returns the same two families on every run."""

    async def run(self) -> tuple[Metric, ...]:
        skus = GaugeMetricFamily("stock_inventory_negative_skus", "SKUs below zero.", value=2)
        units = GaugeMetricFamily("stock_oversold_units", "Oversold.", labels=["sku"])
        units.add_metric(["EGG-01"], 3.0)
        return (skus, units)


class Gate:
    """A collector whose ``collect()`` blocks until released; counts its calls."""

    name = "gate"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> list[Metric]:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(30)
        return [GaugeMetricFamily("gate_open", "Released.", value=1)]


class Broken:
    """A collector that raises on every scrape."""

    name = "broken"

    def collect(self) -> list[Metric]:
        raise RuntimeError("collector bug")


def settings(**overrides: object) -> ServerSettings:
    values: dict[str, object] = {"listen_address": "127.0.0.1", "port": 0}
    values.update(overrides)
    return ServerSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def runner() -> AsyncIterator[ProbeRunner]:
    """The probes' collector after one good run of :class:`FixedProbe`."""
    probes = ProbeRunner(parse_config("server: {port: 19464}\n", environ={}))
    result = await probes.run_once(FixedProbe("fixed", interval=15.0, timeout=5.0))
    assert result.up
    yield probes
    await probes.stop()


def exemplar_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    latency = Histogram("probe_query_seconds", "Query.", buckets=(0.1, 1.0), registry=registry)
    latency.observe(0.3, exemplar={"trace_id": TRACE_ID})
    return registry


# --- /metrics ------------------------------------------------------------------------------


async def test_metrics_text_serves_the_probe_families_and_own_health(
    aiohttp_client: AiohttpClient, runner: ProbeRunner
) -> None:
    client = await aiohttp_client(create_app(settings(), collectors=[runner]))
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"] == CONTENT_TYPE_TEXT
    assert response.headers["Vary"] == "Accept, Accept-Encoding"
    families = list(parse_text(await response.text()))

    assert value(families, "stock_inventory_negative_skus") == 2
    assert value(families, "stock_oversold_units", sku="EGG-01") == 3
    assert value(families, "stocksentry_probe_up", probe="fixed") == 1
    last_success = value(
        families, "stocksentry_probe_last_success_timestamp_seconds", probe="fixed"
    )
    assert last_success is not None
    assert last_success > 0
    # The server's own accounting: one series per source, the probes under their name.
    for source in ("probes", "process"):
        assert value(families, "stocksentry_collector_errors_total", collector=source) == 0
    assert value(families, "process_cpu_seconds_total") is not None


async def test_openmetrics_is_negotiated_and_carries_exemplars(
    aiohttp_client: AiohttpClient, runner: ProbeRunner
) -> None:
    app = create_app(settings(), collectors=[runner, exemplar_registry()])
    client = await aiohttp_client(app)

    response = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert response.headers["Content-Type"] == CONTENT_TYPE_OPENMETRICS
    body = await response.text()
    assert body.endswith("# EOF\n")
    assert body.count("# EOF") == 1
    families = list(parse_openmetrics(body))
    bucket = next(
        s
        for f in families
        if f.name == "probe_query_seconds"
        for s in f.samples
        if s.name == "probe_query_seconds_bucket" and s.labels["le"] == "1.0"
    )
    assert bucket.exemplar is not None
    assert bucket.exemplar.labels == {"trace_id": TRACE_ID}
    assert value(families, "stocksentry_probe_up", probe="fixed") == 1

    # The text format has no exemplars, and is what a plain client gets.
    plain = await client.get("/metrics", headers={"Accept": "text/plain"})
    assert plain.headers["Content-Type"] == CONTENT_TYPE_TEXT
    assert TRACE_ID not in await plain.text()


async def test_gzip_only_when_accepted(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_app(settings()))
    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert "stocksentry_collector_errors_total" in await zipped.text()  # decoded by aiohttp
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in plain.headers


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (PROMETHEUS_ACCEPT, True),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text;version=2.0.0", False),
        ("application/openmetrics-text;q=0", False),
        ("text/plain;q=0.9,application/openmetrics-text;q=0.5", False),
        ("application/openmetrics-text;q=oops,*/*", False),
        ("", False),
    ],
)
def test_wants_openmetrics(accept: str, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


@pytest.mark.parametrize(
    ("encoding", "expected"),
    [("gzip", True), ("x-gzip;q=0.5", True), ("*", True), ("gzip;q=0, *", False), ("br", False)],
)
def test_wants_gzip(encoding: str, expected: bool) -> None:
    assert wants_gzip(encoding) is expected


async def test_a_failing_collector_is_left_out_and_counted(
    aiohttp_client: AiohttpClient, runner: ProbeRunner
) -> None:
    app = create_app(settings(), collectors=[Broken(), runner])
    client = await aiohttp_client(app)
    for _ in range(2):
        response = await client.get("/metrics")
        assert response.status == 200
    families = list(parse_text(await response.text()))
    assert value(families, "stocksentry_collector_errors_total", collector="broken") == 2
    assert value(families, "stock_oversold_units", sku="EGG-01") == 3
    assert app[RENDERER].errors() == {"broken": 2, "probes": 0, "process": 0}


def test_renderer_counts_clashes_and_rate_limits_its_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    first, second = CollectorRegistry(), CollectorRegistry()
    for registry in (first, second):
        Histogram("same_name_seconds", "Clash.", registry=registry)
    renderer = MetricsRenderer(
        [("first", first), ("second", second), ("broken", Broken())], clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger="stocksentry.exporter.server"):
        body = renderer.render(openmetrics=False)
        now[0] = 59.0
        renderer.render(openmetrics=False)
        now[0] = 60.0
        renderer.render(openmetrics=False)

    assert body.count(b"# TYPE same_name_seconds histogram") == 1
    assert renderer.errors() == {"first": 0, "second": 3, "broken": 3}
    assert renderer.source_names == ("first", "second", "broken")
    logged = [r.getMessage() for r in caplog.records]
    # First failure of each, then nothing until a minute (of the injected clock) passed.
    assert sum("second left out" in m for m in logged) == 2
    assert sum("broken left out" in m for m in logged) == 2
    assert any("repeats metric families ['same_name_seconds']" in m for m in logged)


async def test_scrapes_share_one_render_and_health_stays_fast(
    aiohttp_client: AiohttpClient,
) -> None:
    gate = Gate()
    client = await aiohttp_client(create_app(settings(), collectors=[gate]))
    scrapes = [asyncio.create_task(client.get("/metrics")) for _ in range(3)]
    try:
        assert await asyncio.to_thread(gate.entered.wait, 30)
        # Event order, not a stopwatch: the render is stuck in its thread; liveness and
        # readiness are answered all the same.
        health = await asyncio.wait_for(client.get("/healthz"), timeout=30)
        ready = await asyncio.wait_for(client.get("/readyz"), timeout=30)
        assert health.status == 200
        assert ready.status == 200
        assert not gate.release.is_set()
        assert all(not task.done() for task in scrapes)
    finally:
        gate.release.set()
    responses = await asyncio.gather(*scrapes)
    assert [r.status for r in responses] == [200, 200, 200]
    for response in responses:
        assert value(parse_text(await response.text()), "gate_open") == 1
    # Concurrent scrapes shared one render.
    assert gate.calls == 1


class Unencodable:
    """A collector whose family cannot be written out (a value that is not a number)."""

    name = "unencodable"

    def collect(self) -> list[Metric]:
        family = GaugeMetricFamily("bad_value", "Not a number.", labels=["x"])
        family.add_metric(["a"], "many")  # type: ignore[arg-type]
        return [family]


def test_build_renderer_names_its_sources(tmp_path: Path) -> None:
    renderer = build_renderer(
        settings(multiprocess_dir=tmp_path),
        [CollectorRegistry(), CollectorRegistry(), Unencodable()],
    )
    assert renderer.source_names == (
        "multiprocess",
        "CollectorRegistry",
        "CollectorRegistry#2",
        "unencodable",
        "process",
    )
    families = list(parse_text(renderer.render(openmetrics=False).decode()))
    assert value(families, "stocksentry_multiprocess_files") == 0
    assert value(families, "stocksentry_collector_errors_total", collector="unencodable") == 1
    assert value(families, "bad_value", x="a") is None


# --- health, readiness, landing page -------------------------------------------------------


async def test_health_readiness_and_landing(aiohttp_client: AiohttpClient) -> None:
    seen_during_startup: list[bool] = []

    async def background(app: web.Application) -> AsyncIterator[None]:
        seen_during_startup.append(app[LIFECYCLE].ready)
        yield

    app = create_app(settings(metrics_path="/probe<x>"), background=[background])
    client = await aiohttp_client(app)
    assert seen_during_startup == [False]

    health = await client.get("/healthz")
    assert (health.status, await health.text()) == (200, "ok\n")
    ready = await client.get("/readyz")
    assert (ready.status, await ready.text()) == (200, "ready\n")

    landing = await client.get("/")
    assert landing.headers["Content-Type"].startswith("text/html")
    page = await landing.text()
    assert 'href="/probe&lt;x&gt;"' in page
    assert 'href="/healthz"' in page
    info = build_info()
    assert f"<p>Version: {info.version} (revision {info.revision}, Python " in page

    app[LIFECYCLE].stopping = True
    stopping = await client.get("/readyz")
    assert (stopping.status, await stopping.text()) == (503, "not ready: shutting down\n")
    app[LIFECYCLE].stopping, app[LIFECYCLE].started = False, False
    starting = await client.get("/readyz")
    assert (starting.status, await starting.text()) == (503, "not ready: starting\n")


def test_lifecycle_and_settings_validation() -> None:
    assert not Lifecycle().ready
    assert Lifecycle(started=True).ready
    assert not Lifecycle(started=True, stopping=True).ready
    for bad in ({"port": 70000}, {"metrics_path": "/healthz"}, {"metrics_path": "metrics"}):
        with pytest.raises(ValueError, match=r"^(port|metrics_path) must"):
            settings(**bad)
    with pytest.raises(ValueError, match="drain_seconds"):
        settings(drain_seconds=-1.0)


def test_running_server_urls() -> None:
    app = web.Application()
    app[LIFECYCLE] = Lifecycle(started=True)
    v6 = RunningServer(app, "https", (("::1", 19464),))
    assert (v6.url, v6.port) == ("https://[::1]:19464/", 19464)
    assert RunningServer(app, "http", (("127.0.0.1", 80),)).url == "http://127.0.0.1:80/"
    v6.begin_shutdown()
    assert not app[LIFECYCLE].ready
