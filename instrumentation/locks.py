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
- :func:`track_lock` (:class:`TrackedLock`) measures any home-made lock given as callables;
- :class:`SetNxLock` is the seeds' home-made ``SET key token NX PX ttl`` lock, with either
  the naive ``DEL`` release (the bug, kept and measured) or the owned compare-and-delete.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from . import catalog

if TYPE_CHECKING:
    import redis.asyncio.lock
    import redis.lock
    from pottery import AIORedlock, Redlock

    from .api import Sentry

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
    "SetNxLock",
    "TrackedLock",
    "instrument_lock",
    "token_hash",
    "track_lock",
]

LOCK_EXTEND_FAILURES = catalog.LOCK_EXTEND_FAILURES
LOCK_ACQUIRE_RETRIES = catalog.LOCK_ACQUIRE_RETRIES

#: Holds kept per wrapper for locks the app never released (a bound against leaks).
_MAX_OPEN_HOLDS = 1024
_COMPONENT = "locks"
# The wrapped library lock: redis-py Lock (sync or asyncio) or pottery Redlock/AIORedlock.
_L = TypeVar("_L")


class LockNotAcquired(Exception):
    """The home-made lock (:class:`TrackedLock`, :class:`SetNxLock`) was not acquired in time.

    Raised by ``with`` / ``async with`` only; ``acquire()`` returns ``False`` instead.

    Example::

        try:
            with SetNxLock(client, "lock:sku:1", name="checkout", ttl=5):
                reserve()
        except LockNotAcquired:
            answer_busy()
    """

    def __init__(self, name: str, waited: float) -> None:
        super().__init__(f"lock {name!r} not acquired within {waited:.3f} s")
        self.name = name
        self.waited = waited


def token_hash(token: str | bytes | None) -> str | None:
    """A short, stable id of a holder token for logs (8 hex digits), never the token.

    Example::

        >>> token_hash("a-secret-token") == token_hash(b"a-secret-token")
        True
        >>> len(token_hash("a-secret-token"))
        8
        >>> token_hash(None) is None
        True
    """
    if token is None:
        return None
    data = token.encode() if isinstance(token, str) else bytes(token)
    return hashlib.blake2s(data, digest_size=4).hexdigest()


def _as_bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --- the recorder every form uses ----------------------------------------------------------


@dataclass(slots=True)
class LockHold:
    """One acquisition of a lock: who holds it (hashed) and until when, by our clock.

    ``acquired_at`` and ``deadline`` are :func:`time.perf_counter` values; ``deadline`` is
    ``None`` for a lock without a TTL.
    """

    holder: str | None
    acquired_at: float
    deadline: float | None

    @property
    def lease(self) -> float | None:
        """Seconds between acquisition and the current deadline (TTL plus extensions)."""
        return None if self.deadline is None else self.deadline - self.acquired_at


