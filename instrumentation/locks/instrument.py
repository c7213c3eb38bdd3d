"""``instrument_lock``: the right wrapper for a redis-py or pottery lock."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, overload

from .redis_py import InstrumentedAsyncLock, InstrumentedLock
from .redlock import InstrumentedAsyncRedlock, InstrumentedRedlock

if TYPE_CHECKING:
    from typing import Unpack

    from pottery import AIORedlock, Redlock
    from redis.asyncio.lock import Lock as AsyncLock
    from redis.lock import Lock

    from .wrapper import LockOptions


#: The wrapper of each library lock: (module, class name, wrapper), subclasses first.
WRAPPERS = (
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
    for module, class_name, wrapper in WRAPPERS:
        kind = getattr(sys.modules.get(module), class_name, None)
        if kind is not None and isinstance(lock, kind):
            return wrapper(lock, **options)
    raise TypeError(
        f"cannot instrument {type(lock).__qualname__}: expected a redis-py Lock or a "
        "pottery Redlock; use track_lock() for a home-made lock"
    )
