"""The distributed locks the running code holds, as far as the lock wrappers know.

The lock wrappers (:mod:`.locks`) put each acquisition here and take it out at its
release; the SQLAlchemy detector reads it, so that a read-modify-write done under an
owned lock that is still valid at the write is not flagged, and one whose lock expired
before the write is flagged as such. Context-local (a ``ContextVar``): a thread or an
asyncio task sees the locks it acquired, and tasks it spawned see those held when they
were spawned. No lock library is imported here.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Protocol


class HeldLock(Protocol):
    """What the detector needs of one acquisition (``LockHold`` is one)."""

    name: str
    deadline: float | None
    released: bool


# A tuple: a context that copies it (a spawned task) cannot change the parent's.
_HELD: ContextVar[tuple[HeldLock, ...]] = ContextVar("stocksentry_held_locks", default=())
# A bound against a lock object acquired in a loop and never released through us.
_MAX_HELD = 32


def held_locks() -> tuple[HeldLock, ...]:
    """The acquisitions the current context holds (released ones left out), oldest first."""
    held = _HELD.get()
    if not held:
        return held
    return tuple(hold for hold in held if not hold.released)


def hold_started(hold: HeldLock) -> None:
    """Put ``hold`` among the current context's held locks (the wrappers call it)."""
    held = tuple(h for h in _HELD.get() if not h.released)
    if len(held) >= _MAX_HELD:
        held = held[1:]
    _HELD.set((*held, hold))


def hold_released(hold: HeldLock) -> None:
    """Take ``hold`` out of the current context's held locks (after ``released`` is set).

    A release in another context than the acquire leaves the entry there, but marked
    released, so every reader skips it.
    """
    held = _HELD.get()
    if held:
        _HELD.set(tuple(h for h in held if h is not hold and not h.released))


def valid_at(hold: HeldLock, now: float | None = None) -> bool:
    """Whether ``hold`` is still owned at ``now`` (:func:`time.perf_counter`, default now):
    not released, and its lease (TTL plus extensions) not run out."""
    if hold.released:
        return False
    deadline = hold.deadline
    return deadline is None or (time.perf_counter() if now is None else now) < deadline
