"""``instrument_lock``: the right wrapper for a redis-py or pottery lock."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, overload

from .redis_py import InstrumentedAsyncLock, InstrumentedLock
from .redlock import InstrumentedAsyncRedlock, InstrumentedRedlock

if TYPE_CHECKING:
    import redis.asyncio.lock
    import redis.lock
    from pottery import AIORedlock, Redlock

    from ..sentry import Sentry


@overload
def instrument_lock(
    lock: redis.lock.Lock,
    *,
    name: str | None = ...,
    sentry: Sentry | None = ...,
    fencing: bool = ...,
) -> InstrumentedLock: ...
@overload
def instrument_lock(
    lock: redis.asyncio.lock.Lock,
    *,
    name: str | None = ...,
    sentry: Sentry | None = ...,
    fencing: bool = ...,
) -> InstrumentedAsyncLock: ...
@overload
def instrument_lock(
    lock: Redlock, *, name: str | None = ..., sentry: Sentry | None = ..., fencing: bool = ...
) -> InstrumentedRedlock: ...
@overload
def instrument_lock(
    lock: AIORedlock, *, name: str | None = ..., sentry: Sentry | None = ..., fencing: bool = ...
) -> InstrumentedAsyncRedlock: ...
def instrument_lock(
    lock: Any, *, name: str | None = None, sentry: Sentry | None = None, fencing: bool = False
) -> InstrumentedLock | InstrumentedAsyncLock | InstrumentedRedlock | InstrumentedAsyncRedlock:
    """Wrap a redis-py ``Lock`` (sync or asyncio) or a pottery ``Redlock`` / ``AIORedlock``.

    ``fencing=True`` makes each acquisition fetch a fencing token (``lock.fencing_token``,
    one more round trip; see ``docs/locks.md``). Raises ``TypeError`` for anything else
    (set-up code: fails fast).

    Example::

        lock = instrument_lock(client.lock("lock:sku:EGG-01", timeout=5), name="checkout")
    """
    # Only modules the app already imported can have made the lock: look there, import none.
    pottery = sys.modules.get("pottery")
    async_redis_lock = sys.modules.get("redis.asyncio.lock")
    redis_lock = sys.modules.get("redis.lock")
    if pottery is not None and isinstance(lock, pottery.AIORedlock):
        return InstrumentedAsyncRedlock(lock, name=name, sentry=sentry, fencing=fencing)
    if pottery is not None and isinstance(lock, pottery.Redlock):
        return InstrumentedRedlock(lock, name=name, sentry=sentry, fencing=fencing)
    if async_redis_lock is not None and isinstance(lock, async_redis_lock.Lock):
        return InstrumentedAsyncLock(lock, name=name, sentry=sentry, fencing=fencing)
    if redis_lock is not None and isinstance(lock, redis_lock.Lock):
        return InstrumentedLock(lock, name=name, sentry=sentry, fencing=fencing)
    raise TypeError(
        f"cannot instrument {type(lock).__qualname__}: expected a redis-py Lock or a "
        "pottery Redlock; use track_lock() for a home-made lock"
    )
