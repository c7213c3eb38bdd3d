"""The recorder every lock form uses: one named lock's events into a Sentry.

:class:`LockRecorder` turns acquire, extend and release into the catalog's lock metrics
and log lines (:meth:`LockRecorder.attempting` times one acquire and counts the error
outcome, for every form); :class:`LockHold` is one acquisition; ``LockWrapper`` is what
the redis-py and pottery wrappers share. Nothing here imports a lock library.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .. import catalog, events
from ..events import LogEvent
from ..heldlocks import hold_released, hold_started

if TYPE_CHECKING:
    from ..sentry import Sentry

#: Holds kept per wrapper for locks the app never released (a bound against leaks).
_MAX_OPEN_HOLDS = 1024
_COMPONENT = "locks"
# The wrapped library lock: redis-py Lock (sync or asyncio) or pottery Redlock/AIORedlock.
LockT = TypeVar("LockT")
T = TypeVar("T")


class Pause(float):
    """A step of :data:`Steps`: sleep this many seconds (``time.sleep`` or ``asyncio.sleep``)."""


#: What a lock operation does, written once for sync and asyncio: a generator that yields
#: each call to the lock library (a zero-argument callable, or a :class:`Pause`) and is sent
#: its result (or thrown its exception); :func:`run_sync` and :func:`run_async` drive it.
Steps = Generator[Callable[[], object] | Pause, Any, T]


def sync_result(value: object) -> object:
    """``value``, refused when awaitable: an asyncio client or coroutine callable in sync
    code would be a truthy coroutine that never runs. Set-up error, said plainly."""
    if inspect.isawaitable(value):
        close = getattr(value, "close", None)
        if close is not None:
            close()
        raise TypeError("this lock's client or callables are asyncio: use async with")
    return value


async def resolve(value: object) -> object:
    """``value``, awaited when it is awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value


def run_sync(steps: Steps[T]) -> T:
    """Drive ``steps`` in sync code."""
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Pause):
                    time.sleep(step)
                    result: object = None
                else:
                    result = sync_result(step())
            except BaseException as exc:
                step = steps.throw(exc)
            else:
                step = steps.send(result)
    except StopIteration as done:
        value: T = done.value
        return value


async def run_async(steps: Steps[T]) -> T:
    """Drive ``steps`` in asyncio code: each call's result is awaited when awaitable."""
    try:
        step = next(steps)
        while True:
            try:
                if isinstance(step, Pause):
                    await asyncio.sleep(step)
                    result: object = None
                else:
                    result = await resolve(step())
            except BaseException as exc:
                step = steps.throw(exc)
            else:
                step = steps.send(result)
    except StopIteration as done:
        value: T = done.value
        return value


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


def as_bytes(value: object) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(value).encode()


