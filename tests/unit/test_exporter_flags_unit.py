"""The exporter's Prometheus-style flags, build info and start-up lines, without a socket.

Flags: ``--web.listen-address`` (repeatable, IPv6 in brackets), ``--web.telemetry-path``,
``--web.config.file``, ``--log.level``, ``--log.format``, each overriding its YAML key.
The servers themselves are started in tests/integration/test_exporter_cli.py.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from stocksentry.exporter.cli import build_parser
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.listen import format_listen_address, parse_listen_address
from stocksentry.exporter.server import RunningServer, ServerSettings
from stocksentry.exporter.server.buildinfo import (
    BuildInfo,
    BuildInfoCollector,
    build_info,
    read_revision,
)
from stocksentry.exporter.server.running import startup_lines
from stocksentry.exporter.sidecar import apply_overrides, configure_exporter_logging
from stocksentry.exporter.sidecar_cli import Overrides
from stocksentry.exporter.tlsconfig import TLSServerConfig
from stocksentry.exporter.webconfig import WebConfig
from stocksentry.instrumentation.logs import configure_logging, get_logger

# --- --web.listen-address ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":19464", ("", 19464)),
        ("0.0.0.0:19464", ("0.0.0.0", 19464)),  # noqa: S104 - parsing, not binding
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::]:19464", ("::", 19464)),
        ("[::1]:65535", ("::1", 65535)),
        ("[fe80::1%eth0]:1", ("fe80::1%eth0", 1)),
        ("exporter.shop.svc:19464", ("exporter.shop.svc", 19464)),
    ],
)
def test_listen_addresses_as_go_reads_them(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen_address(text) == expected
    assert parse_listen_address(format_listen_address(*expected)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("19464", "has no port"),
        ("::1:19464", "an IPv6 address goes in brackets"),
        ("[127.0.0.1]:1", "is not an IPv6 address"),
        ("[::1]:", "the port must be a number"),
        (":65536", "the port must be a number from 0 to 65535"),
        (":-1", "the port must be a number"),
        ("bad_host:1", "is not an IP address or host name"),
        ("x" * 400 + ":1", "too long"),
    ],
)
def test_bad_listen_addresses_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_listen_address(text)


# --- the flags and the YAML they override ---------------------------------------------------


def parse(*argv: str) -> Overrides:
    return Overrides.from_args(
        build_parser().parse_args(["exporter", "--config", "c.yaml", *argv])
    )


def test_no_flag_overrides_nothing() -> None:
    assert parse() == Overrides()


def test_every_flag_is_read() -> None:
    got = parse(
        "--web.listen-address=:19464",
        "--web.listen-address",
        "[::1]:19465",
        "--web.telemetry-path=/stock/metrics",
        "--web.config.file=web.yml",
        "--log.level=warn",
        "--log.format=logfmt",
    )
    assert got == Overrides(
        listen_addresses=(("", 19464), ("::1", 19465)),
        telemetry_path="/stock/metrics",
        web_config_file="web.yml",
        log_level="warn",
        log_format="logfmt",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--web.listen-address=9100"], "argument --web.listen-address: '9100' has no port"),
        (["--web.telemetry-path=metrics"], "argument --web.telemetry-path: 'metrics' is not"),
        (["--web.telemetry-path=/readyz"], "argument --web.telemetry-path: '/readyz' is not"),
        (["--log.level=WARN"], "argument --log.level: invalid choice: 'WARN'"),
        (["--log.format=console"], "argument --log.format: invalid choice: 'console'"),
    ],
)
def test_bad_flags_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(*argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


YAML = """
server:
  listen_address: 127.0.0.1
  port: 9999
  telemetry_path: /from-yaml
log:
  level: error
  format: json
