"""JSON log lines: correlation ids through contextvars, trace ids, redaction, stdlib bridge."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
from calendar import timegm
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider
from stocksentry.instrumentation.logs import (
    CORRELATION_KEYS,
    REDACTED,
    Redactor,
    add_trace_context,
    bind_correlation,
    configure_logging,
    get_correlation,
    get_logger,
    new_request_id,
)

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def _restore_logging(saved_level: int) -> None:
    # Replacing the configuration without a bridge removes our root handler.
    configure_logging(stream=io.StringIO(), bridge_stdlib=False)
    logging.getLogger().setLevel(saved_level)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Undo every global logging change the test makes."""
    saved_level = logging.getLogger().level
    try:
        yield
    finally:
        _restore_logging(saved_level)


@pytest.fixture
def stream(restore_logging: None) -> io.StringIO:
    """A configured JSON log stream at DEBUG, with the stdlib bridge."""
    out = io.StringIO()
    configure_logging("DEBUG", stream=out)
    return out


def lines(stream: io.StringIO, logger: str | None = None) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in stream.getvalue().splitlines()]
    return [line for line in parsed if logger is None or line["logger"] == logger]


def test_json_line_has_event_level_timestamp_logger(stream: io.StringIO) -> None:
    before = time.time()
    get_logger("checkout").info("stock_update", sku="A", **{"from": 1, "to": 0})
    after = time.time()

    (line,) = lines(stream)
    timestamp = line.pop("timestamp")
    assert line == {
        "event": "stock_update",
        "level": "info",
        "logger": "checkout",
        "sku": "A",
        "from": 1,
        "to": 0,
    }
    assert TIMESTAMP.match(timestamp)
    seconds = timegm(time.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S"))
    millis = int(timestamp[20:23])
    logged_at = seconds + millis / 1000
    assert int(before * 1000) / 1000 <= logged_at <= after


def test_one_json_object_per_line(stream: io.StringIO) -> None:
    log = get_logger()
    log.warning("multi\nline event", note="a\nb")
    log.error("second")

    raw = stream.getvalue()
    assert raw.count("\n") == 2
    first, second = lines(stream)
    assert (first["event"], first["note"], first["level"], first["logger"]) == (
        "multi\nline event",
        "a\nb",
        "warning",
        "stocksentry",
    )
    assert (second["event"], second["level"]) == ("second", "error")


def test_correlation_ids_come_from_contextvars(stream: io.StringIO) -> None:
    ids = {
        "request_id": "req-1",
        "idempotency_key": "idem-1",
        "sku": "SKU-42",
        "product_id": 42,
        "order_id": "ord-9",
        "payment_reference": "pay-7",
    }
    with bind_correlation(**ids):
        get_logger().info("reserved")
    get_logger().info("outside")

    inside, outside = lines(stream)
    assert {key: inside[key] for key in CORRELATION_KEYS} == ids
    assert not set(CORRELATION_KEYS) & outside.keys()


def test_bind_correlation_skips_none_and_get_correlation_filters(restore_logging: None) -> None:
    with bind_correlation(request_id="req-1", idempotency_key=None, tenant="t-1"):
        assert get_correlation() == {"request_id": "req-1"}
        assert structlog.contextvars.get_contextvars() == {
            "request_id": "req-1",
            "tenant": "t-1",
        }
    assert get_correlation() == {}
    assert structlog.contextvars.get_contextvars() == {}


def test_nested_binding_restores_previous_values(stream: io.StringIO) -> None:
    log = get_logger()
    structlog.contextvars.bind_contextvars(order_id="ord-0")
    with bind_correlation(request_id="req-1", sku="A"):
        with bind_correlation(sku="B", order_id="ord-1"):
            log.info("inner")
            assert get_correlation() == {"request_id": "req-1", "sku": "B", "order_id": "ord-1"}
        log.info("outer")
        assert get_correlation() == {"request_id": "req-1", "sku": "A", "order_id": "ord-0"}
        with pytest.raises(RuntimeError), bind_correlation(sku="C"):
            raise RuntimeError("restores on error too")
        assert get_correlation()["sku"] == "A"
    assert get_correlation() == {"order_id": "ord-0"}

    inner, outer = lines(stream)
    assert (inner["request_id"], inner["sku"], inner["order_id"]) == ("req-1", "B", "ord-1")
    assert (outer["request_id"], outer["sku"], outer["order_id"]) == ("req-1", "A", "ord-0")


async def test_ids_survive_create_task_and_gather(stream: io.StringIO) -> None:
    log = get_logger()

    async def child(name: str) -> dict[str, object]:
        await asyncio.sleep(0)
        log.info(name)
        return get_correlation()

    with bind_correlation(request_id="req-parent", sku="SKU-1"):
        task = asyncio.create_task(child("from_task"))
        gathered = await asyncio.gather(child("gather_a"), child("gather_b"))
        from_task = await task

    expected = {"request_id": "req-parent", "sku": "SKU-1"}
    assert from_task == expected
    assert list(gathered) == [expected, expected]
    # The event loop's own debug line is stdlib's; keep ours.
    by_event = {line["event"]: line for line in lines(stream, "stocksentry")}
    assert sorted(by_event) == ["from_task", "gather_a", "gather_b"]
    for line in by_event.values():
        assert (line["request_id"], line["sku"]) == ("req-parent", "SKU-1")


async def test_concurrent_tasks_do_not_leak_ids(stream: io.StringIO) -> None:
    log = get_logger()
    both_bound = asyncio.Barrier(2)

    async def checkout(request_id: str, order_id: str) -> None:
        with bind_correlation(request_id=request_id, order_id=order_id):
            # Both tasks are inside their binding before either logs.
            await both_bound.wait()
            log.info("checkout", who=request_id)
            await asyncio.sleep(0)
            log.info("paid", who=request_id)

    with bind_correlation(request_id="req-parent"):
        await asyncio.gather(checkout("req-a", "ord-a"), checkout("req-b", "ord-b"))
        log.info("parent_after")

    records = lines(stream, "stocksentry")
    assert len(records) == 5
    for line in records[:4]:
        assert line["request_id"] == line["who"]
        assert line["order_id"] == "ord-" + line["who"][-1]
    assert sorted(line["who"] for line in records[:4]) == ["req-a", "req-a", "req-b", "req-b"]
    assert records[4]["event"] == "parent_after"
    assert records[4]["request_id"] == "req-parent"
    assert "order_id" not in records[4]


def test_trace_and_span_ids_inside_active_span(stream: io.StringIO) -> None:
    tracer = TracerProvider().get_tracer("test")
    log = get_logger()

    log.info("before")
    with tracer.start_as_current_span("reserve") as span:
        log.info("inside")
        with tracer.start_as_current_span("child") as child:
            log.info("nested")
    log.info("after")

    before, inside, nested, after = lines(stream)
    ctx = span.get_span_context()
    assert inside["trace_id"] == f"{ctx.trace_id:032x}"
    assert inside["span_id"] == f"{ctx.span_id:016x}"
    assert re.fullmatch(r"[0-9a-f]{32}", inside["trace_id"])
    assert re.fullmatch(r"[0-9a-f]{16}", inside["span_id"])
    assert nested["trace_id"] == inside["trace_id"]
    assert nested["span_id"] == f"{child.get_span_context().span_id:016x}"
    # W3C traceparent's flags field, the span's own byte; the SDK's default sampler
    # samples everything (bit 0; the SDK may also set bit 1, "random trace id").
    assert inside["trace_flags"] == f"{ctx.trace_flags:02x}"
    assert int(inside["trace_flags"], 16) & 1 == 1
    assert nested["trace_flags"] == inside["trace_flags"]
    for outside in (before, after):
        assert "trace_id" not in outside
        assert "span_id" not in outside
        assert "trace_flags" not in outside


def test_trace_flags_say_when_a_span_is_not_sampled(stream: io.StringIO) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    with tracer.start_as_current_span("reserve"):
        get_logger().info("inside")
    (inside,) = lines(stream)
    assert int(inside["trace_flags"], 16) & 1 == 0
    assert re.fullmatch(r"[0-9a-f]{32}", inside["trace_id"])


def test_add_trace_context_keeps_existing_keys() -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("reserve") as span:
        event = add_trace_context(None, "info", {"trace_id": "from-caller"})
    assert event == {
        "trace_id": "from-caller",
        "span_id": f"{span.get_span_context().span_id:016x}",
        "trace_flags": f"{span.get_span_context().trace_flags:02x}",
    }
    assert add_trace_context(None, "info", {"event": "x"}) == {"event": "x"}


def test_redaction_in_json_lines(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(stream=out, redact_keys=["Email"])
    headers = {"Authorization": "Basic dXNlcjpwYXNz", "Accept": "json", "inner": {"Cookie": "s=1"}}

    get_logger().info(
        "payment_callback",
        password="hunter2",  # noqa: S106  # a fake secret is what a redaction test needs
        AUTHORIZATION="Bearer xyz",
        email="buyer@example.com",
        headers=headers,
        note="paid with 4111 1111 1111 1111 via Bearer abc.def today",
        order_number="4111111111111112",
        other_order="1234567812345678",
        amount=4111111111111111,
    )

    (line,) = lines(out)
    assert line["password"] == REDACTED
    assert line["AUTHORIZATION"] == REDACTED
    assert line["email"] == REDACTED
    assert line["headers"] == {
        "Authorization": REDACTED,
        "Accept": "json",
        "inner": {"Cookie": REDACTED},
    }
    assert line["note"] == "paid with ****1111 via Bearer [REDACTED] today"
    # Not Luhn-valid: an order number, left alone.
    assert line["order_number"] == "4111111111111112"
    assert line["other_order"] == "1234567812345678"
    # Only strings are scanned.
    assert line["amount"] == 4111111111111111
    # The caller's nested dict is copied, not mutated.
    assert headers["Authorization"] == "Basic dXNlcjpwYXNz"
    assert headers["inner"] == {"Cookie": "s=1"}


def test_redactor_processor_directly() -> None:
    redact = Redactor(keys=["ssn"])
    event = redact(
        None,
        "info",
        {
            "event": "card 5555-5555-5555-4444 and 4111111111111111",
            "SSN": "123-45-6789",
            "items": [{"cvv": "123", "sku": "A"}, ("bearer  tok.en-1", 7)],
            "api_key": 12345,
            "ts": "1700000000000",
            "order": "ord-4111111111111111x",
            "short": "Bearer",
            "trailing": "4111 1111 1111 1111 22",
        },
    )
    assert event == {
        "event": "card ****4444 and ****1111",
        "SSN": REDACTED,
        "items": [{"cvv": REDACTED, "sku": "A"}, (f"bearer {REDACTED}", 7)],
        "api_key": REDACTED,
        "ts": "1700000000000",
        "order": "ord-4111111111111111x",
        "short": "Bearer",
        "trailing": "****1111 22",
    }


def test_redactor_masks_structures_too_deep_to_inspect() -> None:
    deep: dict[str, object] = {"sku": "A"}
    for _ in range(10):
        deep = {"next": deep}
    cycle: list[object] = ["x"]
    cycle.append(cycle)

    event = Redactor()(None, "info", {"deep": deep, "cycle": cycle})

    inner = event["deep"]
    for _ in range(7):
        inner = inner["next"]
    assert inner == {"next": REDACTED}
    assert event["cycle"][0] == "x"
    assert event["cycle"][1][1][1][1][1][1][1] == ["x", REDACTED]


def test_stdlib_records_come_out_as_json_with_context(stream: io.StringIO) -> None:
    tracer = TracerProvider().get_tracer("test")
    library = logging.getLogger("payments.client")

    with (
        bind_correlation(request_id="req-1", payment_reference="pay-7"),
        tracer.start_as_current_span("callback") as span,
    ):
        library.warning("callback for %s retried", "ord-9", extra={"password": "p"})
    library.debug("after")

    first, second = lines(stream)
    timestamp = first.pop("timestamp")
    assert TIMESTAMP.match(timestamp)
    assert first == {
        "event": "callback for ord-9 retried",
        "level": "warning",
        "logger": "payments.client",
        "request_id": "req-1",
        "payment_reference": "pay-7",
        "password": REDACTED,
        "trace_id": f"{span.get_span_context().trace_id:032x}",
        "span_id": f"{span.get_span_context().span_id:016x}",
        "trace_flags": f"{span.get_span_context().trace_flags:02x}",
    }
    assert (second["event"], second["level"], second["logger"]) == (
        "after",
        "debug",
        "payments.client",
    )
    assert "request_id" not in second


def test_exceptions_are_rendered_and_redacted(stream: io.StringIO) -> None:
    try:
        raise ValueError("gateway said Bearer sekrit.token")
    except ValueError:
        get_logger().exception("callback_failed")
        logging.getLogger("lib").exception("lib_failed")

    structlog_line, stdlib_line = lines(stream)
    for line in (structlog_line, stdlib_line):
        assert line["level"] == "error"
        assert "Traceback (most recent call last)" in line["exception"]
        assert "ValueError: gateway said Bearer [REDACTED]" in line["exception"]
        assert "sekrit" not in line["exception"]


def test_configure_twice_replaces_instead_of_stacking(restore_logging: None) -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=first)
    logging.getLogger("lib").info("once")
    assert [line["event"] for line in lines(first)] == ["once"]

    configure_logging(stream=second)
    logging.getLogger("lib").info("moved")
    get_logger().info("structlog_moved")
    assert [line["event"] for line in lines(first)] == ["once"]
    assert [line["event"] for line in lines(second)] == ["moved", "structlog_moved"]


def test_without_bridge_stdlib_is_left_alone(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    configure_logging(stream=out, bridge_stdlib=False)
    logging.getLogger("lib").warning("not ours")
    get_logger().warning("ours")
    assert [line["event"] for line in lines(out)] == ["ours"]


def test_level_filters_structlog_and_stdlib(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(logging.WARNING, stream=out)
    log = get_logger()
    log.info("dropped")
    logging.getLogger("lib").info("dropped too")
    log.warning("kept")
    logging.getLogger("lib").error("kept too")
    assert [line["event"] for line in lines(out)] == ["kept", "kept too"]


def test_unknown_level_is_rejected(restore_logging: None) -> None:
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        configure_logging("LOUD", stream=io.StringIO())


def test_a_level_of_the_wrong_type_fails_before_the_configuration_changes(
    restore_logging: None,
) -> None:
    configure_logging("INFO", stream=io.StringIO())
    handlers = list(logging.getLogger().handlers)
    with pytest.raises(AttributeError):
        configure_logging(None, stream=io.StringIO())  # type: ignore[arg-type]
    assert logging.getLogger().handlers == handlers


def test_console_renderer_for_humans(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("info", stream=out, json=False)
    with bind_correlation(request_id="req-1"):
        get_logger().info("stock_update", password="hunter2")  # noqa: S106  # fake secret
    text = out.getvalue()
    assert text.count("\n") == 1
    assert "stock_update" in text
    assert "request_id=req-1" in text
    assert f"password={REDACTED}" in text
    assert "hunter2" not in text
    assert "\x1b[" not in text  # no colours into a non-terminal


def test_new_request_id_is_uuid4_hex() -> None:
    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100
    for request_id in ids:
        assert re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", request_id)


def test_stdlib_extra_wins_over_bound_context_like_structlog_kwargs(stream: io.StringIO) -> None:
    with bind_correlation(sku="bound"):
        logging.getLogger("lib").info("stdlib", extra={"sku": "explicit"})
        get_logger().info("structlog", sku="explicit")
    assert [(line["event"], line["sku"]) for line in lines(stream)] == [
        ("stdlib", "explicit"),
        ("structlog", "explicit"),
    ]


def test_default_secret_words_match_inside_longer_keys() -> None:
    from stocksentry.instrumentation.logs import REDACTED, Redactor

    redact = Redactor()
    event = redact(
        None,
        "info",
        {
            "access_token": "t0k",
            "client_secret": "s3c",
            "X-Api-Key": "k3y",
            "headers": {"X-Api-Key": "k3y", "Set-Cookie": "c=1"},
            "idempotency_key": "key-1",
            "sku": "EGG-01",
        },
    )
    assert event["access_token"] == REDACTED
    assert event["client_secret"] == REDACTED
    assert event["X-Api-Key"] == REDACTED
    assert event["headers"] == {"X-Api-Key": REDACTED, "Set-Cookie": REDACTED}
    assert event["idempotency_key"] == "key-1"  # correlation IDs stay readable
    assert event["sku"] == "EGG-01"


def test_another_handlers_formatting_does_not_leak_into_the_json_line(
    restore_logging: None,
) -> None:
    """A handler that formatted the record first leaves ``message``/``asctime`` on it."""
    root = logging.getLogger()
    plain = logging.StreamHandler(io.StringIO())
    plain.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    root.addHandler(plain)
    try:
        out = io.StringIO()
        configure_logging("INFO", stream=out)
        logging.getLogger("lib").warning("retry %d", 2, extra={"order_id": "o-1"})
    finally:
        root.removeHandler(plain)
    (line,) = lines(out)
    line.pop("timestamp")
    assert line == {"event": "retry 2", "level": "warning", "logger": "lib", "order_id": "o-1"}


# --- the line's fields and its JSON: same bytes as the standard library's encoder ---------


def _renderer() -> Any:
    """The JSON renderer configure_logging chained (its last processor)."""
    return structlog.get_config()["processors"][-1]


def test_json_renderer_bytes_match_the_stdlib_encoder(stream: io.StringIO) -> None:
    class Odd:
        def __repr__(self) -> str:
            return "<odd>"

    reference = json.JSONEncoder(default=repr)
    render = _renderer()
    samples: list[dict[str, Any]] = [
        {"event": "stock_update", "sku": "EGG-01", "qty": 1, "success": True, "from": 3, "to": 2},
        {"event": "ünïcödé ✓", "emoji": "\U0001f95a", "ctrl": 'a\nb\t"c"\\', "none": None},
        {"floats": [0.1, 1e16, -0.0, 1.5e-300, float("nan"), float("inf")], "big": 2**70},
        {"nested": {"a": [1, (2, 3), {"b": None}]}, 5: "int key", "obj": Odd()},
        {},
    ]
    for event in samples:
        assert render(None, "info", dict(event)) == reference.encode(event)


def test_json_renderer_recovers_after_a_circular_value(stream: io.StringIO) -> None:
    render = _renderer()
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Circular"):
        render(None, "info", {"event": "x", "cycle": cycle})
    # The same list, now without its cycle, is no longer mistaken for one.
    cycle.clear()
    assert render(None, "info", {"event": "x", "cycle": cycle}) == '{"event": "x", "cycle": []}'


def test_line_fields_in_order_with_the_callers_own_kept(stream: io.StringIO) -> None:
    chain = structlog.get_config()["processors"][:-1]  # all but the renderer

    class Named:
        name = "checkout"

    def run(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        for processor in chain:
            event = processor(logger, method, event)
        return event

    got = run(Named(), "info", {"event": "a", "sku": "S"})
    assert list(got) == ["event", "sku", "level", "logger", "timestamp"]
    assert TIMESTAMP.match(got["timestamp"])
    assert run(None, "warn", {"event": "b"})["level"] == "warning"
    got = run(Named(), "exception", {"event": "c", "logger": "mine"})
    assert (got["level"], got["logger"]) == ("error", "mine")
    with TracerProvider().get_tracer("t").start_as_current_span("s"):
        got = run(Named(), "info", {"event": "d", "exc_info": False})
    assert list(got) == [
        "event",
        "level",
        "logger",
        "trace_id",
        "span_id",
        "trace_flags",
        "timestamp",
    ]
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        got = run(None, "error", {"event": "e", "exc_info": True})
    assert "exc_info" not in got
    assert "RuntimeError: boom" in got["exception"]


def test_redactor_masks_a_repeated_secret_every_time_and_keeps_no_values() -> None:
    redact = Redactor()
    card = "card 4111-1111-1111-1111"
    for _ in range(3):
        event = redact(None, "info", {"event": "stock_update", "note": card, "sku": "EGG-0001"})
        assert event == {"event": "stock_update", "note": "card ****1111", "sku": "EGG-0001"}
    # No memory of values, clean or not: many distinct ids grow nothing but the key cache.
    assert not hasattr(redact, "_clean")
    for i in range(10_000):
        note = f"clean value {i}"
        assert redact(None, "info", {"note": note})["note"] is note
    assert set(redact._sensitive) == {"event", "note", "sku"}
    assert redact(None, "info", {"note": card}) == {"note": "card ****1111"}


class _Odd:
    def __repr__(self) -> str:
        return "<odd>"


@pytest.mark.parametrize(
    "event",
    [
        {"event": "stock_update", "sku": "SKU-1", "qty": 1, "success": True, "to": -3},
        {"event": "x", "ratio": 0.1, "nan": float("nan"), "inf": float("-inf"), "none": None},
        {"event": "ünïcode ✓", "nested": {"a": [1, (2, 3)], "b": {"c": "d"}}, "empty": {}},
        {"event": "x", "odd": _Odd(), "set": {1}, "bytes": b"\x00", 7: "int key"},
    ],
)
def test_json_lines_render_as_json_dumps_would(stream: io.StringIO, event: dict[Any, Any]) -> None:
    assert _renderer()(None, "info", dict(event)) == json.dumps(event, default=repr)


def test_json_lines_refuse_a_cycle_as_json_does(stream: io.StringIO) -> None:
    # Redactor copies (and masks deep) structures first, so no cycle reaches the renderer
    # in a configured chain; called alone it fails as the checking encoder does.
    looped: dict[str, Any] = {"event": "x"}
    looped["self"] = looped
    with pytest.raises(ValueError, match="Circular reference"):
        _renderer()(None, "info", looped)
