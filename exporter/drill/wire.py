"""HTTP/1.1 on asyncio streams, with last-byte synchronisation.

A burst of checkouts reaches a race window only when the requests land together. Each
request of a wave is written but its last byte, on its own connection; once every one is
on the wire, the last bytes go out in one tight loop, so the server parses them all
within a fraction of a millisecond (what race-condition testing tools call last-byte
synchronisation). :func:`send_wave` returns each response with the time its last byte
was sent, so the report gives the wave's arrival spread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["Request", "Response", "WaveResult", "send_one", "send_wave"]

#: The most a response head or body may hold: a checkout answers in a few hundred bytes.
MAX_RESPONSE: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class Request:
    """One rendered request."""

    method: str
    url: str
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""

    def encode(self) -> tuple[str, int, bool, bytes]:
        """``(host, port, tls, bytes)``: the request as written on the wire."""
        parts = urllib.parse.urlsplit(self.url)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        host_header = parts.netloc.rpartition("@")[2]
        lines = [f"{self.method} {target} HTTP/1.1", f"Host: {host_header}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        lines += [f"Content-Length: {len(self.body)}", "Connection: close", "", ""]
        return host, port, tls, "\r\n".join(lines).encode("latin-1") + self.body


@dataclass(slots=True)
class Response:
    """A response, or the error that stood in its way (``status`` 0)."""

    status: int = 0
    body: bytes = b""
    error: str | None = None
    #: When the request's last byte went out, and when the response was read (perf_counter).
    sent_at: float = 0.0
    done_at: float = 0.0
    #: Whether it was a sale, when the engine that sent it judged so already (Locust's
    #: workers); ``None``: judge the status and body.
    sale: bool | None = None

    @property
    def latency(self) -> float:
        """Seconds from the last byte sent to the response read."""
        return max(0.0, self.done_at - self.sent_at)

    def json(self) -> Any:
        """The body as JSON, or ``None`` when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@dataclass(slots=True)
class WaveResult:
    """A wave's responses, in request order, and its arrival spread."""

    responses: list[Response] = field(default_factory=list)
    #: Seconds from the first to the last request completed on the wire.
    spread: float = 0.0


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)


async def _read_response(reader: asyncio.StreamReader, response: Response) -> None:
    raw = b""
    while len(raw) < MAX_RESPONSE and (more := await reader.read(MAX_RESPONSE - len(raw))):
        raw += more
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = lines[0].split(b" ", 2)
    if len(status) < 2 or not status[0].startswith(b"HTTP/") or not status[1].isdigit():
        raise ValueError("not an HTTP response")
    response.status = int(status[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip().lower()
    if headers.get(b"transfer-encoding") == b"chunked":
        body = _dechunk(body)
    elif b"content-length" in headers and headers[b"content-length"].isdigit():
        body = body[: int(headers[b"content-length"])]
    response.body = body


async def send_wave(requests: Sequence[Request], *, wait_s: float) -> WaveResult:
    """Send ``requests`` together: connect and write each but its last byte, then release
    every last byte at once, then read the responses (each within ``wait_s``)."""
    responses = [Response() for _ in requests]
    Staged = tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes] | None

    async def stage(response: Response, request: Request) -> Staged:
        host, port, tls, data = request.encode()
        try:
            context = ssl.create_default_context() if tls else None
            connect = asyncio.open_connection(
                host, port, ssl=context, server_hostname=host if tls else None
            )
            reader, writer = await asyncio.wait_for(connect, wait_s)
            writer.write(data[:-1])
            await asyncio.wait_for(writer.drain(), wait_s)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            response.error = _why(exc)
            return None
        return reader, writer, data[-1:]

    staged = await asyncio.gather(*map(stage, responses, requests))
    # Release: one tight loop of writes, each a send() on its own socket.
    sent: list[float] = []
    for response, link in zip(responses, staged, strict=True):
        if link is not None:
            link[1].write(link[2])
            response.sent_at = time.perf_counter()
            sent.append(response.sent_at)

    async def finish(response: Response, link: Staged) -> None:
        if link is None:
            return
        reader, writer, _ = link
        try:
            await asyncio.wait_for(_read_response(reader, response), wait_s)
        except (OSError, TimeoutError, ValueError, ssl.SSLError) as exc:
            response.error = _why(exc)
        finally:
            response.done_at = time.perf_counter()
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

    await asyncio.gather(*map(finish, responses, staged))
    return WaveResult(responses, (max(sent) - min(sent)) if sent else 0.0)


async def send_one(request: Request, *, wait_s: float) -> Response:
    """One request on its own."""
    return (await send_wave([request], wait_s=wait_s)).responses[0]


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
