"""The lease tracker: each watched lock key's life from its keyspace notifications.

Pure state, no I/O: :meth:`LeaseTracker.apply` takes one notification at a time. The
suspected release-not-owned rule, its false positives and misses: docs/lockwatch.md.

Example::

    >>> from stocksentry.instrumentation.guard import LabelGuard
    >>> from stocksentry.exporter.lockwatch.patterns import LockPatterns
    >>> t = LeaseTracker(LockPatterns(["lock:product:{sku}"], LabelGuard()))
    >>> t.apply("lock:product:A", "set", 0.0); t.apply("lock:product:A", "expire", 0.0, 5.0)
    >>> t.apply("lock:product:A", "expired", 5.0)
    >>> t.apply("lock:product:A", "set", 5.1); t.apply("lock:product:A", "expire", 5.1, 10.1)
    >>> t.apply("lock:product:A", "del", 6.0)
    >>> t.expired_while_held["lock:product:A"], t.release_not_owned["lock:product:A"]
    (1, 1)
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from stocksentry.instrumentation import catalog

from .patterns import LockPatterns

#: Seconds past a lease's deadline after which a lease without an ``expired`` is dropped.
END_UNSEEN_GRACE: Final = 60.0
_EVENTS: Final = frozenset(catalog.LOCKWATCH_EVENTS)
_BUCKETS: Final = catalog.HOLD_RATIO_BUCKETS
_BOUNDS: Final = (*(repr(float(bound)) for bound in _BUCKETS), "+Inf")


@dataclass(slots=True)
class Lease:
    """One lease being followed: its ``deadline`` is the last ``expire``'s, its ``ttl``
    the first's; ``reacquired`` within ``reacquire_window`` of an expiry of its key."""

    lock: str
    acquired_at: float
    deadline: float | None = None
    ttl: float | None = None
    reacquired: bool = False


class _Histogram:
    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(_BUCKETS) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(_BUCKETS, value)] += 1
        self.count += 1
        self.total += value


