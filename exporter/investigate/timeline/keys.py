"""The memory of idempotency keys and payment references: first use of each, oldest
forgotten first, in a fraction of the memory of a dict.

Up to :data:`~.limits.MAX_KEYS` keys are remembered, and nearly all are never seen again.
A dict of them holds two objects per key (the key and the packed first write) besides
its table slot, and a deque of the order a fourth reference: over 200 bytes of resident
memory a key as measured, 105 MB at half a million, most of the memory of a big run.
Here the keys are spread over a fixed list of buckets (by hash), each bucket one string
holding its records one after the other, oldest first: about 100 bytes a key, half as
much. A key is found by a substring search of its bucket (a few records). Each record
carries the number of its key in the order of arrival: a record more than ``limit``
keys old is forgotten (never found again), and dropped from the front of its bucket the
next time a key goes into that bucket, so forgetting costs no bookkeeping of its own.
Text, not bytes: ``in`` and ``find`` of a str are plain C loops, those of bytes go
through the buffer protocol at several times the cost.

A record is ``\\x1e<key>\\x1f<number> <value>``. A key that is not printable (an id with
control characters, the separators among them) goes to a plain dict beside, with its
number; so do a value that is not printable or no packed record, and a value replaced
(a duplicate), their key keeping its record, with no value, in its bucket. Exact either
way: a key is found only by its whole text, never by its hash, and it is remembered
exactly as long as it is among the last ``limit`` keys.
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
    """At most ``limit`` keys (text), each with its first value (text, or any object):
    the last ``limit`` keys that arrived; the older ones are counted in :attr:`forgotten`.

    Example::

        >>> keys: KeyMemory[list[str]] = KeyMemory(2)
        >>> keys.remember("K1", "first"), keys.remember("K2", "second")
        (None, None)
        >>> keys.remember("K1", "again"), keys.remember("K3", "third"), keys.get("K1")
        ('first', None, None)
        >>> keys.replace("K2", ["an object"]); keys.get("K2"), len(keys), keys.forgotten
        (['an object'], 2, 1)
    """

    # Slots: the attributes are read on every remember() of a big run.
    __slots__ = ("_arrived", "_buckets", "_mask", "_others", "_others_order", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        size = 1
        while size * _PER_BUCKET < self.limit:
            size *= 2
        self._mask = size - 1
        self._buckets: list[str] = [""] * size
        #: Keys that arrived so far (the number of the last one).
        self._arrived = 0
        #: Key -> (its number, its value) for what a bucket does not hold (see the module).
        self._others: dict[str, tuple[int, str | T]] = {}
        #: The entries of ``_others`` by number, to drop them once forgotten.
        self._others_order: deque[tuple[int, str]] = deque()

    def __len__(self) -> int:
        return min(self._arrived, self.limit)

    @property
    def forgotten(self) -> int:
        """Keys forgotten so far: every key beyond the last ``limit``."""
        return max(self._arrived - self.limit, 0)

    def get(self, key: str) -> str | T | None:
        """The value of ``key``, ``None`` if it is not (or no longer) remembered."""
        oldest = self._arrived - self.limit
        if not key.isprintable():
            # A key with a separator (or any unprintable character) is only ever beside.
            beside = self._others.get(key)
            return beside[1] if beside is not None and beside[0] > oldest else None
        bucket = self._buckets[hash(key) & self._mask]
        needle = f"\x1e{key}\x1f"
        at = bucket.find(needle) if bucket else -1
        return None if at < 0 else self._alive(key, bucket, at + len(needle), oldest)

    def _alive(self, key: str, bucket: str, start: int, oldest: int) -> str | T | None:
        """The value of the record of ``key`` (its number at ``start``), if not forgotten."""
        space = bucket.index(" ", start)
        number = int(bucket[start:space])
        if number <= oldest:
            return None
        others = self._others
        if others:
            beside = others.get(key)
            if beside is not None and beside[0] == number:
                return beside[1]
        end = bucket.find(_START, space)
        return bucket[space + 1 :] if end < 0 else bucket[space + 1 : end]

    def remember(self, key: str, value: str | T) -> str | T | None:
        """The value of ``key`` if it is remembered; else ``None``, and ``key`` is
        remembered with ``value`` (the oldest forgotten beyond the limit).

        One call for the lookup and the insertion: nearly every key is new, and this is
        run for every write of a big log.
        """
        oldest = self._arrived - self.limit
        others = self._others
        # Printable: no separator in it (nor any other control character).
        if key.isprintable():
            number = hash(key) & self._mask
            buckets = self._buckets
            bucket = buckets[number]
            needle = f"\x1e{key}\x1f"
            if bucket:
                at = bucket.find(needle)
                if at >= 0:
                    found = self._alive(key, bucket, at + len(needle), oldest)
                    if found is not None:
                        return found
                if oldest > 0:
                    # The front record's number, read here: most buckets have nothing
                    # to forget, and then no call is needed.
                    start = bucket.index(_END_KEY) + 1
                    if int(bucket[start : bucket.index(" ", start)]) <= oldest:
                        bucket = _drop_forgotten(bucket, oldest)
            self._arrived += 1
            if type(value) is str and value.isprintable():
                buckets[number] = f"{bucket}{needle}{self._arrived} {value}"
            else:
                buckets[number] = f"{bucket}{needle}{self._arrived} "
                self._beside(key, value)
        else:
            beside = others.get(key)
            if beside is not None and beside[0] > oldest:
                return beside[1]
            self._arrived += 1
            self._beside(key, value)
        # (Whatever is beside has its entry in the order: the check needs no call.)
        if others and self._others_order[0][0] <= self._arrived - self.limit:
            self._drop_forgotten_beside()
        return None

    def replace(self, key: str, value: T) -> None:
        """Give a remembered ``key`` another value; it keeps its place in the order."""
        beside = self._others.get(key)
        if beside is not None and beside[0] > self._arrived - self.limit:
            number = beside[0]
        else:
            # The newest record of the key is the last one in its bucket.
            bucket = self._buckets[hash(key) & self._mask]
            start = bucket.rindex(f"\x1e{key}\x1f") + len(key) + 2
            number = int(bucket[start : bucket.index(" ", start)])
        self._others[key] = (number, value)
        self._others_order.append((number, key))

    def _beside(self, key: str, value: str | T) -> None:
        self._others[key] = (self._arrived, value)
        self._others_order.append((self._arrived, key))

    def _drop_forgotten_beside(self) -> None:
        oldest = self._arrived - self.limit
        order, others = self._others_order, self._others
        while order and order[0][0] <= oldest:
            number, key = order.popleft()
            beside = others.get(key)
            if beside is not None and beside[0] == number:
                del others[key]


def _drop_forgotten(bucket: str, oldest: int) -> str:
    """``bucket`` without its records numbered ``oldest`` or lower (all at its front)."""
    while bucket:
        start = bucket.index(_END_KEY) + 1
        if int(bucket[start : bucket.index(" ", start)]) > oldest:
            return bucket
        end = bucket.find(_START, 1)
        bucket = "" if end < 0 else bucket[end:]
    return bucket
