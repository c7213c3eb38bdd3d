"""Wrappers of redis-py's ``Lock`` (sync and asyncio), measured.

redis itself is imported when a wrapper is built, from the lock the app made.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Self

from .recorder import Steps, as_bytes, run_async, run_sync
from .wrapper import Errors, LockT, LockWrapper

if TYPE_CHECKING:
    # Named only in the quoted base classes below (string annotations).
    import redis.asyncio.lock  # noqa: F401
    import redis.lock  # noqa: F401


class _RedisPyLockBase(LockWrapper[LockT]):
    """What the sync and asyncio wrappers of redis-py's ``Lock`` share."""

    key_attribute, ttl_attribute = "name", "timeout"

    def _refusals(self) -> tuple[Errors, Errors]:
        from redis.exceptions import LockError

        # LockNotOwnedError is a LockError; so is a release without a token (never
        # acquired by this thread, or released twice): a release of a lock not ours.
        return (LockError,), (LockError,)

    def _token(self) -> bytes | None:
        lock: Any = self.lock
        token = None
        with self.recorder.counting_errors():
            token = as_bytes(lock.local.token)
        return token

    def _issuing_token(self) -> Steps[int | None]:
        # One round trip after the acquire; the script checks the key still holds our token.
        lock: Any = self.lock
        return self._fence([lock.redis], self._token())

    def _acquire_steps(
        self,
        sleep: float | None,
        blocking: bool | None,
        blocking_timeout: float | None,
        token: str | bytes | None,
    ) -> Steps[bool]:
        """``Lock.acquire``; its blocking loop sleeps ``sleep`` seconds between attempts
        until ``blocking_timeout`` (``sleep`` is the sync lock's own argument only)."""
        lock: Any = self.lock
        seconds = float(lock.sleep if sleep is None else sleep)
        limit = lock.blocking_timeout if blocking_timeout is None else blocking_timeout
        stop_at = None if limit is None else time.monotonic() + float(limit)
        options: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}

        def pause() -> float | None:
            late = stop_at is not None and time.monotonic() + seconds > stop_at
            return None if late else seconds

        return self._acquiring(
            lock.blocking if blocking is None else blocking,
            once=lambda: lock.acquire(
                blocking=blocking, blocking_timeout=blocking_timeout, token=token, **options
            ),
            attempt=lambda: lock.acquire(blocking=False, token=token),
            keep_trying=lambda: True,
            pause=pause,
        )

    def _entering(self, **fields: Any) -> Steps[Self]:
        """``with``'s acquire, by the lock's own settings; ``LockError`` as redis-py's."""
        if (yield from self._acquire_steps(None, None, None, None)):
            return self
        from redis.exceptions import LockError

        raise LockError("Unable to acquire lock within the time specified", **fields)

    @contextlib.contextmanager
    def _exiting(self, logger: str) -> Iterator[None]:
        """``__exit__``'s release: a refusal is re-raised, or, with the lock's
        ``raise_on_release_error=False``, logged as redis-py does."""
        try:
            yield
        except self.release_refused:
            if getattr(self.lock, "raise_on_release_error", True):
                raise
            logging.getLogger(logger).warning(
                "Lock was unlocked or no longer owned when exiting context manager."
            )


class InstrumentedLock(_RedisPyLockBase["redis.lock.Lock"]):
    """redis-py's ``redis.lock.Lock``, measured; same methods, arguments and exceptions
    (counted, then re-raised; ``__exit__`` follows the lock's ``raise_on_release_error``).

    ``name`` is the ``lock`` label (default: the lock's Redis key). With ``count_retries``
    (the default) a blocking ``acquire`` runs redis-py's own loop here so that each retry
    is counted. ``locked()``, ``owned()`` and the other attributes are the lock's.

    Example::

        lock = InstrumentedLock(client.lock("lock:sku:EGG-01", timeout=5), name="checkout")
    """

    def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """``Lock.acquire``, timed: outcome acquired, timeout (returned False) or error."""
        return run_sync(self._acquire_steps(sleep, blocking, blocking_timeout, token))

    def release(self) -> None:
        """``Lock.release``; a ``LockNotOwnedError`` is counted, then re-raised unchanged."""
        with self._releasing():
            self.lock.release()

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """``Lock.extend``; a refusal (``LockError``) is counted, then re-raised."""
        with self._extending(additional_time, added=not replace_ttl):
            return bool(self.lock.extend(additional_time, replace_ttl))

    def reacquire(self) -> bool:
        """``Lock.reacquire`` (the TTL starts again); a refusal is counted, then re-raised."""
        with self._extending(self.lock.timeout):
            return bool(self.lock.reacquire())

    def __enter__(self) -> InstrumentedLock:
        return run_sync(self._entering(lock_name=self.lock.name))

    def __exit__(self, *exc_info: object) -> None:
        with self._exiting("redis.lock"):
            self.release()


class InstrumentedAsyncLock(_RedisPyLockBase["redis.asyncio.lock.Lock"]):
    """redis-py's ``redis.asyncio.lock.Lock``, measured; the asyncio twin of
    :class:`InstrumentedLock`, with the same rules.

    Example::

        lock = InstrumentedAsyncLock(client.lock("lock:sku:EGG-01", timeout=5), name="checkout")
        async with lock:
            await reserve()
    """

    async def acquire(
        self,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """``Lock.acquire``, timed: outcome acquired, timeout (returned False) or error."""
        return await run_async(self._acquire_steps(None, blocking, blocking_timeout, token))

    async def release(self) -> None:
        """``Lock.release``; a ``LockNotOwnedError`` is counted, then re-raised unchanged."""
        with self._releasing():
            await self.lock.release()

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """``Lock.extend``; a refusal (``LockError``) is counted, then re-raised."""
        with self._extending(additional_time, added=not replace_ttl):
            return bool(await self.lock.extend(additional_time, replace_ttl))

    async def reacquire(self) -> bool:
        """``Lock.reacquire`` (the TTL starts again); a refusal is counted, then re-raised."""
        with self._extending(self.lock.timeout):
            return bool(await self.lock.reacquire())

    async def __aenter__(self) -> InstrumentedAsyncLock:
        return await run_async(self._entering())

    async def __aexit__(self, *exc_info: object) -> None:
        with self._exiting("redis.asyncio.lock"):
            await self.release()
