"""What the watcher watches: lock key patterns, and the keyspace notifications it needs.

A pattern is literal text with ``*`` (any text) and at most one ``{sku}`` (through the SKU
guard); it gives the subscription glob and the ``lock`` label (docs/lockwatch.md).

Example::

    >>> from stocksentry.instrumentation.guard import LabelGuard
    >>> patterns = LockPatterns(["lock:product:{sku}"], LabelGuard(max_values=1))
    >>> patterns.globs
    ('lock:product:*',)
    >>> patterns.label("lock:product:EGG-01"), patterns.label("lock:product:MILK")
    ('lock:product:EGG-01', 'lock:product:__other__')
    >>> patterns.label("lock:cart:1") is None
    True
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from stocksentry.instrumentation.guard import LabelGuard

_SKU: Final = "{sku}"
#: The ``notify-keyspace-events`` flags the watcher needs: keyspace notifications (``K``) of
#: generic commands (``g``), string commands (``$``) and expiries (``x``); ``A`` covers the
#: last three.
REQUIRED_FLAGS: Final = "Kg$x"
_ALL_ALIAS: Final = "g$lshzxetd"


def _regex(text: str) -> re.Pattern[str]:
    parts = text.split(_SKU)
    if len(parts) > 2:
        raise ValueError(f"{text!r}: at most one {_SKU}")
    literal = (".*".join(re.escape(chunk) for chunk in part.split("*")) for part in parts)
    return re.compile("(?P<sku>.+?)".join(literal), re.DOTALL)


class LockPatterns:
    """The configured patterns (validated by the config loader); a key takes the label of
    the first one it matches."""

    __slots__ = ("_cache", "_compiled", "_sku_guard", "globs")

    #: Keys whose label is remembered (a lock key is usually seen twice: set, then del).
    CACHE_SIZE: Final = 65_536

    def __init__(self, texts: Sequence[str], sku_guard: LabelGuard) -> None:
        self._compiled = tuple((text, _regex(text)) for text in texts)
        self._sku_guard = sku_guard
        self._cache: dict[str, str | None] = {}
        #: The subscription globs, one per pattern (Redis globs treat ? [ ] \ specially;
        #: the loader refuses them in patterns).
        self.globs = tuple(text.replace(_SKU, "*") for text in texts)

    def _label(self, key: str) -> str | None:
        for text, regex in self._compiled:
            match = regex.fullmatch(key)
            if match is None:
                continue
            if "sku" not in regex.groupindex:
                return text
            head, tail = text.split(_SKU)
            return head + self._sku_guard(match.group("sku")) + tail
        return None

    def label(self, key: str) -> str | None:
        """The ``lock`` label of ``key``; ``None`` when no pattern matches it."""
        if key in self._cache:
            return self._cache[key]
        label = self._label(key)
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        if len(key) <= 256:
            self._cache[key] = label
        return label


def missing_flags(current: str) -> str:
    """The flags of :data:`REQUIRED_FLAGS` that ``current`` lacks, in that order.

    >>> missing_flags(""), missing_flags("AK"), missing_flags("Ex")
    ('Kg$x', '', 'Kg$')
    >>> missing_flags("Ex" + missing_flags("Ex"))
    ''
    """
    have = set(current)
    if "A" in have:
        have.update(_ALL_ALIAS)
    return "".join(flag for flag in REQUIRED_FLAGS if flag not in have)


def refused_hint(missing: str | None) -> str:
    """What to tell the operator when the watcher may not (or cannot) set the flags."""
    what = f"the flags {missing!r}" if missing else f"at least {REQUIRED_FLAGS!r}"
    return (
        f"set notify-keyspace-events to include {what} on the Redis server (redis.conf, "
        "CONFIG SET, or the parameter group of a managed Redis), or allow "
        "lock_watch.configure_notifications"
    )
