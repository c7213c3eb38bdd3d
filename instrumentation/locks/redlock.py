"""Wrappers of pottery's ``Redlock`` and ``AIORedlock``, measured.

pottery is imported when a wrapper is built, from the lock the app made.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .recorder import (
    Attempts,
    LockHold,
    LockT,
    LockWrapper,
    Steps,
    fence_key,
    run_async,
    run_sync,
)

#: Redlock's token, per master: while ``KEYS[1]`` holds our token ``ARGV[1]``, raise the
#: counter ``KEYS[2]`` to at least ``ARGV[2]``, plus one when ``ARGV[3]`` is 1.
REDLOCK_FENCE_SCRIPT = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return false
end
local c = tonumber(redis.call('get', KEYS[2]) or '0')
local floor = tonumber(ARGV[2])
if floor > c then
  c = floor
end
if ARGV[3] == '1' then
  c = c + 1
end
redis.call('set', KEYS[2], c)
return c
"""

# pottery's own pause between blocking attempts (at most; it keeps the constant private).
_POTTERY_RETRY_DELAY = 0.2


def _token_of(lock: Any) -> str:
    """The holder token of a pottery lock ("" when not held). pottery keeps it in the
    private ``_uuid`` and has no public accessor: read there, for the fencing script and
    the log's token hash."""
    token = getattr(lock, "_uuid", "")
    return token if isinstance(token, str) else ""


if TYPE_CHECKING:
    # Named only in the quoted base classes below (string annotations).
    from pottery import AIORedlock, Redlock  # noqa: F401

    from ..sentry import Sentry


