"""Home-made locks, measured: :class:`TrackedLock` and :func:`track_lock`.

A lock the app built itself (``SET NX`` then ``DEL``, a database advisory lock, anything
given as callables) gets the same metrics and log lines as the library wrappers.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Literal

from ..catalog import ConflictReason
from ..outcomes import ReservationConflict
from .recorder import LockHold, LockRecorder, Pause, Steps, as_bytes, run_async, run_sync

if TYPE_CHECKING:
    from ..sentry import Sentry


class LockNotAcquired(ReservationConflict):
    """A home-made lock (:class:`TrackedLock`) was not acquired in time.

    Raised by ``with`` / ``async with`` only; ``acquire()`` returns ``False`` instead. A
    :class:`ReservationConflict`: a reservation it ends is a conflict, ``reason``
    ``lock_not_acquired`` when the lock was tried once and refused, ``lock_timeout`` when
    it was waited for (a ``blocking_timeout`` above 0) and the wait ran out.
    """

    def __init__(
        self, name: str, waited: float, *, reason: ConflictReason = "lock_not_acquired"
    ) -> None:
        super().__init__(reason, f"lock {name!r} not acquired within {waited:.3f} s")
        self.name = name
        self.waited = waited


class TrackedLock:
    """A home-made lock given as callables, measured: sync ``with`` and ``async with``.

    ``acquire(token)`` tries once and returns something truthy when the lock was taken;
    ``release(token)`` releases (its return value is ignored); ``owner()``, when given,
    returns the token currently under the lock and is called just before ``release`` to
    tell whether we still owned it (a read, then the release: not atomic). ``extend(token,
    ttl)``, optional, returns something truthy when the lease was renewed for ``ttl``
    seconds from now. In ``async with`` the callables may be coroutine functions.

    ``blocking_timeout``: 0 tries once, ``None`` waits for ever, more retries every
    ``retry_delay`` seconds with jitter until that many seconds have passed. Not acquired
    in time: ``with`` raises :class:`LockNotAcquired`, :meth:`acquire` returns ``False``.
    One instance is one holder: make one per use, do not share one between threads or tasks.
    ``track_lock`` is this class under the name of a function.

    Example::

        async with track_lock(
            "checkout",
            ttl=5,
            acquire=lambda token: client.set(KEY, token, nx=True, ex=5),  # redis.asyncio
            release=lambda token: client.delete(KEY),
            owner=lambda: client.get(KEY),
        ):
            await reserve()
    """

    def __init__(
        self,
        name: str,
        *,
        ttl: float | None,
        acquire: Callable[[str], object] | None = None,
        release: Callable[[str], object] | None = None,
        owner: Callable[[], object] | None = None,
        extend: Callable[[str, float], object] | None = None,
        token: str | None = None,
        blocking_timeout: float | None = 0.0,
        retry_delay: float = 0.05,
        sentry: Sentry | None = None,
    ) -> None:
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl}")
        if retry_delay < 0:
            raise ValueError(f"retry_delay must be >= 0, got {retry_delay}")
        self.name = name
        self.ttl = ttl
        self.blocking_timeout = blocking_timeout
        self.retry_delay = retry_delay
        self.recorder = LockRecorder(name, sentry)
        self._fixed_token = token
        self.token: str = token or uuid.uuid4().hex
        self.hold: LockHold | None = None
        self._acquire_fn = acquire
        self._release_fn = release
        self._owner_fn = owner
        self._extend_fn = extend

    # --- what a subclass changes: one attempt, one release, one extension ------------------
    # The calls return what the lock's client returns: awaited by the asyncio forms.

    def _attempt(self) -> object:
        if self._acquire_fn is None:
            raise TypeError("TrackedLock needs an acquire callable")
        return self._acquire_fn(self.token)

    def _release_steps(self) -> Steps[tuple[bool | None, object, bool | None]]:
        """Release; returns whether the lock was still ours, the token found under it and
        whether the release deleted that token (``None``: not known)."""
        current: object = None
        owned: bool | None = None
        if self._owner_fn is not None:
            current = yield self._owner_fn
            owned = as_bytes(current) == self.token.encode()
        if self._release_fn is not None:
            yield partial(self._release_fn, self.token)
        # Whether the release deleted the other holder's key depends on the callable.
        return owned, current, None

    def _extend_once(self, ttl: float) -> object:
        if self._extend_fn is None:
            raise TypeError("this lock has no extend callable")
        return self._extend_fn(self.token, ttl)

    # --- measured, once for sync and asyncio ------------------------------------------------

    def _acquiring(self) -> Steps[bool]:
        timeout = self.blocking_timeout
        stop_at = None if timeout is None else time.monotonic() + timeout
        if self._fixed_token is None:
            self.token = uuid.uuid4().hex
        with self.recorder.attempting() as attempts:
            while True:
                attempts.begin()
                if (yield self._attempt):
                    break
                pause = self.retry_delay * random.uniform(0.5, 1.5)  # noqa: S311 - jitter
                if stop_at is not None and time.monotonic() + pause > stop_at:
                    self.recorder.not_acquired(attempts.started, retries=attempts.retries)
                    return False
                yield Pause(pause)
        self.hold = self.recorder.acquired(
            attempts.started,
            token=self.token,
            ttl=self.ttl,
            retries=attempts.retries,
            attempt_started=attempts.last_started,
        )
        return True

    def _releasing(self) -> Steps[bool | None]:
        started = time.perf_counter()
        try:
            owned, current, deleted_other = yield from self._release_steps()
        except Exception:
            hold, self.hold = self.hold, None
            self.recorder.abandoned(hold)
            raise
        hold, self.hold = self.hold, None
        self.recorder.released(
            hold,
            owned=owned,
            started=started,
            current_holder=as_bytes(current) if owned is False else None,
            deleted_other_holder=deleted_other if owned is False else None,
        )
        return owned

    def _extending(self, ttl: float | None) -> Steps[bool]:
        started = time.perf_counter()
        seconds = ttl if ttl is not None else self.ttl
        if seconds is None:
            raise ValueError("extend needs a ttl: this lock has none")
        if (yield partial(self._extend_once, seconds)):
            self.recorder.extended(self.hold, deadline=started + seconds)
            return True
        self.recorder.extend_failed(self.hold)
        return False

    def _entering(self) -> Steps[TrackedLock]:
        started = time.perf_counter()
        if (yield from self._acquiring()):
            return self
        timeout = self.blocking_timeout
        tried_once = timeout is not None and timeout <= 0
        reason: ConflictReason = "lock_not_acquired" if tried_once else "lock_timeout"
        raise LockNotAcquired(self.name, time.perf_counter() - started, reason=reason)

    def acquire(self) -> bool:
        """Try (and retry until ``blocking_timeout``); ``True`` once held."""
        return run_sync(self._acquiring())

    def release(self) -> bool | None:
        """Release; returns whether the lock was still ours (``None``: not known)."""
        return run_sync(self._releasing())

    def extend(self, ttl: float | None = None) -> bool:
        """Renew the lease for ``ttl`` (default: the lock's TTL) seconds from now.

        Returns ``False`` (and counts an extension failure) when the lock refused.
        """
        return run_sync(self._extending(ttl))

    async def aacquire(self) -> bool:
        """The asyncio form of :meth:`acquire`."""
        return await run_async(self._acquiring())

    async def arelease(self) -> bool | None:
        """The asyncio form of :meth:`release`."""
        return await run_async(self._releasing())

    async def aextend(self, ttl: float | None = None) -> bool:
        """The asyncio form of :meth:`extend`."""
        return await run_async(self._extending(ttl))

    def __enter__(self) -> TrackedLock:
        return run_sync(self._entering())

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self.release()
        return False

    async def __aenter__(self) -> TrackedLock:
        return await run_async(self._entering())

    async def __aexit__(self, *exc_info: object) -> Literal[False]:
        await self.arelease()
        return False


#: :class:`TrackedLock`: measure a home-made lock given as callables (see its example).
track_lock = TrackedLock
