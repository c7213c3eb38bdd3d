"""aiohttp server middleware binding request ids and the caller's trace.

Importing this module imports aiohttp; ``stocksentry.instrumentation`` itself
never does, so apps without aiohttp are unaffected.

Example::

    from aiohttp import web
    from stocksentry.instrumentation.aiohttp import (
        CorrelatedAccessLogger,
        correlation_middleware,
    )

    app = web.Application(middlewares=[correlation_middleware()])
    web.run_app(app, access_log_class=CorrelatedAccessLogger)
"""

from __future__ import annotations

import logging
from typing import Any, Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Handler, Middleware

from .logs import request_correlation

__all__ = ["CorrelatedAccessLogger", "correlation_middleware"]

#: Where the middleware leaves the request's id for the access log, which aiohttp writes
#: after the middleware has unbound it: a typed ``web.RequestKey`` where aiohttp has them
#: (a plain string key warns there), a string before.
REQUEST_ID_KEY: Final[Any] = (
    web.RequestKey("stocksentry.request_id", str)
    if hasattr(web, "RequestKey")
    else "stocksentry.request_id"
)

#: Request header read as ``idempotency_key``.
IDEMPOTENCY_HEADER = "Idempotency-Key"


def correlation_middleware(*, header: str = "X-Request-ID") -> Middleware:
    """Build a middleware that correlates each request in logs and traces.

    For the duration of the handler it binds ``request_id`` (the *header* value when
    safe, else a new one) and ``idempotency_key``, and makes the caller's W3C trace
    context current (:func:`~stocksentry.instrumentation.logs.request_correlation`); it
    echoes the id in the *header* of the response, also of a ``web.HTTPException``
    (re-raised unchanged). Handlers read the ids with
    :func:`~stocksentry.instrumentation.logs.get_correlation`.
    """

    @web.middleware
    async def correlation(request: web.Request, handler: Handler) -> web.StreamResponse:
        with request_correlation(request.headers, header, IDEMPOTENCY_HEADER) as request_id:
            request[REQUEST_ID_KEY] = request_id
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                exc.headers[header] = request_id
                raise

        # A streamed response already sent its headers; they cannot change now.
        if not response.prepared:
            response.headers[header] = request_id
        return response

    return correlation


class CorrelatedAccessLogger(AbstractAccessLogger):
    """aiohttp's access log line (the common log's text) with the request's ``request_id``.

    aiohttp writes it after the middlewares returned, when the ids
    :func:`correlation_middleware` bound are gone: the id the middleware left on the
    request comes as an ``extra`` field, which
    :func:`~stocksentry.instrumentation.logs.configure_logging` puts in the line.
    """

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        """Write one line for ``request`` (aiohttp calls it once the response is sent)."""
        major, minor = request.version
        fields = {"status": response.status, "duration_seconds": round(time, 6)}
        request_id = request.get(REQUEST_ID_KEY)
        if request_id is not None:
            fields["request_id"] = request_id
        self.logger.log(
            logging.INFO,
            '%s "%s %s HTTP/%d.%d" %d %d %.6f',
            request.remote or "-",
            request.method,
            request.path_qs,
            major,
            minor,
            response.status,
            response.body_length,
            time,
            extra=fields,
        )
