"""Wrappers of redis-py's ``Lock`` (sync and asyncio), measured.

redis itself is imported when a wrapper is built, from the lock the app made.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .recorder import (
    FENCE_SCRIPT,
    Attempts,
    Holds,
    LockHold,
    LockT,
    LockWrapper,
    Steps,
    as_bytes,
    as_text,
    fence_key,
    run_async,
    run_sync,
)

if TYPE_CHECKING:
    # Named only in the quoted base classes below (string annotations).
    import redis.asyncio.lock  # noqa: F401
    import redis.lock  # noqa: F401

    from ..sentry import Sentry


class _RedisPyLockBase(LockWrapper[LockT]):
    """What the sync and asyncio wrappers of redis-py's ``Lock`` share."""

    def __init__(
        self,
        lock: LockT,
        *,
        name: str | None = None,
        sentry: Sentry | None = None,
        count_retries: bool = True,
        fencing: bool = False,
    ) -> None:
        from redis.exceptions import LockError, LockNotOwnedError

        # The library lock is typed per subclass; its name attribute is read untyped here.
        label = name if name is not None else as_text(getattr(lock, "name", ""))
        super().__init__(lock, label, sentry, count_retries, fencing)
        self._lock_error = LockError
        self._not_owned_error = LockNotOwnedError
        self._holds = Holds()
        self._fence_script: Any = None

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current hold (this thread's, for the sync lock): higher
        than every token issued before for this lock's key. ``None`` without
        ``fencing=True``, when not held, or when the lock was lost before the token could be
        issued (then do not write: another holder may be in)."""
        hold = self._holds.get(self._token(self.lock))
        return hold.fencing_token if hold is not None else None

    def _issuing_token(self) -> Steps[None]:
        # One round trip after the acquire; a failure leaves the token None, never raises.
        try:
            lock: Any = self.lock
            token = self._token(lock)
            hold = self._holds.get(token)
            if token is None or hold is None:
                return
            if self._fence_script is None:
                self._fence_script = lock.redis.register_script(FENCE_SCRIPT)
            script = self._fence_script
            issued = yield lambda: script(keys=[lock.name, fence_key(lock.name)], args=[token])
            hold.fencing_token = int(issued) if issued is not None else None
        except Exception as exc:
            self.recorder.internal_error(exc)

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

    def _token(self, lock: Any) -> bytes | None:
        try:
            return as_bytes(lock.local.token)
        except Exception as exc:
            self.recorder.internal_error(exc)
            return None

    def _record_acquire(self, acquired: bool, attempts: Attempts) -> None:
        lock: Any = self.lock
        try:
            if acquired:
                token = self._token(lock)
                hold = self.recorder.acquired(
                    attempts.started,
                    token=token,
                    ttl=lock.timeout,
                    retries=attempts.retries,
                    attempt_started=attempts.last_started,
                )
                self._holds.put(token, hold)
            else:
                self.recorder.not_acquired(attempts.started, retries=attempts.retries)
        except Exception as exc:
            self.recorder.internal_error(exc)

    def _extend_deadline(
        self, hold: LockHold | None, started: float, additional: float, replace: bool
    ) -> float | None:
        if replace:
            return started + float(additional)
        if hold is None or hold.deadline is None:
            return None
        return hold.deadline + float(additional)

    def _release_failed(self, exc: BaseException, token: bytes | None, started: float) -> None:
        """Count a release that raised ``exc`` (called before it propagates)."""
        try:
            if isinstance(exc, self._not_owned_error):
                self.recorder.released(self._holds.pop(token), owned=False, started=started)
            elif isinstance(exc, self._lock_error):
                # No token: never acquired by this thread, or released twice.
                self.recorder.released(None, owned=False, started=started)
        except Exception as err:
            self.recorder.internal_error(err)

    @contextlib.contextmanager
    def _releasing(self) -> Iterator[None]:
        """Measure the release the body makes; one that raised is counted, then re-raised."""
        started = time.perf_counter()
        token = self._token(self.lock)
        try:
            yield
        except Exception as exc:
            self._release_failed(exc, token, started)
            raise
        try:
            self.recorder.released(self._holds.pop(token), owned=True, started=started)
        except Exception as exc:
            self.recorder.internal_error(exc)

    @contextlib.contextmanager
    def _extending(self, additional: float | None, replace: bool = False) -> Iterator[None]:
        """Measure the extension the body makes; a refusal (``LockError``) is counted, then
        re-raised. ``additional=None``: the lease starts again for the lock's own timeout
        (``reacquire``)."""
        lock: Any = self.lock
        started = time.perf_counter()
        hold = self._holds.get(self._token(lock))
        try:
            yield
        except self._lock_error as exc:
            self.recorder.extend_failed(hold, exc)
            raise
        if additional is None:
            deadline = started + float(lock.timeout) if lock.timeout else None
        else:
            deadline = self._extend_deadline(hold, started, additional, replace)
        self.recorder.extended(hold, deadline=deadline)

    def _raise_on_exit(self, logger: str) -> bool:
        """After ``__exit__``'s release failed: re-raise, or log as redis-py does and go on."""
        if getattr(self.lock, "raise_on_release_error", True):
            return True
        logging.getLogger(logger).warning(
            "Lock was unlocked or no longer owned when exiting context manager."
        )
        return False


class InstrumentedLock(_RedisPyLockBase["redis.lock.Lock"]):
    """redis-py's ``redis.lock.Lock``, measured; same methods, arguments and exceptions.

    ``name`` is the ``lock`` label (default: the lock's Redis key; pass a stable name when
    the key carries an id). With ``count_retries`` (the default) a blocking ``acquire``
    runs redis-py's own loop here (``acquire(blocking=False)`` every ``sleep`` seconds
    until ``blocking_timeout``), so that each attempt after the first is counted; pass
    ``count_retries=False`` to leave the loop to redis-py.

    ``release()`` re-raises ``LockNotOwnedError`` after counting it, as redis-py does;
    ``__exit__`` then follows the lock's ``raise_on_release_error``.

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
        with self._extending(additional_time, replace_ttl):
            return bool(self.lock.extend(additional_time, replace_ttl))

    def reacquire(self) -> bool:
        """``Lock.reacquire`` (the TTL starts again); a refusal is counted, then re-raised."""
        with self._extending(None):
            return bool(self.lock.reacquire())

    def locked(self) -> bool:
        """``Lock.locked``: whether any holder has the key."""
        return bool(self.lock.locked())

    def owned(self) -> bool:
        """``Lock.owned``: whether the key holds this thread's token."""
        return bool(self.lock.owned())

    def __enter__(self) -> InstrumentedLock:
        if self.acquire():
            return self
        raise self._lock_error(
            "Unable to acquire lock within the time specified", lock_name=self.lock.name
        )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except self._lock_error:
            if self._raise_on_exit("redis.lock"):
                raise


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
        with self._extending(additional_time, replace_ttl):
            return bool(await self.lock.extend(additional_time, replace_ttl))

    async def reacquire(self) -> bool:
        """``Lock.reacquire`` (the TTL starts again); a refusal is counted, then re-raised."""
        with self._extending(None):
            return bool(await self.lock.reacquire())

    async def locked(self) -> bool:
        """``Lock.locked``: whether any holder has the key."""
        return bool(await self.lock.locked())

    async def owned(self) -> bool:
        """``Lock.owned``: whether the key holds this lock's token."""
        return bool(await self.lock.owned())

    async def __aenter__(self) -> InstrumentedAsyncLock:
        if await self.acquire():
            return self
        raise self._lock_error("Unable to acquire lock within the time specified")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except self._lock_error:
            if self._raise_on_exit("redis.asyncio.lock"):
                raise