class _RedlockBase(LockWrapper[LockT]):
    """What the wrappers of pottery's ``Redlock`` and ``AIORedlock`` share.

    A pottery lock holds one lease at a time (its token is an attribute of the object), so
    the hold is one attribute here too.
    """

    def __init__(
        self,
        lock: LockT,
        *,
        name: str | None = None,
        sentry: Sentry | None = None,
        count_retries: bool = True,
        retry_delay: float | None = None,
        fencing: bool = False,
    ) -> None:
        from pottery import (
            ExtendUnlockedLock,
            QuorumNotAchieved,
            ReleaseUnlockedLock,
            TooManyExtensions,
        )

        label = name if name is not None else str(getattr(lock, "key", ""))
        super().__init__(lock, label, sentry, count_retries, fencing)
        self.retry_delay = retry_delay
        self._hold: LockHold | None = None
        self._release_unlocked = ReleaseUnlockedLock
        self._extend_errors: tuple[type[BaseException], ...] = (
            ExtendUnlockedLock,
            TooManyExtensions,
        )
        self._quorum_not_achieved = QuorumNotAchieved
        # One registered script per master client (the master objects are the app's).
        self._fence_scripts: dict[int, Any] = {}

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current hold, ``None`` without ``fencing=True``, when
        not held, or when a majority of the masters could not issue it.

        Weaker than a single Redis's: each master keeps its own counter; the token is the
        highest a majority issued, and the lagging masters of that majority are raised to
        it. A holder whose majority overlaps ours only in a master that missed the raise
        (it failed in between) may get a lower token: fencing over Redlock is as monotonic
        as the masters stay up.
        """
        hold = self._hold
        return hold.fencing_token if hold is not None else None

    def _issuing_token(self) -> Steps[None]:
        # Two rounds over the masters: the next token on each, then the lagging ones
        # raised to the highest; a failure leaves the token None, never raises.
        try:
            lock: Any = self.lock
            hold = self._hold
            token = _token_of(lock)
            if hold is None or not token:
                return
            keys = [lock.key, fence_key(lock.key)]
            scripts = [self._fence_script(master) for master in lock.masters]
            issued: list[int | None] = []
            for script in scripts:
                try:
                    value = yield partial(script, keys=keys, args=[token, 0, 1])
                except Exception:  # a master down: Redlock itself goes on with the rest
                    value = None
                issued.append(int(value) if value is not None else None)
            got = [value for value in issued if value is not None]
            top = max(got) if len(got) > len(issued) // 2 else None
            if top is not None:
                for script, value in zip(scripts, issued, strict=True):
                    if value is not None and value < top:
                        with contextlib.suppress(Exception):
                            yield partial(script, keys=keys, args=[token, top, 0])
            hold.fencing_token = top
        except Exception as exc:
            self.recorder.internal_error(exc)

    def _fence_script(self, master: Any) -> Any:
        """The token script registered on ``master`` (one per master client)."""
        script = self._fence_scripts.get(id(master))
        if script is None:
            script = self._fence_scripts[id(master)] = master.register_script(REDLOCK_FENCE_SCRIPT)
        return script

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

    def _record_acquire(self, acquired: bool, attempts: Attempts) -> None:
        lock: Any = self.lock
        try:
            if acquired:
                self._hold = self.recorder.acquired(
                    attempts.started,
                    token=_token_of(lock) or None,  # only its hash is logged
                    ttl=float(lock.auto_release_time),
                    retries=attempts.retries,
                    attempt_started=attempts.last_started,
                )
            else:
                self.recorder.not_acquired(attempts.started, retries=attempts.retries)
        except Exception as exc:
            self.recorder.internal_error(exc)

    @contextlib.contextmanager
    def _releasing(self) -> Iterator[None]:
        """Measure the release the body makes; one that raised is counted, then re-raised."""
        started = time.perf_counter()
        try:
            yield
        except Exception as exc:
            hold, self._hold = self._hold, None
            if isinstance(exc, self._release_unlocked):
                self.recorder.released(hold, owned=False, started=started)
            # Anything else (QuorumIsImpossible, a connection error): the outcome is unknown.
            raise
        hold, self._hold = self._hold, None
        self.recorder.released(hold, owned=True, started=started)

    @contextlib.contextmanager
    def _extending(self) -> Iterator[None]:
        """Measure the extension the body makes; a refusal is counted, then re-raised."""
        lock: Any = self.lock
        started = time.perf_counter()
        try:
            yield
        except self._extend_errors as exc:
            self.recorder.extend_failed(self._hold, exc)
            raise
        # pottery's extend sets the TTL back to auto_release_time from now.
        self.recorder.extended(self._hold, deadline=started + float(lock.auto_release_time))


class InstrumentedRedlock(_RedlockBase["Redlock"]):
    """pottery's ``Redlock``, measured; same methods, arguments and exceptions.

    The TTL is the lock's ``auto_release_time``. ``release()`` re-raises pottery's
    ``ReleaseUnlockedLock`` (the lease ran out) after counting it as not owned and expired;
    ``extend()`` re-raises ``ExtendUnlockedLock`` / ``TooManyExtensions`` after counting an
    extension failure. With ``count_retries`` a blocking acquire runs pottery's loop here
    (non-blocking attempts with a random pause of up to ``retry_delay``, pottery's own
    0.2 s by default) so that retries are counted.

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
        with self._extending():
            self.lock.extend(raise_on_redis_errors=raise_on_redis_errors)

    def locked(self, *, raise_on_redis_errors: bool | None = None) -> float:
        """``Redlock.locked``: seconds left on our lease, 0 when not held."""
        return self.lock.locked(raise_on_redis_errors=raise_on_redis_errors)

    def __enter__(self) -> InstrumentedRedlock:
        lock = self.lock
        if self.acquire(
            blocking=lock.context_manager_blocking, timeout=lock.context_manager_timeout
        ):
            return self
        raise self._quorum_not_achieved(lock.key, lock.masters)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
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
        with self._extending():
            await self.lock.extend(raise_on_redis_errors=raise_on_redis_errors)

    async def locked(self, *, raise_on_redis_errors: bool | None = None) -> float:
        """``AIORedlock.locked``: seconds left on our lease, 0 when not held."""
        return await self.lock.locked(raise_on_redis_errors=raise_on_redis_errors)

    async def __aenter__(self) -> InstrumentedAsyncRedlock:
        lock = self.lock
        if await self.acquire(
            blocking=lock.context_manager_blocking, timeout=lock.context_manager_timeout
        ):
            return self
        raise self._quorum_not_achieved(lock.key, lock.masters)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()