"""


def test_flags_replace_their_yaml_keys_and_leave_the_rest() -> None:
    config = parse_config(YAML, environ={})
    assert (config.server.telemetry_path, config.log.level) == ("/from-yaml", "error")
    same = apply_overrides(config, Overrides())
    assert same == config
    changed = apply_overrides(
        config,
        Overrides(
            listen_addresses=(("::", 19464), ("127.0.0.1", 19465)),
            telemetry_path="/m",
            web_config_file="/etc/web.yml",
            log_level="debug",
        ),
    )
    assert (changed.server.listen_address, changed.server.port) == ("::", 19464)
    assert changed.server.telemetry_path == "/m"
    assert changed.server.web_config_file == Path("/etc/web.yml")
    assert (changed.log.level, changed.log.format) == ("debug", "json")
    assert changed.server.keepalive_timeout == config.server.keepalive_timeout


def test_the_config_defaults_are_the_exporters() -> None:
    config = parse_config("{}\n", environ={})
    assert (config.server.port, config.server.telemetry_path) == (19464, "/metrics")
    assert (config.log.level, config.log.format) == ("info", "json")


def test_several_addresses_reach_the_server_settings() -> None:
    settings = ServerSettings("", 19464, also_listen=(("::1", 19465),))
    assert settings.addresses == (("", 19464), ("::1", 19465))
    with pytest.raises(ValueError, match="listed twice"):
        ServerSettings("::1", 19465, also_listen=(("::1", 19465),))
    with pytest.raises(ValueError, match="port must be 0-65535"):
        ServerSettings("::1", 1, also_listen=(("::1", 70000),))


# --- --log.level / --log.format -------------------------------------------------------------


def test_logfmt_and_levels() -> None:
    stream = io.StringIO()
    saved_level = logging.getLogger().level
    try:
        configure_exporter_logging("warn", "logfmt", stream=stream)
        log = logging.getLogger("stocksentry.exporter.test")
        log.info("not written at warn")
        log.warning("listening on %s", "http://[::1]:19464/")
        get_logger("stocksentry.probe").error("probe down", probe="oversold")
        configure_exporter_logging("debug", "json", stream=stream)
        log.debug("written at debug")
    finally:
        # As tests/unit/test_logs.py undoes it: no bridge handler left, defaults back.
        configure_logging(stream=io.StringIO(), bridge_stdlib=False)
        logging.getLogger().setLevel(saved_level)
        structlog.reset_defaults()
    first, structured, second = stream.getvalue().splitlines()
    assert re.fullmatch(
        r"time=\S+Z level=ERROR source=test_exporter_flags_unit\.py:\d+ msg=\"probe down\""
        r" probe=oversold logger=stocksentry\.probe",
        structured,
    ), structured
    # promslog's keys and order: time=… level=WARN source=file:line msg="…", then the rest.
    assert re.fullmatch(
        r"time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=WARN"
        r" source=test_exporter_flags_unit\.py:\d+"
        r' msg="listening on http://\[::1\]:19464/" logger=stocksentry\.exporter\.test',
        first,
    ), first
    assert json.loads(second)["event"] == "written at debug"
    assert "not written" not in stream.getvalue()


# --- stocksentry_build_info -----------------------------------------------------------------


def test_revision_from_the_build_file_then_the_installer_then_unknown(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    vcs = json.dumps({"url": "https://git.example/shop.git", "vcs_info": {"commit_id": "beef42"}})
    assert read_revision(package, direct_url="") == "unknown"
    assert read_revision(package, direct_url=vcs) == "beef42"
    assert read_revision(package, direct_url='{"dir_info": {"editable": true}}') == "unknown"
    assert read_revision(package, direct_url="not json") == "unknown"
    (package / "REVISION").write_text("0123abc\n")
    assert read_revision(package, direct_url=vcs) == "0123abc"
    # Anything that is not a commit id or tag (an unfilled template) is not a label value.
    (package / "REVISION").write_text("${REVISION}\n")
    assert read_revision(package, direct_url="") == "unknown"


def test_build_info_is_one_series_of_value_1() -> None:
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector(BuildInfo("1.2.3", "0123abc", "3.12.7")))
    text = generate_latest(registry).decode()
    assert (
        'stocksentry_build_info{python_version="3.12.7",revision="0123abc",version="1.2.3"} 1.0'
    ) in text
    assert (
        registry.get_sample_value(
            "stocksentry_build_info",
            {"version": "1.2.3", "revision": "0123abc", "python_version": "3.12.7"},
        )
        == 1.0
    )
    this = build_info()
    assert this.describe().startswith(f"stocksentry {this.version} (revision ")


# --- start-up lines -------------------------------------------------------------------------

TLS = TLSServerConfig(cert_file=Path("/tls/crt"), key_file=Path("/tls/key"))
HASH = {"prometheus": b"$2b$04$abcdefghijklmnopqrstuu1234567890123456789012345678901"}


def client_cert_tls(client_auth_type: str, **options: Any) -> TLSServerConfig:
    """TLS that asks for client certificates signed by /ca."""
    return TLSServerConfig(
        cert_file=Path("/c"),
        key_file=Path("/k"),
        client_auth_type=client_auth_type,
        client_ca_file=Path("/ca"),
        **options,
    )


def lines_for(web_config: WebConfig | None, *addresses: tuple[str, int]) -> list[str]:
    server = RunningServer(web.Application(), "https" if web_config and web_config.tls else "http",
                           addresses)  # fmt: skip
    settings = ServerSettings("127.0.0.1", 0, web_config=web_config, metrics_path="/m")
    return [f"{logging.getLevelName(x.level)} {x.text}" for x in startup_lines(server, settings)]


def test_plain_http_says_so_per_address_and_warns() -> None:
    lines = lines_for(None, ("0.0.0.0", 19464), ("::", 19464))  # noqa: S104
    assert lines[0].startswith("INFO starting stocksentry ")
    assert lines[1:3] == [
        "INFO listening on http://0.0.0.0:19464/ with metrics at http://0.0.0.0:19464/m "
        "(/healthz and /readyz answer without credentials); plain HTTP, no authentication",
        "INFO listening on http://[::]:19464/ with metrics at http://[::]:19464/m "
        "(/healthz and /readyz answer without credentials); plain HTTP, no authentication",
    ]
    # Said once a line: what protects the metrics, at its end.
    assert all(line.count("authentication") == 1 for line in lines[1:3])
    assert lines[3].startswith("WARNING no authentication on the metrics")
    assert len(lines) == 4


def test_basic_auth_without_tls_is_not_called_unauthenticated() -> None:
    lines = lines_for(WebConfig(basic_auth_users=HASH), ("127.0.0.1", 19464))
    assert lines[1].endswith("; plain HTTP, basic auth (1 user)")
    assert lines[2].startswith("WARNING basic auth over plain HTTP: passwords cross")
    assert not any("no authentication on the metrics" in line for line in lines)


def test_tls_with_basic_auth_or_client_certificates() -> None:
    both = lines_for(WebConfig(tls=TLS, basic_auth_users=HASH), ("127.0.0.1", 19464))
    assert both[1].startswith("INFO listening on https://127.0.0.1:19464/")
    assert both[1].endswith("; TLS (TLS12-TLS13), no client certificates, basic auth (1 user)")
    assert len(both) == 2
    mtls = client_cert_tls("RequireAndVerifyClientCert", min_version="TLS13")
    certs = lines_for(WebConfig(tls=mtls), ("127.0.0.1", 19464))
    assert certs[1].endswith(
        "; TLS (TLS13-TLS13), client certificates: RequireAndVerifyClientCert"
    )
    assert len(certs) == 2
    optional = client_cert_tls("VerifyClientCertIfGiven")
    lines = lines_for(WebConfig(tls=optional), ("127.0.0.1", 19464))
    assert lines[1].endswith("client certificates: VerifyClientCertIfGiven, no authentication")
    assert lines[2].startswith("WARNING no authentication on the metrics")
