"""The sidecar's HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and a landing page.

One aiohttp application, built by :func:`create_app` from a :class:`ServerSettings` and
served by :func:`run_server` (until SIGTERM) or :func:`serving` (``async with``), e.g.
``run_server(ServerSettings("0.0.0.0", 19464), collectors=[probes])``.
docs/exporter-server.md describes the endpoints, the settings, TLS and basic auth.
"""

from __future__ import annotations

from .app import BASIC_AUTH, LIFECYCLE, RENDERER, SETTINGS, Background, create_app
from .exposition import build_renderer
from .running import RunningServer, run_server, serving
from .settings import ServerSettings

__all__ = [
    "BASIC_AUTH",
    "LIFECYCLE",
    "RENDERER",
    "SETTINGS",
    "Background",
    "RunningServer",
    "ServerSettings",
    "build_renderer",
    "create_app",
    "run_server",
    "serving",
]
