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

from ..webconfig import WebConfig
from .app import LIFECYCLE, Background, create_app
from .buildinfo import build_info
from .deadlines import WatchedSite
from .quiet import ClientErrorLog
from .settings import HEALTHZ_PATH, READYZ_PATH, ServerSettings

__all__ = [
    "RunningServer",
    "StartupLine",
    "describe_security",
    "run_server",
    "serving",
    "startup_lines",
]

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
        return self.urls[0]

    @property
    def urls(self) -> tuple[str, ...]:
        """The base URL of every bound socket, in binding order."""
        return tuple(_url(self.scheme, host, port) for host, port in self.addresses)

    def begin_shutdown(self) -> None:
        """Answer 503 on ``/readyz`` from now on (before the listener closes)."""
        self.app[LIFECYCLE].stopping = True


def _url(scheme: str, host: str, port: int) -> str:
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/"


@dataclass(frozen=True, slots=True)
class StartupLine:
    """One line of the start-up log: its level and text."""

    level: int
    text: str


def describe_security(web_config: WebConfig | None) -> str:
    """What protects the listener, in words (see :meth:`WebConfig.describe`).

    Example::

        >>> describe_security(None)
        'plain HTTP, no authentication'
    """
    return web_config.describe() if web_config is not None else "plain HTTP, no authentication"


def startup_lines(server: RunningServer, settings: ServerSettings) -> list[StartupLine]:
    """The lines :func:`run_server` logs once the listeners are open.

    One INFO line per bound socket, saying exactly what it serves (URL of the metrics,
    TLS or not, client certificates, basic auth); then a WARNING when nothing protects
    the metrics, or when basic-auth passwords would cross the network unencrypted.
    """
    web_config = settings.web_config
    security = describe_security(web_config)
    lines = [StartupLine(logging.INFO, f"starting {build_info().describe()}")]
    path = settings.metrics_path.lstrip("/")
    for url in server.urls:
        lines.append(
            StartupLine(
                logging.INFO,
                f"listening on {url} with metrics at {url}{path}, "
                f"{HEALTHZ_PATH} and {READYZ_PATH} without authentication; {security}",
            )
        )
    tls = web_config.tls if web_config is not None else None
    users = web_config.basic_auth_users if web_config is not None else {}
    if web_config is None or not web_config.authenticates:
        lines.append(
            StartupLine(
                logging.WARNING,
                "no authentication on the metrics (no basic_auth_users or client "
                "certificates in a web config): anyone who can reach the port can read them",
            )
        )
    if users and tls is None:
        lines.append(
            StartupLine(
                logging.WARNING,
                "basic auth over plain HTTP: passwords cross the network unencrypted "
                "(add tls_server_config to the web config)",
            )
        )
    return lines


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
        # timeout); WatchedSite's has (see deadlines.py). One site per listen address.
        for host, port in settings.addresses:
            site = WatchedSite(
                runner,
                host,
                port,
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
    exits 0. Once listening it logs :func:`startup_lines`: each address, TLS or not,
    authentication or not, and a warning when the metrics are unprotected. Errors at
    start (a busy port: ``OSError``; a bad certificate:
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
        async with serving(settings, collectors=collectors, background=background) as server:
            for line in startup_lines(server, settings):
                _log.log(line.level, "%s", line.text)
            await stop.wait()
            _log.info("received %s: shutting down", received[0] if received else "stop")
            server.begin_shutdown()
            if settings.drain_seconds:
                await asyncio.sleep(settings.drain_seconds)
        _log.info("stocksentry exporter stopped")
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
