"""The structlog processors of stocksentry's log lines: redaction, trace ids, timestamps.

Each has structlog's processor contract, ``(logger, method_name, event_dict) ->
event_dict``, with its work decided when it is built; :func:`.logs.configure_logging`
chains them. What counts as a secret is :mod:`.secrets`' decision, not theirs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from opentelemetry import trace
from structlog.typing import EventDict, WrappedLogger

from .secrets import MIN_SENSITIVE_LEN, REDACTED, SECRET_WORDS, is_secret_key, scrub_text
from .tracing import trace_fields

__all__ = [
    "DEFAULT_REDACT_KEYS",
    "REDACTED",
    "Redactor",
    "add_logger_name",
    "add_timestamp",
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
                if len(value) >= MIN_SENSITIVE_LEN and key not in _TRUSTED_KEYS:
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


def add_trace_context(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Processor adding ``trace_id``, ``span_id`` and ``trace_flags`` of the current span.

    As in W3C ``traceparent``: ids in lowercase hex (32 and 16 characters), the flags as
    two hex digits (``"01"``: sampled), the fields of OpenTelemetry's log data model.
    Nothing is added outside a valid span, and keys the caller already set are kept.

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
    """Processor adding ``logger``: the wrapped logger's ``name``, unless the caller set one.

    (structlog's own ``add_logger_name`` overwrites the caller's key and needs a stdlib
    logger.)
    """
    name = getattr(logger, "name", None)
    if name is not None:
        event_dict.setdefault("logger", name)
    return event_dict


def add_timestamp(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Processor adding ``timestamp``: ISO-8601 UTC with milliseconds, e.g.
    ``2025-01-31T12:00:00.123Z`` (structlog's ``TimeStamper`` has no millisecond format)."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    event_dict["timestamp"] = now.replace("+00:00", "Z")
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