class LockRecorder:
    """Records the events of one named lock into a :class:`~stocksentry.instrumentation.Sentry`.

    The building block of every form in this module, public for locks none of them fits.
    It keeps no per-hold state (that is the :class:`LockHold` it returns), so one recorder
    serves any number of threads and tasks. No method raises.

    Example::

        recorder = LockRecorder("checkout", sentry)
        started = time.perf_counter()
        if my_lock.try_lock(token, ttl=5):
            hold = recorder.acquired(started, token=token, ttl=5, attempt_started=started)
            ...
            releasing = time.perf_counter()  # before the release call
            recorder.released(hold, owned=my_lock.unlock(token), started=releasing)
        else:
            recorder.not_acquired(started)
    """

    __slots__ = ("_sentry", "name")

    def __init__(self, name: str, sentry: Sentry | None = None) -> None:
        self.name = name
        self._sentry = sentry

    @property
    def sentry(self) -> Sentry:
        """The given Sentry, else the process-wide one looked up at each event, so a lock
        wrapped before :func:`~stocksentry.instrumentation.configure` still records."""
        if self._sentry is not None:
            return self._sentry
        from .api import get_sentry

        return get_sentry()

    def _error(self, exc: BaseException) -> None:
        # internal_error never raises; the suppress is belt and braces.
        with contextlib.suppress(Exception):
            self.sentry.internal_error(_COMPONENT, exc)

    def _log(self, level: str, event: str, **fields: Any) -> None:
        sentry = self.sentry
        if not sentry.log_enabled:
            return
        try:
            getattr(sentry.logger, level)(event, lock=self.name, **fields)
        except Exception as exc:
            self._error(exc)

    def acquired(
        self,
        started: float,
        *,
        token: str | bytes | None,
        ttl: float | None,
        retries: int = 0,
        attempt_started: float | None = None,
    ) -> LockHold:
        """Record a successful acquire that began at ``started``; returns the hold.

        ``attempt_started`` is when the successful attempt was sent: the lease is counted
        from there, never later than the server started the TTL, so a hold found past its
        deadline really was past the TTL. Without it the lease starts now.
        """
        now = time.perf_counter()
        holder = None
        try:
            holder = token_hash(token)
        except Exception as exc:
            self._error(exc)
        base = now if attempt_started is None else attempt_started
        hold = LockHold(holder, base, base + ttl if ttl else None)
        try:
            metrics = self.sentry.metrics
            metrics.lock_acquire_duration(self.name, "acquired", now - started)
            if retries:
                metrics.lock_acquire_retries(self.name, retries)
        except Exception as exc:
            self._error(exc)
        self._log(
            "info",
            "lock_acquired",
            holder=holder,
            wait_ms=round((now - started) * 1000, 3),
            retries=retries,
            ttl_s=ttl,
        )
        return hold

    def not_acquired(
        self, started: float, *, retries: int = 0, exc: BaseException | None = None
    ) -> None:
        """Record an acquire that gave up (``exc is None``: timeout) or raised ``exc`` (error)."""
        waited = time.perf_counter() - started
        outcome = "timeout" if exc is None else "error"
        try:
            metrics = self.sentry.metrics
            metrics.lock_acquire_duration(self.name, outcome, waited)
            if retries:
                metrics.lock_acquire_retries(self.name, retries)
        except Exception as err:
            self._error(err)
        if exc is None:
            self._log(
                "info",
                "lock_acquire_timeout",
                wait_ms=round(waited * 1000, 3),
                retries=retries,
            )
        else:
            self._log(
                "warning",
                "lock_acquire_error",
                wait_ms=round(waited * 1000, 3),
                error=type(exc).__name__,
            )

    def extended(self, hold: LockHold | None, *, deadline: float | None) -> None:
        """Record a successful extension: the hold's lease now ends at ``deadline``."""
        if hold is not None and deadline is not None:
            hold.deadline = deadline

    def extend_failed(self, hold: LockHold | None, exc: BaseException | None = None) -> None:
        """Record an extension the lock refused (lost, or out of extensions)."""
        try:
            self.sentry.metrics.lock_extend_failure(self.name)
        except Exception as err:
            self._error(err)
        self._log(
            "warning",
            "lock_extend_failed",
            holder=hold.holder if hold is not None else None,
            error=type(exc).__name__ if exc is not None else None,
        )

    def released(
        self,
        hold: LockHold | None,
        *,
        owned: bool | None,
        started: float,
        current_holder: str | bytes | None = None,
        deleted_other_holder: bool | None = None,
    ) -> None:
        """Record a release that began at ``started`` (read the clock *before* releasing).

        ``owned``: whether the key still held our token (``None``: not known). The hold
        expired while held when ``started`` is past its deadline (the lease is counted from
        before the server started the TTL, so this never fires early); a lock without a
        known lease expires when it is found not owned. A hold not owned *before* its
        deadline was lost another way (a naive ``DEL`` by someone else, an overwrite): it
        counts as not owned only, logged with ``reason="lost_before_ttl"``.
        ``current_holder`` is the token found under the key instead of ours (only its hash
        is logged); ``deleted_other_holder`` says a naive release removed it.
        """
        expired = False
        held: float | None = None
        lease: float | None = None
        try:
            metrics = self.sentry.metrics
            if hold is not None:
                held = started - hold.acquired_at
                lease = hold.lease
                if lease is not None and lease > 0:
                    metrics.lock_hold_ratio(self.name, held / lease)
                    expired = held > lease
                else:
                    expired = owned is False
            # Without a hold (nothing acquired through us) there is no expiry to tell, only
            # that the lock was not ours.
            if expired:
                metrics.lock_expired_while_held(self.name)
            if owned is False:
                metrics.lock_release_not_owned(self.name)
        except Exception as exc:
            self._error(exc)
        holder = hold.holder if hold is not None else None
        if expired:
            self._log(
                "warning",
                "lock_expired_while_held",
                holder=holder,
                held_s=None if held is None else round(held, 6),
                ttl_s=None if lease is None else round(lease, 6),
            )
        if owned is False:
            fields: dict[str, Any] = {"holder": holder}
            try:
                if current_holder is not None:
                    fields["current_holder"] = token_hash(current_holder)
            except Exception as exc:
                self._error(exc)
            if deleted_other_holder is not None:
                fields["deleted_other_holder"] = deleted_other_holder
            if hold is None:
                fields["reason"] = "not_held"
            elif not expired:
                fields["reason"] = "lost_before_ttl"
            self._log("warning", "lock_release_not_owned", **fields)


class _Attempts:
    """The attempts of one acquire (readable after an exception too)."""

    __slots__ = ("count", "last_started")

    def __init__(self) -> None:
        self.count = 0
        self.last_started: float | None = None

    def begin(self) -> None:
        """Call just before each attempt."""
        self.count += 1
        self.last_started = time.perf_counter()

    @property
    def retries(self) -> int:
        """Attempts after the first."""
        return max(0, self.count - 1)


class _Holds:
    """Open holds of one wrapper, by token: redis-py keeps one token per thread."""

    __slots__ = ("_holds", "_lock")

    def __init__(self) -> None:
        self._holds: dict[bytes | None, LockHold] = {}
        self._lock = threading.Lock()

    def put(self, token: bytes | None, hold: LockHold) -> None:
        with self._lock:
            if len(self._holds) >= _MAX_OPEN_HOLDS:
                # Holds the app never released: drop the oldest rather than grow.
                self._holds.pop(next(iter(self._holds)))
            self._holds[token] = hold

    def get(self, token: bytes | None) -> LockHold | None:
        with self._lock:
            return self._holds.get(token)

    def pop(self, token: bytes | None) -> LockHold | None:
        with self._lock:
            return self._holds.pop(token, None)


# --- redis-py Lock -------------------------------------------------------------------------


