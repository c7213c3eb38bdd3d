"""Structured JSON logs with correlation ids, trace ids and redaction.

Every line is one JSON object carrying the ids that follow a double-sell across services
(:data:`CORRELATION_KEYS`, bound through :mod:`contextvars`, so asyncio tasks inherit
them) and the ``trace_id``/``span_id`` of the active OpenTelemetry span::

    configure_logging("INFO")
    with bind_correlation(request_id="r-1", sku="SKU-42"):
        get_logger(__name__).info("stock_update", **{"from": 1, "to": 0})
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, TextIO

import structlog
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from structlog.typing import EventDict, Processor, WrappedLogger

from .secrets import REDACTED, SECRET_WORDS, is_secret_key, scrub_text
from .tracing import trace_fields

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
    "promslog_keys",
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
"""Keys that identify one checkout across logs, spans and services."""


DEFAULT_REDACT_KEYS: frozenset[str] = SECRET_WORDS
"""Keys (compared case-insensitively) whose values :class:`Redactor` always masks; the
words of :data:`stocksentry.instrumentation.secrets.SECRET_WORDS`."""


# --- the processors (structlog's contract: (logger, method_name, event_dict) -> event_dict)

# Keys written by our own processors: their values are never sensitive, and
# skipping them keeps a hex trace id from ever being mistaken for digits.
_TRUSTED_KEYS = frozenset({"timestamp", "level", "logger", "trace_id", "span_id", "trace_flags"})

_MAX_NESTING = 8
_KEY_CACHE_LIMIT = 4096
# Longest key cached (in characters): with the entry limit, the cache holds at most
# 4096 x 128 characters whatever keys the data brings.
_KEY_CACHE_MAX_LENGTH = 128


class Redactor:
    """Processor that masks secrets and card numbers before rendering.

    Values whose key is sensitive (case-insensitively one of *keys*, or containing one of
    :data:`DEFAULT_REDACT_KEYS`: ``access_token``, ``X-Api-Key``) become
    ``"[REDACTED]"``, also in nested dicts, lists and tuples (copied, never mutated in
    place). Inside string values, :func:`~.secrets.scrub_text` masks card numbers and
    bearer tokens.

    Example::

        >>> redact = Redactor(keys=["email"])
        >>> redact(None, "info", {"Email": "a@b.c", "note": "card 4111-1111-1111-1111"})
        {'Email': '[REDACTED]', 'note': 'card ****1111'}
    """

    __slots__ = ("_keys", "_sensitive")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        # The configured keys only: the default words are is_secret_key's to match.
        self._keys = frozenset(key.lower() for key in keys)
        # Key -> is it sensitive: log keys are a small set of code constants.
        self._sensitive: dict[str, bool] = {}

    def __call__(
        self, logger: WrappedLogger, method_name: str, event_dict: EventDict
    ) -> EventDict:
        sensitive = self._sensitive
        # Assigning to existing keys while iterating is safe: the dict's size does not change.
        for key, value in event_dict.items():
            masked = sensitive.get(key)
            if masked or (masked is None and self.masks(key)):
                event_dict[key] = REDACTED
            elif type(value) is str:
                if key not in _TRUSTED_KEYS:
                    event_dict[key] = scrub_text(value)
            elif isinstance(value, (str, dict, list, tuple)):
                event_dict[key] = self._redact_value(value, 1)
        return event_dict

    def masks(self, key: object) -> bool:
        """Whether this redactor masks the value of ``key`` (a configured or default key)."""
        if not isinstance(key, str):
            return False
        is_sensitive = self._sensitive.get(key)
        if is_sensitive is None:
            lowered = key.lower()
            # Configured keys match exactly; the default words also match inside a key
            # (access_token, client_secret, x-api-key), as secrets come with prefixes.
            is_sensitive = bool(lowered) and (lowered in self._keys or is_secret_key(lowered))
            # Bounded: keys built from data (not code) must not grow the cache without limit.
            if len(key) <= _KEY_CACHE_MAX_LENGTH and len(self._sensitive) < _KEY_CACHE_LIMIT:
                self._sensitive[key] = is_sensitive
        return is_sensitive

    def _redact_value(self, value: object, depth: int) -> object:
        if isinstance(value, str):
            return scrub_text(value)
        if depth > _MAX_NESTING:
            # Too deep to inspect cheaply (or a cycle): mask rather than leak.
            return REDACTED if isinstance(value, (dict, list, tuple)) else value
        if isinstance(value, dict):
            return {
                k: REDACTED if self.masks(k) else self._redact_value(v, depth + 1)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            items = [self._redact_value(v, depth + 1) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value


def add_trace_context(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Processor adding ``trace_id``, ``span_id`` and ``trace_flags`` of the current span
    (:func:`~.tracing.trace_fields`); nothing outside a valid span, and keys the caller
    already set are kept.

    Example::

        >>> add_trace_context(None, "info", {"event": "x"})  # no active span
        {'event': 'x'}
    """
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        trace_id, span_id, flags = trace_fields(span_context)
        event_dict.setdefault("trace_id", trace_id)
        event_dict.setdefault("span_id", span_id)
        event_dict.setdefault("trace_flags", flags)
    return event_dict


