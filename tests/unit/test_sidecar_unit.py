"""``check_config`` and ``run_exporter``: exit statuses and their one-line errors.

No database is contacted: loading a config never connects. ``run_exporter`` runs in a
child interpreter (it configures logging for the whole process and serves until a
signal), which receives a real SIGTERM.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.sidecar import check_config, describe, run_exporter
from stocksentry.exporter.sidecar_cli import Overrides

DB_URL_ENV = "STOCKSENTRY_TEST_SIDECAR_DB"
RUN = (
    "import sys; from stocksentry.exporter.sidecar import run_exporter; "
    "sys.exit(run_exporter(sys.argv[1]))"
)


@pytest.fixture(autouse=True)
def no_multiproc_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The default of server.multiprocess_dir comes from the environment.
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def run_python(code: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter with ``path`` as its argument, outside any
    multiprocess directory of the test run."""
    return subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
    )


def check(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = check_config(path, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_a_good_config_is_ok_and_described(tmp_path: Path) -> None:
    path = write(tmp_path / "exporter.yaml", "server: {port: 9555}\n")
    status, out, err = check(path)
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"{path}: ok"
    assert "  listen 0.0.0.0:9555, metrics at /metrics: plain HTTP, no authentication" in lines
    assert "  log level info, format json" in lines
    assert "  multiprocess dir: none" in lines
    assert "  database probes: off (no database section)" in lines
    assert "  redis: off" in lines


def test_describe_names_the_probes_and_never_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DB_URL_ENV, "postgresql://app:pw-not-to-print@db:5432/shop")
    (tmp_path / "web.yml").write_text("basic_auth_users: {}\n")
    path = write(
        tmp_path / "exporter.yaml",
        "server:\n"
        "  web_config_file: web.yml\n"
        f"  multiprocess_dir: {tmp_path}\n"
        f"database: {{url_env: {DB_URL_ENV}}}\n",
    )
    status, out, _ = check(path)
    assert status == 0
    assert "pw-not-to-print" not in out
    # The web config is loaded and described: no TLS, no users, so nothing protects it.
    assert "plain HTTP, no authentication (web config " in out
    assert f"multiprocess dir: {tmp_path}" in out
    assert "database probes: " in out
    assert "negative_stock" in out


HEADLINE = "headline alerts that cannot fire with this config: "
EXAMPLE = Path(__file__).resolve().parents[2] / "exporter" / "config.example.yaml"


def test_check_config_names_the_headline_alert_an_unmapped_allocation_silences(
    tmp_path: Path,
) -> None:
    path = write(tmp_path / "exporter.yaml", "database: {url: 'postgresql://app@db/shop'}\n")
    status, out, _ = check(path)
    assert status == 0
    assert f"  {HEADLINE}StockOversold (probe oversold is off)" in out.splitlines()


def test_every_headline_alert_off_is_named() -> None:
    config = parse_config(
        "database: {url: 'postgresql://app@db/shop'}\n"
        "schema: {products: {allocation: initial_stock}}\n"
        "probes: {negative_stock: {enabled: false}, duplicate_orders: {enabled: false}}\n",
        environ={},
    )
    assert describe(config)[-1] == (
        HEADLINE + "StockNegativeInventory (probe negative_stock is off), "
        "StockDuplicateOrders (probe duplicate_orders is off)"
    )


def test_the_example_config_silences_no_headline_alert(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOCKSENTRY_DATABASE_URL", "postgresql://app@db/shop")
    monkeypatch.setenv("STOCKSENTRY_REDIS_URL", "redis://127.0.0.1:6379/0")
    status, out, err = check(EXAMPLE)
    assert (status, err) == (0, "")
    assert HEADLINE not in out


def test_without_a_database_no_headline_line_is_said() -> None:
    assert not any(
        line.startswith(HEADLINE)
        for line in describe(parse_config("server: {port: 9555}\n", environ={}))
    )


def test_describe_with_every_probe_off() -> None:
    config = parse_config(
        "database: {url: 'postgresql://app@db/shop'}\n"
        "probes:\n"
        + "".join(
            f"  {name}: {{enabled: false}}\n"
            for name in parse_config(
                "database: {url: 'postgresql://app@db/shop'}\n", environ={}
            ).probes.builtin()
        ),
        environ={},
    )
    assert "database probes: none enabled" in describe(config)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server: {prot: 19464}\n", "server.prot"),
        ("server:\n  port: 99999\n", ":2:"),
        ("server: [\n", "exporter.yaml"),
    ],
)
def test_a_bad_config_is_one_line_and_status_2(tmp_path: Path, text: str, expected: str) -> None:
    status, out, err = check(write(tmp_path / "exporter.yaml", text))
    assert (status, out) == (2, "")
    assert err.startswith("stocksentry")
    assert err.endswith("\n")
    assert err.count("\n") == 1
    assert expected in err
    assert "Traceback" not in err