class _RedisPyLockBase(Generic[_L]):
    """What the sync and asyncio wrappers of redis-py's ``Lock`` share."""

    def __init__(
        self,
        lock: _L,
        *,
        name: str | None = None,
        sentry: Sentry | None = None,
        count_retries: bool = True,
    ) -> None:
        from redis.exceptions import LockError, LockNotOwnedError

        self.lock = lock
        # The library lock is typed per subclass; its name attribute is read untyped here.
        self.name = name if name is not None else _text(getattr(lock, "name", ""))
        self.count_retries = count_retries
        self.recorder = LockRecorder(self.name, sentry)
        self._lock_error = LockError
        self._not_owned_error = LockNotOwnedError
        self._holds = _Holds()

    def _token(self, lock: Any) -> bytes | None:
        try:
            return _as_bytes(lock.local.token)
        except Exception as exc:
            self.recorder._error(exc)
            return None

    def _record_acquire(
        self, lock: Any, started: float, acquired: bool, attempts: _Attempts
    ) -> None:
        try:
            if acquired:
                token = self._token(lock)
                hold = self.recorder.acquired(
                    started,
                    token=token,
                    ttl=lock.timeout,
                    retries=attempts.retries,
                    attempt_started=attempts.last_started,
                )
                self._holds.put(token, hold)
            else:
                self.recorder.not_acquired(started, retries=attempts.retries)
        except Exception as exc:
            self.recorder._error(exc)

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
            self.recorder._error(err)


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
        if lock.acquire(blocking_timeout=2):
            try:
                reserve()
            finally:
                lock.release()  # LockNotOwnedError if the 5 s ran out: counted, re-raised
    """

    def acquire(
        self,
        sleep: float | None = None,
        blocking: bool | None = None,
        blocking_timeout: float | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """``Lock.acquire``, timed: outcome acquired, timeout (returned False) or error."""
        lock = self.lock
        started = time.perf_counter()
        attempts = _Attempts()
        try:
            blocks = lock.blocking if blocking is None else blocking
            if self.count_retries and blocks:
                acquired = self._acquire_counting(sleep, blocking_timeout, token, attempts)
            else:
                if not blocks:
                    attempts.begin()  # one attempt: the lease starts no later than now
                acquired = bool(
                    lock.acquire(
                        sleep=sleep,
                        blocking=blocking,
                        blocking_timeout=blocking_timeout,
                        token=token,  # type: ignore[arg-type]
                    )
                )
        except Exception as exc:
            self.recorder.not_acquired(started, retries=attempts.retries, exc=exc)
            raise
        self._record_acquire(lock, started, acquired, attempts)
        return acquired

    def _acquire_counting(
        self,
        sleep: float | None,
        blocking_timeout: float | None,
        token: str | bytes | None,
        attempts: _Attempts,
    ) -> bool:
        # redis-py's blocking loop, one non-blocking attempt at a time.
        lock = self.lock
        pause = float(lock.sleep if sleep is None else sleep)
        limit = lock.blocking_timeout if blocking_timeout is None else blocking_timeout
        stop_at = None if limit is None else time.monotonic() + float(limit)
        while True:
            attempts.begin()
            if lock.acquire(blocking=False, token=token):  # type: ignore[arg-type]
                return True
            if stop_at is not None and time.monotonic() + pause > stop_at:
                return False
            time.sleep(pause)

    def release(self) -> None:
        """``Lock.release``; a ``LockNotOwnedError`` is counted, then re-raised unchanged."""
        started = time.perf_counter()
        token = self._token(self.lock)
        try:
            self.lock.release()
        except Exception as exc:
            self._release_failed(exc, token, started)
            raise
        try:
            self.recorder.released(self._holds.pop(token), owned=True, started=started)
        except Exception as exc:
            self.recorder._error(exc)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """``Lock.extend``; a refusal (``LockError``) is counted, then re-raised."""
        started = time.perf_counter()
        hold = self._holds.get(self._token(self.lock))
        try:
            result = self.lock.extend(additional_time, replace_ttl)
        except self._lock_error as exc:
            self.recorder.extend_failed(hold, exc)
            raise
        self.recorder.extended(
            hold, deadline=self._extend_deadline(hold, started, additional_time, replace_ttl)
        )
        return bool(result)

    def reacquire(self) -> bool:
        """``Lock.reacquire`` (the TTL starts again); a refusal is counted, then re-raised."""
        started = time.perf_counter()
        hold = self._holds.get(self._token(self.lock))
        try:
            result = self.lock.reacquire()
        except self._lock_error as exc:
            self.recorder.extend_failed(hold, exc)
            raise
        timeout = self.lock.timeout
        self.recorder.extended(hold, deadline=started + float(timeout) if timeout else None)
        return bool(result)

    def locked(self) -> bool:
        """``Lock.locked``: whether any holder has the key."""
        return bool(self.lock.locked())

    def owned(self) -> bool:
        """``Lock.owned``: whether the key holds this thread's token."""
        return bool(self.lock.owned())

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.lock, attribute)

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
            if getattr(self.lock, "raise_on_release_error", True):
                raise
            logging.getLogger("redis.lock").warning(
                "Lock was unlocked or no longer owned when exiting context manager."
            )


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
        lock = self.lock
        started = time.perf_counter()
        attempts = _Attempts()
        try:
            blocks = lock.blocking if blocking is None else blocking
            if self.count_retries and blocks:
                acquired = await self._acquire_counting(blocking_timeout, token, attempts)
            else:
                if not blocks:
                    attempts.begin()  # one attempt: the lease starts no later than now
                acquired = bool(
                    await lock.acquire(
                        blocking=blocking, blocking_timeout=blocking_timeout, token=token
                    )
                )
        except Exception as exc:
            self.recorder.not_acquired(started, retries=attempts.retries, exc=exc)
            raise
        self._record_acquire(lock, started, acquired, attempts)
        return acquired

    async def _acquire_counting(
        self, blocking_timeout: float | None, token: str | bytes | None, attempts: _Attempts
    ) -> bool:
        lock = self.lock
        pause = float(lock.sleep)
        limit = lock.blocking_timeout if blocking_timeout is None else blocking_timeout
        loop = asyncio.get_running_loop()
        stop_at = None if limit is None else loop.time() + float(limit)
        while True:
            attempts.begin()
            if await lock.acquire(blocking=False, token=token):
                return True
            if stop_at is not None and loop.time() + pause > stop_at:
                return False
            await asyncio.sleep(pause)

    async def release(self) -> None:
        """``Lock.release``; a ``LockNotOwnedError`` is counted, then re-raised unchanged."""
        started = time.perf_counter()
        token = self._token(self.lock)
        try:
            await self.lock.release()
        except Exception as exc:
            self._release_failed(exc, token, started)
            raise
        try:
            self.recorder.released(self._holds.pop(token), owned=True, started=started)
        except Exception as exc:
            self.recorder._error(exc)

    async def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """``Lock.extend``; a refusal (``LockError``) is counted, then re-raised."""
        started = time.perf_counter()
        hold = self._holds.get(self._token(self.lock))
        try:
            result = await self.lock.extend(additional_time, replace_ttl)
        except self._lock_error as exc:
            self.recorder.extend_failed(hold, exc)
            raise
        self.recorder.extended(
            hold, deadline=self._extend_deadline(hold, started, additional_time, replace_ttl)
        )
        return bool(result)

    async def reacquire(self) -> bool:
        """``Lock.reacquire`` (the TTL starts again); a refusal is counted, then re-raised."""
        started = time.perf_counter()
        hold = self._holds.get(self._token(self.lock))
        try:
            result = await self.lock.reacquire()
        except self._lock_error as exc:
            self.recorder.extend_failed(hold, exc)
            raise
        timeout = self.lock.timeout
        self.recorder.extended(hold, deadline=started + float(timeout) if timeout else None)
        return bool(result)

    async def locked(self) -> bool:
        """``Lock.locked``: whether any holder has the key."""
        return bool(await self.lock.locked())

    async def owned(self) -> bool:
        """``Lock.owned``: whether the key holds this lock's token."""
        return bool(await self.lock.owned())

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.lock, attribute)

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
            if getattr(self.lock, "raise_on_release_error", True):
                raise
            logging.getLogger("redis.asyncio.lock").warning(
                "Lock was unlocked or no longer owned when exiting context manager."
            )


