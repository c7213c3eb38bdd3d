"""Duplicate order keys kept between probe runs: the incremental duplicate bookkeeping.

A key is a duplicate while at least two orders of the window hold it, so it stays one
until its second newest order leaves the window: that time is all that is kept per key. A
key can only *become* a duplicate through a new order, so after one full read of the
window each run asks only about the keys of the orders created since the last horizon
(see :mod:`.db` for why the horizon catches late commits).

Example::

    keys = DuplicateKeys(window=3600.0)
    keys.update("external_ref", rows)     # (key, second newest created_at)
    keys.expire(now)
    keys.count()
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

__all__ = ["DuplicateKeys"]


class DuplicateKeys:
    """The duplicate keys of the window, per key kind, with the time each one ends."""

    def __init__(self, *, window: float) -> None:
        self.window = timedelta(seconds=window)
        #: Orders created at or after it are read again next run; ``None``: read the
        #: whole window first.
        self.boundary: datetime | None = None
        self._ends: dict[tuple[str, str], datetime] = {}

    def update(self, kind: str, rows: Iterable[tuple[Any, Any]]) -> None:
        """Rows ``(key, second_newest_created_at)`` of keys held by two orders or more."""
        for key, second_newest in rows:
            self._ends[(kind, str(key))] = second_newest + self.window

    def expire(self, now: datetime) -> None:
        """Forget the keys whose second newest order has left the window by ``now``."""
        gone = [k for k, end in self._ends.items() if end < now]
        for k in gone:
            del self._ends[k]

    def keys_of(self, kind: str) -> list[str]:
        """The duplicate keys of one kind (``external_ref``, ``idempotency_key``), sorted."""
        return sorted(key for k, key in self._ends if k == kind)

    def count(self) -> int:
        """How many keys, over every kind, are duplicates now."""
        return len(self._ends)
