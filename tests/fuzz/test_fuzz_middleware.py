"""The middlewares' header parsing on hostile values: never raises, binds only safe ids.

``X-Request-ID``, ``Idempotency-Key``, ``traceparent`` and ``tracestate`` get values of
any text (aiohttp) or any bytes (ASGI, where header values are raw bytes), repeated
headers included. The handler records what was bound for the logs: every id is either
left out or 1-128 printable ASCII characters, the request id is always there, and the
echoed response header carries the same id. ``sanitize_id`` and the trace-context helpers
of :mod:`stocksentry.instrumentation.tracing` are fuzzed on their own as well.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from fuzzing import MAX_TEXT, any_text, examples, hostile_text
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict
from stocksentry.instrumentation.aiohttp import correlation_middleware
from stocksentry.instrumentation.asgi import CorrelationMiddleware
from stocksentry.instrumentation.logs import get_correlation, sanitize_id
from stocksentry.instrumentation.tracing import link_from_carrier

_SAFE = re.compile(r"[\x20-\x7e]{1,128}")
_HEADERS = ["X-Request-ID", "Idempotency-Key", "traceparent", "tracestate"]
_TRACEPARENT_SHAPE = r"[0-9a-f]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-f]{2}.{0,20}"
_TRACEPARENTS = st.one_of(
    st.sampled_from(
        [
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "",
        ]
    ),
    st.from_regex(_TRACEPARENT_SHAPE, fullmatch=True),
)
_values = st.one_of(hostile_text, any_text, _TRACEPARENTS, st.text("a=b,c ", max_size=MAX_TEXT))


def _check_bound(bound: dict[str, object], echoed: str | None) -> None:
    request_id = bound.get("request_id")
    assert isinstance(request_id, str)
    assert _SAFE.fullmatch(request_id), repr(request_id)
    key = bound.get("idempotency_key")
    assert key is None or (isinstance(key, str) and _SAFE.fullmatch(key)), repr(key)
    assert echoed == request_id


# make_mocked_request encodes header values as UTF-8, so lone surrogates cannot reach the
# middleware through it (sanitize_id gets them below); they become "?" here.
_header_text = _values.map(lambda t: t.encode("utf-8", "replace").decode("utf-8"))


@examples(500)
@given(st.lists(st.tuples(st.sampled_from(_HEADERS), _header_text), max_size=6))
def test_aiohttp_middleware_binds_only_safe_ids(headers: list[tuple[str, str]]) -> None:
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.update(get_correlation())
        return web.Response(text="ok")

    async def run() -> web.StreamResponse:
        request = make_mocked_request("GET", "/", headers=CIMultiDict(headers))
        return await correlation_middleware()(request, handler)

    response = asyncio.run(run())
    _check_bound(seen, response.headers.get("X-Request-ID"))


_raw_values = st.one_of(
    st.binary(max_size=MAX_TEXT), _values.map(lambda t: t.encode("utf-8", "surrogatepass"))
)


@examples(500)
@given(
    st.lists(
        st.tuples(st.sampled_from([h.lower().encode() for h in _HEADERS]), _raw_values),
        max_size=6,
    )
)
def test_asgi_middleware_binds_only_safe_ids(headers: list[tuple[bytes, bytes]]) -> None:
    seen: dict[str, object] = {}
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(get_correlation())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers}
    asyncio.run(CorrelationMiddleware(app)(scope, receive, send))
    echoed = [v for n, v in sent[0]["headers"] if n == b"x-request-id"]
    assert len(echoed) == 1
    _check_bound(seen, echoed[0].decode("ascii"))


@examples(1000)
@given(st.one_of(st.none(), _values))
def test_sanitize_id_keeps_only_safe_ids(value: str | None) -> None:
    clean = sanitize_id(value)
    assert clean is None or (clean == value and _SAFE.fullmatch(clean))
    assert sanitize_id(clean) == clean


@examples(300)
@given(st.dictionaries(st.sampled_from(["traceparent", "tracestate", "x"]), _values, max_size=3))
def test_a_hostile_carrier_links_to_nothing_or_a_valid_span(carrier: dict[str, str]) -> None:
    link = link_from_carrier(carrier)
    assert link is None or link.context.is_valid