# --- pottery Redlock -----------------------------------------------------------------------


class _RedlockBase(Generic[_L]):
    """What the wrappers of pottery's ``Redlock`` and ``AIORedlock`` share.

    A pottery lock holds one lease at a time (its token is an attribute of the object), so
    the hold is one attribute here too.
    """

    def __init__(
        self,
        lock: _L,
        *,
        name: str | None = None,
        sentry: Sentry | None = None,
        count_retries: bool = True,
        retry_delay: float | None = None,
    ) -> None:
        self.lock = lock
        from pottery import (
            ExtendUnlockedLock,
            QuorumNotAchieved,
            ReleaseUnlockedLock,
            TooManyExtensions,
        )

        self.name = name if name is not None else str(getattr(lock, "key", ""))
        self.count_retries = count_retries
        self.retry_delay = retry_delay
        self.recorder = LockRecorder(self.name, sentry)
        self._hold: LockHold | None = None
        self._release_unlocked = ReleaseUnlockedLock
        self._extend_errors: tuple[type[BaseException], ...] = (
            ExtendUnlockedLock,
            TooManyExtensions,
        )
        self._quorum_not_achieved = QuorumNotAchieved

    def _delay(self, lock: Any) -> float:
        if self.retry_delay is not None:
            return self.retry_delay
        return float(getattr(lock, "_RETRY_DELAY", 0.2))

    def _record_acquire(
        self, lock: Any, started: float, acquired: bool, attempts: _Attempts
    ) -> None:
        try:
            if acquired:
                self._hold = self.recorder.acquired(
                    started,
                    # pottery keeps the token private; only its hash is logged.
                    token=getattr(lock, "_uuid", None) or None,
                    ttl=float(lock.auto_release_time),
                    retries=attempts.retries,
                    attempt_started=attempts.last_started,
                )
            else:
                self.recorder.not_acquired(started, retries=attempts.retries)
        except Exception as exc:
            self.recorder._error(exc)

    def _record_release(self, exc: BaseException | None, started: float) -> None:
        hold, self._hold = self._hold, None
        if exc is None:
            self.recorder.released(hold, owned=True, started=started)
        elif isinstance(exc, self._release_unlocked):
            self.recorder.released(hold, owned=False, started=started)
        # Anything else (QuorumIsImpossible, a connection error): the outcome is unknown.

    def _record_extend(self, lock: Any, exc: BaseException | None, started: float) -> None:
        if exc is None:
            # pottery's extend sets the TTL back to auto_release_time from now.
            self.recorder.extended(self._hold, deadline=started + float(lock.auto_release_time))
        elif isinstance(exc, self._extend_errors):
            self.recorder.extend_failed(self._hold, exc)