def as_text(value: str | bytes) -> str:
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
    #: The lock's name (what its series are labelled with).
    name: str = ""
    #: Set at the release: the held-locks view (:mod:`..heldlocks`) then skips it.
    released: bool = False
    #: The fencing token issued for this acquisition (wrappers built with ``fencing=True``).
    fencing_token: int | None = None

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
        from ..api import get_sentry

        return get_sentry()

    def internal_error(self, exc: BaseException) -> None:
        # internal_error never raises; the suppress is belt and braces.
        with contextlib.suppress(Exception):
            self.sentry.internal_error(_COMPONENT, exc)

    def _log(self, event: LogEvent, **fields: Any) -> None:
        self.sentry.log_event(event, lock=self.name, **fields)

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
            self.internal_error(exc)
        base = now if attempt_started is None else attempt_started
        hold = LockHold(holder, base, base + ttl if ttl else None, self.name)
        try:
            hold_started(hold)
        except Exception as exc:
            self.internal_error(exc)
        try:
            metrics = self.sentry.metrics
            metrics.observe(catalog.LOCK_ACQUIRE_DURATION, now - started, self.name, "acquired")
            if retries:
                metrics.count(catalog.LOCK_ACQUIRE_RETRIES, self.name, amount=retries)
        except Exception as exc:
            self.internal_error(exc)
        self._log(
            events.LOCK_ACQUIRED,
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
            metrics.observe(catalog.LOCK_ACQUIRE_DURATION, waited, self.name, outcome)
            if retries:
                metrics.count(catalog.LOCK_ACQUIRE_RETRIES, self.name, amount=retries)
        except Exception as err:
            self.internal_error(err)
        if exc is None:
            self._log(
                events.LOCK_ACQUIRE_TIMEOUT,
                wait_ms=round(waited * 1000, 3),
                retries=retries,
            )
        else:
            self._log(
                events.LOCK_ACQUIRE_ERROR,
                wait_ms=round(waited * 1000, 3),
                error=type(exc).__name__,
            )

    @contextlib.contextmanager
    def attempting(self) -> Iterator[Attempts]:
        """Time one acquire, from now: the body counts its attempts in what this yields.

        An exception from the body (the app's or the lock library's) is recorded as an
        ``error`` outcome, then propagates unchanged; the body records the other outcomes.

        Example::

            with recorder.attempting() as attempts:
                attempts.begin()
                acquired = try_lock()
        """
        try:
            # The lock's other series (expiries, foreign releases) exist from its first
            # attempt on, so their first increase is seen.
            self.sentry.metrics.prime_lock(self.name)
        except Exception as exc:
            self.internal_error(exc)
        attempts = Attempts()
        try:
            yield attempts
        except Exception as exc:
            self.not_acquired(attempts.started, retries=attempts.retries, exc=exc)
            raise

    def extended(self, hold: LockHold | None, *, deadline: float | None) -> None:
        """Record a successful extension: the hold's lease now ends at ``deadline``."""
        if hold is not None and deadline is not None:
            hold.deadline = deadline

    def extend_failed(self, hold: LockHold | None, exc: BaseException | None = None) -> None:
        """Record an extension the lock refused (lost, or out of extensions)."""
        try:
            self.sentry.metrics.count(catalog.LOCK_EXTEND_FAILURES, self.name)
        except Exception as err:
            self.internal_error(err)
        self._log(
            events.LOCK_EXTEND_FAILED,
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
        if hold is not None:
            hold.released = True
            try:
                hold_released(hold)
            except Exception as exc:
                self.internal_error(exc)
        try:
            metrics = self.sentry.metrics
            if hold is not None:
                held = started - hold.acquired_at
                lease = hold.lease
                if lease is not None and lease > 0:
                    metrics.observe(catalog.LOCK_HOLD_RATIO, held / lease, self.name)
                    expired = held > lease
                else:
                    expired = owned is False
            # Without a hold (nothing acquired through us) there is no expiry to tell, only
            # that the lock was not ours.
            if expired:
                metrics.count(catalog.LOCK_EXPIRED_WHILE_HELD, self.name)
            if owned is False:
                metrics.count(catalog.LOCK_RELEASE_NOT_OWNED, self.name)
        except Exception as exc:
            self.internal_error(exc)
        holder = hold.holder if hold is not None else None
        if expired:
            self._log(
                events.LOCK_EXPIRED_WHILE_HELD,
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
                self.internal_error(exc)
            if deleted_other_holder is not None:
                fields["deleted_other_holder"] = deleted_other_holder
            if hold is None:
                fields["reason"] = "not_held"
            elif not expired:
                fields["reason"] = "lost_before_ttl"
            self._log(events.LOCK_RELEASE_NOT_OWNED, **fields)


class Attempts:
    """The attempts of one acquire that began at ``started`` (readable after an exception)."""

    __slots__ = ("count", "last_started", "started")

    def __init__(self) -> None:
        self.started = time.perf_counter()
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


class Holds:
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


class LockWrapper(Generic[LockT]):
    """What every wrapper of a library's lock holds: the lock, its label, its recorder.

    The attributes a wrapper does not define are the wrapped lock's.
    """

    def __init__(
        self, lock: LockT, name: str, sentry: Sentry | None, count_retries: bool, fencing: bool
    ) -> None:
        self.lock = lock
        self.name = name
        self.count_retries = count_retries
        self.fencing = fencing
        self.recorder = LockRecorder(name, sentry)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.lock, attribute)

    def _acquiring(
        self,
        blocks: bool,
        once: Callable[[], object],
        attempt: Callable[[], object],
        keep_trying: Callable[[], bool],
        pause: Callable[[], float | None],
    ) -> Steps[bool]:
        """One acquire, timed. With ``count_retries`` a blocking acquire is the library's
        own loop run here, so that its retries are counted: ``attempt`` (one non-blocking
        try) while ``keep_trying()``, ``pause()`` seconds apart (``None``: give up). Else
        ``once`` is the library's own call, which does its own waiting (if any)."""
        with self.recorder.attempting() as attempts:
            if self.count_retries and blocks:
                acquired = False
                while keep_trying():
                    attempts.begin()
                    if (yield attempt):
                        acquired = True
                        break
                    seconds = pause()
                    if seconds is None:
                        break
                    yield Pause(seconds)
            else:
                if not blocks:
                    attempts.begin()  # one attempt: the lease starts no later than now
                acquired = bool((yield once))
        self._record_acquire(acquired, attempts)
        if acquired and self.fencing:
            yield from self._issuing_token()
        return acquired

    def _record_acquire(self, acquired: bool, attempts: Attempts) -> None:
        raise NotImplementedError

    def _issuing_token(self) -> Steps[None]:
        raise NotImplementedError


# --- fencing tokens ------------------------------------------------------------------------

#: Issues the next token of ``KEYS[2]`` only while ``KEYS[1]`` (the lock) holds our token
#: ``ARGV[1]``: atomic on the server, so a token is never issued to a holder that has
#: already lost the lock, and every later holder's token is higher.
FENCE_SCRIPT = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('incr', KEYS[2])
end
return false
"""


def fence_key(lock_key: str | bytes) -> str:
    """The Redis key of the fencing counter of the lock stored at ``lock_key``.

    Example::

        >>> fence_key("lock:sku:EGG-01")
        'lock:sku:EGG-01:fence'
    """
    return f"{as_text(lock_key)}:fence"
