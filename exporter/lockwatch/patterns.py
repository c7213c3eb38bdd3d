"""Lock key patterns: which keys are watched, their subscription glob, their ``lock`` label.

A pattern is literal text with ``*`` (any text) and at most one ``{sku}`` (the SKU, which
goes through the SKU guard); a pattern without ``{sku}`` is its own label, so the label's
values are bounded whatever keys the app writes.

Example::

    >>> from stocksentry.instrumentation.guard import LabelGuard
    >>> pattern = LockPattern("lock:product:{sku}", LabelGuard(max_values=1))
    >>> pattern.glob
    'lock:product:*'
    >>> pattern.label("lock:product:EGG-01"), pattern.label("lock:product:MILK")
    ('lock:product:EGG-01', 'lock:product:__other__')
    >>> pattern.label("lock:cart:1") is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from stocksentry.instrumentation.guard import LabelGuard

_SKU: Final = "{sku}"


class LockPattern:
    """One configured pattern (validated by the config loader)."""

    __slots__ = ("_regex", "_sku_guard", "glob", "text")

    def __init__(self, text: str, sku_guard: LabelGuard) -> None:
        self.text = text
        self._sku_guard = sku_guard
        parts = text.split(_SKU)
        if len(parts) > 2:
            raise ValueError(f"{text!r}: at most one {_SKU}")
        regex = []
        for index, part in enumerate(parts):
            if index:
                regex.append("(?P<sku>.+?)")
            regex.append(".*".join(re.escape(chunk) for chunk in part.split("*")))
        self._regex = re.compile("".join(regex), re.DOTALL)
        # Redis globs treat ? [ ] \ specially; the loader refuses them in patterns.
        self.glob = text.replace(_SKU, "*")

    def label(self, key: str) -> str | None:
        """The ``lock`` label of ``key``, or ``None`` when the key does not match."""
        match = self._regex.fullmatch(key)
        if match is None:
            return None
        if "sku" not in self._regex.groupindex:
            return self.text
        head, tail = self.text.split(_SKU)
        return head + self._sku_guard(match.group("sku")) + tail


class LockPatterns:
    """Every configured pattern; a key takes the label of the first one it matches."""

    __slots__ = ("_cache", "patterns")

    #: Keys whose label is remembered (a lock key is usually seen twice: set, then del).
    CACHE_SIZE: Final = 65_536

    def __init__(self, texts: Sequence[str], sku_guard: LabelGuard) -> None:
        self.patterns = tuple(LockPattern(text, sku_guard) for text in texts)
        self._cache: dict[str, str | None] = {}

    @property
    def globs(self) -> tuple[str, ...]:
        """The subscription globs, one per pattern."""
        return tuple(p.glob for p in self.patterns)

    def label(self, key: str) -> str | None:
        """The ``lock`` label of ``key``; ``None`` when no pattern matches it."""
        try:
            return self._cache[key]
        except KeyError:
            pass
        label = next((lab for p in self.patterns if (lab := p.label(key)) is not None), None)
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        if len(key) <= 256:
            self._cache[key] = label
        return label