def add_logger_name(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Processor adding ``logger``: the wrapped logger's ``name``, unless the caller set one
    (structlog's own overwrites it and needs a stdlib logger)."""
    name = getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


# The last whole second formatted, and its text: lines come many to a second, and
# formatting the date once a second instead of once a line is most of a line's timestamp.
# One tuple, replaced whole, so threads never see a second with another second's text.
_second_text: tuple[int, str] = (-1, "")


def add_timestamp(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Processor adding ``timestamp``: ISO-8601 UTC with milliseconds, e.g.
    ``2025-01-31T12:00:00.123Z`` (structlog's ``TimeStamper`` has no millisecond format)."""
    global _second_text
    millis = time.time_ns() // 1_000_000
    second, text = _second_text
    if millis // 1000 != second:
        second = millis // 1000
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        _second_text = (second, text)
    event_dict["timestamp"] = f"{text}.{millis % 1000:03d}Z"
    return event_dict


def drop_formatter_text(
    logger: WrappedLogger, method_name: str, event_dict: EventDict
) -> EventDict:
    """Drop ``message`` and ``asctime``: what another handler's ``Formatter`` left on a
    stdlib record it saw first, copied by ``ExtraAdder`` as if it were an ``extra``
    (``logging`` refuses both names in ``extra=``, so they are never the caller's)."""
    event_dict.pop("message", None)
    event_dict.pop("asctime", None)
    return event_dict


# --- set-up -------------------------------------------------------------------------------


class _LineWriter:
    """structlog's wrapped logger: one rendered line to the stream, under the lock of the
    stdlib bridge handler (no interleaving); ``name`` is ``get_logger(name)``'s."""

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


class _BridgeHandler(logging.StreamHandler[TextIO]):
    """Root handler rendering stdlib records through our processors (its own class, so
    configure_logging can find and replace it)."""


def _line_fields(logger_name: Processor) -> list[Processor]:
    """The fields every line gets, in their order; ``logger_name`` adds ``logger``."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        logger_name,
        add_trace_context,
        add_timestamp,
    ]


#: promslog's level names (Go's slog) where they are not ours in upper case: the logfmt
#: lines read like the exporters' own.
_PROMSLOG_LEVELS: Final = {
    "warning": "WARN",
    "warn": "WARN",
    "critical": "ERROR",
    "exception": "ERROR",
}
#: Where a line was logged from, for promslog's ``source=file:line``.
_CALLSITE: Final = structlog.processors.CallsiteParameterAdder(
    [
        structlog.processors.CallsiteParameter.FILENAME,
        structlog.processors.CallsiteParameter.LINENO,
    ]
)


def promslog_keys(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """Rename a line's fields as promslog writes logfmt: ``time``, ``level`` (``INFO``,
    ``WARN`` ...), ``source`` (``file.py:42``) and ``msg``; the other fields follow."""
    if "timestamp" in event_dict:
        event_dict["time"] = event_dict.pop("timestamp")
    level = event_dict.get("level")
    if isinstance(level, str):
        event_dict["level"] = _PROMSLOG_LEVELS.get(level, level.upper())
    filename, lineno = event_dict.pop("filename", None), event_dict.pop("lineno", None)
    if filename is not None:
        event_dict["source"] = f"{filename}:{lineno}"
    if "event" in event_dict:
        event_dict["msg"] = event_dict.pop("event")
    return event_dict


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

    Each line is one JSON object with ``event``, ``level``, ``timestamp`` (ISO-8601 UTC,
    milliseconds), ``logger`` when known, every bound contextvar (:func:`bind_correlation`)
    and ``trace_id``/``span_id`` inside a span, secrets masked by :class:`Redactor`. With
    *bridge_stdlib*, stdlib ``logging`` records come out the same way on the same stream.
    ``json=False`` renders for humans, or with ``logfmt=True`` as logfmt with promslog's
    keys first (:func:`promslog_keys`). Calling it again replaces the configuration;
    loggers are cached on first use, so create them after configuring.

    Example::

        configure_logging("DEBUG", redact_keys=["email"])
        get_logger("checkout").info("reserved", sku="SKU-1", order_id="o-9")
        # {"sku": "SKU-1", "order_id": "o-9", "event": "reserved",
        #  "level": "info", "logger": "checkout",
        #  "timestamp": "2025-01-31T12:00:00.123Z"}
    """
    # Anything but an int is read as a name here, so a bad level fails before the previous
    # configuration is taken down.
    if not isinstance(level, int):
        try:
            level = logging.getLevelNamesMapping()[level.upper()]
        except KeyError:
            raise ValueError(f"unknown log level {level!r}") from None
    out: TextIO = stream if stream is not None else sys.stdout

    redactor = Redactor(redact_keys)
    renderer: Processor
    # Tracebacks become text before redaction, so secrets in them are masked.
    before_render: list[Processor] = [structlog.processors.format_exc_info, redactor]
    if json:
        renderer = structlog.processors.JSONRenderer(default=repr)
    elif logfmt:
        renderer = structlog.processors.LogfmtRenderer(
            key_order=["time", "level", "source", "msg"], drop_missing=True
        )
        before_render.append(promslog_keys)
    else:
        try:
            colors = out.isatty()
        except (AttributeError, ValueError):  # no isatty(), or a closed stream
            colors = False
        renderer = structlog.dev.ConsoleRenderer(colors=colors)
        before_render = [redactor]
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BridgeHandler)]:
        root.removeHandler(old)
        old.close()  # StreamHandler.close never closes the stream itself

    handler = _BridgeHandler(out)
    # structlog lines and stdlib lines share the handler's lock: no interleaving.
    shared_lock = handler.lock if handler.lock is not None else threading.RLock()

    # The call site is read while the stdlib record is still at hand (pre-chain).
    callsite: list[Processor] = [_CALLSITE] if logfmt and not json else []
    structlog.configure(
        processors=[*_line_fields(add_logger_name), *callsite, *before_render, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        context_class=dict,
        # get_logger(name)'s name, kept on the line writer for the ``logger`` field.
        logger_factory=lambda *args: _LineWriter(
            args[0] if args and isinstance(args[0], str) else None, out, shared_lock
        ),
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
        *_line_fields(structlog.stdlib.add_logger_name),  # the record's name
        *callsite,
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
    root.setLevel(level)


def bind_correlation(**ids: object) -> contextlib.AbstractContextManager[None]:
    """Bind correlation ids (``None`` values skipped) to every log line inside the ``with``
    block; structlog's ``bound_contextvars``, so bindings nest and tasks created inside
    inherit them.

    Example::

        with bind_correlation(request_id="r-1", idempotency_key=None):
            with bind_correlation(sku="SKU-42", order_id="o-9"):
                log.info("reserved")  # request_id, sku and order_id
            log.info("done")  # request_id only
    """
    values = {key: value for key, value in ids.items() if value is not None}
    return structlog.contextvars.bound_contextvars(**values)


@contextlib.contextmanager
def request_correlation(
    headers: Mapping[str, str], header: str, idempotency_header: str
) -> Iterator[str]:
    """One HTTP request's correlation, for the middlewares: ``request_id`` (the ``header``
    value when :func:`sanitize_id` accepts it, else a new one) and ``idempotency_key``
    bound, and the caller's W3C ``traceparent``/``tracestate`` context current unless a
    span already is (an earlier server instrumentation's). Yields the request id."""
    request_id = sanitize_id(headers.get(header)) or new_request_id()
    idempotency_key = sanitize_id(headers.get(idempotency_header))
    token = None
    if not trace.get_current_span().get_span_context().is_valid:
        token = otel_context.attach(propagate.extract(headers))
    try:
        with bind_correlation(request_id=request_id, idempotency_key=idempotency_key):
            yield request_id
    finally:
        if token is not None:
            otel_context.detach(token)


def get_correlation() -> dict[str, object]:
    """Return the correlation ids bound now (only :data:`CORRELATION_KEYS`)."""
    bound = structlog.contextvars.get_contextvars()
    return {key: bound[key] for key in CORRELATION_KEYS if key in bound}


def get_logger(name: str = "stocksentry") -> Any:
    """Return a structlog logger; its lines carry ``"logger": name``."""
    return structlog.get_logger(name)


def new_request_id() -> str:
    """Return a fresh request id (32 lowercase hex characters, UUID4)."""
    return uuid.uuid4().hex


_SAFE_ID = re.compile(r"[\x20-\x7e]{1,128}")


def sanitize_id(value: str | None) -> str | None:
    """Return *value* if it is a safe id from a request header (1 to 128 printable ASCII
    characters: nothing that could break a log line or blow up storage), else ``None``.

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