class InstrumentedRedlock(_RedlockBase["Redlock"]):
    """pottery's ``Redlock``, measured; same methods, arguments and exceptions.

    The TTL is the lock's ``auto_release_time``. ``release()`` re-raises pottery's
    ``ReleaseUnlockedLock`` (the lease ran out) after counting it as not owned and expired;
    ``extend()`` re-raises ``ExtendUnlockedLock`` / ``TooManyExtensions`` after counting an
    extension failure. With ``count_retries`` a blocking acquire runs pottery's loop here
    (non-blocking attempts with a random pause of up to ``retry_delay``, pottery's own
    0.2 s by default) so that retries are counted.

    Example::

        from pottery import Redlock

        lock = InstrumentedRedlock(
            Redlock(key="sku:EGG-01", masters={client}, auto_release_time=5),
            name="checkout",
        )
        with lock:
            reserve()
    """

    def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float = -1,
        raise_on_redis_errors: bool | None = None,
    ) -> bool:
        """``Redlock.acquire``, timed: outcome acquired, timeout or error."""
        lock = self.lock
        started = time.perf_counter()
        attempts = _Attempts()
        try:
            if blocking and self.count_retries:
                acquired = self._acquire_counting(timeout, raise_on_redis_errors, attempts)
            else:
                if not blocking:
                    attempts.begin()  # one attempt: the lease starts no later than now
                acquired = lock.acquire(
                    blocking=blocking,
                    timeout=timeout,
                    raise_on_redis_errors=raise_on_redis_errors,
                )
        except Exception as exc:
            self.recorder.not_acquired(started, retries=attempts.retries, exc=exc)
            raise
        self._record_acquire(lock, started, acquired, attempts)
        return acquired

    def _acquire_counting(
        self, timeout: float, raise_on_redis_errors: bool | None, attempts: _Attempts
    ) -> bool:
        # pottery's blocking loop, one non-blocking attempt at a time.
        lock = self.lock
        delay = self._delay(lock)
        start = time.monotonic()
        while timeout == -1 or time.monotonic() - start < timeout:
            attempts.begin()
            if lock.acquire(blocking=False, raise_on_redis_errors=raise_on_redis_errors):
                return True
            time.sleep(random.uniform(0, delay))  # noqa: S311 - jitter, not cryptography
        return False

    def release(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``Redlock.release``; ``ReleaseUnlockedLock`` is counted, then re-raised."""
        started = time.perf_counter()
        try:
            self.lock.release(raise_on_redis_errors=raise_on_redis_errors)
        except Exception as exc:
            self._record_release(exc, started)
            raise
        self._record_release(None, started)

    def extend(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``Redlock.extend``; a refusal is counted as an extension failure, then re-raised."""
        started = time.perf_counter()
        try:
            self.lock.extend(raise_on_redis_errors=raise_on_redis_errors)
        except Exception as exc:
            self._record_extend(self.lock, exc, started)
            raise
        self._record_extend(self.lock, None, started)

    def locked(self, *, raise_on_redis_errors: bool | None = None) -> float:
        """``Redlock.locked``: seconds left on our lease, 0 when not held."""
        return self.lock.locked(raise_on_redis_errors=raise_on_redis_errors)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.lock, attribute)

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

        from pottery import AIORedlock

        lock = InstrumentedAsyncRedlock(
            AIORedlock(key="sku:EGG-01", masters={async_client}, auto_release_time=5),
            name="checkout",
        )
        async with lock:
            await reserve()
    """

    async def acquire(
        self,
        *,
        blocking: bool = True,
        timeout: float = -1,  # noqa: ASYNC109 - AIORedlock.acquire's own signature
        raise_on_redis_errors: bool | None = None,
    ) -> bool:
        """``AIORedlock.acquire``, timed: outcome acquired, timeout or error."""
        lock = self.lock
        started = time.perf_counter()
        attempts = _Attempts()
        try:
            if blocking and self.count_retries:
                acquired = await self._acquire_counting(timeout, raise_on_redis_errors, attempts)
            else:
                if not blocking:
                    attempts.begin()  # one attempt: the lease starts no later than now
                acquired = await lock.acquire(
                    blocking=blocking,
                    timeout=timeout,
                    raise_on_redis_errors=raise_on_redis_errors,
                )
        except Exception as exc:
            self.recorder.not_acquired(started, retries=attempts.retries, exc=exc)
            raise
        self._record_acquire(lock, started, acquired, attempts)
        return acquired

    async def _acquire_counting(
        self,
        timeout: float,  # noqa: ASYNC109 - AIORedlock.acquire's own argument
        raise_on_redis_errors: bool | None,
        attempts: _Attempts,
    ) -> bool:
        lock = self.lock
        delay = self._delay(lock)
        start = time.monotonic()
        while timeout == -1 or time.monotonic() - start < timeout:
            attempts.begin()
            if await lock.acquire(blocking=False, raise_on_redis_errors=raise_on_redis_errors):
                return True
            await asyncio.sleep(random.uniform(0, delay))  # noqa: S311 - jitter
        return False

    async def release(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``AIORedlock.release``; ``ReleaseUnlockedLock`` is counted, then re-raised."""
        started = time.perf_counter()
        try:
            await self.lock.release(raise_on_redis_errors=raise_on_redis_errors)
        except Exception as exc:
            self._record_release(exc, started)
            raise
        self._record_release(None, started)

    async def extend(self, *, raise_on_redis_errors: bool | None = None) -> None:
        """``AIORedlock.extend``; a refusal is counted as an extension failure, then re-raised."""
        started = time.perf_counter()
        try:
            await self.lock.extend(raise_on_redis_errors=raise_on_redis_errors)
        except Exception as exc:
            self._record_extend(self.lock, exc, started)
            raise
        self._record_extend(self.lock, None, started)

    async def locked(self, *, raise_on_redis_errors: bool | None = None) -> float:
        """``AIORedlock.locked``: seconds left on our lease, 0 when not held."""
        return await self.lock.locked(raise_on_redis_errors=raise_on_redis_errors)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.lock, attribute)

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


