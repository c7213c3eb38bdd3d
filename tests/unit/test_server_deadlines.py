"""Slow clients cannot hold the exporter's connections: head, body and TLS deadlines.

Each test injects short deadlines through ``ServerSettings`` and asserts that the server
closes the connection (the client reads EOF or a reset) within a generous wait, never
how long it took; and that normal scrapes, kept-alive connections and other clients
are served meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import trustme
from polling import async_wait_until
from stocksentry.exporter.server import ServerSettings, deadlines, serving
from stocksentry.exporter.server.deadlines import HeadDeadline
from stocksentry.exporter.webconfig import WebConfig, load_web_config

SHORT = 0.5
# Longer: the test's own good clients must finish their handshakes within it, on a
# loaded machine, with both ends on one event loop.
HANDSHAKE = 2.0
# Generous: a loaded two-core machine may be slow to run the timer and the close.
WAIT = 30.0


def settings(**overrides: object) -> ServerSettings:
    values: dict[str, object] = {
        "listen_address": "127.0.0.1",
        "port": 0,
        "header_timeout": SHORT,
        "body_timeout": SHORT,
        "tls_handshake_timeout": HANDSHAKE,
    }
    values.update(overrides)
    return ServerSettings(**values)  # type: ignore[arg-type]


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes (a reset counts as the close)."""
    received = b""
    try:
        while chunk := await reader.read(65536):
            received += chunk
    except (ConnectionError, ssl.SSLError):
        pass
    return received


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    task = asyncio.ensure_future(_read_to_end(reader))
    try:
        await async_wait_until(
            task.done, timeout=WAIT, message="the server did not close the connection"
        )
    finally:
        task.cancel()
    return task.result()


