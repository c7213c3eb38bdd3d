"""The structlog processors of stocksentry's log lines: redaction, trace ids, timestamps.

Each has structlog's processor contract, ``(logger, method_name, event_dict) ->
event_dict``, with its work decided when it is built; :func:`.logs.configure_logging`
chains them. What counts as a secret is :mod:`.secrets`' decision, not theirs.
"""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from structlog.contextvars import STRUCTLOG_KEY_PREFIX
from structlog.processors import format_exc_info
from structlog.typing import EventDict, Processor, WrappedLogger

from .events import EVENTS
from .secrets import MIN_SENSITIVE_LEN, REDACTED, SECRET_WORDS, is_secret_key, scrub_text
from .tracing import CONTEXT_VAR, trace_fields

try:  # CPython's C encoder; without it the pure-Python encoder renders every line
    from _json import make_encoder as _c_make_encoder
except ImportError:  # pragma: no cover - other interpreters
    _c_make_encoder = None  # type: ignore[assignment,misc]  # absent on other interpreters
c_make_encoder: Any = _c_make_encoder

__all__ = [
    "DEFAULT_REDACT_KEYS",
    "REDACTED",
    "Redactor",
    "add_trace_context",
    "drop_formatter_text",
]

DEFAULT_REDACT_KEYS: frozenset[str] = SECRET_WORDS
"""Keys (compared case-insensitively) whose values :class:`Redactor` always masks; the
words of :data:`stocksentry.instrumentation.secrets.SECRET_WORDS`.

Example::

    >>> "cvv" in DEFAULT_REDACT_KEYS
    True
"""

# Keys written by our own processors: their values are never sensitive, and
# skipping them keeps a hex trace id from ever being mistaken for digits.
_TRUSTED_KEYS = frozenset({"timestamp", "level", "logger", "trace_id", "span_id", "trace_flags"})

_MAX_NESTING = 8
_KEY_CACHE_LIMIT = 4096
# Longest key cached (in characters): with the entry limit, the cache holds at most
# 4096 x 128 characters whatever keys the data brings.
_KEY_CACHE_MAX_LENGTH = 128
# The names of the project's own log events: constants, never a secret, so a line's
# "event" among them skips the text scan (the one string of every line long enough to
# be scanned).
_OWN_EVENT_NAMES: frozenset[str] = frozenset(event.name for event in EVENTS)
# Values that cannot hold a secret as text: skipped without further checks.
_PLAIN_SCALARS: frozenset[type] = frozenset({int, float, bool, type(None)})


