"""Two clusters, one central Prometheus: the rules and dashboards keep them apart.

Three real Prometheus servers. Each "cluster" server (``external_labels: {cluster: a}`` and
``{cluster: b}``) scrapes a stocksentry target of its own in namespace ``shop`` and
remote-writes everything to a central server started with
``--web.enable-remote-write-receiver``, which evaluates ``alert_rules/stocksentry.rules.yml``
and nothing else. The targets serve a small fixed exposition (a test HTTP server, not a lab
run: the rules' view of the series is the point, and fixed values keep it exact): the same
SKU ``EGG-01`` in both clusters, oversold by 3 units in cluster a and by none in cluster b.

What must hold at the central server: StockOversold fires for ``cluster="a"`` only, with the
location in its labels and its summary; the recording rules keep one series per cluster for
the same SKU; the overview dashboard's oversold query, with every cluster selected, shows
the two clusters apart. Runtime: about 15 s (the remote write's batches, 1 s evaluations).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prom import Prometheus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "alert_rules" / "stocksentry.rules.yml"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dashboards import lint  # noqa: E402 - needs the repository root on sys.path

SKU = "EGG-01"


def exposition(oversold: int) -> bytes:
    """What a stocksentry target of one cluster serves."""
    return (
        "# TYPE stock_oversold_units gauge\n"
        f'stock_oversold_units{{sku="{SKU}"}} {oversold}\n'
        "# TYPE stock_reservation_success_total counter\n"
        f'stock_reservation_success_total{{sku="{SKU}",strategy="atomic"}} 40\n'
        "# TYPE stocksentry_probe_up gauge\n"
        'stocksentry_probe_up{probe="oversold"} 1\n'
    ).encode()


class Target:
    """A fixed exposition on /metrics, on a free loopback port, in a thread."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def cluster(name: str, target: Target, central: Prometheus) -> Prometheus:
    """A cluster's Prometheus: its target in namespace shop, everything sent to central."""
    return Prometheus(
        scrape_configs=[
            {
                "job_name": "stocksentry",
                "static_configs": [{"targets": [target.address], "labels": {"namespace": "shop"}}],
            }
        ],
        external_labels={"cluster": name},
        remote_write=[
            {
                "url": f"{central.url}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "min_backoff": "100ms"},
            }
        ],
    )


@pytest.fixture(scope="module")
def central() -> Iterator[Prometheus]:
    targets = {"a": Target(exposition(3)), "b": Target(exposition(0))}
    try:
        with (
            Prometheus(
                rule_files=[RULES_FILE], extra_args=["--web.enable-remote-write-receiver"]
            ) as prom,
            cluster("a", targets["a"], prom),
            cluster("b", targets["b"], prom),
        ):
            prom.wait_for('up{cluster="a"}', timeout=30)
            prom.wait_for('up{cluster="b"}', timeout=30)
            prom.wait_for('ALERTS{alertname="StockOversold",alertstate="firing"}', timeout=30)
            # both clusters' samples evaluated, so an alert for b would have had its chance
            prom.wait_for(
                "sku:stock_reservation_success:rate5m",
                predicate=lambda result: len(result) == 2,
                timeout=30,
            )
            yield prom
    finally:
        for target in targets.values():
            target.stop()


def _labels(series: list[dict[str, Any]]) -> list[dict[str, str]]:
    return sorted((s["metric"] for s in series), key=lambda m: json.dumps(m, sort_keys=True))


def test_the_oversell_fires_for_its_cluster_only(central: Prometheus) -> None:
    firing = [
        a for a in central.alerts(state="firing") if a["labels"]["alertname"] == "StockOversold"
    ]
    assert [a["labels"] for a in firing] == [
        {
            "alertname": "StockOversold",
            "cluster": "a",
            "namespace": "shop",
            "severity": "critical",
            "sku": SKU,
            "team": "checkout",
        }
    ]
    assert firing[0]["annotations"]["summary"] == (
        f"SKU {SKU} is oversold by 3 unit(s) in cluster a, namespace shop."
    )
    # Both clusters' oversold series are there: b's is evaluated, and is 0.
    assert sorted(
        (s["metric"]["cluster"], s["value"][1])
        for s in central.query(f'stock_oversold_units{{sku="{SKU}"}}')
    ) == [("a", "3"), ("b", "0")]


def test_recording_rules_keep_one_series_per_cluster(central: Prometheus) -> None:
    series = central.query("sku:stock_reservation_success:rate5m")
    assert _labels(series) == [
        {
            "__name__": "sku:stock_reservation_success:rate5m",
            "cluster": c,
            "namespace": "shop",
            "sku": SKU,
        }
        for c in ("a", "b")
    ]


def test_the_overview_dashboard_shows_the_clusters_apart(central: Prometheus) -> None:
    board = json.loads((ROOT / "dashboards" / "stocksentry-overview.json").read_text())
    (panel,) = [p for p in lint.iter_panels(board) if p["title"] == "Oversold units (probe)"]
    (target,) = panel["targets"]
    expr = lint.substitute(
        target["expr"],
        {"cluster": ".*", "namespace": ".*", "job": "stocksentry", "__rate_interval": "1m"},
    )
    assert sorted(
        (s["metric"]["cluster"], s["metric"]["namespace"], s["value"][1])
        for s in central.query(expr)
    ) == [("a", "shop", "3"), ("b", "shop", "0")]