@overload
def instrument_lock(
    lock: redis.lock.Lock, *, name: str | None = ..., sentry: Sentry | None = ...
) -> InstrumentedLock: ...
@overload
def instrument_lock(
    lock: redis.asyncio.lock.Lock, *, name: str | None = ..., sentry: Sentry | None = ...
) -> InstrumentedAsyncLock: ...
@overload
def instrument_lock(
    lock: Redlock, *, name: str | None = ..., sentry: Sentry | None = ...
) -> InstrumentedRedlock: ...
@overload
def instrument_lock(
    lock: AIORedlock, *, name: str | None = ..., sentry: Sentry | None = ...
) -> InstrumentedAsyncRedlock: ...
def instrument_lock(
    lock: Any, *, name: str | None = None, sentry: Sentry | None = None
) -> InstrumentedLock | InstrumentedAsyncLock | InstrumentedRedlock | InstrumentedAsyncRedlock:
    """Wrap a redis-py ``Lock`` (sync or asyncio) or a pottery ``Redlock`` / ``AIORedlock``.

    Raises ``TypeError`` for anything else (set-up code: fails fast).

    Example::

        lock = instrument_lock(client.lock("lock:sku:EGG-01", timeout=5), name="checkout")
    """
    # Only modules the app already imported can have made the lock: look there, import none.
    pottery = sys.modules.get("pottery")
    async_redis_lock = sys.modules.get("redis.asyncio.lock")
    redis_lock = sys.modules.get("redis.lock")
    if pottery is not None and isinstance(lock, pottery.AIORedlock):
        return InstrumentedAsyncRedlock(lock, name=name, sentry=sentry)
    if pottery is not None and isinstance(lock, pottery.Redlock):
        return InstrumentedRedlock(lock, name=name, sentry=sentry)
    if async_redis_lock is not None and isinstance(lock, async_redis_lock.Lock):
        return InstrumentedAsyncLock(lock, name=name, sentry=sentry)
    if redis_lock is not None and isinstance(lock, redis_lock.Lock):
        return InstrumentedLock(lock, name=name, sentry=sentry)
    raise TypeError(
        f"cannot instrument {type(lock).__qualname__}: expected a redis-py Lock or a "
        "pottery Redlock; use track_lock() for a home-made lock"
    )


# --- home-made locks -----------------------------------------------------------------------


def _sync_result(value: object) -> object:
    # An asyncio client or coroutine callable in a sync ``with``: its coroutine would be
    # truthy and never run. Set-up error, said plainly.
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()
        raise TypeError("this lock's client or callables are asyncio: use async with")
    return value


async def _resolve(value: object) -> object:
    if inspect.isawaitable(value):
        return await value
    return value


