"""Read deadlines for slow clients: a request head, a request body and a TLS handshake.

aiohttp bounds the size of a request head but not the time a client takes to send it: a
client that sends half a request line and then nothing holds its connection for the
keep-alive timeout, and a few hundred of them exhaust the descriptors while Prometheus is
refused. :func:`listen` opens a listener whose connections are wrapped in a
:class:`HeadDeadline`, which aborts a connection whose request head has not arrived within
``header_timeout`` seconds (of the connection opening or of the head's first byte), or
whose body (``Content-Length`` or ``chunked``) has not arrived within ``body_timeout``
seconds of its head; ``ssl_handshake_timeout`` bounds the TLS handshake. The watch only
finds where a head ends and how long its body is; aiohttp still parses the request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from ssl import SSLContext
from typing import cast

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
    ``body_timeout``), or idle between requests (aiohttp's keep-alive timeout). Every call
    is passed on to the wrapped handler unchanged.
    """

    def __init__(
        self,
        inner: asyncio.Protocol,
        *,
        header_timeout: float,
        body_timeout: float,
    ) -> None:
        self._inner = inner
        self._header_timeout = header_timeout
        self._body_timeout = body_timeout
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: "head" (waiting for one), "body" (reading one) or "idle" (between requests).
        self.state = "head"
        #: The part of a request head received so far (its last 128 KiB at most).
        self.pending_head = b""
        self._body_left = 0  # bytes of a Content-Length body still to come; -1: chunked
        self._chunked_tail = b""

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

    def _watch(self, data: bytes) -> None:
        while data:
            state = self.state
            if state == "idle":
                self.state = "head"
                self.pending_head = b""
                self._arm(self._header_timeout)
                continue
            if state == "head":
                # Keep the last 3 bytes seen, so an end split across reads is found.
                start = max(len(self.pending_head) - 3, 0)
                buffer = self.pending_head + data
                end = buffer.find(_HEAD_END, start)
                if end < 0:
                    self.pending_head = buffer[-_MAX_HEAD_KEPT:]
                    return
                head = buffer[: end + 4]
                data = buffer[end + 4 :]
                self.pending_head = b""
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
            self.state = "idle"
            self._disarm()
        else:
            self.state = "body"
            self._arm(self._body_timeout)

    def _read_body(self, data: bytes) -> bytes:
        """Consume body bytes from ``data``; return what follows the body."""
        if self._body_left > 0:
            taken = min(self._body_left, len(data))
            self._body_left -= taken
            rest = data[taken:]
            if self._body_left == 0:
                self.state = "idle"
                self._disarm()
            return rest
        buffer = self._chunked_tail + data
        end = buffer.find(_LAST_CHUNK)
        if end < 0:
            self._chunked_tail = buffer[-(len(_LAST_CHUNK) - 1) :]
            return b""
        self.state = "idle"
        self._disarm()
        # What follows the last chunk is all from ``data``: the tail kept is shorter than
        # the marker, so the marker ends inside ``data``.
        return buffer[end + len(_LAST_CHUNK) :]

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


async def listen(
    handler_factory: Callable[[], asyncio.Protocol],
    host: str,
    port: int,
    *,
    ssl_context: SSLContext | None = None,
    header_timeout: float,
    body_timeout: float,
    handshake_timeout: float,
) -> asyncio.Server:
    """A listener on ``host``:``port`` (``""``: every interface) whose connections have
    read deadlines; ``handler_factory`` is the runner's ``web.Server``."""

    def protocol() -> asyncio.Protocol:
        return HeadDeadline(
            handler_factory(), header_timeout=header_timeout, body_timeout=body_timeout
        )

    return await asyncio.get_running_loop().create_server(
        protocol,
        host,
        port,
        ssl=ssl_context,
        ssl_handshake_timeout=handshake_timeout if ssl_context else None,
        backlog=128,  # aiohttp's TCPSite default
    )
