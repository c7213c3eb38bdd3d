"""Distributed-lock instrumentation: redis-py ``Lock``, pottery ``Redlock``, home-made locks.

Every form records the catalog's lock metrics under a bounded ``lock`` label (acquire
waits and outcomes, hold ratio, expiries while held, releases not owned, extension
failures, retries) and their log lines; the rules are in ``docs/locks.md``.

- :class:`InstrumentedLock` / :class:`InstrumentedAsyncLock` wrap ``redis.lock.Lock`` and
  ``redis.asyncio.lock.Lock`` (what ``Redis.lock()`` returns);
- :class:`InstrumentedRedlock` / :class:`InstrumentedAsyncRedlock` wrap pottery's
  ``Redlock`` and ``AIORedlock``;
- :func:`instrument_lock` picks the right one of those four;
- :func:`track_lock` (:class:`TrackedLock`) measures any home-made lock given as callables;
- :class:`LockRecorder` is the building block of them all, for a lock none of them fits.

Wrappers never change what the lock does; exceptions of the lock library and of the app
pass through unchanged after they are counted. A failure inside stocksentry itself counts
``stocksentry_instrumentation_errors_total{component="locks"}`` and is never raised.
Importing this module imports neither redis nor pottery.

Example::

    import redis
    from stocksentry.instrumentation.locks import instrument_lock

    client = redis.Redis()
    lock = instrument_lock(client.lock("lock:product:8891", timeout=5), name="checkout")
    with lock:  # LockError when not acquired, LockNotOwnedError when it expired: as before
        reserve()
"""

from __future__ import annotations

from .instrument import instrument_lock
from .recorder import LockHold, LockRecorder, token_hash
from .redis_py import InstrumentedAsyncLock, InstrumentedLock
from .redlock import InstrumentedAsyncRedlock, InstrumentedRedlock
from .tracked import LockNotAcquired, TrackedLock, track_lock

__all__ = [
    "InstrumentedAsyncLock",
    "InstrumentedAsyncRedlock",
    "InstrumentedLock",
    "InstrumentedRedlock",
    "LockHold",
    "LockNotAcquired",
    "LockRecorder",
    "TrackedLock",
    "instrument_lock",
    "token_hash",
    "track_lock",
]
