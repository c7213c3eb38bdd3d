"""Distributed-lock instrumentation: redis-py ``Lock``, pottery ``Redlock``, home-made locks.

Every form records the catalog's lock metrics and log lines under a bounded ``lock``
label, never changes what the lock does and never raises a failure of its own; the rules
are in ``docs/locks.md``. Importing this module imports neither redis nor pottery.

- :class:`InstrumentedLock` / :class:`InstrumentedAsyncLock` wrap ``redis.lock.Lock`` and
  ``redis.asyncio.lock.Lock`` (what ``Redis.lock()`` returns);
- :class:`InstrumentedRedlock` / :class:`InstrumentedAsyncRedlock` wrap pottery's
  ``Redlock`` and ``AIORedlock``;
- :func:`instrument_lock` picks the right one of those four;
- :func:`track_lock` (:class:`TrackedLock`) measures any home-made lock given as callables;
- :class:`LockRecorder` is the building block of them all, for a lock none of them fits.

Example::

    import redis
    from stocksentry.instrumentation.locks import instrument_lock

    client = redis.Redis()
    lock = instrument_lock(client.lock("lock:product:8891", timeout=5), name="checkout")
    with lock:  # LockError when not acquired, LockNotOwnedError when it expired: as before
        reserve()
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, overload

from .recorder import LockHold, LockRecorder, token_hash
from .redis_py import InstrumentedAsyncLock, InstrumentedLock
from .redlock import InstrumentedAsyncRedlock, InstrumentedRedlock
from .tracked import LockNotAcquired, TrackedLock, track_lock

if TYPE_CHECKING:
    from typing import Unpack

    from pottery import AIORedlock, Redlock
    from redis.asyncio.lock import Lock as AsyncLock
    from redis.lock import Lock

    from .wrapper import LockOptions


#: The wrapper of each library lock: (module, class name, wrapper), subclasses first.
_WRAPPERS = (
    ("pottery", "AIORedlock", InstrumentedAsyncRedlock),
    ("pottery", "Redlock", InstrumentedRedlock),
    ("redis.asyncio.lock", "Lock", InstrumentedAsyncLock),
    ("redis.lock", "Lock", InstrumentedLock),
)


@overload
def instrument_lock(lock: Lock, **options: Unpack[LockOptions]) -> InstrumentedLock: ...
@overload
def instrument_lock(lock: AsyncLock, **options: Unpack[LockOptions]) -> InstrumentedAsyncLock: ...
@overload
def instrument_lock(lock: Redlock, **options: Unpack[LockOptions]) -> InstrumentedRedlock: ...
@overload
def instrument_lock(
    lock: AIORedlock, **options: Unpack[LockOptions]
) -> InstrumentedAsyncRedlock: ...
def instrument_lock(
    lock: Any, **options: Unpack[LockOptions]
) -> InstrumentedLock | InstrumentedAsyncLock | InstrumentedRedlock | InstrumentedAsyncRedlock:
    """Wrap a redis-py ``Lock`` (sync or asyncio) or a pottery ``Redlock`` / ``AIORedlock``.

    ``name`` and ``sentry`` are the wrapper's; ``fencing=True`` makes each acquisition fetch
    a fencing token (``lock.fencing_token``, one more round trip; see ``docs/locks.md``).
    Raises ``TypeError`` for anything else (set-up code: fails fast).

    Example::

        lock = instrument_lock(client.lock("lock:sku:EGG-01", timeout=5), name="checkout")
    """
    # Only modules the app already imported can have made the lock: look there, import none.
    for module, class_name, wrapper in _WRAPPERS:
        kind = getattr(sys.modules.get(module), class_name, None)
        if kind is not None and isinstance(lock, kind):
            return wrapper(lock, **options)
    raise TypeError(
        f"cannot instrument {type(lock).__qualname__}: expected a redis-py Lock or a "
        "pottery Redlock; use track_lock() for a home-made lock"
    )


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
