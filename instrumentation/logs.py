"""Structured JSON logs with correlation ids, trace ids and redaction.

Every log line is one JSON object carrying the ids that let on-call follow a
double-sell across services: ``request_id``, ``idempotency_key``, ``sku``,
``product_id``, ``order_id``, ``payment_reference`` (bound through
:mod:`contextvars`, so asyncio tasks inherit them) plus ``trace_id`` and
``span_id`` of the active OpenTelemetry span.

Typical use in a checkout service::

    from stocksentry.instrumentation.logs import (
        bind_correlation,
        configure_logging,
        get_logger,
    )

    configure_logging("INFO")
    log = get_logger(__name__)

    with bind_correlation(request_id="r-1", sku="SKU-42"):
        log.info("stock_update", **{"from": 1, "to": 0})

This module imports only the standard library, structlog and
opentelemetry-api, so it is safe in the lightest install.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from contextvars import Token
from types import TracebackType
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

from .processors import (
    DEFAULT_REDACT_KEYS,
    REDACTED,
    Redactor,
    add_logger_name,
    add_timestamp,
    add_trace_context,
    drop_formatter_text,
)

__all__ = [
    "CORRELATION_KEYS",
    "DEFAULT_REDACT_KEYS",
    "REDACTED",
    "Redactor",
    "add_trace_context",
    "bind_correlation",
    "configure_logging",
    "get_correlation",
    "get_logger",
    "new_request_id",
    "sanitize_id",
]

CORRELATION_KEYS: tuple[str, ...] = (
    "request_id",
    "idempotency_key",
    "sku",
    "product_id",
    "order_id",
    "payment_reference",
)
"""Keys that identify one checkout across logs, spans and services.

Example::

    >>> "order_id" in CORRELATION_KEYS
    True
