"""What the detectors keep per SKU, and what the log's values are as numbers.

:class:`SkuState` holds, besides the latest write and the recent starting values, the
account of the SKU's sales since its last restock: the highest stock read and the units
the successful writes sold. More units sold than the stock read allows is an oversell
(:class:`~.incidents.SoldBeyond`), whatever the log's ``to`` values say: an app that
runs ``stock = stock - 1`` logs the value it read minus one, never the stock below zero.
"""

from __future__ import annotations

import re

from .incidents import NegativeStock, Overwrite, SameFrom, SoldBeyond, StaleRead, Write

#: A whole number in text that fits 64 bits: read as an ``int``.
INT = re.compile(r"-?\d{1,18}\Z")


def as_int(value: object) -> int | None:
    """A stock number of a log line as an ``int``; ``None`` when it is none.

    Example::

        >>> as_int("-3"), as_int(2.0), as_int(True), as_int("2.5")
        (-3, 2, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and INT.match(value.strip()):
        return int(value)
    return None


def truthy(value: object) -> bool | None:
    """A ``success`` field as a bool; ``None`` when it says neither.

    Example::

        >>> truthy("yes"), truthy(0), truthy("maybe")
        (True, False, None)
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "yes", "ok", "1", "t", "y"):
            return True
        if lowered in ("false", "no", "0", "f", "n", "failed"):
            return False
    return None


class SkuState:
    """One SKU's detector state (see :mod:`.analysis`)."""

    __slots__ = (
        "beyond",
        "epoch",
        "froms",
        "last",
        "lost",
        "negative",
        "off_computed",
        "off_relative",
        "sold",
        "stale",
        "top",
    )

    def __init__(self) -> None:
        #: Restocks seen (writes that raised the stock), and the oversell since the last.
        self.epoch = 0
        self.negative: NegativeStock | None = None
        #: The latest write, and the stale-read finding of reads that missed it.
        self.last: Write | None = None
        self.stale: StaleRead | None = None
        #: Recent ``from`` values -> the write (or lost update) that started from it.
        self.froms: dict[int, Write | SameFrom] = {}
        #: Since the last restock: the highest stock read (a check's ``available``, a
        #: write's ``from``) and the units the successful writes sold.
        self.top: int | None = None
        self.sold = 0
        #: The writes that sold past ``top`` (opened when the first one does).
        self.beyond: SoldBeyond | None = None
        #: The values the lost updates since the last restock wrote -> the lost update: a
        #: later read of that very value by another request shows it stayed written.
        self.lost: dict[int, SameFrom | Overwrite] = {}
        #: How far the checks' values were from each account of the writes: the stock
        #: the last write wrote (writes of computed values) and the stock read less the
        #: units sold since (relative decrements, ``stock = stock - 1``).
        self.off_computed = 0
        self.off_relative = 0

    @property
    def relative(self) -> bool:
        """Whether the checks since the last restock fit relative decrements better than
        writes of computed values: then writes from one value were not lost updates."""
        return self.off_relative < self.off_computed

    def check(self, value: int, name: str | None, ts: float) -> None:
        """A stock check by ``name`` read ``value`` (at most :attr:`top`) at ``ts``, once
        the SKU has a lost update: which account of the writes does it fit, and does it
        show a lost update's value still written?"""
        top, last = self.top, self.last
        if top is not None and last is not None and last.to is not None and self.sold:
            self.off_relative += abs(value - (top - self.sold))
            self.off_computed += abs(value - last.to)
        incident = self.lost.get(value)
        if incident is not None:
            incident.seen_after(name, ts)

    def sold_past(self, sku: str, write: Write) -> SoldBeyond | None:
        """``write`` took :attr:`sold` past :attr:`top`: the oversell it opens, if it is
        the first such write since the restock (the caller lists the new incident)."""
        beyond = self.beyond
        if beyond is None:
            beyond = self.beyond = SoldBeyond(sku, self.epoch, self.top or 0, write)
            beyond.sold = self.sold
            return beyond
        beyond.sold, beyond.top = self.sold, self.top or 0
        beyond.keep(beyond.writes, write)
        return None

    def restock(self, to: int) -> None:
        """A write that raised the stock to ``to``: a new account starts."""
        self.epoch += 1
        self.negative = None
        self.froms.clear()
        self.top = to
        self.sold = 0
        self.beyond = None
        self.lost = {}
        self.off_computed = self.off_relative = 0
