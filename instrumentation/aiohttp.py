"""aiohttp server middleware binding request ids and the caller's trace.

Importing this module imports aiohttp; ``stocksentry.instrumentation`` itself
never does, so apps without aiohttp are unaffected.

Example::

    from aiohttp import web
    from stocksentry.instrumentation.aiohttp import correlation_middleware

    app = web.Application(middlewares=[correlation_middleware()])
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .logs import request_correlation

__all__ = ["correlation_middleware"]

IDEMPOTENCY_HEADER = "Idempotency-Key"
"""Request header read as ``idempotency_key``.

Example::

    await client.post("/checkout", headers={IDEMPOTENCY_HEADER: "k-1"})
"""


def correlation_middleware(*, header: str = "X-Request-ID") -> Middleware:
    """Build a middleware that correlates each request in logs and traces.

    For the duration of the handler it:

    - binds ``request_id`` (the *header* value if it is 1-128 printable ASCII
      characters, otherwise a new one) and ``idempotency_key`` (the
      ``Idempotency-Key`` header, when safe) with
      :func:`~stocksentry.instrumentation.logs.bind_correlation`;
    - makes the W3C ``traceparent``/``tracestate`` caller context current, so
      spans started in the handler join the caller's trace (unless a server
      span from another instrumentation is already current);
    - echoes the id in the *header* of the response, including
      ``web.HTTPException`` responses, which are re-raised unchanged. Other
      exceptions pass through untouched.

    Handlers read the ids with
    :func:`~stocksentry.instrumentation.logs.get_correlation`.

    Example::

        app = web.Application(middlewares=[correlation_middleware()])
    """

    @web.middleware
    async def correlation(request: web.Request, handler: Handler) -> web.StreamResponse:
        with request_correlation(request.headers, header, IDEMPOTENCY_HEADER) as request_id:
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
