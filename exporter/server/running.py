"""Serving the app: the listener with TLS, graceful shutdown, and the signals that start it.

:func:`serving` is the ``async with`` form (tests and embedding); :func:`run_server` is
what ``stocksentry exporter`` calls: it serves until SIGTERM or SIGINT and returns.

Example::

    async with serving(ServerSettings("127.0.0.1", 0)) as server:
        print("listening on", server.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client.registry import Collector

from .app import LIFECYCLE, Background, create_app
from .deadlines import WatchedSite
from .quiet import ClientErrorLog
from .settings import ServerSettings

__all__ = ["RunningServer", "run_server", "serving"]

_log = logging.getLogger("stocksentry.exporter.server")


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A server started by :func:`serving`: its app and where it listens."""

    app: web.Application
    scheme: str
    addresses: tuple[tuple[str, int], ...] = field(default=())

    @property
    def port(self) -> int:
        """The bound port (the real one when ``ServerSettings.port`` was 0)."""
        return self.addresses[0][1]

    @property
    def url(self) -> str:
        """The base URL of the first bound address, e.g. ``https://127.0.0.1:19464/``."""
        host, port = self.addresses[0][:2]
        if ":" in host:
            host = f"[{host}]"
        return f"{self.scheme}://{host}:{port}/"

    def begin_shutdown(self) -> None:
        """Answer 503 on ``/readyz`` from now on (before the listener closes)."""
        self.app[LIFECYCLE].stopping = True


@contextlib.asynccontextmanager
async def serving(
    settings: ServerSettings,
    *,
    collectors: Sequence[Collector] = (),
    background: Sequence[Background] = (),
) -> AsyncIterator[RunningServer]:
    """Serve the app on ``settings.listen_address``/``port`` for the ``async with`` body.

    On entry: the SSL context is built from the web config (a bad certificate raises
    :class:`~stocksentry.exporter.webconfig.WebConfigError` before anything starts), the
    app starts (``background`` start-ups run) and the listener opens. On exit: the
    listener closes, ``/readyz`` turns 503, in-flight requests get
    ``settings.shutdown_timeout`` seconds, then ``background`` clean-ups run. Start-up
    errors propagate after the clean-up of what had started. No signal handling: that is
    :func:`run_server`'s job. Malformed requests are answered 4xx and logged quietly
    (:class:`~.quiet.ClientErrorLog`).

    Example::

        async with serving(ServerSettings("127.0.0.1", 0)) as server:
            print("listening on", server.url)
            await stop_event.wait()
    """
    web_config = settings.web_config
    ssl_context = web_config.ssl_context() if web_config else None
    app = create_app(settings, collectors=collectors, background=background)
    # No access log: Prometheus scrapes every few seconds and kubelet probes as often.
    # lingering_time: how long aiohttp drains a body no handler read (none reads one)
    # before closing; the body deadline of the site bounds it the same way.
    runner = web.AppRunner(
        app,
        access_log=None,
        logger=ClientErrorLog(),
        shutdown_timeout=settings.shutdown_timeout,
        keepalive_timeout=settings.keepalive_timeout,
        lingering_time=settings.body_timeout,
    )
    try:
        await runner.setup()
        # Not aiohttp's TCPSite: its listener has no deadline for a slow client's request
        # head, body or TLS handshake (a half-sent request is held for the keep-alive
        # timeout); WatchedSite's has (see deadlines.py).
        site = WatchedSite(
            runner,
            settings.listen_address,
            settings.port,
            ssl_context=ssl_context,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            handshake_timeout=settings.tls_handshake_timeout,
        )
        await site.start()
        addresses = tuple((str(a[0]), int(a[1])) for a in runner.addresses)
        yield RunningServer(app, "https" if ssl_context else "http", addresses)
    finally:
        app[LIFECYCLE].stopping = True
        await runner.cleanup()


def run_server(
    settings: ServerSettings,
    *,
    collectors: Sequence[Collector] = (),
    background: Sequence[Background] = (),
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully and return.

    On the signal: ``/readyz`` turns 503, ``settings.drain_seconds`` pass, the listener
    closes, in-flight requests finish (up to ``settings.shutdown_timeout``), the
    ``background`` clean-ups run, and the function returns normally, so the command
    exits 0. Without a web config, one warning says that it serves plain HTTP without
    TLS or authentication. Errors at start (a busy port: ``OSError``; a bad certificate:
    ``WebConfigError``; a failing background start-up) propagate.

    Example::

        run_server(ServerSettings("0.0.0.0", 19464, multiprocess_dir=Path("/run/prom")))
    """
    asyncio.run(_serve_until_signal(settings, collectors, background))


async def _serve_until_signal(
    settings: ServerSettings,
    collectors: Sequence[Collector],
    background: Sequence[Background],
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        stop.set()

    # Installed before start-up, so a signal during a slow background start-up still
    # ends in a clean shutdown rather than the default abrupt exit.
    handled = (signal.SIGTERM, signal.SIGINT)
    for sig in handled:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        web_config = settings.web_config
        if web_config is None:
            _log.warning(
                "serving plain HTTP without TLS or basic auth (no web config given); "
                "anyone who can reach the port can read the metrics"
            )
        async with serving(settings, collectors=collectors, background=background) as server:
            _log.info(
                "stocksentry exporter listening on %s (metrics at %s)",
                server.url,
                settings.metrics_path,
            )
            await stop.wait()
            _log.info("received %s: shutting down", received[0] if received else "stop")
            server.begin_shutdown()
            if settings.drain_seconds:
                await asyncio.sleep(settings.drain_seconds)
        _log.info("stocksentry exporter stopped")
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