async def _get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str = "/healthz"
) -> tuple[bytes, bytes]:
    """One keep-alive GET on an open connection: (status line, body)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    body = await reader.readexactly(length)
    return head.split(b"\r\n", 1)[0], body


async def _scrape_works(port: int, context: ssl.SSLContext | None = None) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        status, body = await _get(reader, writer, "/metrics")
        assert status.endswith(b" 200 OK"), status
        assert body
    finally:
        writer.close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[WebConfig, ssl.SSLContext]:
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        tmp_path / "server.pem"
    )
    (tmp_path / "web.yml").write_text(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.pem\n"
    )
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return load_web_config(tmp_path / "web.yml"), client


@pytest.mark.parametrize(
    "partial",
    [b"", b"GET /metr", b"GET /metrics HTTP/1.1\r\nHost: x\r\n", b"GET / HTTP/1.1\r\n\r"],
    ids=["nothing", "half-line", "half-headers", "split-end"],
)
async def test_a_partial_request_head_is_closed(
    partial: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving(settings()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(partial)
        await writer.drain()
        # Other clients are served while the slow one waits for its deadline.
        await _scrape_works(server.port)
        assert await _closed_by_server(reader) == b""
        writer.close()
        await _scrape_works(server.port)
    # A slow client is the client's problem: nothing above debug level is logged for it.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_partial_head_over_tls_is_closed(tls: tuple[WebConfig, ssl.SSLContext]) -> None:
    web_config, client = tls
    async with serving(settings(web_config=web_config)) as server:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=client, server_hostname="127.0.0.1"
        )
        writer.write(b"GET /metrics HTTP/1.1\r\nHo")
        await writer.drain()
        await _scrape_works(server.port, client)
        assert await _closed_by_server(reader) == b""
        writer.close()
        await _scrape_works(server.port, client)


async def test_a_stalled_tls_handshake_is_closed(tls: tuple[WebConfig, ssl.SSLContext]) -> None:
    web_config, client = tls
    async with serving(settings(web_config=web_config)) as server:
        # A TCP connection that never starts (or finishes) its handshake.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"\x16\x03\x01\x00")  # the first bytes of a ClientHello, no more
        await writer.drain()
        await _scrape_works(server.port, client)
        assert await _closed_by_server(reader) == b""
        writer.close()


async def test_a_stalled_request_body_is_closed() -> None:
    async with serving(settings(body_timeout=SHORT, header_timeout=WAIT)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
        await writer.drain()
        await _scrape_works(server.port)
        # The server may answer (405) before it closes; what matters is that it closes.
        await _closed_by_server(reader)
        writer.close()


async def test_kept_alive_connections_outlive_the_head_deadline() -> None:
    """Idle time between requests is keep-alive's, not the head deadline's."""
    async with serving(settings()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            for _ in range(2):
                status, _ = await _get(reader, writer)
                assert status.endswith(b" 200 OK"), status
                # Longer than every deadline: an idle kept-alive connection stays open.
                await asyncio.sleep(SHORT * 4)
            status, _ = await _get(reader, writer, "/metrics")
            assert status.endswith(b" 200 OK"), status
        finally:
            writer.close()


async def test_a_partial_second_request_on_a_kept_alive_connection_is_closed() -> None:
    async with serving(settings()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        status, _ = await _get(reader, writer)
        assert status.endswith(b" 200 OK")
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        await writer.drain()
        assert await _closed_by_server(reader) == b""
        writer.close()


# --- lingering after a refused request ------------------------------------------------------


@dataclass
class _Connection:
    """How one server connection ended: the ``close``/``abort`` calls on its transport
    until it was lost. (aiohttp closes it once more when told it was lost: a no-op, not
    recorded.)"""

    watch: HeadDeadline
    events: list[str] = field(default_factory=list)
    lost: bool = False
    #: The bytes the watch had dropped while lingering when it aborted.
    dropped_at_abort: int | None = None


class _RecordingTransport:
    """The server's transport as the watch sees it, recording how the watch ends it."""

    def __init__(self, transport: asyncio.Transport, connection: _Connection) -> None:
        self._transport = transport
        self._connection = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        if not self._connection.lost:
            self._connection.events.append("close")
        self._transport.close()

    def abort(self) -> None:
        if not self._connection.lost:
            self._connection.events.append("abort")
            self._connection.dropped_at_abort = self._connection.watch._dropped
        self._transport.abort()


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[_Connection]:
    """The server's connections, in order, each recording how it ended."""
    seen: list[_Connection] = []
    made = HeadDeadline.connection_made
    lost = HeadDeadline.connection_lost

    def connection_made(self: HeadDeadline, transport: asyncio.BaseTransport) -> None:
        connection = _Connection(self)
        seen.append(connection)
        recording = _RecordingTransport(cast(asyncio.Transport, transport), connection)
        made(self, cast(asyncio.Transport, recording))

    def connection_lost(self: HeadDeadline, exc: Exception | None) -> None:
        for connection in seen:
            if connection.watch is self:
                connection.lost = True
        lost(self, exc)

    monkeypatch.setattr(HeadDeadline, "connection_made", connection_made)
    monkeypatch.setattr(HeadDeadline, "connection_lost", connection_lost)
    return seen


# A request line over aiohttp's 8 KiB limit, refused (400) while the client is still sending.
_REFUSED_HEAD = b"GET /" + b"a" * 65536
_CHUNK = b"a" * 65536
# Smaller than the default (64 MiB) to keep the test quick, yet larger than what loopback
# buffers may hold in flight (Linux's tcp_rmem and tcp_wmem maxima: 32 MiB received and
# 4 MiB sent on the machine this was written on), so the 4x bound on what the client got to
# send holds.
_LINGER_BYTES = 16 * 1024 * 1024


async def _send_until_reset(writer: asyncio.StreamWriter, most: int) -> int:
    """Send the refused head, then more of it, until the server aborts the connection:
    return how many bytes were sent by then; fail past ``most``."""
    writer.write(_REFUSED_HEAD)
    sent = len(_REFUSED_HEAD)
    try:
        await writer.drain()
        while sent <= most:
            writer.write(_CHUNK)
            sent += len(_CHUNK)
            await writer.drain()
    except ConnectionError:
        return sent
    pytest.fail(f"the server still read after {sent} bytes (lingering up to {_LINGER_BYTES})")