class LeaseTracker:
    """The state of every watched lock key and the counts it led to (thread-safe)."""

    def __init__(
        self,
        patterns: LockPatterns,
        *,
        max_tracked: int = 10_000,
        reacquire_window: float = 30.0,
        foreign_release_ratio: float = 0.5,
    ) -> None:
        self.patterns = patterns
        self.max_tracked = max_tracked
        self.reacquire_window = reacquire_window
        self.foreign_release_ratio = foreign_release_ratio
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}
        #: Key -> when it last expired (insertion order: oldest first). Kept through the
        #: leases that follow, not only the next one: in the cascade, every holder whose
        #: lock was deleted works on and deletes the next holder's.
        self._expired_at: dict[str, float] = {}
        self.acquisitions: dict[str, int] = {}
        self.expired_while_held: dict[str, int] = {}
        self.release_not_owned: dict[str, int] = {}
        self.hold_ratio: dict[str, _Histogram] = {}
        self.events: dict[str, int] = dict.fromkeys(catalog.LOCKWATCH_EVENTS, 0)
        self.lost: dict[str, int] = dict.fromkeys(catalog.LOCKWATCH_LOST_REASONS, 0)

    @property
    def tracked(self) -> int:
        return len(self._leases)

    def apply(self, key: str, event: str, now: float, deadline: float | None = None) -> None:
        """Update the state with one notification received at ``now``.

        ``deadline``: for ``expire``, when the key will expire (``PTTL`` read back);
        ``None`` when the key was gone by then.
        """
        lock = self.patterns.label(key)
        with self._lock:
            self.events[event if event in _EVENTS else "other"] += 1
            if lock is None:
                return
            if event == "set":
                self._set(key, lock, now)
            elif event == "expire":
                lease = self._leases.get(key)
                if lease is not None and deadline is not None:
                    if lease.ttl is None:
                        lease.ttl = max(deadline - lease.acquired_at, 0.0)
                    lease.deadline = deadline
            elif event == "persist":
                lease = self._leases.get(key)
                if lease is not None:
                    lease.deadline = None
            elif event == "del":
                self._del(key, now)
            elif event == "expired":
                self._expired(key, lock, now)
            elif event == "evicted" and self._leases.pop(key, None) is not None:
                self.lost["evicted"] += 1

    def _set(self, key: str, lock: str, now: float) -> None:
        self.acquisitions[lock] = self.acquisitions.get(lock, 0) + 1
        # The lock's problem counters exist at 0 from its first acquisition on, so the
        # first expiry is an increase() the alerts see, not a series born at 1.
        self.expired_while_held.setdefault(lock, 0)
        self.release_not_owned.setdefault(lock, 0)
        expired = self._expired_at.get(key)
        reacquired = expired is not None and now - expired <= self.reacquire_window
        if key not in self._leases and len(self._leases) >= self.max_tracked:
            self.lost["tracked_limit"] += 1
            return
        self._leases[key] = Lease(lock, now, reacquired=reacquired)

    def _del(self, key: str, now: float) -> None:
        lease = self._leases.pop(key, None)
        if lease is None:
            return
        held = now - lease.acquired_at
        self._observe(lease, held)
        if (
            lease.reacquired
            and lease.ttl is not None
            and held < self.foreign_release_ratio * lease.ttl
        ):
            self.release_not_owned[lease.lock] = self.release_not_owned.get(lease.lock, 0) + 1

    def _expired(self, key: str, lock: str, now: float) -> None:
        # Counted whether the lease was followed or not (acquired before the watcher
        # started, or past the tracking bound): the key ran out instead of being released.
        self.expired_while_held[lock] = self.expired_while_held.get(lock, 0) + 1
        lease = self._leases.pop(key, None)
        if lease is not None:
            self._observe(lease, now - lease.acquired_at)
        self._expired_at.pop(key, None)  # re-inserted last: the oldest go first
        if len(self._expired_at) >= self.max_tracked:
            del self._expired_at[next(iter(self._expired_at))]
        self._expired_at[key] = now

    def _observe(self, lease: Lease, held: float) -> None:
        if lease.deadline is None or lease.deadline <= lease.acquired_at:
            return
        granted = lease.deadline - lease.acquired_at
        # The watcher sees an expiry a little after the deadline; 1.0 is what happened.
        self.hold_ratio.setdefault(lease.lock, _Histogram()).observe(held / granted)

    def sweep(self, now: float) -> None:
        """Drop leases whose deadline passed :data:`END_UNSEEN_GRACE` ago (lost ``expired``)."""
        with self._lock:
            stale = [
                key
                for key, lease in self._leases.items()
                if lease.deadline is not None and now - lease.deadline > END_UNSEEN_GRACE
            ]
            for key in stale:
                del self._leases[key]
            self.lost["end_unseen"] += len(stale)
            cutoff = now - self.reacquire_window
            old = [key for key, when in self._expired_at.items() if when < cutoff]
            for key in old:
                del self._expired_at[key]

    def forget(self) -> int:
        """Drop every lease (the connection was lost); returns how many were dropped."""
        with self._lock:
            dropped = len(self._leases)
            self._leases.clear()
            self._expired_at.clear()
            self.lost["disconnect"] += dropped
            return dropped

    def families(self) -> Iterator[Metric]:
        """The lock families and the event/lost counters, from the current counts."""
        with self._lock:
            yield _counter(catalog.LOCK_ACQUISITIONS, self.acquisitions)
            yield _counter(catalog.LOCK_EXPIRED_WHILE_HELD, self.expired_while_held)
            yield _counter(catalog.LOCK_RELEASE_NOT_OWNED, self.release_not_owned)
            spec = catalog.LOCK_HOLD_RATIO
            hist = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
            for lock, h in sorted(self.hold_ratio.items()):
                counts = map(float, itertools.accumulate(h.buckets))
                hist.add_metric([lock], list(zip(_BOUNDS, counts, strict=True)), h.total)
            yield hist
            yield _counter(catalog.LOCKWATCH_EVENT_COUNT, self.events)
            yield _counter(catalog.LOCKWATCH_LEASES_LOST, self.lost)


def _counter(spec: catalog.MetricSpec, values: dict[str, int]) -> Metric:
    family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    for label, value in sorted(values.items()):
        family.add_metric([label], float(value))
    return family
