"""Serving the app: the listeners with TLS, graceful shutdown, quiet client-error logs.

:func:`serving` is the ``async with`` form (tests and embedding); :func:`run_server` is
what ``stocksentry exporter`` calls: it serves until SIGTERM or SIGINT and returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client.registry import Collector

from ..listen import format_listen_address
from ..webconfig import WebConfig
from .app import LIFECYCLE, Background, create_app
from .buildinfo import build_info
from .deadlines import HeadDeadline
from .settings import HEALTHZ_PATH, READYZ_PATH, ServerSettings

_log: Final = logging.getLogger("stocksentry.exporter.server")


class ClientErrorLog(logging.LoggerAdapter[logging.Logger]):
    """The logger handed to aiohttp's request handler: client errors are not ours.

    aiohttp answers a request it cannot parse with a correct 4xx, then logs it at error
    level with a traceback, once per request: anyone who can reach the port could flood
    the log. Here a client error (``HttpProcessingError`` with a 4xx code) is one INFO line
    without a traceback, at most once per ``interval`` seconds, with the count of those
    left out since; anything else is logged as before.

    Example::

        >>> from aiohttp.http_exceptions import BadHttpMessage
        >>> log = ClientErrorLog(clock=lambda: 0.0)
        >>> log.exception("Error handling request from %s", "10.0.0.7",
        ...               exc_info=BadHttpMessage("bad header"))
        >>> log.client_errors
        1
    """

    def __init__(
        self,
        logger: logging.Logger = _log,
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logger, {})
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last_logged: float | None = None
        self._suppressed = 0
        #: Client errors seen since this logger was made.
        self.client_errors = 0

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        """Client errors: one rate-limited INFO line; anything else: ERROR with traceback."""
        error = exc_info[1] if isinstance(exc_info, tuple) and len(exc_info) == 3 else exc_info
        if not (isinstance(error, HttpProcessingError) and 400 <= error.code < 500):
            super().exception(msg, *args, exc_info=exc_info, **kwargs)
            return
        now = self._clock()
        with self._lock:
            self.client_errors += 1
            if self._last_logged is not None and now - self._last_logged < self.interval:
                self._suppressed += 1
                return
            self._last_logged = now
            suppressed, self._suppressed = self._suppressed, 0
        remote = args[0] if args else "?"
        detail = " ".join(str(error.message or type(error).__name__).split())[:200]
        note = f" ({suppressed} more since the last line)" if suppressed else ""
        self.logger.info(
            "malformed request from %s answered %d: %s%s", remote, error.code, detail, note
        )


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
        return tuple(
            f"{self.scheme}://{format_listen_address(host, port)}/"
            for host, port in self.addresses
        )

    def begin_shutdown(self) -> None:
        """Answer 503 on ``/readyz`` from now on (before the listener closes)."""
        self.app[LIFECYCLE].stopping = True


@dataclass(frozen=True, slots=True)
class StartupLine:
    """One line of the start-up log: its level and text."""

    level: int
    text: str


def startup_lines(server: RunningServer, settings: ServerSettings) -> list[StartupLine]:
    """The lines :func:`run_server` logs once listening: one per bound socket, then
    warnings when nothing protects the metrics or passwords would cross unencrypted."""
    web_config = settings.web_config or WebConfig()
    path = settings.metrics_path.lstrip("/")
    info = [f"starting {build_info().describe()}"] + [
        # What protects the metrics is said once, at the end; the health endpoints never
        # ask for credentials (kubelet probes carry none).
        f"listening on {url} with metrics at {url}{path} ({HEALTHZ_PATH} and {READYZ_PATH} "
        f"answer without credentials); {web_config.describe()}"
        for url in server.urls
    ]
    warnings: list[str] = []
    if not web_config.authenticates:
        warnings.append(
            "no authentication on the metrics (no basic_auth_users or client certificates "
            "in a web config): anyone who can reach the port can read them"
        )
    if web_config.basic_auth_users and web_config.tls is None:
        warnings.append(
            "basic auth over plain HTTP: passwords cross the network unencrypted "
            "(add tls_server_config to the web config)"
        )
    return [StartupLine(logging.INFO, text) for text in info] + [
        StartupLine(logging.WARNING, text) for text in warnings
    ]


@contextlib.asynccontextmanager
async def serving(
    settings: ServerSettings,
    *,
    collectors: Sequence[Collector] = (),
    background: Sequence[Background] = (),
    routes: Sequence[web.RouteDef] = (),
) -> AsyncIterator[RunningServer]:
    """Serve the app on every address of ``settings`` for the ``async with`` body.

    A bad certificate raises :class:`~stocksentry.exporter.webconfig.WebConfigError`
    before anything starts. On exit the listeners close, ``/readyz`` turns 503, in-flight
    requests get ``settings.shutdown_timeout`` seconds, then ``background`` clean-ups run.
    """
    ssl_context = (settings.web_config or WebConfig()).ssl_context()
    app = create_app(settings, collectors=collectors, background=background, routes=routes)
    # No access log: Prometheus scrapes every few seconds and kubelet probes as often.
    # lingering_time: how long aiohttp drains a body no handler read (none reads one)
    # before closing; the body deadline bounds it the same way.
    runner = web.AppRunner(
        app,
        access_log=None,
        logger=ClientErrorLog(),
        shutdown_timeout=settings.shutdown_timeout,
        keepalive_timeout=settings.keepalive_timeout,
        lingering_time=settings.body_timeout,
    )
    listeners: list[asyncio.Server] = []
    try:
        await runner.setup()
        handler_factory = cast(web.Server, runner.server)  # set by setup()

        # Not aiohttp's TCPSite: its listener has no deadline for a slow client's request
        # head, body or TLS handshake (see deadlines.py).
        def protocol() -> asyncio.Protocol:
            return HeadDeadline(
                handler_factory(),
                header_timeout=settings.header_timeout,
                body_timeout=settings.body_timeout,
            )

        loop = asyncio.get_running_loop()
        for host, port in settings.addresses:
            listener = await loop.create_server(
                protocol,
                host,
                port,
                ssl=ssl_context,
                ssl_handshake_timeout=settings.tls_handshake_timeout if ssl_context else None,
                backlog=128,  # aiohttp's TCPSite default
            )
            listeners.append(listener)
        addresses = tuple(
            (str(sock.getsockname()[0]), int(sock.getsockname()[1]))
            for listener in listeners
            for sock in listener.sockets
        )
        yield RunningServer(app, "https" if ssl_context else "http", addresses)
    finally:
        app[LIFECYCLE].stopping = True
        for listener in listeners:
            listener.close()
        await runner.cleanup()


def run_server(
    settings: ServerSettings,
    *,
    collectors: Sequence[Collector] = (),
    background: Sequence[Background] = (),
    routes: Sequence[web.RouteDef] = (),
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully and return (exit 0).

    On the signal ``/readyz`` turns 503 and ``settings.drain_seconds`` pass before
    :func:`serving` closes. Errors at start (a busy port, a bad certificate, a failing
    background start-up) propagate.
    """

    async def serve() -> None:
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
            async with serving(
                settings, collectors=collectors, background=background, routes=routes
            ) as server:
                for line in startup_lines(server, settings):
                    _log.log(line.level, "%s", line.text)
                await stop.wait()
                _log.info("received %s: shutting down", received[0])
                server.begin_shutdown()
                if settings.drain_seconds:
                    await asyncio.sleep(settings.drain_seconds)
            _log.info("stocksentry exporter stopped")
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    asyncio.run(serve())
