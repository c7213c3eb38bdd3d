"""Wrappers of pottery's ``Redlock`` and ``AIORedlock``, measured.

pottery is imported when a wrapper is built, from the lock the app made.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Literal, Self

from .recorder import Steps, run_async, run_sync
from .wrapper import Errors, LockT, LockWrapper, WrapperOptions

# pottery's own pause between blocking attempts (at most; it keeps the constant private).
_POTTERY_RETRY_DELAY = 0.2

if TYPE_CHECKING:
    from typing import Unpack

    # Named only in the quoted base classes below (string annotations).
    from pottery import AIORedlock, Redlock  # noqa: F401


class _RedlockBase(LockWrapper[LockT]):
    """What the wrappers of pottery's ``Redlock`` and ``AIORedlock`` share.

    A pottery lock holds one lease at a time, under a token it keeps private (no public
    accessor): the wrapper keys its one hold by ``None``, and the hold's log lines carry the
    hash of an id of its own.
    """

    key_attribute, ttl_attribute = "key", "auto_release_time"

    def __init__(
        self,
        lock: LockT,
        *,
        retry_delay: float | None = None,
        **options: Unpack[WrapperOptions],
    ) -> None:
        super().__init__(lock, **options)
        self.retry_delay = retry_delay

    def _refusals(self) -> tuple[Errors, Errors]:
        from pottery import ExtendUnlockedLock, ReleaseUnlockedLock, TooManyExtensions

        return (ReleaseUnlockedLock,), (ExtendUnlockedLock, TooManyExtensions)

    def _entering(self) -> Steps[Self]:
        """``with``'s acquire, by the lock's context-manager settings, as pottery's own."""
        lock: Any = self.lock
        blocking, timeout = lock.context_manager_blocking, lock.context_manager_timeout
        if (yield from self._acquire_steps(blocking, timeout, None)):
            return self
        from pottery import QuorumNotAchieved

        raise QuorumNotAchieved(lock.key, lock.masters)

    def _issuing_token(self) -> Steps[int | None]:
        # pottery keeps its token private: the token a majority of the masters shows is taken
        # for ours, then confirmed by locked(), above 0 only while our token, held since our
        # acquire, still has a majority: one that overlaps the majority the script saw.
        lock: Any = self.lock
        token = yield from self._fence(lock.masters, None)
        if token is not None and (yield lambda: lock.locked(raise_on_redis_errors=False)):
            return token
        return None

    def _acquire_steps(
        self, blocking: bool, timeout: float, raise_on_redis_errors: bool | None
    ) -> Steps[bool]:
        """``acquire``; its blocking loop pauses at random up to ``retry_delay`` between
        attempts, until ``timeout`` (-1: for ever)."""
        lock: Any = self.lock
        delay = _POTTERY_RETRY_DELAY if self.retry_delay is None else self.retry_delay
        start = time.monotonic()
        return self._acquiring(
            blocking,
            once=lambda: lock.acquire(
                blocking=blocking, timeout=timeout, raise_on_redis_errors=raise_on_redis_errors
            ),
            attempt=lambda: lock.acquire(
                blocking=False, raise_on_redis_errors=raise_on_redis_errors
            ),
            keep_trying=lambda: timeout == -1 or time.monotonic() - start < timeout,
            pause=lambda: random.uniform(0, delay),  # noqa: S311 - jitter
        )


class InstrumentedRedlock(_RedlockBase["Redlock"]):
    """pottery's ``Redlock``, measured; same methods, arguments and exceptions (counted,
    then re-raised). The TTL is the lock's ``auto_release_time``.

    With ``count_retries`` a blocking acquire runs pottery's loop here (a random pause of up
    to ``retry_delay``, pottery's own 0.2 s by default) so that retries are counted.
    ``locked()`` and the other attributes are the lock's.

    Example::

        lock = InstrumentedRedlock(Redlock(key="sku:EGG-01", masters={client}), name="checkout")
    """

    def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float = -1,
        raise_on_redis_errors: bool | None = None,
    ) -> bool:
        """``Redlock.acquire``, timed: outcome acquired, timeout or error."""
        return run_sync(self._acquire_steps(blocking, timeout, raise_on_redis_errors))

    def release(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``Redlock.release``; ``ReleaseUnlockedLock`` is counted, then re-raised."""
        with self._releasing():
            self.lock.release(raise_on_redis_errors=raise_on_redis_errors)

    def extend(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``Redlock.extend``; a refusal is counted as an extension failure, then re-raised."""
        # pottery's extend sets the TTL back to auto_release_time from now.
        with self._extending(self.lock.auto_release_time):
            self.lock.extend(raise_on_redis_errors=raise_on_redis_errors)

    def __enter__(self) -> InstrumentedRedlock:
        return run_sync(self._entering())

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self.release()
        return False


class InstrumentedAsyncRedlock(_RedlockBase["AIORedlock"]):
    """pottery's ``AIORedlock``, measured; the asyncio twin of :class:`InstrumentedRedlock`.

    Example::

        lock = InstrumentedAsyncRedlock(AIORedlock(key="sku:EGG-01", masters={client}))
    """

    async def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float = -1,  # noqa: ASYNC109 - AIORedlock.acquire's own signature
        raise_on_redis_errors: bool | None = None,
    ) -> bool:
        """``AIORedlock.acquire``, timed: outcome acquired, timeout or error."""
        return await run_async(self._acquire_steps(blocking, timeout, raise_on_redis_errors))

    async def release(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``AIORedlock.release``; ``ReleaseUnlockedLock`` is counted, then re-raised."""
        with self._releasing():
            await self.lock.release(raise_on_redis_errors=raise_on_redis_errors)

    async def extend(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``AIORedlock.extend``; a refusal is counted as an extension failure, then re-raised."""
        with self._extending(self.lock.auto_release_time):
            await self.lock.extend(raise_on_redis_errors=raise_on_redis_errors)

    async def __aenter__(self) -> InstrumentedAsyncRedlock:
        return await run_async(self._entering())

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()
