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
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from .logs import bind_correlation, new_request_id, sanitize_id

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
        headers = request.headers
        request_id = sanitize_id(headers.get(header)) or new_request_id()
        idempotency_key = sanitize_id(headers.get(IDEMPOTENCY_HEADER))

        # An earlier instrumentation (e.g. an OpenTelemetry server middleware)
        # may have made its server span current already: keep it as the parent.
        token = None
        if not trace.get_current_span().get_span_context().is_valid:
            token = otel_context.attach(propagate.extract(headers))
        try:
            with bind_correlation(request_id=request_id, idempotency_key=idempotency_key):
                try:
                    response = await handler(request)
                except web.HTTPException as exc:
                    exc.headers[header] = request_id
                    raise
        finally:
            if token is not None:
                otel_context.detach(token)

        # A streamed response already sent its headers; they cannot change now.
        if not response.prepared:
            response.headers[header] = request_id
        return response

    return correlation
