"""Exemplars from two real multiprocess workers reach the sidecar's OpenMetrics output.

Two worker processes run with ``PROMETHEUS_MULTIPROC_DIR`` set (prometheus_client's real
multiprocess mode) and a recording OpenTelemetry SDK tracer; the exporter's ``/metrics``
answers OpenMetrics with their trace ids on the buckets they observed, and the same scrape
in the Prometheus text format passes ``promtool check metrics`` (promtool 2.x parses only
that format; the OpenMetrics body is checked by prometheus_client's strict parser).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from prom import promtool_binary
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser
from pytest_aiohttp import AiohttpClient
from stocksentry.exporter.server import ServerSettings, create_app

parse_openmetrics: Callable[[str], Iterable[Metric]] = (
    openmetrics_parser.text_string_to_metric_families
)

pytestmark = pytest.mark.integration

WORKER = textwrap.dedent(
    """
    import sys
    from opentelemetry.sdk.trace import TracerProvider
    from stocksentry.instrumentation import catalog
    from stocksentry.instrumentation.metrics import StockMetrics
    from stocksentry.instrumentation.tracing import exemplar_for

    seconds = float(sys.argv[1])
    tracer = TracerProvider().get_tracer("test")
    metrics = StockMetrics()
    with tracer.start_as_current_span("reservation") as span:
        exemplar = exemplar_for(span)
        metrics.observe(catalog.RESERVATION_DURATION, seconds, "success", exemplar=exemplar)
        metrics.observe(catalog.DB_LOCK_WAIT, seconds, "products", exemplar=exemplar)
    print(exemplar["trace_id"], exemplar["span_id"])
    """
)


def run_workers(directory: Path, durations: Iterable[str]) -> list[tuple[str, str]]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, seconds], env=env, stdout=subprocess.PIPE, text=True
        )
        for seconds in durations
    ]
    ids = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        trace_id, span_id = out.split()
        ids.append((trace_id, span_id))
    return ids


async def test_exemplars_of_two_workers_reach_openmetrics_and_pass_promtool(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    directory = tmp_path / "prom"
    directory.mkdir()
    # Different buckets (0.02 -> le 0.025, 0.3 -> le 0.5), so each worker's exemplar stays.
    (first, second) = run_workers(directory, ["0.02", "0.3"])
    assert sorted(p.name for p in directory.glob("exemplars_*.mmap"))
    app = create_app(
        ServerSettings(listen_address="127.0.0.1", port=0, multiprocess_dir=directory)
    )
    client = await aiohttp_client(app)

    response = await client.get(
        "/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}
    )
    assert response.status == 200
    body = await response.text()
    families = {family.name: family for family in parse_openmetrics(body)}
    for name in ("stock_reservation_duration_seconds", "stock_db_lock_wait_duration_seconds"):
        found = {
            s.labels["le"]: s.exemplar
            for s in families[name].samples
            if s.name == f"{name}_bucket" and s.exemplar is not None
        }
        assert set(found) == {"0.025", "0.5"}, name
        assert found["0.025"].labels == {"trace_id": first[0], "span_id": first[1]}
        assert found["0.5"].labels == {"trace_id": second[0], "span_id": second[1]}
        assert found["0.025"].value == 0.02
        assert found["0.5"].value == 0.3

    text_response = await client.get("/metrics", headers={"Accept": "text/plain"})
    text = await text_response.text()
    assert first[0] not in text  # exemplars are OpenMetrics only
    checked = await asyncio.to_thread(
        subprocess.run,
        [promtool_binary() or "promtool", "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    # 0: clean; 3: only lint remarks (e.g. help text), never a parse error (1).
    assert checked.returncode in (0, 3), checked.stderr
    assert "error while linting" not in checked.stderr, checked.stderr
