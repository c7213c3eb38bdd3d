"""`stocksentry exporter` end to end: the lab oversells, the sidecar's probes see it.

The lab writes its products / orders / order_items schema into a fresh PostgreSQL
database; the exporter runs as a real process with a config file, and /metrics is read
over HTTP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from exportercli import CLI, run_cli, run_demo, write_exporter_config
from polling import wait_until
from prom import free_port
from stocksentry.instrumentation import catalog

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def wait_for(
    check: Callable[[], bool], process: subprocess.Popen[str], timeout: float = 30.0
) -> None:
    """Wait until ``check()`` holds; a refused connection means not listening yet.

    Stops at once when the exporter ``process`` has exited.
    """

    def probe() -> bool | OSError:
        if process.poll() is not None:
            raise AssertionError(f"the exporter exited with {process.returncode}")
        try:
            return check()
        except OSError as exc:  # not listening yet
            return exc

    wait_until(probe, accept=lambda v: v is True, timeout=timeout, interval=0.2)


@pytest.fixture
def exporter_env(pg_database: str) -> dict[str, str]:
    return {**os.environ, "STOCKSENTRY_DATABASE_URL": pg_database}


@pytest.fixture
def oversold_database(pg_database: str) -> str:
    """The lab's check_then_decrement run: stock below zero and more paid than allocated."""
    done = run_demo(
        "--database",
        pg_database,
        "--strategy",
        "check_then_decrement,atomic",
        "--buyers",
        "200",
        "--stock",
        "40",
    )
    results = {r["strategy"]: r for r in json.loads(done.stdout)}
    assert results["check_then_decrement"]["final_stock"] < 0
    return pg_database


@pytest.fixture
def run_exporter(exporter_env: dict[str, str]) -> Iterator[object]:
    processes: list[subprocess.Popen[str]] = []

    def start(config: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*CLI, "exporter", "--config", str(config)],
            env=env or exporter_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def test_probes_report_the_labs_oversell(
    tmp_path: Path, oversold_database: str, run_exporter, exporter_env: dict[str, str]
) -> None:
    import psycopg

    with psycopg.connect(oversold_database) as conn:
        negative = conn.execute(
            "SELECT count(*), coalesce(sum(-available_stock), 0) FROM products"
            " WHERE available_stock < 0"
        ).fetchone()
        oversold = conn.execute(
            """SELECT p.sku, sum(oi.quantity) - p.initial_stock FROM products p
               JOIN order_items oi ON oi.product_id = p.id
               JOIN orders o ON o.id = oi.order_id AND o.status = 'PAID'
               GROUP BY p.sku, p.initial_stock HAVING sum(oi.quantity) > p.initial_stock"""
        ).fetchall()
    assert negative is not None
    assert negative[0] == 1
    assert len(oversold) == 1

    port = free_port()
    process = run_exporter(write_exporter_config(tmp_path, port))
    up = f'{catalog.PROBE_UP.name}{{probe="oversold"}}'
    wait_for(lambda: scrape(port).get(up) == 1.0, process)
    negative_up = f'{catalog.PROBE_UP.name}{{probe="negative_stock"}}'
    wait_for(lambda: scrape(port).get(negative_up) == 1, process)
    samples = scrape(port)
    assert samples[catalog.NEGATIVE_INVENTORY_SKUS.name] == negative[0]
    assert samples[catalog.NEGATIVE_INVENTORY_UNITS.name] == negative[1]
    sku, units = oversold[0]
    assert sku == "LAB-CHECK_THEN_DECREMENT"
    assert samples[f'{catalog.OVERSOLD_UNITS.name}{{sku="{sku}"}}'] == units
    # The safe strategy's SKU is not oversold.
    assert f'{catalog.OVERSOLD_UNITS.name}{{sku="LAB-ATOMIC"}}' not in samples

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
        assert response.status == 200

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0