class Redactor:
    """Processor that masks secrets and card numbers before rendering.

    Values whose key is sensitive (case-insensitively one of
    :data:`DEFAULT_REDACT_KEYS` or *keys*; the defaults also inside a longer key such as
    ``access_token`` or ``X-Api-Key``) become ``"[REDACTED]"``, also in
    nested dicts, lists and tuples (copied, never mutated in place). Inside any
    string value, Luhn-valid card numbers keep only their last four digits and
    ``Bearer <token>`` loses the token. Non-string leaves are left alone.

    Example::

        >>> redact = Redactor(keys=["email"])
        >>> redact(None, "info", {"Email": "a@b.c", "note": "card 4111-1111-1111-1111"})
        {'Email': '[REDACTED]', 'note': 'card ****1111'}
    """

    __slots__ = ("_keys", "_sensitive")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        # The configured keys only: the default words are is_secret_key's to match.
        self._keys = frozenset(key.lower() for key in keys)
        # Key -> is it sensitive; log keys are a small set of code constants, so the
        # lower() and set lookup run once per key instead of once per line.
        self._sensitive: dict[str, bool] = {}

    def __call__(
        self, logger: WrappedLogger, method_name: str, event_dict: EventDict
    ) -> EventDict:
        sensitive = self._sensitive
        # Assigning to existing keys while iterating is safe: the size of the
        # dict does not change.
        for key, value in event_dict.items():
            is_sensitive = sensitive.get(key)
            if is_sensitive is None:
                is_sensitive = self._classify(key)
            if is_sensitive:
                event_dict[key] = REDACTED
                continue
            kind = type(value)
            if kind is str:
                # The length check first: most values are short ids, skipped without a call.
                if (
                    len(value) >= MIN_SENSITIVE_LEN
                    and key not in _TRUSTED_KEYS
                    and value not in _OWN_EVENT_NAMES
                ):
                    # re.sub hands back the very string when nothing matched: no store.
                    scrubbed = scrub_text(value)
                    if scrubbed is not value:
                        event_dict[key] = scrubbed
            elif kind in _PLAIN_SCALARS:
                continue
            elif isinstance(value, str):  # a str subclass
                event_dict[key] = scrub_text(value)
            elif isinstance(value, (dict, list, tuple)):
                event_dict[key] = self._redact_value(value, 1)
        return event_dict

    def masks(self, key: str) -> bool:
        """Whether this redactor masks the value of ``key`` (a configured or default key)."""
        is_sensitive = self._sensitive.get(key)
        return self._classify(key) if is_sensitive is None else is_sensitive

    def _classify(self, key: object) -> bool:
        lowered = key.lower() if isinstance(key, str) else ""
        # Configured keys match exactly; the default words also match inside a key
        # (access_token, client_secret, x-api-key), as secrets come with prefixes.
        is_sensitive = bool(lowered) and (lowered in self._keys or is_secret_key(lowered))
        # Bounded: keys built from data (not code) must not grow the cache without limit.
        if (
            isinstance(key, str)
            and len(key) <= _KEY_CACHE_MAX_LENGTH
            and len(self._sensitive) < _KEY_CACHE_LIMIT
        ):
            self._sensitive[key] = is_sensitive
        return is_sensitive

    def _redact_value(self, value: object, depth: int) -> object:
        if isinstance(value, str):
            return scrub_text(value)
        if depth > _MAX_NESTING:
            # Too deep to inspect cheaply (or a cycle): mask rather than leak.
            return REDACTED if isinstance(value, (dict, list, tuple)) else value
        if isinstance(value, dict):
            sensitive = self._sensitive
            return {
                k: (
                    REDACTED
                    if (sensitive.get(k) if isinstance(k, str) else None) or self._classify(k)
                    else self._redact_value(v, depth + 1)
                )
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            items = [self._redact_value(v, depth + 1) for v in value]
            return items if isinstance(value, list) else tuple(items)
        return value


class _JsonLines:
    """JSON renderer with its encoder built once.

    ``json.dumps`` (and ``JSONEncoder.encode``) builds a new C encoder on every call, with a
    fresh dict for its circular-reference check. This one builds the C encoder once,
    without that check: nothing mutable is left in it, so threads can share it, and no
    cycle can reach it, as :class:`Redactor` runs first and copies every dict, list and
    tuple it is given, down to a depth after which it masks. A line it still cannot encode
    goes through the checking encoder, which says why in the usual way.
    """

    __slots__ = ("_checked", "_fast")

    def __init__(self) -> None:
        checked = json.JSONEncoder(default=_json_default)
        self._checked = checked.encode
        self._fast = (
            None
            if c_make_encoder is None
            else c_make_encoder(
                None,  # no circular check
                _json_default,
                encode_basestring_ascii,
                None,  # no indent
                checked.key_separator,
                checked.item_separator,
                False,  # sort_keys
                False,  # skipkeys
                True,  # allow_nan, as json.dumps
            )
        )

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        fast = self._fast
        if fast is not None:
            try:
                return "".join(fast(event_dict, 0))
            except (RecursionError, ValueError, TypeError):
                pass
        return self._checked(event_dict)


def _json_default(value: object) -> object:
    # Same spirit as structlog's JSONRenderer fallback: never fail a line on a value.
    return repr(value)


def add_trace_context(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Processor adding ``trace_id``, ``span_id`` and ``trace_flags`` of the current span.

    As in W3C ``traceparent``: ids in lowercase hex (32 and 16 characters), the flags as
    two hex digits (``"01"``: sampled), the fields of OpenTelemetry's log data model.
    Nothing is added outside a valid span, and keys the caller already set are kept.

    Example::

        >>> add_trace_context(None, "info", {"event": "x"})  # no active span
        {'event': 'x'}
    """
    global _last_trace
    # The current OpenTelemetry context decides the ids, and it is immutable: the same
    # context object as the last line's (the reservation's lines all run in it) has the
    # same ids, so the span lookup and its checks run once per context, not once per line.
    # One tuple, swapped whole: threads never see a torn pair (a race only looks twice).
    # It keeps the last context (and its span) alive until a line in another context.
    var = CONTEXT_VAR
    context = var.get() if var is not None else otel_context.get_current()
    last = _last_trace
    if last[0] is context:
        fields = last[1]
    else:
        span_context = trace.get_current_span(context).get_span_context()
        fields = trace_fields(span_context) if span_context.is_valid else None
        _last_trace = (context, fields)
    if fields is not None:
        trace_id, span_id, flags = fields
        if "trace_id" not in event_dict:
            event_dict["trace_id"] = trace_id
        if "span_id" not in event_dict:
            event_dict["span_id"] = span_id
        if "trace_flags" not in event_dict:
            event_dict["trace_flags"] = flags
    return event_dict


_last_trace: tuple[object, tuple[str, str, str] | None] = (None, None)


class _ContextvarsMerger:
    """structlog's ``merge_contextvars``, with what each context variable is learnt once.

    The same keys, values and order (``setdefault``: the call's own keys win): structlog
    keeps every bound key in a ``ContextVar`` named with its prefix, and this walks the
    current context once, where structlog's looks each variable up twice and tests and
    cuts its name on every line. Which variables are structlog's (and under what key) is
    remembered for the first :data:`_CONTEXTVARS_KNOWN` variables seen; later ones are
    worked out each time, so variables made at run time cannot grow the memo.
    """

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: dict[contextvars.ContextVar[Any], str | None] = {}

    def __call__(
        self, logger: WrappedLogger, method_name: str, event_dict: EventDict
    ) -> EventDict:
        keys = self._keys
        for var, value in contextvars.copy_context().items():
            if value is Ellipsis:  # unbound: structlog sets Ellipsis rather than deleting
                continue
            key = keys.get(var, _UNSEEN)
            if key is _UNSEEN:
                key = self._learn(var)
            if key is not None:
                event_dict.setdefault(key, value)
        return event_dict

    def _learn(self, var: contextvars.ContextVar[Any]) -> str | None:
        name = var.name
        key = name[_PREFIX_LEN:] if name.startswith(STRUCTLOG_KEY_PREFIX) else None
        if len(self._keys) < _CONTEXTVARS_KNOWN:
            self._keys[var] = key
        return key


_UNSEEN: Any = object()
_PREFIX_LEN = len(STRUCTLOG_KEY_PREFIX)
_CONTEXTVARS_KNOWN = 1024


class _UtcMillisTimestamper:
    """``timestamp`` as ISO-8601 UTC with milliseconds, e.g. 2025-01-31T12:00:00.123Z.

    The date-and-seconds prefix changes once a second, so it is cached.
    """

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: tuple[int, str] = (-1, "")

    def __call__(
        self, logger: WrappedLogger, method_name: str, event_dict: EventDict
    ) -> EventDict:
        seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
        cached_seconds, prefix = self._cache
        if seconds != cached_seconds:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            # One tuple assignment, so concurrent threads never see a torn pair.
            self._cache = (seconds, prefix)
        event_dict["timestamp"] = f"{prefix}.{nanos // 1_000_000:03d}Z"
        return event_dict


#: The keys :class:`_LineFields` writes (``exception`` aside): never the caller's secrets.
LINE_FIELD_KEYS: tuple[str, ...] = (
    "level",
    "logger",
    "trace_id",
    "span_id",
    "trace_flags",
    "timestamp",
)


class _LineFields:
    """``level``, ``logger``, ``trace_id``/``span_id``, ``timestamp`` (and, with
    ``render_exc_info``, ``exception``) in one processor.

    The same keys, values and order as ``add_log_level``, the wrapped logger's ``name``
    (set if absent), :func:`add_trace_context`, :class:`_UtcMillisTimestamper` and
    ``format_exc_info`` chained, for one call per line instead of five.

    With ``redactor``, the same line as those followed by ``redactor``, with the redactor
    run first, on the caller's fields only: the fields added here are the redactor's
    trusted keys, which it would skip one by one on every line (pass a redactor only if
    it masks none of :data:`LINE_FIELD_KEYS`). A rendered traceback is text from the
    caller's world: the redactor runs again over a line that has one.
    """

    __slots__ = ("_exc_info", "_redact", "_timestamp")

    def __init__(
        self,
        timestamper: _UtcMillisTimestamper,
        *,
        render_exc_info: bool,
        redactor: Redactor | None = None,
    ) -> None:
        self._timestamp = timestamper
        self._exc_info: Processor | None = format_exc_info if render_exc_info else None
        self._redact = redactor

    def __call__(
        self, logger: WrappedLogger, method_name: str, event_dict: EventDict
    ) -> EventDict:
        redact = self._redact
        if redact is not None:
            event_dict = redact(logger, method_name, event_dict)
        # structlog's add_log_level mapping: "warn" is the stdlib's alias, "exception" an
        # error with its traceback.
        event_dict["level"] = (
            "warning"
            if method_name == "warn"
            else "error"
            if method_name == "exception"
            else method_name
        )
        name = getattr(logger, "name", None)
        if name is not None:
            event_dict.setdefault("logger", name)
        event_dict = add_trace_context(logger, method_name, event_dict)
        event_dict = self._timestamp(logger, method_name, event_dict)
        render = self._exc_info
        if render is not None and "exc_info" in event_dict:
            # ExceptionRenderer does nothing else without an exc_info key.
            result: EventDict = render(logger, method_name, event_dict)  # type: ignore[assignment]  # a processor returns the event dict here
            if redact is not None:
                # The traceback's text, masked as if the redactor had run after it (a
                # second pass leaves what the first masked as it is).
                result = redact(logger, method_name, result)
            return result
        return event_dict


def drop_formatter_text(
    logger: WrappedLogger, method_name: str, event_dict: EventDict
) -> EventDict:
    """Drop ``message`` and ``asctime``: what another handler's ``Formatter`` left on a
    stdlib record it saw first, copied by ``ExtraAdder`` as if it were an ``extra``.

    ``logging`` refuses both names in ``extra=``, so they are never the caller's.

    Example::

        >>> drop_formatter_text(None, "info", {"event": "x", "message": "x", "asctime": "t"})
        {'event': 'x'}
    """
    event_dict.pop("message", None)
    event_dict.pop("asctime", None)
    return event_dict
