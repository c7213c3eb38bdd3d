"""The sidecar's HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and a landing page.

One aiohttp application, built by :func:`create_app` from a :class:`ServerSettings`:

- ``/metrics`` (``settings.metrics_path``) merges, into one exposition, the app's
  multiprocess directory (:class:`~stocksentry.exporter.multiproc.MultiprocessDirCollector`,
  when ``multiprocess_dir`` is set), the collectors handed in (the probes' snapshot
  collector) and the exporter's own process metrics. Prometheus text 0.0.4 by default;
  OpenMetrics 1.0.0, with exemplars, when ``Accept`` asks for
  ``application/openmetrics-text``; gzip when ``Accept-Encoding`` allows it.
  A collector that raises is left out of that scrape and counted in
  ``stocksentry_collector_errors_total{collector}``; the rest is still served.
- ``/healthz``: 200 ``ok`` while the process serves at all (liveness).
- ``/readyz``: 200 once the app has started (every ``cleanup_ctx`` start-up ran, the
  ``background`` ones included), 503 before that and from the moment shutdown begins.
- ``/``: a small HTML page linking the three.

Generating the exposition is CPU work (and the multiprocess files are read there), so it
runs in a thread: a slow collector delays its scrape, never ``/healthz``. Scrapes that
arrive while one of the same format is being generated share its result, so a hung
collector holds at most one thread per format instead of one per scrape.

With a :class:`~stocksentry.exporter.webconfig.WebConfig` the server speaks TLS
(``tls_server_config``) and asks for basic auth (``basic_auth_users``) on ``/metrics``
and ``/``; ``/healthz`` and ``/readyz`` stay open, because kubelet probes carry no
credentials and the answers reveal nothing.

Example::

    from pathlib import Path
    from stocksentry.exporter.server import ServerSettings, run_server
    from stocksentry.exporter.webconfig import load_web_config

    settings = ServerSettings(
        listen_address="0.0.0.0",
        port=9464,
        multiprocess_dir=Path("/run/stocksentry/prom"),
        web_config=load_web_config("/etc/stocksentry/web.yml"),
    )
    run_server(settings, collectors=[probe_collector], background=[probe_runner])
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import html
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from stocksentry.instrumentation import catalog

from .multiproc import MultiprocessDirCollector
from .webconfig import BasicAuth, WebConfig

__all__ = [
    "BASIC_AUTH",
    "COLLECTOR_ERRORS",
    "CONTENT_TYPE_OPENMETRICS",
    "CONTENT_TYPE_TEXT",
    "LIFECYCLE",
    "RENDERER",
    "SETTINGS",
    "Background",
    "Lifecycle",
    "MetricsRenderer",
    "RunningServer",
    "ServerSettings",
    "build_renderer",
    "create_app",
    "run_server",
    "serving",
    "wants_gzip",
    "wants_openmetrics",
]

_log = logging.getLogger(__name__)

#: Prometheus text format, the default.
CONTENT_TYPE_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
#: OpenMetrics 1.0.0, chosen by ``Accept``; the only format that carries exemplars.
CONTENT_TYPE_OPENMETRICS: Final = "application/openmetrics-text; version=1.0.0; charset=utf-8"

HEALTHZ_PATH: Final = "/healthz"
READYZ_PATH: Final = "/readyz"
# Level 6 is what Go's gzip (and so the Prometheus exporters) use by default: most of the
# ratio of level 9 for a fraction of its CPU.
_GZIP_LEVEL: Final = 6
# Errors of one collector are logged at most this often (they recur every scrape).
_ERROR_LOG_INTERVAL_S: Final = 60.0
_EOF: Final = b"# EOF\n"

#: A background resource for ``app.cleanup_ctx``: start-up before ``yield``, clean-up after.
Background = Callable[[web.Application], AsyncIterator[None]]

_T = TypeVar("_T")

# The OpenMetrics encoder is untyped in prometheus_client; this gives it a type once.
_encode_openmetrics_raw: Final[Callable[[Collector], bytes]] = openmetrics.generate_latest


#: Counter, label ``collector``: a collector left out of a scrape.
COLLECTOR_ERRORS: Final = catalog.COLLECTOR_ERRORS


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Where and how the exporter serves.

    Args:
        listen_address: the address to bind (``0.0.0.0`` in a pod, so Prometheus can reach
            the pod IP; ``127.0.0.1`` on a laptop).
        port: the TCP port; 0 picks a free one (see :attr:`RunningServer.port`).
        multiprocess_dir: the app's ``PROMETHEUS_MULTIPROC_DIR``, or None.
        web_config: TLS and basic auth, or None for plain HTTP (logged at start).
        metrics_path: where the exposition is served.
        multiprocess_check_pids: drop ``live*`` gauges of pids that ``os.kill(pid, 0)``
            says are gone; set False when the exporter does not share the app's PID
            namespace (see :mod:`stocksentry.exporter.multiproc`).
        shutdown_timeout: seconds in-flight requests get to finish at shutdown.
        drain_seconds: seconds between the stop signal and closing the listener, during
            which ``/readyz`` already answers 503 (for load balancers that must notice).

    Example::

        >>> ServerSettings(listen_address="127.0.0.1", port=0).metrics_path
        '/metrics'
    """

    listen_address: str
    port: int
    multiprocess_dir: Path | None = None
    web_config: WebConfig | None = None
    metrics_path: str = "/metrics"
    multiprocess_check_pids: bool = True
    shutdown_timeout: float = 10.0
    drain_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if not self.metrics_path.startswith("/") or self.metrics_path in (
            "/",
            HEALTHZ_PATH,
            READYZ_PATH,
        ):
            raise ValueError(
                f"metrics_path must start with '/' and not be /, {HEALTHZ_PATH} or "
                f"{READYZ_PATH}, got {self.metrics_path!r}"
            )
        if not self.shutdown_timeout >= 0 or not self.drain_seconds >= 0:
            raise ValueError("shutdown_timeout and drain_seconds must be >= 0")


