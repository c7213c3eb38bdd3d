"""Deadlines for slow clients (request head, request body) and lingering after a refused
request; docs/exporter-server.md ("Slow clients", "Oversized requests") describes both.

aiohttp bounds the size of a request head but not the time a client takes to send it.
:class:`HeadDeadline` only finds where a head ends and how long its body is; aiohttp still
parses the request.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

_HEAD_END = b"\r\n\r\n"
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*(\d{1,18})[ \t]*\r\n", re.I)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding[ \t]*:[^\r\n]*chunked", re.I)
# The last chunk of a chunked body with no trailers: its end is the body's end.
_LAST_CHUNK = b"\r\n0\r\n\r\n"
# A head longer than this is refused by aiohttp (400) anyway; the watch stops keeping it.
_MAX_HEAD_KEPT = 128 * 1024
#: How long, and for how many bytes, a refused request's rest is read and dropped.
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 * 1024 * 1024


class _Lingering:
    """The transport aiohttp is given: the real one, except for a ``close()`` while the
    client is still sending its request, which lingers through :meth:`HeadDeadline.linger`."""

    def __init__(self, transport: asyncio.Transport, owner: HeadDeadline) -> None:
        self._transport = transport
        self._owner = owner
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def close(self) -> None:
        self._closing = True
        if not self._owner.linger():
            self._transport.close()

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()


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
        #: Bytes of a refused request dropped while lingering; -1: not lingering.
        self._dropped = -1

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
            if self._body_left == 0:
                self.state = "idle"
                self._disarm()
            return data[taken:]
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

    def linger(self) -> bool:
        """aiohttp closes the connection: linger (and say so) when the client is still
        sending a request and the writing side can be shut alone (plain TCP)."""
        transport = self._transport
        if (
            transport is None
            or self.state == "idle"
            or (self.state == "head" and not self.pending_head)
            or not transport.can_write_eof()
        ):
            return False
        transport.write_eof()
        self._dropped = 0
        self._arm(LINGER_SECONDS)
        if not transport.is_reading():
            transport.resume_reading()
        return True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_server gives a stream transport (TCP or TLS), which has abort().
        self._transport = cast(asyncio.Transport, transport)
        self._arm(self._header_timeout)
        self._inner.connection_made(cast(asyncio.Transport, _Lingering(self._transport, self)))

    def data_received(self, data: bytes) -> None:
        if self._dropped >= 0:
            # The rest of a refused request: read so that the answer is not reset.
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES and self._transport is not None:
                self._transport.abort()
            return
        self._watch(data)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._dropped >= 0:
            if self._transport is not None:
                self._transport.close()
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
