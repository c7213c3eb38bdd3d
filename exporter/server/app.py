"""The aiohttp application: its routes, its state, and :func:`create_app`.

Routes: ``/metrics`` (``settings.metrics_path``, the exposition of
:mod:`.exposition`, negotiated by :mod:`.negotiation`), ``/healthz``, ``/readyz`` and a
landing page at ``/`` (with the version, see :mod:`.buildinfo`). Basic auth
(:mod:`.auth`) guards the first and the last.

Example::

    app = create_app(ServerSettings("127.0.0.1", 0), collectors=[probe_runner])
    web.run_app(app)  # or run_server(...), which also handles TLS and signals
"""

from __future__ import annotations

import asyncio
import gzip
import html
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final

from aiohttp import hdrs, web
from prometheus_client.registry import Collector

from ..webconfig import BasicAuth
from .auth import BASIC_AUTH, basic_auth_middleware
from .buildinfo import build_info
from .exposition import MetricsRenderer, SharedRender, build_renderer
from .negotiation import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, wants_gzip, wants_openmetrics
from .settings import HEALTHZ_PATH, READYZ_PATH, Lifecycle, ServerSettings

__all__ = ["LIFECYCLE", "RENDERER", "SETTINGS", "Background", "create_app"]

#: A background resource for ``app.cleanup_ctx``: start-up before ``yield``, clean-up after.
Background = Callable[[web.Application], AsyncIterator[None]]

#: The settings the app was built from.
SETTINGS: Final = web.AppKey("stocksentry_settings", ServerSettings)
#: Start-up / shutdown state behind ``/readyz``.
LIFECYCLE: Final = web.AppKey("stocksentry_lifecycle", Lifecycle)
#: The renderer behind ``/metrics`` (its error counts, its sources).
RENDERER: Final = web.AppKey("stocksentry_renderer", MetricsRenderer)
_SHARED: Final = web.AppKey("stocksentry_shared_render", SharedRender)

# Level 6 is what Go's gzip (and so the Prometheus exporters) use by default: most of the
# ratio of level 9 for a fraction of its CPU.
_GZIP_LEVEL: Final = 6

_LANDING: Final = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>stocksentry exporter</title></head>
<body>
<h1>stocksentry exporter</h1>
<p>Observability for double-selling in flash sales.</p>
<p>Version: {version}</p>
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
        version=html.escape(build_info().describe().removeprefix("stocksentry "), quote=True),
        metrics=html.escape(request.app[SETTINGS].metrics_path, quote=True),
        healthz=HEALTHZ_PATH,
        readyz=READYZ_PATH,
    )
    return web.Response(text=page, content_type="text/html")


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
    app = web.Application(middlewares=[basic_auth_middleware] if auth.enabled else [])
    app[SETTINGS] = settings
    app[LIFECYCLE] = Lifecycle()
    renderer = build_renderer(settings, collectors)
    app[RENDERER] = renderer
    app[_SHARED] = SharedRender(renderer)
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
