"""A TCP proxy that can go silent: :class:`Blackhole`, for partition tests.

It accepts connections on a port of its own and forwards each to ``upstream``. On
:meth:`Blackhole.cut` it stops forwarding in both directions *without closing anything*:
new connections are still accepted (the kernel completes the handshake) and never answered,
bytes already sent are held, not delivered — what a partition, a full NAT table or a dead
load balancer looks like to both ends. :meth:`Blackhole.heal` delivers what was held and
forwards again.

The proxy keeps reading from the client while cut (and holds the bytes), so it sees at once
when the client closes a connection: :attr:`Blackhole.open_clients` is the number of
connections the client side holds open now, whatever the network does — the figure a
connection bound is about.

Example::

    async with Blackhole.before(pg_url) as proxy:
        url = proxy.url(pg_url)          # the same database, through the proxy
        ...
        proxy.cut()          # silence
        proxy.heal()         # forwarding again
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Blackhole"]

_CHUNK = 65536


class _Pair:
    """One accepted connection and its upstream, forwarded through two held queues."""

    def __init__(
        self, proxy: Blackhole, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.proxy = proxy
        self.client_reader = reader
        self.client_writer = writer
        self.client_open = True

    async def run(self) -> None:
        proxy = self.proxy
        to_upstream: asyncio.Queue[bytes] = asyncio.Queue()
        # Read the client from the start (its close is seen even while cut); connect
        # upstream only once the network lets the handshake through.
        reading = asyncio.create_task(self._read(self.client_reader, to_upstream, client=True))
        try:
            await proxy.flowing.wait()
            try:
                up_reader, up_writer = await asyncio.open_connection(*proxy.upstream)
            except OSError:
                return
            to_client: asyncio.Queue[bytes] = asyncio.Queue()
            tasks = [
                asyncio.create_task(self._read(up_reader, to_client, client=False)),
                asyncio.create_task(self._write(to_upstream, up_writer)),
                asyncio.create_task(self._write(to_client, self.client_writer)),
            ]
            try:
                # Either side's end (delivered through the gate) ends the pair.
                await asyncio.wait(tasks[1:], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                up_writer.close()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            self.client_writer.close()
            self._client_closed()

    def _client_closed(self) -> None:
        if self.client_open:
            self.client_open = False
            self.proxy.open_clients -= 1

    async def _read(
        self, reader: asyncio.StreamReader, queue: asyncio.Queue[bytes], *, client: bool
    ) -> None:
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                queue.put_nowait(data)
        except OSError:
            pass
        if client:
            self._client_closed()
        queue.put_nowait(b"")  # the end, delivered in order through the gate

    async def _write(self, queue: asyncio.Queue[bytes], writer: asyncio.StreamWriter) -> None:
        while True:
            data = await queue.get()
            await self.proxy.flowing.wait()
            if not data:
                return
            writer.write(data)
            try:
                await writer.drain()
            except OSError:
                return


class Blackhole:
    """A TCP proxy in front of ``host:port`` that :meth:`cut` silences (see the module)."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.port = 0
        #: Connections the client side holds open now (its closes are seen even while cut).
        self.open_clients = 0
        #: Connections accepted so far.
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pairs):
            task.cancel()
        await asyncio.gather(*self._pairs, return_exceptions=True)

    async def __aenter__(self) -> Blackhole:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def cut_off(self) -> bool:
        return not self.flowing.is_set()

    def cut(self) -> None:
        """Stop forwarding in both directions; nothing is closed."""
        self.flowing.clear()

    def heal(self) -> None:
        """Deliver what was held and forward again."""
        self.flowing.set()

    @classmethod
    def before(cls, url: str, default_port: int = 0) -> Blackhole:
        """A proxy in front of the host and port of ``url`` (PostgreSQL, MySQL, Redis)."""
        parts = urlsplit(url)
        port = parts.port or default_port or {"redis": 6379, "mysql": 3306}.get(parts.scheme, 5432)
        return cls(parts.hostname or "127.0.0.1", port)

    def url(self, url: str) -> str:
        """``url`` with this proxy as its host and port (call once started)."""
        parts = urlsplit(url)
        credentials, _, _ = parts.netloc.rpartition("@")
        netloc = f"{credentials}@" if credentials else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{self.port}"))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open_clients += 1
        pair = _Pair(self, reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self._pairs.add(task)
        try:
            await pair.run()
        except asyncio.CancelledError:
            pass  # the proxy is closing (a handler's error would be logged by asyncio)
        finally:
            self._pairs.discard(task)