def test_database_down_keeps_serving_and_says_which_probe(
    tmp_path: Path, run_exporter, exporter_env: dict[str, str]
) -> None:
    port = free_port()
    env = {
        **exporter_env,
        "STOCKSENTRY_DATABASE_URL": "postgresql://postgres:hunter2@127.0.0.1:1/none",
    }
    process = run_exporter(write_exporter_config(tmp_path, port), env)
    key = f'{catalog.PROBE_UP.name}{{probe="negative_stock"}}'
    wait_for(lambda: key in scrape(port), process)
    # The probe has failed: /metrics still answers, within the scrape's own HTTP timeout,
    # and the exporter keeps running.
    samples = scrape(port)
    assert samples[key] == 0.0
    assert process.poll() is None
    assert catalog.NEGATIVE_INVENTORY_SKUS.name not in samples
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    output = process.stderr.read() + process.stdout.read()
    assert "negative_stock" in output  # the log names the probe that is down ...
    assert "hunter2" not in output  # ... and never the password


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("server:\n  port: eighty\n", ":2: server.port:"),
        ("servre: {}\n", ":1: servre: unknown key"),
        (
            "probes:\n  oversold:\n    interval: 5s\n    timeout: 30s\n",
            ":4: probes.oversold.timeout:",
        ),
        ("database:\n  url: postgresql://u:secret@h/db\n", ":2: database.url:"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, body: str, expected: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(body)
    for command in ("exporter --config", "check-config"):
        done = run_cli(*command.split(), str(config))
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert f"{config}{expected}" in lines[0]
        assert "secret" not in done.stderr
        assert "Traceback" not in done.stderr


def test_check_config_accepts_the_shipped_example(exporter_env: dict[str, str]) -> None:
    example = Path(__file__).resolve().parents[2] / "exporter" / "config.example.yaml"
    env = {**exporter_env, "STOCKSENTRY_REDIS_URL": "redis://127.0.0.1:6379/0"}
    done = run_cli("check-config", str(example), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{example}: ok\n")


def test_web_config_flag_enables_basic_auth(
    tmp_path: Path, run_exporter, exporter_env: dict[str, str]
) -> None:
    import base64

    import bcrypt

    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    port = free_port()
    config = write_exporter_config(tmp_path, port)
    process = subprocess.Popen(
        [*CLI, "exporter", "--config", str(config), "--web.config.file", str(web)],
        env={**exporter_env, "STOCKSENTRY_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def status(auth: str | None) -> int:
            request = urllib.request.Request(url)
            if auth:
                request.add_header(
                    "Authorization", "Basic " + base64.b64encode(auth.encode()).decode()
                )
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        wait_for(lambda: status("prometheus:s3cret") == 200, process)
        assert status(None) == 401
        assert status("prometheus:wrong") == 401
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_flags_override_the_yaml_and_the_start_up_says_what_is_served(
    tmp_path: Path, exporter_env: dict[str, str]
) -> None:
    """--web.listen-address twice (IPv4 and IPv6), --web.telemetry-path, --web.config.file
    with basic auth, --log.level and --log.format: each replaces its YAML key (the YAML
    says port ``yaml_port``, /metrics, info and json), and the start-up lines name each
    address with its TLS and authentication."""
    import base64

    import bcrypt

    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"basic_auth_users:\n  prometheus: {hashed}\n")
    yaml_port, v4_port, v6_port = free_port(), free_port(), free_port()
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f"server:\n  listen_address: 127.0.0.1\n  port: {yaml_port}\n"
        "log:\n  level: info\n  format: json\n"
    )
    process = subprocess.Popen(
        [
            *CLI,
            "exporter",
            f"--config={config}",
            f"--web.listen-address=127.0.0.1:{v4_port}",
            f"--web.listen-address=[::1]:{v6_port}",
            "--web.telemetry-path=/stock-metrics",
            f"--web.config.file={web}",
            "--log.level=debug",
            "--log.format=logfmt",
        ],
        env=exporter_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    credentials = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()

    def get(url: str, auth: bool = True) -> tuple[int, str]:
        request = urllib.request.Request(url)
        if auth:
            request.add_header("Authorization", credentials)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), ""

    try:
        v4, v6 = f"http://127.0.0.1:{v4_port}", f"http://[::1]:{v6_port}"
        wait_for(lambda: get(f"{v6}/stock-metrics")[0] == 200, process)
        status, body = get(f"{v4}/stock-metrics")
        assert status == 200
        assert 'stocksentry_build_info{python_version="' in body
        assert get(f"{v4}/stock-metrics", auth=False)[0] == 401
        assert get(f"{v4}/metrics")[0] == 404
        status, page = get(f"{v4}/")
        version = run_cli("--version", env=exporter_env, timeout=30).stdout.split()[-1]
        assert status == 200
        assert f"Version: {version} (revision " in page
        assert 'href="/stock-metrics"' in page
        with pytest.raises(urllib.error.URLError):  # the YAML's port is not served
            urllib.request.urlopen(f"http://127.0.0.1:{yaml_port}/healthz", timeout=2)
    finally:
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=20)
    assert process.returncode == 0, out
    lines = out.splitlines()
    # logfmt, not JSON: the --log.format flag won over log.format: json.
    assert lines
    # promslog's keys, in its order.
    assert all(re.match(r"time=\S+ level=[A-Z]+ source=\S+\.py:\d+ msg=", x) for x in lines), lines
    served = [line for line in lines if "listening on" in line]
    assert len(served) == 2, lines
    assert f"listening on http://127.0.0.1:{v4_port}/ with metrics at " in served[0]
    assert f"listening on http://[::1]:{v6_port}/ with metrics at " in served[1]
    for line in served:
        assert "/stock-metrics" in line
        assert "plain HTTP, basic auth (1 user)" in line
        assert "no authentication" not in line
    warnings = [line for line in lines if " level=WARN " in line]
    assert any("basic auth over plain HTTP" in line for line in warnings), lines
    assert not any("no authentication on the metrics" in line for line in lines)
    # --log.level=debug: debug lines are written (none at info).
    assert any(" level=DEBUG " in line for line in lines), lines


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--web.listen-address=::1:9", "an IPv6 address goes in brackets"),
        ("--web.listen-address=:70000", "the port must be a number from 0 to 65535"),
        ("--web.telemetry-path=/healthz", "is not a path starting with /"),
        ("--log.level=trace", "invalid choice: 'trace'"),
        ("--log.format=text", "invalid choice: 'text'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(tmp_path: Path, flag: str, message: str) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text("server: {port: 0}\n")
    done = run_cli("exporter", f"--config={config}", flag)
    assert done.returncode == 2
    assert flag.split("=")[0] in done.stderr
    assert message in done.stderr
