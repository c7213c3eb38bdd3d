"""aiohttp and ASGI correlation middleware: request ids, idempotency keys, W3C trace context."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from aiohttp import web
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from stocksentry.instrumentation.aiohttp import CorrelatedAccessLogger, correlation_middleware
from stocksentry.instrumentation.asgi import CorrelationMiddleware, Message, Scope
from stocksentry.instrumentation.logs import (
    get_correlation,
    get_logger,
    sanitize_id,
)

GENERATED = re.compile(r"[0-9a-f]{32}")
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"
HOSTILE_IDS = [
    "a" * 500,
    "a" * 129,
    "tab\tinside",
    "caf\u00e9",
]


def lines(stream: io.StringIO, logger: str) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in parsed if line["logger"] == logger]


@pytest.fixture
def tracer() -> trace.Tracer:
    return TracerProvider().get_tracer("test")


def test_sanitize_id() -> None:
    assert sanitize_id("req-1") == "req-1"
    assert sanitize_id("x" * 128) == "x" * 128
    assert sanitize_id(" !~") == " !~"
    for hostile in [None, "", "x" * 129, "a\nb", "a\r\nSet-Cookie: x", "a\x00", "\u00e9", "a\x7f"]:
        assert sanitize_id(hostile) is None


# --- aiohttp -----------------------------------------------------------------------------


class Seen:
    """What the handler observed and what passed through the middleware."""

    def __init__(self) -> None:
        self.raised: list[BaseException] = []
        self.passed_out: list[BaseException] = []


def make_app(tracer: trace.Tracer, seen: Seen, **options: str) -> web.Application:
    async def checkout(request: web.Request) -> web.Response:
        get_logger("handler").info("handled")
        with tracer.start_as_current_span("reserve") as span:
            context = span.get_span_context()
            parent = span.parent  # type: ignore[attr-defined]  # SDK span
        return web.json_response(
            {
                "correlation": get_correlation(),
                "trace_id": f"{context.trace_id:032x}",
                "parent_span_id": None if parent is None else f"{parent.span_id:016x}",
                "trace_state": dict(context.trace_state),
            }
        )

    async def fail(request: web.Request) -> web.Response:
        error = ValueError("boom")
        seen.raised.append(error)
        raise error

    async def missing(request: web.Request) -> web.Response:
        error = web.HTTPNotFound(text="no such sku")
        seen.raised.append(error)
        raise error

    async def streamed(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(json.dumps(get_correlation()).encode())
        await response.write_eof()
        return response

    @web.middleware
    async def outer(
        request: web.Request, handler: Any
    ) -> web.StreamResponse:  # wraps ours: sees what it lets out
        try:
            return await handler(request)  # type: ignore[no-any-return]
        except Exception as exc:
            seen.passed_out.append(exc)
            raise

    app = web.Application(middlewares=[outer, correlation_middleware(**options)])
    for handler in (checkout, fail, missing, streamed):  # each at /<its name>
        app.router.add_get(f"/{handler.__name__}", handler)
    return app


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
async def client(
    aiohttp_client: Any, stream: io.StringIO, tracer: trace.Tracer, seen: Seen
) -> Any:
    """A client of the app behind the middleware, its logs in ``stream``."""
    return await aiohttp_client(make_app(tracer, seen))


async def test_aiohttp_generates_and_echoes_request_id(client: Any, stream: io.StringIO) -> None:
    first = await client.get("/checkout")
    second = await client.get("/checkout")

    ids = [first.headers["X-Request-ID"], second.headers["X-Request-ID"]]
    assert all(GENERATED.fullmatch(request_id) for request_id in ids)
    assert ids[0] != ids[1]
    assert (await first.json())["correlation"] == {"request_id": ids[0]}
    assert [line["request_id"] for line in lines(stream, "handler")] == ids


async def test_the_access_log_line_carries_the_request_id(
    aiohttp_server: Any, aiohttp_client: Any, stream: io.StringIO, tracer: trace.Tracer
) -> None:
    server = await aiohttp_server(
        make_app(tracer, Seen()), access_log_class=CorrelatedAccessLogger
    )
    client = await aiohttp_client(server)
    given = await client.get("/checkout", headers={"X-Request-ID": "req-42"})
    made = await client.get("/missing")
    assert (given.status, made.status) == (200, 404)
    first, second = lines(stream, "aiohttp.access")
    assert first["request_id"] == "req-42"
    assert first["status"] == 200
    assert re.fullmatch(
        r'127\.0\.0\.1 "GET /checkout HTTP/1\.1" 200 \d+ \d+\.\d{6}', first["event"]
    )
    # A generated id, the same the response echoed; the 404 is logged with it too.
    assert second["request_id"] == made.headers["X-Request-ID"]
    assert GENERATED.fullmatch(second["request_id"])
    assert second["status"] == 404


async def test_aiohttp_keeps_valid_incoming_id_and_binds_idempotency_key(
    client: Any, stream: io.StringIO
) -> None:
    response = await client.get(
        "/checkout", headers={"X-Request-ID": "req-abc-123", "Idempotency-Key": "idem-42"}
    )

    assert response.status == 200
    assert response.headers["X-Request-ID"] == "req-abc-123"
    assert (await response.json())["correlation"] == {
        "request_id": "req-abc-123",
        "idempotency_key": "idem-42",
    }
    (line,) = lines(stream, "handler")
    assert (line["request_id"], line["idempotency_key"]) == ("req-abc-123", "idem-42")


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
async def test_aiohttp_replaces_hostile_ids(client: Any, hostile: str) -> None:
    response = await client.get(
        "/checkout", headers={"X-Request-ID": hostile, "Idempotency-Key": hostile}
    )

    request_id = response.headers["X-Request-ID"]
    assert GENERATED.fullmatch(request_id)
    # The hostile idempotency key is dropped, not replaced: a made-up key would lie.
    assert (await response.json())["correlation"] == {"request_id": request_id}


async def test_aiohttp_custom_header_name(aiohttp_client: Any, tracer: trace.Tracer) -> None:
    client = await aiohttp_client(make_app(tracer, Seen(), header="X-Correlation-ID"))

    response = await client.get("/checkout", headers={"x-correlation-id": "corr-1"})

    assert response.headers["X-Correlation-ID"] == "corr-1"
    assert "X-Request-ID" not in response.headers
    assert (await response.json())["correlation"] == {"request_id": "corr-1"}


async def test_aiohttp_handler_span_joins_incoming_trace(client: Any) -> None:
    joined = await (
        await client.get(
            "/checkout", headers={"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
        )
    ).json()
    fresh = await (await client.get("/checkout")).json()

    assert joined["trace_id"] == TRACE_ID
    assert joined["parent_span_id"] == PARENT_SPAN_ID
    assert joined["trace_state"] == {"vendor": "abc"}
    # The caller's context was detached after the first request.
    assert fresh["trace_id"] != TRACE_ID
    assert fresh["parent_span_id"] is None


async def test_aiohttp_value_error_passes_through_unchanged(
    client: Any, stream: io.StringIO, seen: Seen
) -> None:
    response = await client.get("/fail", headers={"X-Request-ID": "req-fail"})

    assert response.status == 500
    assert len(seen.raised) == 1
    assert seen.passed_out == seen.raised
    assert seen.passed_out[0] is seen.raised[0]
    # aiohttp's own error line comes out as JSON through the stdlib bridge. It is
    # written after the middleware returned, so the request id is no longer bound.
    (error_line,) = lines(stream, "aiohttp.server")
    assert error_line["level"] == "error"
    assert "ValueError: boom" in error_line["exception"]


async def test_aiohttp_http_exception_keeps_status_and_gets_header(
    client: Any, seen: Seen
) -> None:
    response = await client.get("/missing", headers={"X-Request-ID": "req-404"})

    assert response.status == 404
    assert await response.text() == "no such sku"
    assert response.headers["X-Request-ID"] == "req-404"
    assert len(seen.raised) == 1
    assert seen.passed_out[0] is seen.raised[0]
    assert isinstance(seen.passed_out[0], web.HTTPNotFound)


async def test_aiohttp_streamed_response_keeps_correlation(
    client: Any, stream: io.StringIO
) -> None:
    response = await client.get("/streamed", headers={"X-Request-ID": "req-stream"})

    assert response.status == 200
    assert json.loads(await response.read()) == {"request_id": "req-stream"}


# --- ASGI --------------------------------------------------------------------------------


class TinyApp:
    """An ASGI app recording what it saw, answering with its own x-request-id."""

    def __init__(self, tracer: trace.Tracer, error: BaseException | None = None) -> None:
        self.tracer = tracer
        self.error = error
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        with self.tracer.start_as_current_span("reserve") as span:
            parent = span.parent  # type: ignore[attr-defined]  # SDK span
            get_logger("asgi_app").info("handled")
            self.seen.append(
                {
                    "scope": scope,
                    "receive": receive,
                    "send": send,
                    "correlation": get_correlation(),
                    "trace_id": f"{span.get_span_context().trace_id:032x}",
                    "parent_span_id": None if parent is None else f"{parent.span_id:016x}",
                    "trace_state": dict(span.get_span_context().trace_state),
                }
            )
        if self.error is not None:
            raise self.error
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [(b"content-type", b"text/plain"), (b"X-Request-ID", b"from-app")],
            }
        )
        await send({"type": "http.response.body", "body": b"ok"})


def http_scope(*headers: tuple[bytes, bytes]) -> Scope:
    return {"type": "http", "method": "GET", "path": "/checkout", "headers": list(headers)}


async def call(app: Any, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_asgi_generates_and_echoes_request_id(
    stream: io.StringIO, tracer: trace.Tracer
) -> None:
    inner = TinyApp(tracer)

    start, body = await call(CorrelationMiddleware(inner), http_scope())

    request_id = inner.seen[0]["correlation"]["request_id"]
    assert GENERATED.fullmatch(request_id)
    assert inner.seen[0]["correlation"] == {"request_id": request_id}
    # The app's own x-request-id is replaced, the other headers kept in order.
    assert start == {
        "type": "http.response.start",
        "status": 201,
        "headers": [(b"content-type", b"text/plain"), (b"x-request-id", request_id.encode())],
    }
    assert body == {"type": "http.response.body", "body": b"ok"}
    (line,) = lines(stream, "asgi_app")
    assert line["request_id"] == request_id
    # Nothing stays bound or attached after the request.
    assert get_correlation() == {}
    assert not trace.get_current_span().get_span_context().is_valid


async def test_asgi_keeps_valid_id_binds_idempotency_key_and_joins_trace(
    stream: io.StringIO, tracer: trace.Tracer
) -> None:
    inner = TinyApp(tracer)
    scope = http_scope(
        (b"x-request-id", b"req-asgi-1"),
        (b"idempotency-key", b"idem-7"),
        (b"traceparent", TRACEPARENT.encode()),
        (b"tracestate", b"a=1"),
        (b"tracestate", b"b=2"),
    )

    start, _ = await call(CorrelationMiddleware(inner), scope)

    seen = inner.seen[0]
    assert seen["correlation"] == {"request_id": "req-asgi-1", "idempotency_key": "idem-7"}
    assert seen["trace_id"] == TRACE_ID
    assert seen["parent_span_id"] == PARENT_SPAN_ID
    assert seen["trace_state"] == {"a": "1", "b": "2"}
    assert start["headers"][-1] == (b"x-request-id", b"req-asgi-1")
    (line,) = lines(stream, "asgi_app")
    assert (line["request_id"], line["idempotency_key"], line["trace_id"]) == (
        "req-asgi-1",
        "idem-7",
        TRACE_ID,
    )


@pytest.mark.parametrize(
    "hostile", [b"a\nb", b"a\r\nset-cookie: x=1", b"a" * 500, b"\xff\xfe", b"nul\x00"]
)
async def test_asgi_replaces_hostile_ids(
    stream: io.StringIO, tracer: trace.Tracer, hostile: bytes
) -> None:
    inner = TinyApp(tracer)

    start, _ = await call(
        CorrelationMiddleware(inner),
        http_scope((b"x-request-id", hostile), (b"idempotency-key", hostile)),
    )

    request_id = inner.seen[0]["correlation"]["request_id"]
    assert GENERATED.fullmatch(request_id)
    assert inner.seen[0]["correlation"] == {"request_id": request_id}
    assert start["headers"][-1] == (b"x-request-id", request_id.encode())


async def test_asgi_custom_header_name(stream: io.StringIO, tracer: trace.Tracer) -> None:
    inner = TinyApp(tracer)

    start, _ = await call(
        CorrelationMiddleware(inner, header="X-Correlation-ID"),
        http_scope((b"x-correlation-id", b"corr-9"), (b"x-request-id", b"ignored")),
    )

    assert inner.seen[0]["correlation"] == {"request_id": "corr-9"}
    assert start["headers"] == [
        (b"content-type", b"text/plain"),
        (b"X-Request-ID", b"from-app"),
        (b"x-correlation-id", b"corr-9"),
    ]


@pytest.mark.parametrize("scope_type", ["lifespan", "websocket"])
async def test_asgi_other_scopes_pass_straight_through(
    stream: io.StringIO, tracer: trace.Tracer, scope_type: str
) -> None:
    inner = TinyApp(tracer)
    scope: Scope = {"type": scope_type, "headers": [(b"x-request-id", b"req-ws")]}

    async def receive() -> Message:
        return {"type": f"{scope_type}.startup"}

    async def send(message: Message) -> None:
        raise AssertionError("the tiny app sends nothing for this scope")

    await CorrelationMiddleware(inner)(scope, receive, send)

    seen = inner.seen[0]
    assert seen["scope"] is scope
    assert seen["receive"] is receive
    assert seen["send"] is send
    assert seen["correlation"] == {}
    assert seen["parent_span_id"] is None


async def test_asgi_app_exception_propagates_unchanged(
    stream: io.StringIO, tracer: trace.Tracer
) -> None:
    error = ValueError("boom")
    inner = TinyApp(tracer, error=error)

    with pytest.raises(ValueError, match="boom") as raised:
        await call(
            CorrelationMiddleware(inner),
            http_scope((b"x-request-id", b"req-err"), (b"traceparent", TRACEPARENT.encode())),
        )

    assert raised.value is error
    assert inner.seen[0]["correlation"] == {"request_id": "req-err"}
    assert get_correlation() == {}
    assert not trace.get_current_span().get_span_context().is_valid