def test_a_missing_config_file_is_status_2(tmp_path: Path) -> None:
    status, _, err = check(tmp_path / "nowhere.yaml")
    assert status == 2
    assert err.count("\n") == 1
    assert "nowhere.yaml" in err


def test_a_bad_web_config_is_one_line_and_status_2(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text("tls_server_config:\n  min_version: TLS11\n")
    path = write(tmp_path / "exporter.yaml", "server: {web_config_file: web.yml}\n")
    status, out, err = check(path)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "web.yml:2" in err
    assert "tls_server_config.min_version" in err


def test_run_exporter_refuses_a_bad_config_before_starting(tmp_path: Path) -> None:
    err = io.StringIO()
    path = write(tmp_path / "exporter.yaml", "server: {prot: 19464}\n")
    assert run_exporter(path, err=err) == 2
    assert err.getvalue().count("\n") == 1
    assert "server.prot" in err.getvalue()

    (tmp_path / "web.yml").write_text("nonsense: 1\n")
    good = write(tmp_path / "good.yaml", "server: {port: 19464}\n")
    err = io.StringIO()
    assert (
        run_exporter(good, overrides=Overrides(web_config_file=tmp_path / "web.yml"), err=err) == 2
    )
    assert "nonsense" in err.getvalue()


def test_run_exporter_on_a_busy_port_is_status_2(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        path = write(
            tmp_path / "exporter.yaml", f"server: {{listen_address: 127.0.0.1, port: {port}}}\n"
        )
        done = run_python(RUN, path)
    assert done.returncode == 2
    # The log lines before it are JSON; the error is the one plain line.
    (error,) = [x for x in done.stderr.splitlines() if x.startswith("stocksentry")]
    assert f"cannot listen on 127.0.0.1:{port}: " in error
    assert "Traceback" not in done.stderr


def test_run_exporter_refuses_a_listen_address_given_twice(tmp_path: Path) -> None:
    path = write(tmp_path / "exporter.yaml", "server: {port: 19464}\n")
    twice = (
        "import sys; from stocksentry.exporter.sidecar import run_exporter; "
        "from stocksentry.exporter.sidecar_cli import Overrides; "
        "sys.exit(run_exporter(sys.argv[1], overrides=Overrides("
        "listen_addresses=(('127.0.0.1', 9555), ('127.0.0.1', 9555)))))"
    )
    done = run_python(twice, path)
    assert done.returncode == 2
    (error,) = [x for x in done.stderr.splitlines() if x.startswith("stocksentry")]
    assert error.startswith("stocksentry exporter: error: --web.listen-address: ")
    assert "listed twice" in error


def test_run_exporter_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = write(
        tmp_path / "exporter.yaml", f"server: {{listen_address: 127.0.0.1, port: {port}}}\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", RUN, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
    )
    try:
        assert process.stdout is not None
        # Event order, not time: the "listening" log line comes once the port is open.
        for line in process.stdout:
            if "listening on" in line:
                break
        else:
            raise AssertionError(f"exited {process.wait()} before listening")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_servers_read_deadlines_come_from_the_config(tmp_path):
    from stocksentry.exporter.config import parse_config
    from stocksentry.exporter.server import ServerSettings

    default = parse_config("server: {port: 0}\n", "c.yaml", environ={}).server
    in_code = ServerSettings("", 0)
    assert default.header_timeout == in_code.header_timeout == 10.0
    assert default.keepalive_timeout == in_code.keepalive_timeout == 150.0
    tuned = parse_config(
        "server:\n  header_timeout: 2s\n  body_timeout: 1m\n"
        "  tls_handshake_timeout: 500ms\n  keepalive_timeout: 1h\n",
        "c.yaml",
        environ={},
    ).server
    assert (
        tuned.header_timeout,
        tuned.body_timeout,
        tuned.tls_handshake_timeout,
        tuned.keepalive_timeout,
    ) == (2.0, 60.0, 0.5, 3600.0)
