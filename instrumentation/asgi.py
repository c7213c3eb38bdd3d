"""ASGI middleware binding request ids and the caller's trace.

Framework-neutral (Starlette, FastAPI, Quart, Django ASGI...): it depends only
on the ASGI protocol, opentelemetry-api and structlog.

Example::

    from stocksentry.instrumentation.asgi import CorrelationMiddleware

    app = CorrelationMiddleware(app)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .logs import request_correlation

__all__ = ["CorrelationMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_IDEMPOTENCY_HEADER = "idempotency-key"


class CorrelationMiddleware:
    """Correlate each HTTP request in logs and traces.

    For ``http`` scopes, while the wrapped app runs it binds ``request_id`` (the *header*
    value when safe, else a new one) and ``idempotency_key``, makes the caller's W3C trace
    context current (:func:`~stocksentry.instrumentation.logs.request_correlation`), and
    adds the request id to ``http.response.start``. Other scope types pass straight
    through; exceptions from the app propagate unchanged.
    """

    __slots__ = ("_header", "_header_bytes", "app")

    def __init__(self, app: ASGIApp, *, header: str = "x-request-id") -> None:
        self.app = app
        # ASGI header names are lowercase bytes.
        self._header = header.lower()
        self._header_bytes = self._header.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        carrier: dict[str, str] = {}
        for raw_name, raw_value in scope.get("headers", ()):
            name = bytes(raw_name).decode("latin-1").lower()
            value = bytes(raw_value).decode("latin-1")
            # Repeated header lines form one comma-separated list (RFC 9110).
            carrier[name] = f"{carrier[name]},{value}" if name in carrier else value

        header_bytes = self._header_bytes

        async def send_with_request_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", ())
                    if bytes(name).lower() != header_bytes
                ]
                headers.append((header_bytes, request_id.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        with request_correlation(carrier, self._header, _IDEMPOTENCY_HEADER) as request_id:
            await self.app(scope, receive, send_with_request_id)