"""


class _LineWriter:
    """structlog's wrapped logger: writes one rendered line to the stream.

    It remembers the name given to ``get_logger(name)`` and shares its lock
    with the stdlib bridge handler, so lines from both never interleave.
    """

    __slots__ = ("_flush", "_lock", "_write", "name")

    def __init__(self, name: str | None, stream: TextIO, lock: threading.RLock) -> None:
        self.name = name
        self._write = stream.write
        self._flush = stream.flush
        self._lock = lock

    def msg(self, message: str) -> None:
        with self._lock:
            self._write(message + "\n")
            self._flush()

    log = debug = info = warn = warning = msg
    error = err = critical = fatal = exception = failure = msg


class _LineWriterFactory:
    __slots__ = ("_lock", "_stream")

    def __init__(self, stream: TextIO, lock: threading.RLock) -> None:
        self._stream = stream
        self._lock = lock

    def __call__(self, *args: Any) -> _LineWriter:
        name = args[0] if args and isinstance(args[0], str) else None
        return _LineWriter(name, self._stream, self._lock)


class _BridgeHandler(logging.StreamHandler[TextIO]):
    """Root handler rendering stdlib records through our processors.

    Its own class, so configure_logging can find and replace it.
    """


def _resolve_level(level: int | str) -> int:
    if isinstance(level, int):
        return level
    try:
        return logging.getLevelNamesMapping()[level.upper()]
    except KeyError:
        msg = f"unknown log level {level!r}"
        raise ValueError(msg) from None


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def configure_logging(
    level: int | str = "INFO",
    *,
    stream: TextIO | None = None,
    redact_keys: Iterable[str] = (),
    json: bool = True,
    bridge_stdlib: bool = True,
    logfmt: bool = False,
) -> None:
    """Configure structlog (and stdlib ``logging``) for JSON lines.

    Each line is one JSON object with ``event``, ``level``, ``timestamp``
    (ISO-8601 UTC, milliseconds), ``logger`` when known, every bound
    contextvar (see :func:`bind_correlation`), ``trace_id``/``span_id`` inside
    a span, with secrets masked by :class:`Redactor`. With *bridge_stdlib*,
    records from stdlib ``logging`` (libraries) come out the same way on the
    same stream. ``json=False`` renders for humans instead, or, with ``logfmt=True``,
    as logfmt ``key=value`` pairs (the same fields, ``timestamp level logger event``
    first), as the Prometheus exporters log.

    Calling it again replaces the previous configuration. Loggers are cached
    on first use, so create them (``get_logger``) after configuring.

    Example::

        configure_logging("DEBUG", redact_keys=["email"])
        get_logger("checkout").info("reserved", sku="SKU-1", order_id="o-9")
        # {"sku": "SKU-1", "order_id": "o-9", "event": "reserved",
        #  "level": "info", "logger": "checkout",
        #  "timestamp": "2025-01-31T12:00:00.123Z"}
    """
    numeric_level = _resolve_level(level)
    out: TextIO = stream if stream is not None else sys.stdout

    redactor = Redactor(redact_keys)
    renderer: Processor
    # Tracebacks become text before redaction, so secrets in them are masked.
    before_render: list[Processor] = [structlog.processors.format_exc_info, redactor]
    if json:
        renderer = structlog.processors.JSONRenderer(default=repr)
    elif logfmt:
        renderer = structlog.processors.LogfmtRenderer(
            key_order=["timestamp", "level", "logger", "event"], drop_missing=True
        )
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_is_tty(out))
        before_render = [redactor]
    line_fields: list[Processor] = [
        structlog.processors.add_log_level,
        add_logger_name,
        add_trace_context,
        add_timestamp,
    ]

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BridgeHandler)]:
        root.removeHandler(old)
        old.close()  # StreamHandler.close never closes the stream itself

    handler = _BridgeHandler(out)
    # structlog lines and stdlib lines share the handler's lock: no interleaving.
    shared_lock = handler.lock if handler.lock is not None else threading.RLock()

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *line_fields,
            *before_render,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        context_class=dict,
        logger_factory=_LineWriterFactory(out, shared_lock),
        cache_logger_on_first_use=True,
    )

    if not bridge_stdlib:
        handler.close()
        return

    # Extras first: like keyword arguments of a structlog call, they win over
    # bound contextvars (merge_contextvars only fills missing keys).
    foreign_pre_chain: Sequence[Processor] = (
        structlog.stdlib.ExtraAdder(),
        drop_formatter_text,
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,  # the record's name
        add_trace_context,
        add_timestamp,
    )
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=foreign_pre_chain,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                *before_render,
                renderer,
            ],
        )
    )
    root.addHandler(handler)
    root.setLevel(numeric_level)


class _CorrelationBinding(contextlib.AbstractContextManager[None]):
    __slots__ = ("_stack", "_values")

    def __init__(self, values: dict[str, object]) -> None:
        self._values = values
        # A stack, so one binding object can be entered again while active.
        self._stack: list[Mapping[str, Token[Any]]] = []

    def __enter__(self) -> None:
        self._stack.append(structlog.contextvars.bind_contextvars(**self._values))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        structlog.contextvars.reset_contextvars(**self._stack.pop())


def bind_correlation(**ids: object) -> contextlib.AbstractContextManager[None]:
    """Bind correlation ids to every log line inside the ``with`` block.

    ``None`` values are skipped. On exit the previous values (or absence) of
    exactly these keys are restored, so bindings nest. Works in sync and async
    code; tasks created inside the block (``asyncio.create_task``,
    ``asyncio.gather``) inherit the ids, concurrent tasks do not see each
    other's. Enter and exit in the same task or thread.

    Example::

        with bind_correlation(request_id="r-1", idempotency_key=None):
            with bind_correlation(sku="SKU-42", order_id="o-9"):
                log.info("reserved")  # request_id, sku and order_id
            log.info("done")  # request_id only
    """
    return _CorrelationBinding({k: v for k, v in ids.items() if v is not None})


def get_correlation() -> dict[str, object]:
    """Return the correlation ids bound now (only :data:`CORRELATION_KEYS`).

    Example::

        with bind_correlation(request_id="r-1", user="u"):
            assert get_correlation() == {"request_id": "r-1"}
    """
    bound = structlog.contextvars.get_contextvars()
    return {key: bound[key] for key in CORRELATION_KEYS if key in bound}


def get_logger(name: str = "stocksentry") -> Any:
    """Return a structlog logger; its lines carry ``"logger": name``.

    Example::

        log = get_logger(__name__)
        log.warning("lost_race", sku="SKU-42")
    """
    return structlog.get_logger(name)


def new_request_id() -> str:
    """Return a fresh request id (32 lowercase hex characters, UUID4).

    Example::

        >>> len(new_request_id())
        32
    """
    return uuid.uuid4().hex


_SAFE_ID = re.compile(r"[\x20-\x7e]{1,128}")


def sanitize_id(value: str | None) -> str | None:
    """Return *value* if it is a safe id from a request header, else ``None``.

    Safe means 1 to 128 printable ASCII characters: an id that could break a
    log line, forge a field or blow up storage is dropped, not logged.

    Example::

        >>> sanitize_id("req-123")
        'req-123'
        >>> sanitize_id("evil\\nlevel=error") is None
        True
    """
    # The length first: a hostile header of megabytes is refused without a scan.
    if value is None or len(value) > 128 or _SAFE_ID.fullmatch(value) is None:
        return None
    return value