@dataclass(slots=True)
class Lifecycle:
    """Where the app is in its life; ``/readyz`` answers from it."""

    started: bool = False
    stopping: bool = False

    @property
    def ready(self) -> bool:
        """True between the end of start-up and the start of shutdown."""
        return self.started and not self.stopping


# --- content negotiation -------------------------------------------------------------------


def _media_ranges(header: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """``a/b;version=1;q=0.5, c/d`` -> (media type, params, q) per range."""
    for part in header.split(","):
        media, *raw_params = part.split(";")
        params: dict[str, str] = {}
        for raw in raw_params:
            name, _, value = raw.partition("=")
            params[name.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        yield media.strip().lower(), params, q


def wants_openmetrics(accept: str) -> bool:
    """True when ``Accept`` prefers OpenMetrics 1.x over the Prometheus text format.

    OpenMetrics is chosen when an ``application/openmetrics-text`` range without a
    version, or with a 1.x version, has a q above 0 and at least that of ``text/plain``
    and ``*/*``. Prometheus itself sends exactly such a header.

    Example::

        >>> wants_openmetrics("application/openmetrics-text;version=1.0.0;q=0.6,*/*;q=0.2")
        True
        >>> wants_openmetrics("text/plain;version=0.0.4")
        False
    """
    best_om = 0.0
    best_other = 0.0
    for media, params, q in _media_ranges(accept):
        if media == "application/openmetrics-text":
            version = params.get("version", "1.0.0")
            if version.split(".")[0] == "1":
                best_om = max(best_om, q)
        elif media in ("text/plain", "*/*", "text/*"):
            best_other = max(best_other, q)
    return best_om > 0 and best_om >= best_other


def wants_gzip(accept_encoding: str) -> bool:
    """True when ``Accept-Encoding`` allows gzip (explicitly or through ``*``).

    Example::

        >>> wants_gzip("gzip, deflate"), wants_gzip("gzip;q=0, *"), wants_gzip("")
        (True, False, False)
    """
    gzip_q: float | None = None
    star_q: float | None = None
    for coding, _, q in _media_ranges(accept_encoding):
        if coding in ("gzip", "x-gzip"):
            gzip_q = q
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


# --- exposition ----------------------------------------------------------------------------


class _Families:
    """A collector over a fixed list, the shape prometheus_client's encoders take."""

    __slots__ = ("_families",)

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _encode_text(families: list[Metric]) -> bytes:
    return generate_latest(_Families(families))


def _encode_openmetrics(families: list[Metric]) -> bytes:
    # Each chunk is encoded on its own (so one bad family costs only its collector);
    # the single "# EOF" goes at the very end.
    return _encode_openmetrics_raw(_Families(families)).removesuffix(_EOF)


def _collector_name(collector: Collector, taken: set[str]) -> str:
    base = getattr(collector, "name", None)
    if not isinstance(base, str) or not base:
        base = type(collector).__name__
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}#{n}"
    taken.add(name)
    return name


class MetricsRenderer:
    """Collects every source and encodes one exposition; what ``/metrics`` runs in a thread.

    Sources are tried one by one: a collector that raises in ``collect()``, whose output
    cannot be encoded, or that repeats a family name an earlier source already exposed,
    is left out of the scrape and counted in ``stocksentry_collector_errors_total``
    (its first error and then one a minute are logged with the traceback). The counter
    itself is always the last family.

    A collector's label value is its ``name`` attribute when it has a string one, else
    its class name (``#2``, ``#3``... for repeats); the built-in sources are
    ``multiprocess`` and ``process``.

    Thread-safe. Example::

        >>> from prometheus_client import CollectorRegistry, Counter
        >>> registry = CollectorRegistry()
        >>> Counter("demo", "Demo.", registry=registry).inc()
        >>> renderer = MetricsRenderer([("demo", registry)])
        >>> b"demo_total 1.0" in renderer.render(openmetrics=False)
        True
    """

    def __init__(self, sources: Sequence[tuple[str, Collector]]) -> None:
        self._sources = tuple(sources)
        self._lock = threading.Lock()
        self._errors: dict[str, int] = {name: 0 for name, _ in self._sources}
        self._last_logged: dict[str, float] = {}

    @property
    def source_names(self) -> tuple[str, ...]:
        """The collector label values, in exposition order."""
        return tuple(name for name, _ in self._sources)

    def errors(self) -> dict[str, int]:
        """A copy of the error counts per collector."""
        with self._lock:
            return dict(self._errors)

    def render(self, *, openmetrics: bool) -> bytes:
        """The exposition of every working source, in OpenMetrics or Prometheus text."""
        encode = _encode_openmetrics if openmetrics else _encode_text
        chunks: list[bytes] = []
        seen: set[str] = set()
        for name, collector in self._sources:
            try:
                families = list(collector.collect())
            except Exception:
                self._failed(name, "collect() raised")
                continue
            names = [family.name for family in families]
            clash = seen.intersection(names)
            if clash:
                self._failed(name, f"repeats metric families {sorted(clash)}", trace=False)
                continue
            try:
                chunk = encode(families)
            except Exception:
                self._failed(name, "its metrics could not be encoded")
                continue
            seen.update(names)
            chunks.append(chunk)
        chunks.append(encode([self._own_family()]))
        if openmetrics:
            chunks.append(_EOF)
        return b"".join(chunks)

    def _failed(self, name: str, what: str, *, trace: bool = True) -> None:
        now = time.monotonic()
        with self._lock:
            self._errors[name] = self._errors.get(name, 0) + 1
            last = self._last_logged.get(name)
            log_it = last is None or now - last >= _ERROR_LOG_INTERVAL_S
            if log_it:
                self._last_logged[name] = now
        if log_it:
            _log.warning(
                "collector %s left out of the scrape: %s (logged at most once a minute)",
                name,
                what,
                exc_info=trace,
            )

    def _own_family(self) -> Metric:
        family = CounterMetricFamily(
            COLLECTOR_ERRORS.base_name,
            COLLECTOR_ERRORS.help,
            labels=list(COLLECTOR_ERRORS.labels),
        )
        for name, count in self.errors().items():
            family.add_metric([name], float(count))
        return family


def _process_collector() -> Collector:
    """The exporter's own process, platform and GC metrics, as the default registry has."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def build_renderer(
    settings: ServerSettings, collectors: Sequence[Collector] = ()
) -> MetricsRenderer:
    """The renderer ``/metrics`` uses: multiprocess dir, then ``collectors``, then process.

    Example::

        renderer = build_renderer(ServerSettings("127.0.0.1", 0, multiprocess_dir=path))
        body = renderer.render(openmetrics=False)
    """
    taken = {"multiprocess", "process"}
    sources: list[tuple[str, Collector]] = []
    if settings.multiprocess_dir is not None:
        sources.append(
            (
                "multiprocess",
                MultiprocessDirCollector(
                    settings.multiprocess_dir, check_pids=settings.multiprocess_check_pids
                ),
            )
        )
    sources.extend((_collector_name(c, taken), c) for c in collectors)
    sources.append(("process", _process_collector()))
    return MetricsRenderer(sources)


# --- threads -------------------------------------------------------------------------------


def _in_daemon_thread(fn: Callable[[], _T]) -> asyncio.Future[_T]:
    """Run ``fn`` in a new daemon thread; the future resolves on the calling loop.

    Not the default executor: ``asyncio.run`` waits for its threads at exit, so a
    collector stuck forever would turn a clean SIGTERM into a SIGKILL. A daemon thread is
    abandoned instead. Threads are few: scrapes of one format share a render.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def succeed(result: _T) -> None:
        if not future.done():
            future.set_result(result)

    def fail(error: BaseException) -> None:
        if not future.done():
            future.set_exception(error)

    def run() -> None:
        # RuntimeError from call_soon_threadsafe: the loop is closed, nobody waits.
        try:
            result = fn()
        except BaseException as exc:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(fail, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(succeed, result)

    threading.Thread(target=run, name="stocksentry-scrape", daemon=True).start()
    return future


class _SharedRender:
    """Single-flight renders: one thread per format at a time, shared by its waiters."""

    def __init__(self, renderer: MetricsRenderer) -> None:
        self._renderer = renderer
        self._inflight: dict[bool, asyncio.Future[bytes]] = {}

    async def render(self, *, openmetrics: bool) -> bytes:
        future = self._inflight.get(openmetrics)
        if future is None:
            future = _in_daemon_thread(lambda: self._renderer.render(openmetrics=openmetrics))
            self._inflight[openmetrics] = future
            future.add_done_callback(lambda _: self._inflight.pop(openmetrics, None))
        # Shielded: a scrape that gives up must not cancel the render others wait for.
        return await asyncio.shield(future)


# --- the application -----------------------------------------------------------------------

#: The settings the app was built from.
SETTINGS: Final = web.AppKey("stocksentry_settings", ServerSettings)
#: Start-up / shutdown state behind ``/readyz``.
LIFECYCLE: Final = web.AppKey("stocksentry_lifecycle", Lifecycle)
#: The renderer behind ``/metrics`` (its error counts, its sources).
RENDERER: Final = web.AppKey("stocksentry_renderer", MetricsRenderer)
_SHARED: Final = web.AppKey("stocksentry_shared_render", _SharedRender)
#: The basic-auth checker (disabled when the web config has no users).
BASIC_AUTH: Final = web.AppKey("stocksentry_basic_auth", BasicAuth)

_LANDING: Final = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>stocksentry exporter</title></head>
<body>
<h1>stocksentry exporter</h1>
<p>Observability for double-selling in flash sales.</p>
<ul>
<li><a href="{metrics}">{metrics}</a>: metrics (Prometheus text or OpenMetrics)</li>
<li><a href="{healthz}">{healthz}</a>: liveness</li>
<li><a href="{readyz}">{readyz}</a>: readiness</li>
</ul>
</body>
</html>
"""


async def _metrics(request: web.Request) -> web.Response:
    app = request.app
    openmetrics = wants_openmetrics(request.headers.get(hdrs.ACCEPT, ""))
    body = await app[_SHARED].render(openmetrics=openmetrics)
    headers = {
        hdrs.CONTENT_TYPE: CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT,
        hdrs.VARY: "Accept, Accept-Encoding",
    }
    if wants_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, "")):
        # Compression is CPU work too; this one is bounded, so the executor is fine.
        body = await asyncio.to_thread(gzip.compress, body, _GZIP_LEVEL)
        headers[hdrs.CONTENT_ENCODING] = "gzip"
    return web.Response(body=body, headers=headers)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _readyz(request: web.Request) -> web.Response:
    lifecycle = request.app[LIFECYCLE]
    if lifecycle.ready:
        return web.Response(text="ready\n")
    state = "shutting down" if lifecycle.stopping else "starting"
    return web.Response(status=503, text=f"not ready: {state}\n")


async def _landing(request: web.Request) -> web.Response:
    page = _LANDING.format(
        metrics=html.escape(request.app[SETTINGS].metrics_path, quote=True),
        healthz=HEALTHZ_PATH,
        readyz=READYZ_PATH,
    )
    return web.Response(text=page, content_type="text/html")


@web.middleware
async def _basic_auth(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.path in (HEALTHZ_PATH, READYZ_PATH):
        return await handler(request)
    auth = request.app[BASIC_AUTH]
    if await auth.check(request.headers.get(hdrs.AUTHORIZATION)):
        return await handler(request)
    return web.Response(
        status=401,
        text="401: credentials missing or wrong\n",
        headers={hdrs.WWW_AUTHENTICATE: auth.challenge},
    )


def create_app(
    settings: ServerSettings,
    *,
    collectors: Sequence[Collector] = (),
    background: Sequence[Background] = (),
) -> web.Application:
    """Build the exporter's aiohttp application.

    ``collectors`` join the exposition after the multiprocess directory and before the
    process metrics. ``background`` callables are async generators appended to
    ``app.cleanup_ctx``: start their tasks before ``yield``, cancel and await them after;
    ``/readyz`` turns 200 only once all of them have started. (It flips in an
    ``on_startup`` handler registered here, which runs after every ``cleanup_ctx``
    start-up; ``on_startup`` handlers added later by the caller run after it.)

    Example::

        async def probes(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(runner.run_forever())
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app = create_app(settings, collectors=[snapshot_collector], background=[probes])
        web.run_app(app)  # or run_server(...), which also handles TLS and signals
    """
    web_config = settings.web_config
    auth = BasicAuth(web_config.basic_auth_users if web_config else {})
    app = web.Application(middlewares=[_basic_auth] if auth.enabled else [])
    app[SETTINGS] = settings
    app[LIFECYCLE] = Lifecycle()
    renderer = build_renderer(settings, collectors)
    app[RENDERER] = renderer
    app[_SHARED] = _SharedRender(renderer)
    app[BASIC_AUTH] = auth

    app.router.add_get(settings.metrics_path, _metrics)
    app.router.add_get(HEALTHZ_PATH, _healthz)
    app.router.add_get(READYZ_PATH, _readyz)
    app.router.add_get("/", _landing)

    extra_headers = dict(web_config.http.headers) if web_config else {}
    if extra_headers:

        async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
            response.headers.update(extra_headers)

        app.on_response_prepare.append(add_headers)

    app.cleanup_ctx.extend(background)

    async def started(app: web.Application) -> None:
        app[LIFECYCLE].started = True

    async def stopping(app: web.Application) -> None:
        app[LIFECYCLE].stopping = True

    app.on_startup.append(started)
    app.on_shutdown.append(stopping)
    return app


# --- running -------------------------------------------------------------------------------


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
        """The base URL of the first bound address, e.g. ``https://127.0.0.1:9464/``."""
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
    :func:`run_server`'s job.

    Example::

        async with serving(ServerSettings("127.0.0.1", 0)) as server:
            print("listening on", server.url)
            await stop_event.wait()
    """
    web_config = settings.web_config
    ssl_context = web_config.ssl_context() if web_config else None
    app = create_app(settings, collectors=collectors, background=background)
    # No access log: Prometheus scrapes every few seconds and kubelet probes as often.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=settings.shutdown_timeout)
    try:
        await runner.setup()
        site = web.TCPSite(runner, settings.listen_address, settings.port, ssl_context=ssl_context)
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

        run_server(ServerSettings("0.0.0.0", 9464, multiprocess_dir=Path("/run/prom")))
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
