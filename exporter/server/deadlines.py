"""Read deadlines for slow clients: a request head, a request body and a TLS handshake.

aiohttp bounds the size of a request line and of its headers, but not the time a client
takes to send them: a client that sends half a request line and then nothing holds its
connection (and a file descriptor, and with TLS a session) for aiohttp's keep-alive
timeout, about an hour. A few hundred such clients exhaust the exporter's descriptors
while Prometheus is refused. So the listener here wraps each connection's protocol in a
:class:`HeadDeadline` that aborts the connection when

- a request head (request line and headers, up to the empty line) has not arrived in
  full within ``header_timeout`` seconds of the connection opening or of its first byte;
- a request body announced by ``Content-Length`` (or ``chunked``) has not arrived in full
  within ``body_timeout`` seconds of the end of its head;

and the TLS handshake itself is bounded by ``loop.create_server``'s
``ssl_handshake_timeout``. Between requests a kept-alive connection is idle, which is
aiohttp's ``keepalive_timeout`` to bound, not ours: Prometheus reuses its connection
from one scrape to the next.

The watch reads the bytes as they pass, without parsing them for aiohttp: it only finds
where a head ends (``\\r\\n\\r\\n``) and how long the body that follows is. aiohttp still
parses, and refuses malformed requests with 400 as before.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from ssl import SSLContext
from typing import Final, cast

from aiohttp import web

from ..config import model

__all__ = [
    "BODY_TIMEOUT",
    "HANDSHAKE_TIMEOUT",
    "HEADER_TIMEOUT",
    "KEEPALIVE_TIMEOUT",
    "HeadDeadline",
    "WatchedSite",
]

# The defaults are the config model's (``server:`` in the exporter's config), where their
# reasons are written; a ServerSettings built in code gets the same.
HEADER_TIMEOUT: Final = model.HEADER_TIMEOUT
BODY_TIMEOUT: Final = model.BODY_TIMEOUT
HANDSHAKE_TIMEOUT: Final = model.TLS_HANDSHAKE_TIMEOUT
KEEPALIVE_TIMEOUT: Final = model.KEEPALIVE_TIMEOUT

_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*(\d{1,18})[ \t]*\r\n", re.I)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding[ \t]*:[^\r\n]*chunked", re.I)
# The last chunk of a chunked body with no trailers: its end is the body's end.
_LAST_CHUNK = b"\r\n0\r\n\r\n"
# A head longer than this is refused by aiohttp (400) anyway; the watch stops keeping it.
_MAX_HEAD_KEPT = 128 * 1024


class HeadDeadline(asyncio.Protocol):
    """Wraps an aiohttp request handler: aborts the connection of a slow sender.

    States: waiting for a head (deadline ``header_timeout``), reading a body (deadline
    ``body_timeout``), or idle between requests (no deadline here). Every call is passed
    on to the wrapped handler unchanged.
    """

    __slots__ = (
        "_body_left",
        "_body_timeout",
        "_chunked_tail",
        "_head",
        "_header_timeout",
        "_inner",
        "_loop",
        "_state",
        "_timer",
        "_transport",
    )

    def __init__(
        self,
        inner: asyncio.Protocol,
        *,
        header_timeout: float = HEADER_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self._inner = inner
        self._header_timeout = header_timeout
        self._body_timeout = body_timeout
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._state = "head"
        self._head = b""
        self._body_left = 0  # bytes of a Content-Length body still to come; -1: chunked
        self._chunked_tail = b""

    # --- the deadlines -------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self._loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            # abort, not close: close() would wait for the very client that stalls (to
            # flush, or for its TLS close_notify).
            transport.abort()

    # --- reading the stream --------------------------------------------------------------

    def _watch(self, data: bytes) -> None:
        while data:
            state = self._state
            if state == "idle":
                self._state = "head"
                self._head = b""
                self._arm(self._header_timeout)
                continue
            if state == "head":
                # Keep the last 3 bytes seen, so an end split across reads is found.
                start = max(len(self._head) - 3, 0)
                buffer = self._head + data
                end = buffer.find(_HEAD_END, start)
                if end < 0:
                    self._head = buffer[-_MAX_HEAD_KEPT:]
                    return
                head = buffer[: end + 4]
                data = buffer[end + 4 :]
                self._head = b""
                self._begin_body(head)
                continue
            data = self._read_body(data)

    def _begin_body(self, head: bytes) -> None:
        if _CHUNKED.search(head) is not None:
            self._body_left = -1
            self._chunked_tail = b"\r\n"  # the last chunk may come first
        else:
            match = _CONTENT_LENGTH.search(head)
            self._body_left = int(match.group(1)) if match is not None else 0
        if self._body_left == 0:
            self._state = "idle"
            self._disarm()
        else:
            self._state = "body"
            self._arm(self._body_timeout)

    def _read_body(self, data: bytes) -> bytes:
        """Consume body bytes from ``data``; return what follows the body."""
        if self._body_left > 0:
            taken = min(self._body_left, len(data))
            self._body_left -= taken
            rest = data[taken:]
            if self._body_left == 0:
                self._state = "idle"
                self._disarm()
            return rest
        buffer = self._chunked_tail + data
        end = buffer.find(_LAST_CHUNK)
        if end < 0:
            self._chunked_tail = buffer[-(len(_LAST_CHUNK) - 1) :]
            return b""
        self._state = "idle"
        self._disarm()
        # What follows the last chunk is all from ``data``: the tail kept is shorter than
        # the marker, so the marker ends inside ``data``.
        return buffer[end + len(_LAST_CHUNK) :]

    # --- the protocol, passed on -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_server gives a stream transport (TCP or TLS), which has abort().
        self._transport = cast(asyncio.Transport, transport)
        self._arm(self._header_timeout)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._watch(data)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class WatchedSite(web.BaseSite):
    """A TCP site like aiohttp's ``TCPSite``, whose connections have read deadlines.

    Each connection's handler is wrapped in a :class:`HeadDeadline`, and a TLS
    handshake must finish within ``handshake_timeout`` seconds.
    """

    __slots__ = ("_body_timeout", "_handshake_timeout", "_header_timeout", "_host", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: SSLContext | None = None,
        header_timeout: float = HEADER_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self._header_timeout = header_timeout
        self._body_timeout = body_timeout
        self._handshake_timeout = handshake_timeout

    @property
    def name(self) -> str:
        """The site's URL, as aiohttp names sites in its logs."""
        scheme = "https" if self._ssl_context else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self._port}"

    async def start(self) -> None:
        """Open the listener (registering the site with its runner first)."""
        await super().start()
        server = self._runner.server
        if server is None:  # setup() was undone meanwhile
            raise RuntimeError("the runner has no server: call runner.setup() first")
        handler_factory: Callable[[], asyncio.Protocol] = server

        def protocol() -> asyncio.Protocol:
            return HeadDeadline(
                handler_factory(),
                header_timeout=self._header_timeout,
                body_timeout=self._body_timeout,
            )

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self._handshake_timeout if self._ssl_context else None,
            backlog=self._backlog,
        )
