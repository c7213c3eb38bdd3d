"""The memory of idempotency keys and payment references: first use of each, oldest
forgotten first, in a fraction of the memory of a dict.

Up to :data:`~.limits.MAX_KEYS` keys are remembered, and nearly all are never seen again.
A dict of them holds three objects per key (the key, the packed first write, the table
slot) and a deque a fourth reference: about 160 bytes a key, 80 MB at half a million,
most of the memory of a big run. Here the keys are spread over a fixed list of buckets
(by hash), each bucket one bytes object holding its records one after the other,
oldest first: about 60 bytes a key. A key is found by a substring search of its bucket
(a few records), and forgetting the oldest key drops the first record of the bucket it
went into: the order of records in a bucket is the order of the keys overall.

A record is ``\\x1e<key>\\x1f<value>``. A key or value holding either separator (an id
with control characters) and a first write that is no packed record go to a plain dict
beside, forgotten in the same order. Exact either way: a key is found only by its whole
text, never by its hash.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["KeyMemory"]

_START = b"\x1e"
_END_KEY = b"\x1f"
#: Keys per bucket on average when the memory is full.
_PER_BUCKET = 4

#: What the dict beside holds (the analysis's unpacked write or its duplicate).
T = TypeVar("T")


class KeyMemory(Generic[T]):
    """At most ``limit`` keys (bytes), each with its first value (bytes, or any object);
    the oldest forgotten first.

    Example::

        >>> keys: KeyMemory[object] = KeyMemory(2)
        >>> keys.add(b"K1", b"first"), keys.add(b"K2", b"second"), keys.get(b"K1")
        (False, False, b'first')
        >>> keys.add(b"K3", b"third"), keys.get(b"K1"), keys.get(b"K3"), len(keys)
        (True, None, b'third', 2)
        >>> keys.replace(b"K2", "an object"); keys.get(b"K2")
        'an object'
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        size = 1
        while size * _PER_BUCKET < self.limit:
            size *= 2
        self._mask = size - 1
        self._buckets: list[bytes] = [b""] * size
        # One int object per bucket, shared by every entry of the order that names it.
        self._numbers = list(range(size))
        #: Bucket numbers (a record there) or keys (of ``_others``), oldest first.
        self._order: deque[int | bytes] = deque()
        #: Keys and values a bucket cannot hold, and keys whose value was replaced.
        self._others: dict[bytes, bytes | T] = {}

    def __len__(self) -> int:
        return len(self._order)

    def get(self, key: bytes) -> bytes | T | None:
        """The value of ``key``, ``None`` if it is not (or no longer) remembered."""
        others = self._others
        if others:
            value = others.get(key)
            if value is not None:
                return value
        bucket = self._buckets[hash(key) & self._mask]
        if not bucket or _START in key or _END_KEY in key:
            # Such a key is only ever beside (its needle could match across records).
            return None
        needle = _START + key + _END_KEY
        at = bucket.find(needle)
        if at < 0:
            return None
        start = at + len(needle)
        end = bucket.find(_START, start)
        return bucket[start:] if end < 0 else bucket[start:end]

    def add(self, key: bytes, value: bytes | T) -> bool:
        """Remember a new ``key`` (not remembered now); ``True`` if the oldest was forgotten."""
        if (
            type(value) is bytes
            and _START not in key
            and _END_KEY not in key
            and _START not in value
        ):
            number = hash(key) & self._mask
            self._buckets[number] += _START + key + _END_KEY + value
            self._order.append(self._numbers[number])
        else:
            self._others[key] = value
            self._order.append(key)
        if len(self._order) > self.limit:
            self._forget()
            return True
        return False

    def replace(self, key: bytes, value: T) -> None:
        """Give a remembered ``key`` another value; it keeps its place in the order."""
        self._others[key] = value

    def _forget(self) -> None:
        oldest = self._order.popleft()
        others = self._others
        if type(oldest) is bytes:
            others.pop(oldest, None)
            return
        number: int = oldest  # type: ignore[assignment]
        bucket = self._buckets[number]
        end = bucket.find(_START, 1)
        record = bucket if end < 0 else bucket[:end]
        self._buckets[number] = b"" if end < 0 else bucket[end:]
        if others:
            # A key of a bucket whose value was replaced goes with its record.
            others.pop(record[1 : record.index(_END_KEY)], None)
