"""The recorder every lock form uses (:class:`LockRecorder`, :class:`LockHold`), and
:func:`run_sync` / :func:`run_async`, which drive a lock operation written once for both.
Nothing here imports a lock library.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .. import catalog, events
from ..events import LogEvent
from ..heldlocks import hold_released, hold_started

if TYPE_CHECKING:
    from ..sentry import Sentry

T = TypeVar("T")


class Pause(float):
    """A step of :data:`Steps`: sleep this many seconds (``time.sleep`` or ``asyncio.sleep``)."""


#: What a lock operation does, written once for sync and asyncio: a generator that yields
#: each call to the lock library (a zero-argument callable, or a :class:`Pause`) and is sent
#: its result (or thrown its exception); :func:`run_sync` and :func:`run_async` drive it.
Steps = Generator[Callable[[], object] | Pause, Any, T]


async def run_async(steps: Steps[T], *, blocking: bool = False) -> T:
    """Drive ``steps`` in asyncio code: each call's result is awaited when awaitable. With
    ``blocking`` (:func:`run_sync`) it sleeps and calls as sync code does, awaiting nothing."""
    try:
        step = next(steps)
        while True:
            try:
                result: object = None
                if not isinstance(step, Pause):
                    result = step()
                    if inspect.isawaitable(result):
                        if blocking:
                            # An asyncio client or callable in sync code (its truthy
                            # coroutine would never run): a set-up error, said plainly.
                            close = getattr(result, "close", None)
                            if close is not None:
                                close()
                            raise TypeError(
                                "this lock's client or callables are asyncio: use async with"
                            )
                        result = await result
                elif blocking:
                    time.sleep(step)  # noqa: ASYNC251 - run_sync's run, in sync code
                else:
                    await asyncio.sleep(step)
            except BaseException as exc:
                step = steps.throw(exc)
            else:
                step = steps.send(result)
    except StopIteration as done:
        value: T = done.value
        return value


def run_sync(steps: Steps[T]) -> T:
    """Drive ``steps`` in sync code: the blocking :func:`run_async`, which never suspends,
    runs to its end at the first ``send``."""
    try:
        run_async(steps, blocking=True).send(None)
    except StopIteration as done:
        value: T = done.value
        return value
    raise AssertionError("a blocking run of lock steps suspended")


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
    if value is None or isinstance(value, bytes):
        return value
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
            self.sentry.internal_error("locks", exc)

    @contextlib.contextmanager
    def counting_errors(self) -> Iterator[None]:
        """A failure of stocksentry's own in the body: counted as an internal error, never
        raised (the body stops there)."""
        try:
            yield
        except Exception as exc:
            self.internal_error(exc)

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
        with self.counting_errors():
            holder = token_hash(token)
        base = now if attempt_started is None else attempt_started
        hold = LockHold(holder, base, base + ttl if ttl else None, self.name)
        with self.counting_errors():
            hold_started(hold)
        self._count_acquire("acquired", now - started, retries)
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
        self._count_acquire("timeout" if exc is None else "error", waited, retries)
        wait_ms = round(waited * 1000, 3)
        if exc is None:
            self._log(events.LOCK_ACQUIRE_TIMEOUT, wait_ms=wait_ms, retries=retries)
        else:
            self._log(events.LOCK_ACQUIRE_ERROR, wait_ms=wait_ms, error=type(exc).__name__)

    def _count_acquire(self, outcome: str, waited: float, retries: int) -> None:
        with self.counting_errors():
            metrics = self.sentry.metrics
            metrics.observe(catalog.LOCK_ACQUIRE_DURATION, waited, self.name, outcome)
            if retries:
                metrics.count(catalog.LOCK_ACQUIRE_RETRIES, self.name, amount=retries)

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
        with self.counting_errors():
            # The lock's other series (expiries, foreign releases) exist from its first
            # attempt on, so their first increase is seen.
            self.sentry.metrics.prime_lock(self.name)
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
        with self.counting_errors():
            self.sentry.metrics.count(catalog.LOCK_EXTEND_FAILURES, self.name)
        self._log(
            events.LOCK_EXTEND_FAILED,
            holder=hold.holder if hold is not None else None,
            error=type(exc).__name__ if exc is not None else None,
        )

    def abandoned(self, hold: LockHold | None) -> None:
        """Take ``hold`` out of the held locks after a release that raised, recording
        nothing: whether the lock was still ours is not known, but the code after the
        release is no longer under it (the unsafe-write detector must not think so)."""
        if hold is not None:
            hold.released = True
            with self.counting_errors():
                hold_released(hold)

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
            with self.counting_errors():
                hold_released(hold)
        with self.counting_errors():
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
            with self.counting_errors():
                if current_holder is not None:
                    fields["current_holder"] = token_hash(current_holder)
            if deleted_other_holder is not None:
                fields["deleted_other_holder"] = deleted_other_holder
            if hold is None:
                fields["reason"] = "not_held"
            elif not expired:
                fields["reason"] = "lost_before_ttl"
            self._log(events.LOCK_RELEASE_NOT_OWNED, **fields)


@dataclass(slots=True)
class Attempts:
    """The attempts of one acquire that began at ``started`` (readable after an exception)."""

    started: float = field(default_factory=time.perf_counter)
    count: int = 0
    last_started: float | None = None

    def begin(self) -> None:
        """Call just before each attempt."""
        self.count += 1
        self.last_started = time.perf_counter()

    @property
    def retries(self) -> int:
        """Attempts after the first."""
        return max(0, self.count - 1)
