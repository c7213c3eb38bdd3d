"""Serving over real local sockets: malformed requests, basic auth and TLS, SIGTERM.

No database, no binary: the listener is on 127.0.0.1 with a free port, basic auth checks
bcrypt hashes made here (at the lowest cost), TLS uses trustme certificates, and the log
rate limit runs on an injected clock.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import trustme
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from pytest_aiohttp import AiohttpClient
from stocksentry.exporter.server import BASIC_AUTH, ServerSettings, create_app, run_server, serving
from stocksentry.exporter.server.running import ClientErrorLog
from stocksentry.exporter.webconfig import WebConfig, load_web_config


def settings(**overrides: object) -> ServerSettings:
    values: dict[str, object] = {"listen_address": "127.0.0.1", "port": 0}
    values.update(overrides)
    return ServerSettings(**values)  # type: ignore[arg-type]


# --- malformed requests --------------------------------------------------------------------


async def _raw_request(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


async def test_a_malformed_request_gets_400_and_one_quiet_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        async with serving(settings()) as server:
            answer = await _raw_request(
                server.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"
            )
            healthy = await _raw_request(
                server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    assert healthy.startswith(b"HTTP/1.1 200 ")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
    quiet = [r for r in caplog.records if "malformed request from 127.0.0.1" in r.getMessage()]
    assert len(quiet) == 1
    assert quiet[0].levelno == logging.INFO


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /" + b"a" * 1_000_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Long: " + b"b" * 4_000_000 + b"\r\n\r\n",
    ],
    ids=["megabyte-path", "four-megabyte-header"],
)
async def test_a_request_too_long_is_answered_400_not_reset(request_bytes: bytes) -> None:
    # aiohttp refuses it after 8 KiB and closes while the rest is still coming: without
    # the lingering close the kernel resets the connection and the 400 is never read.
    async with serving(settings()) as server:
        answer = await _raw_request(server.port, request_bytes)
        healthy = await _raw_request(
            server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
    assert healthy.startswith(b"HTTP/1.1 200 ")


def test_client_error_log_rate_limits_and_keeps_real_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    log = ClientErrorLog(logging.getLogger("test.quiet"), interval=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.DEBUG, logger="test.quiet"):
        for at in (100.0, 130.0, 159.0, 160.0):
            now[0] = at
            log.exception(
                "Error handling request from %s", "10.0.0.7", exc_info=BadHttpMessage("x")
            )
        try:
            raise ZeroDivisionError("handler bug")
        except ZeroDivisionError as exc:
            log.exception("Error handling request from %s", "10.0.0.7", exc_info=exc)

    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert log.client_errors == 4
    assert messages[0] == (logging.INFO, "malformed request from 10.0.0.7 answered 400: x")
    assert messages[1] == (
        logging.INFO,
        "malformed request from 10.0.0.7 answered 400: x (2 more since the last line)",
    )
    # A handler's own bug is still an error, with its traceback.
    assert messages[2] == (logging.ERROR, "Error handling request from 10.0.0.7")
    assert caplog.records[2].exc_info is not None
    assert len(messages) == 3


# --- basic auth and TLS from a web config --------------------------------------------------


@pytest.fixture(scope="module")
def auth_config(tmp_path_factory: pytest.TempPathFactory) -> WebConfig:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path_factory.mktemp("web") / "web.yml"
    path.write_text(
        "basic_auth_users:\n"
        f"  prometheus: '{hashed}'\n"
        "http_server_config:\n"
        "  headers:\n"
        "    X-Frame-Options: deny\n"
    )
    return load_web_config(path)


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def test_basic_auth_accepts_and_refuses(
    aiohttp_client: AiohttpClient, auth_config: WebConfig
) -> None:
    app = create_app(settings(web_config=auth_config))
    client = await aiohttp_client(app)

    for path in ("/metrics", "/"):
        missing = await client.get(path)
        assert missing.status == 401
        assert missing.headers["WWW-Authenticate"] == 'Basic realm="stocksentry"'
    for headers in (
        basic("prometheus", "wrong"),
        basic("nobody", "s3cret"),
        {"Authorization": "Bearer s3cret"},
        {"Authorization": "Basic !!notbase64"},
    ):
        assert (await client.get("/metrics", headers=headers)).status == 401

    good = await client.get("/metrics", headers=basic("prometheus", "s3cret"))
    assert good.status == 200
    assert good.headers["X-Frame-Options"] == "deny"
    # The second good scrape is answered from the verified cache, without bcrypt.
    checks = app[BASIC_AUTH].bcrypt_checks
    assert (await client.get("/metrics", headers=basic("prometheus", "s3cret"))).status == 200
    assert app[BASIC_AUTH].bcrypt_checks == checks

    # Kubelet probes carry no credentials.
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200


async def test_no_web_config_means_no_auth(aiohttp_client: AiohttpClient) -> None:
    app = create_app(settings())
    assert not app[BASIC_AUTH].enabled
    client = await aiohttp_client(app)
    assert (await client.get("/metrics")).status == 200


async def test_tls_from_the_web_config(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(tmp_path / "server.pem")
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.pem\n"
    )
    web_config = load_web_config(tmp_path / "web.yml")
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    async with serving(settings(web_config=web_config)) as server:
        assert server.url.startswith("https://127.0.0.1:")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{server.url}healthz", ssl=client_context) as response,
        ):
            assert response.status == 200


# --- run_server ----------------------------------------------------------------------------


def test_run_server_stops_cleanly_on_sigterm(caplog: pytest.LogCaptureFixture) -> None:
    events: list[str] = []

    async def background(app: web.Application) -> AsyncIterator[None]:
        events.append("started")
        # The handler is installed before start-up: this SIGTERM ends in a clean stop.
        asyncio.get_running_loop().call_soon(signal.raise_signal, signal.SIGTERM)
        yield
        events.append("cleaned up")

    with caplog.at_level(logging.INFO, logger="stocksentry.exporter.server"):
        run_server(settings(), background=[background])

    assert events == ["started", "cleaned up"]
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("listening on http://127.0.0.1:")
        and m.endswith("; plain HTTP, no authentication")
        for m in messages
    ), messages
    assert any(m.startswith("no authentication on the metrics") for m in messages)
    assert any(m.startswith("starting stocksentry ") for m in messages)
    assert "received SIGTERM: shutting down" in messages
    assert messages[-1] == "stocksentry exporter stopped"
    # The handlers are removed again: SIGTERM is back to its default.
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
