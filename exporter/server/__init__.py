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
- ``/``: a small HTML page with the version, linking the three.

Beside the process metrics, every scrape carries ``stocksentry_build_info{version,
revision, python_version} 1`` (:mod:`.buildinfo`). ``ServerSettings.also_listen`` adds
listen addresses (a repeated ``--web.listen-address``, parsed by
:mod:`stocksentry.exporter.listen`); at start
:func:`run_server` logs one line per bound socket saying whether it speaks TLS and asks
for authentication.

Generating the exposition is CPU work (and the multiprocess files are read there), so it
runs in a thread: a slow collector delays its scrape, never ``/healthz``. Scrapes that
arrive while one of the same format is being generated share its result, so a hung
collector holds at most one thread per format instead of one per scrape.

With a :class:`~stocksentry.exporter.webconfig.WebConfig` the server speaks TLS
(``tls_server_config``) and asks for basic auth (``basic_auth_users``) on ``/metrics``
and ``/``; ``/healthz`` and ``/readyz`` stay open, because kubelet probes carry no
credentials and the answers reveal nothing. A request the server cannot parse is answered
4xx and logged as one rate-limited INFO line, without a traceback.

One module per role, all re-exported here:

- :mod:`.settings`: :class:`ServerSettings`, :class:`Lifecycle`, the health paths;
- :mod:`.negotiation`: ``Accept`` / ``Accept-Encoding``, the two content types;
- :mod:`.exposition`: :class:`MetricsRenderer`, :func:`build_renderer`, the scrape thread;
- :mod:`.auth`: the basic-auth middleware;
- :mod:`.app`: routes and :func:`create_app`;
- :mod:`.quiet`: :class:`ClientErrorLog`, quiet logs for malformed requests;
- :mod:`.running`: :func:`serving`, :func:`run_server`, signals and shutdown, the
  start-up lines;
- :mod:`.buildinfo`: ``stocksentry_build_info`` and the version line.

Example::

    from pathlib import Path
    from stocksentry.exporter.server import ServerSettings, run_server
    from stocksentry.exporter.webconfig import load_web_config

    settings = ServerSettings(
        listen_address="0.0.0.0",
        port=19464,
        multiprocess_dir=Path("/run/stocksentry/prom"),
        web_config=load_web_config("/etc/stocksentry/web.yml"),
    )
    run_server(settings, collectors=[probe_collector], background=[probe_runner])
"""

from __future__ import annotations

from .app import LIFECYCLE, RENDERER, SETTINGS, Background, create_app
from .auth import BASIC_AUTH, basic_auth_middleware
from .buildinfo import BUILD_INFO, BuildInfo, BuildInfoCollector, build_info
from .exposition import COLLECTOR_ERRORS, MetricsRenderer, SharedRender, build_renderer
from .negotiation import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, wants_gzip, wants_openmetrics
from .quiet import ClientErrorLog
from .running import (
    RunningServer,
    StartupLine,
    describe_security,
    run_server,
    serving,
    startup_lines,
)
from .settings import HEALTHZ_PATH, READYZ_PATH, Lifecycle, ServerSettings

__all__ = [
    "BASIC_AUTH",
    "BUILD_INFO",
    "COLLECTOR_ERRORS",
    "CONTENT_TYPE_OPENMETRICS",
    "CONTENT_TYPE_TEXT",
    "HEALTHZ_PATH",
    "LIFECYCLE",
    "READYZ_PATH",
    "RENDERER",
    "SETTINGS",
    "Background",
    "BuildInfo",
    "BuildInfoCollector",
    "ClientErrorLog",
    "Lifecycle",
    "MetricsRenderer",
    "RunningServer",
    "ServerSettings",
    "SharedRender",
    "StartupLine",
    "basic_auth_middleware",
    "build_info",
    "build_renderer",
    "create_app",
    "describe_security",
    "run_server",
    "serving",
    "startup_lines",
    "wants_gzip",
    "wants_openmetrics",
]
