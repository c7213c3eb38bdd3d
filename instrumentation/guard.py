"""Cardinality guard: bounded, sanitised label values.

A flash sale can carry thousands of SKUs and a hostile client can send any string as one:
every ``sku`` label value goes through a :class:`LabelGuard`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable

from .catalog import OVERFLOW_VALUE

#: Characters kept as they are; anything else (control characters, quotes, spaces, markup,
#: lone surrogates that would break the UTF-8 exposition) becomes ``_``.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@#+\-]")
EMPTY_VALUE = "__empty__"
#: The longest raw value kept as a cache key (here and in the metrics' children caches): a
#: longer one is sanitised at every call, so hostile 256 kB SKUs do not stay alive as keys.
MAX_CACHED_KEY_LENGTH = 256
#: The characters of raw keys one cache may hold in all (at most 4 MiB), however many
#: entries its limit allows.
CACHE_CHAR_BUDGET = 1 << 20


def sanitize_label_value(value: object, max_length: int = 64) -> str:
    """Return ``value`` as a label value safe for any Prometheus consumer.

    Characters outside ``[A-Za-z0-9_.:/@#+-]`` become ``_`` and the result is cut to
    ``max_length`` characters; an empty value becomes ``__empty__`` (cut to
    ``max_length`` too, so the result is always within it and sanitising it again gives
    it back).
    """
    text = value if isinstance(value, str) else str(value)
    # Cut before the substitution: the regex then never scans more than max_length
    # characters, however long the input.
    text = _UNSAFE.sub("_", text[:max_length])
    return text or EMPTY_VALUE[:max_length]


class LabelGuard:
    """Bounds the distinct values of one label.

    ``guard(value)`` returns the value to use as the label: sanitised, ``always`` values
    kept, and at most ``max_values`` others admitted (first come, first kept: a counter's
    series cannot be evicted without losing its count); past them
    :data:`OVERFLOW_VALUE`. Thread-safe; a value seen before costs one dict lookup.
    """

    def __init__(
        self,
        max_values: int = 100,
        *,
        always: Iterable[str] = (),
        max_length: int = 64,
    ) -> None:
        if max_values < 0:
            raise ValueError(f"max_values must be >= 0, got {max_values}")
        # The guard's own labels (__other__, __empty__) must fit, or an overflowed series
        # could not be told from a real value cut short.
        if max_length < len(OVERFLOW_VALUE):
            raise ValueError(
                f"max_length must be >= {len(OVERFLOW_VALUE)} (the length of"
                f" {OVERFLOW_VALUE!r}), got {max_length}"
            )
        self.max_values = max_values
        self.max_length = max_length
        self._lock = threading.Lock()
        pinned = {sanitize_label_value(v, max_length) for v in always}
        # Values that always keep their own series, plus those admitted so far; the budget
        # counts only the latter.
        self._admitted: set[str] = set(pinned)
        self._count = 0
        # Raw value -> label value. Bounded in entries and, through MAX_CACHED_KEY_LENGTH,
        # in bytes, so hostile input cannot grow memory without limit; past the bound,
        # lookups take the slow path but stay correct.
        self._cache: dict[str, str] = {}
        self._cache_limit = 4 * (max_values + len(pinned)) + 1024
        self._cache_chars = 0

    def __call__(self, value: str) -> str:
        label = self._cache.get(value)
        if label is not None:
            return label
        clean = sanitize_label_value(value, self.max_length)
        with self._lock:
            if clean in self._admitted:
                label = clean
            elif self._count < self.max_values:
                self._admitted.add(clean)
                self._count += 1
                label = clean
            else:
                label = OVERFLOW_VALUE
            if (
                isinstance(value, str)
                and len(value) <= MAX_CACHED_KEY_LENGTH
                and len(self._cache) < self._cache_limit
                and self._cache_chars + len(value) <= CACHE_CHAR_BUDGET
            ):
                self._cache[value] = label
                self._cache_chars += len(value)
        return label

    @property
    def admitted_count(self) -> int:
        """How many values beyond the pinned ones hold their own series."""
        return self._count

    def values(self) -> frozenset[str]:
        """Every label value that has its own series (pinned and admitted)."""
        with self._lock:
            return frozenset(self._admitted)
