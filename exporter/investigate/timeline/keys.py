"""The memory of idempotency keys and payment references: first use of each, oldest
forgotten first, in a fraction of the memory of a dict.

Up to :data:`~.limits.MAX_KEYS` keys are remembered, and nearly all are never seen again.
A dict of them holds three objects per key (the key, the packed first write, the table
slot) and a deque a fourth reference: about 160 bytes a key, 80 MB at half a million,
most of the memory of a big run. Here the keys are spread over a fixed list of buckets
(by hash), each bucket one string holding its records one after the other, oldest
first: about 60 bytes a key. A key is found by a substring search of its bucket (a few
records), and forgetting the oldest key drops the first record of the bucket it went
into: the order of records in a bucket is the order of the keys overall. Text, not
bytes: ``in`` and ``find`` of a str are plain C loops, those of bytes go through the
buffer protocol at several times the cost.

A record is ``\\x1e<key>\\x1f<value>``. A key or value that is not printable (an id
with control characters, the separators among them) and a first write that is no
packed record go to a plain dict
beside, forgotten in the same order. Exact either way: a key is found only by its whole
text, never by its hash.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["KeyMemory"]

_START = "\x1e"
_END_KEY = "\x1f"
#: Keys per bucket on average when the memory is full.
_PER_BUCKET = 4

#: What the dict beside holds (the analysis's unpacked write or its duplicate).
T = TypeVar("T")


class KeyMemory(Generic[T]):
    """At most ``limit`` keys (text), each with its first value (text, or any object);
    the oldest forgotten first, counted in :attr:`forgotten`.

    Example::

        >>> keys: KeyMemory[list[str]] = KeyMemory(2)
        >>> keys.remember("K1", "first"), keys.remember("K2", "second")
        (None, None)
        >>> keys.remember("K1", "again"), keys.remember("K3", "third"), keys.get("K1")
        ('first', None, None)
        >>> keys.replace("K2", ["an object"]); keys.get("K2"), len(keys), keys.forgotten
        (['an object'], 2, 1)
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        size = 1
        while size * _PER_BUCKET < self.limit:
            size *= 2
        self._mask = size - 1
        self._buckets: list[str] = [""] * size
        # One int object per bucket, shared by every entry of the order that names it.
        self._numbers = list(range(size))
        #: Bucket numbers (a record there) or keys (of ``_others``), oldest first.
        self._order: deque[int | str] = deque()
        #: Keys and values a bucket cannot hold, and keys whose value was replaced.
        self._others: dict[str, str | T] = {}
        #: Keys forgotten so far.
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._order)

    def get(self, key: str) -> str | T | None:
        """The value of ``key``, ``None`` if it is not (or no longer) remembered."""
        if not key.isprintable():
            # A key with a separator (or any unprintable character) is only ever beside.
            return self._others.get(key)
        bucket = self._buckets[hash(key) & self._mask]
        needle = f"{_START}{key}{_END_KEY}"
        at = bucket.find(needle) if bucket else -1
        if at < 0:
            return None
        return self._value(key, bucket, at + len(needle))

    def _value(self, key: str, bucket: str, start: int) -> str | T:
        """The value of the record of ``key`` whose value starts at ``start``."""
        others = self._others
        if others:
            found = others.get(key)
            if found is not None:
                return found
        end = bucket.find(_START, start)
        return bucket[start:] if end < 0 else bucket[start:end]

    def remember(self, key: str, value: str | T) -> str | T | None:
        """The value of ``key`` if it is remembered; else ``None``, and ``key`` is
        remembered with ``value`` (the oldest forgotten beyond the limit).

        One call for the lookup and the insertion: nearly every key is new, and this is
        run for every write of a big log. A key that is printable always has its record
        in its bucket (with an empty value when the value is kept beside), so that a new
        key is known new from its bucket alone.
        """
        order = self._order
        # Printable: no separator in it (nor any other control character).
        if key.isprintable():
            number = hash(key) & self._mask
            buckets = self._buckets
            bucket = buckets[number]
            needle = f"{_START}{key}{_END_KEY}"
            if bucket:
                at = bucket.find(needle)
                if at >= 0:
                    return self._value(key, bucket, at + len(needle))
            if type(value) is str and value.isprintable():
                buckets[number] = f"{bucket}{needle}{value}"
            else:
                buckets[number] = f"{bucket}{needle}"
                self._others[key] = value
            order.append(self._numbers[number])
        else:
            others = self._others
            found = others.get(key)
            if found is not None:
                return found
            others[key] = value
            order.append(key)
        if len(order) > self.limit:
            self._forget()
        return None

    def replace(self, key: str, value: T) -> None:
        """Give a remembered ``key`` another value; it keeps its place in the order."""
        self._others[key] = value

    def _forget(self) -> None:
        self.forgotten += 1
        oldest = self._order.popleft()
        others = self._others
        if type(oldest) is str:
            others.pop(oldest, None)
            return
        number: int = oldest  # type: ignore[assignment]
        buckets = self._buckets
        bucket = buckets[number]
        end = bucket.find(_START, 1)
        buckets[number] = "" if end < 0 else bucket[end:]
        if others:
            # A key of a bucket whose value is beside goes with its record.
            record = bucket if end < 0 else bucket[:end]
            others.pop(record[1 : record.index(_END_KEY)], None)
