"""Distributed-lock instrumentation: redis-py ``Lock``, pottery ``Redlock``, home-made locks.

A lock that protects a stock decision fails in ways a reservation counter cannot see: the
work outlives the TTL, a second holder enters, the first one's naive ``DEL`` removes the
second one's key, and a third enters. Every form here records the same catalog metrics
under a bounded ``lock`` label:

- ``stock_lock_acquire_duration_seconds{lock,outcome}``: the wait, ``outcome`` is
  ``acquired``, ``timeout`` or ``error`` (an exception from the lock library or the app's
  own acquire call);
- ``stock_lock_hold_ratio{lock}``: at release, time held / the lease (the TTL, plus
  extensions); 1.0 and above means the TTL ran out while held;
- ``stock_lock_expired_while_held_total{lock}``: detected at release, when the hold
  outlived its lease by a clock that never starts it late (or, for a lock whose TTL is
  not known, when the token is no longer ours);
- ``stock_lock_release_not_owned_total{lock}``: a release by a holder that no longer owned
  the lock (redis-py's ``LockNotOwnedError``, pottery's ``ReleaseUnlockedLock``, or a naive
  ``DEL`` that found another holder's token, or none, under the key);
- ``stock_lock_extend_failures_total`` and ``stock_lock_acquire_retries_total``.

Log lines ``lock_acquired`` (info), ``lock_acquire_timeout`` (info), ``lock_extend_failed``,
``lock_expired_while_held`` and ``lock_release_not_owned`` (warnings) carry ``lock``, the
holder token's short hash as ``holder`` (never the token itself) and, through structlog's
contextvars, the request's correlation ids.

The forms, each usable from sync code and asyncio:

- :class:`InstrumentedLock` / :class:`InstrumentedAsyncLock` wrap ``redis.lock.Lock`` and
  ``redis.asyncio.lock.Lock`` (what ``Redis.lock()`` returns);
- :class:`InstrumentedRedlock` / :class:`InstrumentedAsyncRedlock` wrap pottery's
  ``Redlock`` and ``AIORedlock``;
- :func:`instrument_lock` picks the right one of those four;
- :func:`track_lock` (:class:`TrackedLock`) measures any home-made lock given as callables,
  a naive ``SET key token NX EX ttl`` lock released with a plain ``DEL`` included.

For an owned lock (compare-and-delete release, renewals only while ours) use redis-py's
``Lock``, which :func:`instrument_lock` wraps.

Wrappers never change what the lock does (a blocking acquire runs the library's own
retry loop, attempt by attempt, so that retries can be counted; ``count_retries=False``
leaves it to the library). Exceptions of the lock library and of the app pass through
unchanged, *after* they are counted: ``LockNotOwnedError`` from ``release()`` (and from
``__exit__`` when ``raise_on_release_error`` is set) is re-raised, exactly as redis-py
raises it without the wrapper. At run time a failure inside stocksentry itself is counted
in ``stocksentry_instrumentation_errors_total{component="locks"}`` and never raised; only
set-up (constructors, bad arguments) raises.

Importing this module imports neither redis nor pottery; a wrapper takes the lock object
the app made and imports that library's exception classes when it is built.

Example::

    import redis
    from stocksentry.instrumentation.locks import instrument_lock

    client = redis.Redis()
    lock = instrument_lock(client.lock("lock:product:8891", timeout=5), name="checkout")
    with lock:  # LockError when not acquired, LockNotOwnedError when it expired: as before
        reserve()

The package is split by role: :mod:`.recorder` (:class:`LockRecorder`, :class:`LockHold`),
:mod:`.redis_py`, :mod:`.redlock`, :mod:`.instrument` (:func:`instrument_lock`) and
:mod:`.tracked` (home-made locks).
"""

from __future__ import annotations

from .instrument import instrument_lock

# _as_bytes, _resolve, _sync_result: what a TrackedLock subclass (a lock of its own on
# TrackedLock's hooks) needs, importable from here as before the split.
from .recorder import (
    LOCK_ACQUIRE_RETRIES,
    LOCK_EXTEND_FAILURES,
    LockHold,
    LockRecorder,
    token_hash,
)
from .recorder import (
    _as_bytes as _as_bytes,
)
from .redis_py import InstrumentedAsyncLock, InstrumentedLock
from .redlock import InstrumentedAsyncRedlock, InstrumentedRedlock
from .tracked import LockNotAcquired, TrackedLock, track_lock
from .tracked import _resolve as _resolve
from .tracked import _sync_result as _sync_result

__all__ = [
    "LOCK_ACQUIRE_RETRIES",
    "LOCK_EXTEND_FAILURES",
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
