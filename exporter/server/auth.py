"""Basic auth on the exporter's pages, from the web config's ``basic_auth_users``.

``/metrics`` and the landing page ask for credentials; ``/healthz`` and ``/readyz`` stay
open, because kubelet probes carry no credentials and the answers reveal nothing. The
password check itself (bcrypt, in a thread, with a cache) is
:class:`~stocksentry.exporter.webconfig.BasicAuth`; this module wires it into aiohttp.

Example::

    auth = BasicAuth(web_config.basic_auth_users)
    app = web.Application(middlewares=[basic_auth_middleware] if auth.enabled else [])
    app[BASIC_AUTH] = auth
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import hdrs, web

from ..webconfig import BasicAuth
from .settings import HEALTHZ_PATH, READYZ_PATH

__all__ = ["BASIC_AUTH", "basic_auth_middleware"]

#: The basic-auth checker (disabled when the web config has no users).
BASIC_AUTH: Final = web.AppKey("stocksentry_basic_auth", BasicAuth)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def basic_auth_middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """401 with a ``WWW-Authenticate`` challenge unless the credentials check out.

    The health endpoints pass without credentials.
    """
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