async def test_a_refused_request_still_coming_past_linger_bytes_is_aborted(
    monkeypatch: pytest.MonkeyPatch, connections: list[_Connection]
) -> None:
    monkeypatch.setattr(deadlines, "LINGER_BYTES", _LINGER_BYTES)
    # Far longer than the test: only the byte bound can end the lingering.
    monkeypatch.setattr(deadlines, "LINGER_SECONDS", 10 * WAIT)
    async with serving(settings(header_timeout=WAIT, body_timeout=WAIT)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            answer = asyncio.ensure_future(_read_to_end(reader))
            async with asyncio.timeout(WAIT):
                sent = await _send_until_reset(writer, 4 * _LINGER_BYTES)
                received = await answer
        finally:
            writer.close()
        connection = connections[0]
        await async_wait_until(
            lambda: connection.lost,
            timeout=WAIT,
            message="the server did not drop the connection",
        )
        # The client got the answer before the abort, then a reset for what it kept sending.
        assert received.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), received[:200]
        assert _LINGER_BYTES < sent <= 4 * _LINGER_BYTES
        assert connection.events == ["abort"]
        # Aborted on the read that crossed the bound (asyncio reads at most 256 KiB).
        assert connection.dropped_at_abort is not None
        assert _LINGER_BYTES < connection.dropped_at_abort <= _LINGER_BYTES + 1024 * 1024
        await _scrape_works(server.port)


async def test_a_refused_request_whose_rest_ends_under_linger_bytes_is_closed(
    monkeypatch: pytest.MonkeyPatch, connections: list[_Connection]
) -> None:
    # Far longer than the test: the client's end, not the linger deadline, closes it.
    monkeypatch.setattr(deadlines, "LINGER_SECONDS", 10 * WAIT)
    async with serving(settings(header_timeout=WAIT, body_timeout=WAIT)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(_REFUSED_HEAD)
            await writer.drain()
            async with asyncio.timeout(WAIT):
                # The answer, then the end of the server's side (it lingers): no reset.
                received = await reader.read()
            assert received.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), received[:200]
            # The rest, 1 MiB (far under the bound), then the client's end of sending.
            for _ in range(16):
                writer.write(_CHUNK)
                await writer.drain()
            writer.write(b" HTTP/1.1\r\nHost: x\r\n\r\n")
            writer.write_eof()
            await writer.drain()
            connection = connections[0]
            await async_wait_until(
                lambda: connection.lost,
                timeout=WAIT,
                message="the server did not close the lingering connection",
            )
        finally:
            writer.close()
        assert connection.events == ["close"]
        assert connection.dropped_at_abort is None
        await _scrape_works(server.port)


# --- the stream watch on its own -------------------------------------------------------------


class _Inner:
    def __init__(self) -> None:
        self.data = b""

    def connection_made(self, transport: object) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: object) -> None:
        pass


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def _watch(*pieces: bytes) -> HeadDeadline:
    inner = _Inner()
    watch = HeadDeadline(inner, header_timeout=WAIT, body_timeout=WAIT)  # type: ignore[arg-type]
    watch.connection_made(_Transport())  # type: ignore[arg-type]
    for piece in pieces:
        watch.data_received(piece)
    assert inner.data == b"".join(pieces)  # passed on unchanged
    return watch


@pytest.mark.parametrize(
    ("pieces", "state"),
    [
        ((b"GET / HTTP/1.1\r\n\r\n",), "idle"),
        ((b"GET / HTTP/1.1\r\n", b"\r", b"\n"), "idle"),
        ((b"GET / HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\n",), "head"),
        ((b"POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\nab",), "body"),
        ((b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab", b"cde"), "idle"),
        ((b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nabGET / HTTP/1.1\r\n\r\n",), "idle"),
        ((b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nabGET",), "head"),
        ((b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",), "body"),
        (
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r", b"\n\r\n"),
            "idle",
        ),
        ((b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",), "idle"),
    ],
)
async def test_the_watch_follows_heads_and_bodies(pieces: tuple[bytes, ...], state: str) -> None:
    watch = _watch(*pieces)
    assert watch.state == state
    watch.connection_lost(None)


async def test_the_watch_keeps_a_bounded_head() -> None:
    watch = _watch(b"GET / HTTP/1.1\r\n", b"X: " + b"a" * 1_000_000)
    assert len(watch.pending_head) <= 128 * 1024
    watch.connection_lost(None)


def test_deadlines_are_validated() -> None:
    for name in ("header_timeout", "body_timeout", "tls_handshake_timeout", "keepalive_timeout"):
        for bad in (0, -1, float("nan"), 1e9):
            with pytest.raises(ValueError, match=name):
                settings(**{name: bad})
