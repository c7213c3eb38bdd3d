"""What the wrappers of redis-py's and pottery's locks share: :class:`LockWrapper`.

It measures the library lock's acquire, release and extension, and fetches fencing
tokens, over a few hooks each wrapper fills in. Nothing here imports a lock library.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypedDict, TypeVar

from .recorder import LockHold, LockRecorder, Pause, Steps, as_text

if TYPE_CHECKING:
    from ..sentry import Sentry

#: Holds kept per wrapper for locks the app never released (a bound against leaks).
_MAX_OPEN_HOLDS = 1024
# The wrapped library lock: redis-py Lock (sync or asyncio) or pottery Redlock/AIORedlock.
LockT = TypeVar("LockT")
#: Exception classes of a lock library.
Errors = tuple[type[BaseException], ...]


class LockOptions(TypedDict, total=False):
    """The keyword arguments of ``instrument_lock``, the wrappers' own."""

    name: str | None
    sentry: Sentry | None
    fencing: bool


class WrapperOptions(LockOptions, total=False):
    """The keyword arguments every wrapper of a library's lock takes."""

    count_retries: bool


class LockWrapper(Generic[LockT]):
    """What every wrapper of a library's lock holds and does: the lock, its label, its
    recorder, its open holds, and the acquire, release, extension and fencing they measure.

    The attributes a wrapper does not define are the wrapped lock's.
    """

    #: The names of the library lock's attributes that hold its Redis key and its TTL.
    key_attribute: ClassVar[str]
    ttl_attribute: ClassVar[str]

    def __init__(
        self,
        lock: LockT,
        *,
        name: str | None = None,
        sentry: Sentry | None = None,
        count_retries: bool = True,
        fencing: bool = False,
    ) -> None:
        self.lock = lock
        #: The lock's Redis key, as the library holds it.
        self.lock_key: str | bytes = getattr(lock, self.key_attribute)
        self.name = name if name is not None else as_text(self.lock_key)
        self.count_retries = count_retries
        self.fencing = fencing
        self.recorder = LockRecorder(self.name, sentry)
        #: The library's errors for a release, and an extension, of a lock no longer ours.
        self.release_refused, self.extend_refused = self._refusals()
        # Open holds, by token: redis-py keeps one token per thread.
        self._holds: dict[bytes | None, LockHold] = {}
        # One registered fencing script per master client (registering hashes the script):
        # each script holds its client, so a cached id is never reused by another one.
        self._fence_scripts: dict[int, Any] = {}

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.lock, attribute)

    # --- what a wrapper tells of its library's lock ------------------------------------------

    def _refusals(self) -> tuple[Errors, Errors]:
        """The library's errors for a release, and an extension, of a lock no longer ours
        (imported at the wrapper's making: the app made the lock with that library)."""
        raise NotImplementedError

    def _token(self) -> bytes | None:
        """The token under the lock's key while held here, ``None`` when not known."""
        return None

    def _issuing_token(self) -> Steps[int | None]:
        """The fencing token of the hold just acquired (``None``: none issued)."""
        raise NotImplementedError

    # --- measured ------------------------------------------------------------------------------

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current hold (this thread's, for redis-py's sync lock):
        higher than every token issued before for the lock's key. ``None`` without
        ``fencing=True``, when not held, or when the lock was lost before the token could be
        issued (then do not write: another holder may be in). Over several Redlock masters
        it is as monotonic as the masters stay up (see ``docs/locks.md``)."""
        hold = self._holds.get(self._token())
        return hold.fencing_token if hold is not None else None

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
        with self.recorder.counting_errors():
            if not acquired:
                self.recorder.not_acquired(attempts.started, retries=attempts.retries)
                return False
            token = self._token()
            hold = self.recorder.acquired(
                attempts.started,
                # A token we do not know (pottery keeps its own private): an id of ours.
                token=token if token is not None else uuid.uuid4().hex,
                ttl=getattr(self.lock, self.ttl_attribute),
                retries=attempts.retries,
                attempt_started=attempts.last_started,
            )
            if len(self._holds) >= _MAX_OPEN_HOLDS:
                # Holds the app never released: drop the oldest (of a copy: threads share it).
                self._holds.pop(next(iter(self._holds.copy())), None)
            self._holds[token] = hold
            if self.fencing:
                # A failure leaves the token None, counted, never raised.
                hold.fencing_token = yield from self._issuing_token()
        return True

    @contextlib.contextmanager
    def _releasing(self) -> Iterator[None]:
        """Measure the release the body makes; one that raised is counted, then re-raised."""
        started = time.perf_counter()
        token = self._token()
        try:
            yield
        except Exception as exc:
            hold = self._holds.pop(token, None)
            if isinstance(exc, self.release_refused):
                self.recorder.released(hold, owned=False, started=started)
            else:
                # Anything else (a connection error, QuorumIsImpossible): the outcome is
                # unknown, nothing is recorded, but the hold is over for the app.
                self.recorder.abandoned(hold)
            raise
        self.recorder.released(self._holds.pop(token, None), owned=True, started=started)

    @contextlib.contextmanager
    def _extending(self, seconds: float | None, *, added: bool = False) -> Iterator[None]:
        """Measure the extension the body makes: the lease then ends ``seconds`` from now
        (``added``: from its old deadline; ``None``: not known). A refusal is counted, then
        re-raised."""
        started = time.perf_counter()
        hold = self._holds.get(self._token())
        try:
            yield
        except self.extend_refused as exc:
            self.recorder.extend_failed(hold, exc)
            raise
        base = (hold.deadline if hold is not None else None) if added else started
        if base is not None and seconds is not None:
            self.recorder.extended(hold, deadline=base + float(seconds))

    def _fence_script(self, master: Any) -> Any:
        script = self._fence_scripts.get(id(master))
        if script is None:
            script = self._fence_scripts[id(master)] = master.register_script(FENCE_SCRIPT)
        return script

    def _fence(self, masters: Iterable[Any], token: bytes | None) -> Steps[int | None]:
        """The lock's next fencing token on its masters: the highest that a majority of them
        issued while the lock held ``token`` (``None``: the token that majority shows), the
        lagging masters of that majority then raised to it."""
        keys = [self.lock_key, f"{as_text(self.lock_key)}:fence"]
        scripts = [self._fence_script(master) for master in masters]
        issued: list[tuple[bytes, int] | None] = []
        failure: Exception | None = None
        for script in scripts:
            try:
                found = yield partial(script, keys=keys, args=[token or b"", 0, 1])
            except Exception as exc:  # a master down: Redlock itself goes on with the rest
                failure, found = exc, None
            issued.append((found[0], int(found[1])) if found else None)
        holders = Counter(found[0] for found in issued if found is not None)
        holder, count = holders.most_common(1)[0] if holders else (b"", 0)
        if count <= len(scripts) // 2:
            if failure is not None:
                raise failure  # not issued for want of the masters: counted
            return None
        top = max(found[1] for found in issued if found is not None and found[0] == holder)
        for script, found in zip(scripts, issued, strict=True):
            if found is not None and found[0] == holder and found[1] < top:
                with contextlib.suppress(Exception):
                    yield partial(script, keys=keys, args=[holder, top, 0])
        return top


# --- fencing tokens ------------------------------------------------------------------------

#: On one master, atomically: while the lock ``KEYS[1]`` is held (by the token ``ARGV[1]``;
#: ``''``: by anyone), the counter ``KEYS[2]`` plus ``ARGV[3]`` (1 issues the next token, 0
#: only raises), and at least ``ARGV[2]``; returns the holder's token and the counter. A
#: token is thus never issued to a holder that has already lost the lock.
FENCE_SCRIPT = """
local holder = redis.call('get', KEYS[1])
if not holder or (ARGV[1] ~= '' and holder ~= ARGV[1]) then
  return false
end
local c = tonumber(redis.call('get', KEYS[2]) or '0') + tonumber(ARGV[3])
c = math.max(c, tonumber(ARGV[2]))
redis.call('set', KEYS[2], c)
return {holder, c}
"""