class TrackedLock:
    """A home-made lock given as callables, measured: sync ``with`` and ``async with``.

    ``acquire(token)`` tries once and returns something truthy when the lock was taken;
    ``release(token)`` releases (its return value is ignored); ``owner()``, when given,
    returns the token currently under the lock and is called just before ``release`` to
    tell whether we still owned it (a read, then the release: not atomic, see
    :class:`SetNxLock` for the atomic form). ``extend(token, ttl)``, optional, returns
    something truthy when the lease was renewed for ``ttl`` seconds from now. In
    ``async with`` the callables may be coroutine functions.

    ``blocking_timeout``: 0 tries once (the seeds' lock), ``None`` waits for ever, more
    retries every ``retry_delay`` seconds with jitter (x0.5 to x1.5) until that many seconds
    have passed. Not acquired in time: ``with`` raises :class:`LockNotAcquired`, and
    :meth:`acquire` returns ``False``. An exception from a callable is the app's: counted as
    an ``error`` outcome and passed through unchanged. One instance is one holder: make
    one per use (cheap), do not share one between concurrent threads or tasks.

    Example (the seeds' lock, unchanged, measured)::

        with track_lock(
            "checkout",
            ttl=5,
            acquire=lambda token: r.set("lock:product:8891", token, nx=True, ex=5),
            release=lambda token: r.delete("lock:product:8891"),
            owner=lambda: r.get("lock:product:8891"),
        ):
            reserve()
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

    # --- what a subclass changes (one attempt, one release, one extension) -----------------

    def _attempt(self) -> object:
        if self._acquire_fn is None:
            raise TypeError("TrackedLock needs an acquire callable")
        return self._acquire_fn(self.token)

    def _release_once(self) -> tuple[bool | None, object, bool | None]:
        """Release; returns (owned, the token found under the lock, whether it was deleted)."""
        current: object = None
        owned: bool | None = None
        if self._owner_fn is not None:
            current = self._owner_fn()
            owned = _as_bytes(current) == self.token.encode()
        if self._release_fn is not None:
            self._release_fn(self.token)
        # Whether the release deleted the other holder's key depends on the callable.
        return owned, current, None

    def _extend_once(self, ttl: float) -> object:
        if self._extend_fn is None:
            raise TypeError("this lock has no extend callable")
        return self._extend_fn(self.token, ttl)

    async def _aattempt(self) -> object:
        if self._acquire_fn is None:
            raise TypeError("TrackedLock needs an acquire callable")
        return await _resolve(self._acquire_fn(self.token))

    async def _arelease_once(self) -> tuple[bool | None, object, bool | None]:
        current: object = None
        owned: bool | None = None
        if self._owner_fn is not None:
            current = await _resolve(self._owner_fn())
            owned = _as_bytes(current) == self.token.encode()
        if self._release_fn is not None:
            await _resolve(self._release_fn(self.token))
        return owned, current, None

    async def _aextend_once(self, ttl: float) -> object:
        if self._extend_fn is None:
            raise TypeError("this lock has no extend callable")
        return await _resolve(self._extend_fn(self.token, ttl))

    # --- shared bookkeeping ----------------------------------------------------------------

    def _new_token(self) -> None:
        if self._fixed_token is None:
            self.token = uuid.uuid4().hex

    def _pause(self) -> float:
        return self.retry_delay * random.uniform(0.5, 1.5)  # noqa: S311 - jitter

    def _give_up_at(self) -> float | None:
        timeout = self.blocking_timeout
        return None if timeout is None else time.monotonic() + timeout

    def _record_release(
        self, started: float, verdict: tuple[bool | None, object, bool | None]
    ) -> bool | None:
        owned, current, deleted_other = verdict
        hold, self.hold = self.hold, None
        self.recorder.released(
            hold,
            owned=owned,
            started=started,
            current_holder=_as_bytes(current) if owned is False else None,
            deleted_other_holder=deleted_other if owned is False else None,
        )
        return owned

    def _record_extend(self, ok: object, ttl: float, started: float) -> bool:
        if ok:
            self.recorder.extended(self.hold, deadline=started + ttl)
            return True
        self.recorder.extend_failed(self.hold)
        return False

    # --- sync ------------------------------------------------------------------------------

    def acquire(self) -> bool:
        """Try (and retry until ``blocking_timeout``); ``True`` once held."""
        started = time.perf_counter()
        stop_at = self._give_up_at()
        attempts = _Attempts()
        self._new_token()
        try:
            while True:
                attempts.begin()
                if _sync_result(self._attempt()):
                    break
                pause = self._pause()
                if stop_at is not None and time.monotonic() + pause > stop_at:
                    self.recorder.not_acquired(started, retries=attempts.retries)
                    return False
                time.sleep(pause)
        except Exception as exc:
            self.recorder.not_acquired(started, retries=attempts.retries, exc=exc)
            raise
        self.hold = self.recorder.acquired(
            started,
            token=self.token,
            ttl=self.ttl,
            retries=attempts.retries,
            attempt_started=attempts.last_started,
        )
        return True

    def release(self) -> bool | None:
        """Release; returns whether the lock was still ours (``None``: not known)."""
        started = time.perf_counter()
        try:
            verdict = self._release_once()
        except Exception:
            self.hold = None
            raise
        return self._record_release(started, verdict)

    def extend(self, ttl: float | None = None) -> bool:
        """Renew the lease for ``ttl`` (default: the lock's TTL) seconds from now.

        Returns ``False`` (and counts an extension failure) when the lock refused.
        """
        started = time.perf_counter()
        seconds = ttl if ttl is not None else self.ttl
        if seconds is None:
            raise ValueError("extend needs a ttl: this lock has none")
        return self._record_extend(_sync_result(self._extend_once(seconds)), seconds, started)

    def __enter__(self) -> TrackedLock:
        started = time.perf_counter()
        if not self.acquire():
            raise LockNotAcquired(self.name, time.perf_counter() - started)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self.release()
        return False

    # --- asyncio ---------------------------------------------------------------------------

    async def aacquire(self) -> bool:
        """The asyncio form of :meth:`acquire`."""
        started = time.perf_counter()
        stop_at = self._give_up_at()
        attempts = _Attempts()
        self._new_token()
        try:
            while True:
                attempts.begin()
                if await self._aattempt():
                    break
                pause = self._pause()
                if stop_at is not None and time.monotonic() + pause > stop_at:
                    self.recorder.not_acquired(started, retries=attempts.retries)
                    return False
                await asyncio.sleep(pause)
        except Exception as exc:
            self.recorder.not_acquired(started, retries=attempts.retries, exc=exc)
            raise
        self.hold = self.recorder.acquired(
            started,
            token=self.token,
            ttl=self.ttl,
            retries=attempts.retries,
            attempt_started=attempts.last_started,
        )
        return True

    async def arelease(self) -> bool | None:
        """The asyncio form of :meth:`release`."""
        started = time.perf_counter()
        try:
            verdict = await self._arelease_once()
        except Exception:
            self.hold = None
            raise
        return self._record_release(started, verdict)

    async def aextend(self, ttl: float | None = None) -> bool:
        """The asyncio form of :meth:`extend`."""
        started = time.perf_counter()
        seconds = ttl if ttl is not None else self.ttl
        if seconds is None:
            raise ValueError("extend needs a ttl: this lock has none")
        return self._record_extend(await self._aextend_once(seconds), seconds, started)

    async def __aenter__(self) -> TrackedLock:
        started = time.perf_counter()
        if not await self.aacquire():
            raise LockNotAcquired(self.name, time.perf_counter() - started)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        await self.arelease()
        return False


def track_lock(
    name: str,
    *,
    ttl: float | None,
    acquire: Callable[[str], object],
    release: Callable[[str], object],
    owner: Callable[[], object] | None = None,
    extend: Callable[[str, float], object] | None = None,
    token: str | None = None,
    blocking_timeout: float | None = 0.0,
    retry_delay: float = 0.05,
    sentry: Sentry | None = None,
) -> TrackedLock:
    """A :class:`TrackedLock`: measure a home-made lock given as callables.

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
    return TrackedLock(
        name,
        ttl=ttl,
        acquire=acquire,
        release=release,
        owner=owner,
        extend=extend,
        token=token,
        blocking_timeout=blocking_timeout,
        retry_delay=retry_delay,
        sentry=sentry,
    )


# KEYS[1] the lock key; ARGV[1] our token; ARGV[2] "1" to delete whatever is there (the
# naive DEL, kept so that the bug stays observable), "0" to delete only our own token.
# Returns the value that was under the key, read in the same atomic step as the delete.
_RELEASE_LUA = """
local current = redis.call('get', KEYS[1])
if ARGV[2] == '1' or current == ARGV[1] then
    redis.call('del', KEYS[1])
end
return current
"""
# Renew the TTL (ms) only while the token is ours.
_EXTEND_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""


class SetNxLock(TrackedLock):
    """The seeds' home-made Redis lock, ``SET key token NX PX ttl``, measured.

    ``release="naive"`` is the seeds' ``DEL key``: it deletes whatever is under the key,
    another holder's token included, as the original did, but it reads the value in the
    same Lua step, so the bug is counted (``release_not_owned``, ``expired_while_held``)
    and logged with ``deleted_other_holder``. ``release="owned"`` is the fix: compare and
    delete, the key is deleted only while it still holds our token. :meth:`extend` renews
    the TTL only while the token is ours. ``client`` is a ``redis.Redis`` for ``with`` or a
    ``redis.asyncio.Redis`` for ``async with``. ``ttl`` is in seconds (kept to the
    millisecond). Other arguments as in :class:`TrackedLock`.

    Example::

        with SetNxLock(client, "lock:product:8891", name="checkout", ttl=5, release="naive"):
            reserve()  # 6 s of work: counted as expired while held at release
    """

    def __init__(
        self,
        client: Any,
        key: str,
        *,
        name: str,
        ttl: float,
        release: Literal["naive", "owned"] = "owned",
        token: str | None = None,
        blocking_timeout: float | None = 0.0,
        retry_delay: float = 0.05,
        sentry: Sentry | None = None,
    ) -> None:
        if release not in ("naive", "owned"):
            raise ValueError(f"release must be 'naive' or 'owned', got {release!r}")
        super().__init__(
            name,
            ttl=ttl,
            token=token,
            blocking_timeout=blocking_timeout,
            retry_delay=retry_delay,
            sentry=sentry,
        )
        self.client = client
        self.key = key
        self.release_mode = release
        self._ttl_ms = max(1, round(ttl * 1000))
        self._release_script = client.register_script(_RELEASE_LUA)
        self._extend_script = client.register_script(_EXTEND_LUA)

    def _release_args(self) -> list[str]:
        return [self.token, "1" if self.release_mode == "naive" else "0"]

    def _verdict(self, current: object) -> tuple[bool | None, object, bool | None]:
        owned = _as_bytes(current) == self.token.encode()
        deleted_other = self.release_mode == "naive" and not owned and current is not None
        return owned, current, deleted_other

    def _attempt(self) -> object:
        return self.client.set(self.key, self.token, nx=True, px=self._ttl_ms)

    def _release_once(self) -> tuple[bool | None, object, bool | None]:
        return self._verdict(self._release_script(keys=[self.key], args=self._release_args()))

    def _extend_once(self, ttl: float) -> object:
        ms = max(1, round(ttl * 1000))
        return self._extend_script(keys=[self.key], args=[self.token, ms])

    async def _aattempt(self) -> object:
        return await _resolve(self.client.set(self.key, self.token, nx=True, px=self._ttl_ms))

    async def _arelease_once(self) -> tuple[bool | None, object, bool | None]:
        current = await _resolve(self._release_script(keys=[self.key], args=self._release_args()))
        return self._verdict(current)

    async def _aextend_once(self, ttl: float) -> object:
        ms = max(1, round(ttl * 1000))
        return await _resolve(self._extend_script(keys=[self.key], args=[self.token, ms]))
