"""The aiohttp application: its routes, content negotiation, basic auth, :func:`create_app`.

Basic auth guards ``/metrics`` and the landing page; the health endpoints stay open,
because kubelet probes carry no credentials and the answers reveal nothing.
"""

from __future__ import annotations

import asyncio
import gzip
import html
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Final

from aiohttp import hdrs, web
from prometheus_client.registry import Collector

from ..basicauth import BasicAuth
from ..webconfig import WebConfig
from .buildinfo import build_info
from .exposition import MetricsRenderer, build_renderer
from .settings import HEALTHZ_PATH, READYZ_PATH, Lifecycle, ServerSettings

#: A background resource for ``app.cleanup_ctx``: start-up before ``yield``, clean-up after.
Background = Callable[[web.Application], AsyncIterator[None]]

#: The settings the app was built from.
SETTINGS: Final = web.AppKey("stocksentry_settings", ServerSettings)
#: Start-up / shutdown state behind ``/readyz``.
LIFECYCLE: Final = web.AppKey("stocksentry_lifecycle", Lifecycle)
#: The renderer behind ``/metrics`` (its error counts, its sources).
RENDERER: Final = web.AppKey("stocksentry_renderer", MetricsRenderer)
#: The basic-auth checker (disabled when the web config has no users).
BASIC_AUTH: Final = web.AppKey("stocksentry_basic_auth", BasicAuth)

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


@web.middleware
async def basic_auth_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """401 with a ``WWW-Authenticate`` challenge unless the credentials check out; the
    health endpoints pass without credentials."""
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


#: Prometheus text format, the default.
CONTENT_TYPE_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
#: OpenMetrics 1.0.0, chosen by ``Accept``; the only format that carries exemplars.
CONTENT_TYPE_OPENMETRICS: Final = "application/openmetrics-text; version=1.0.0; charset=utf-8"


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
    """True when ``Accept`` prefers OpenMetrics 1.x (or no version) over the text format,
    at a q above 0 and at least that of ``text/plain`` and ``*/*``.

    Example::

        >>> wants_openmetrics("application/openmetrics-text;version=1.0.0;q=0.6,*/*;q=0.2")
        True
        >>> wants_openmetrics("application/openmetrics-text;version=1.0.0,*/*;q=0.1")
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
    # The last q given wins; gzip's own, when given, over that of "*".
    qs = {"gzip" if c == "x-gzip" else c: q for c, _, q in _media_ranges(accept_encoding)}
    return qs.get("gzip", qs.get("*", 0.0)) > 0


async def _metrics(request: web.Request) -> web.Response:
    openmetrics = wants_openmetrics(request.headers.get(hdrs.ACCEPT, ""))
    body = await request.app[RENDERER].render_shared(openmetrics=openmetrics)
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
    routes: Sequence[web.RouteDef] = (),
) -> web.Application:
    """Build the exporter's aiohttp application.

    ``collectors`` join the exposition after the multiprocess directory and before the
    process metrics; ``background`` goes to ``app.cleanup_ctx``, and ``/readyz`` turns
    200 once all of it has started; ``routes`` (the freeze webhook) sit behind the same
    basic auth as ``/metrics``.
    """
    web_config = settings.web_config or WebConfig()
    auth = BasicAuth(web_config.basic_auth_users)
    app = web.Application(middlewares=[basic_auth_middleware] if auth.enabled else [])
    app[SETTINGS] = settings
    app[LIFECYCLE] = Lifecycle()
    app[RENDERER] = build_renderer(settings, collectors)
    app[BASIC_AUTH] = auth

    app.router.add_get(settings.metrics_path, _metrics)
    app.router.add_get(HEALTHZ_PATH, _healthz)
    app.router.add_get(READYZ_PATH, _readyz)
    app.router.add_get("/", _landing)
    app.router.add_routes(routes)

    extra_headers = dict(web_config.http.headers)
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
