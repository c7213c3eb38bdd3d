"""Distributed-lock instrumentation against the real Redis: a lock expiring mid-work, counted.

The naive-lock scenarios run here on a home-made ``SET NX`` lock measured through
``track_lock`` (:class:`TestHomeMadeLock`); they are written once in :mod:`lockscenarios`
and run on the lab's lock too. Every key lives under the test's ``redis_prefix`` (pottery
adds its own ``redlock:`` namespace in front, so those keys are deleted by the tests
themselves). Times are short but far apart (TTL 0.2 s against 0.4 s of work), so the values
asserted are exact.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import lockscenarios
import pytest
import redis
import redis.asyncio
from lockscenarios import (
    ACQUIRE,
    EXPIRED,
    EXTEND_FAILURES,
    NOT_OWNED,
    RATIO,
    REDIS_URL,
    RETRIES,
    acquires,
    aioredlock,
    value,
)
from prometheus_client import CollectorRegistry
from redis.exceptions import LockError, LockNotOwnedError
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.locks import (
    InstrumentedAsyncLock,
    InstrumentedAsyncRedlock,
    InstrumentedLock,
    InstrumentedRedlock,
    LockRecorder,
    TrackedLock,
    instrument_lock,
    track_lock,
)

pytestmark = pytest.mark.integration

# The shared fixtures, named here so that pytest finds them for this module.
sentry = lockscenarios.sentry
client = lockscenarios.client


def naive_lock(
    client: redis.Redis | redis.asyncio.Redis,
    key: str,
    *,
    name: str,
    ttl: float,
    blocking_timeout: float | None = 0.0,
    retry_delay: float = 0.05,
    sentry: Sentry | None = None,
    naive_del: bool = True,
) -> TrackedLock:
    """A home-made ``SET key token NX PX ttl`` lock released by a plain ``DEL``, measured.

    The release reads the key first (``owner``), then deletes whatever is there: the naive
    lock that deletes another holder's key once its own lease ran out. With an asyncio
    client the callables return coroutines, for ``async with``. ``naive_del`` is there for
    :class:`~lockscenarios.NaiveLockScenarios`: this lock's release always is that plain DEL.
    """
    ms = max(1, round(ttl * 1000))
    return track_lock(
        name,
        ttl=ttl,
        acquire=lambda token: client.set(key, token, nx=True, px=ms),
        release=lambda token: client.delete(key),
        owner=lambda: client.get(key),
        blocking_timeout=blocking_timeout,
        retry_delay=retry_delay,
        sentry=sentry,
    )


# --- a home-made lock: SET NX, naive DEL --------------------------------------------------


class TestHomeMadeLock(lockscenarios.NaiveLockScenarios):
    """The naive-lock scenarios on :func:`naive_lock`, whose release always is a plain DEL."""

    make = staticmethod(naive_lock)
    # A read, then a DEL given as callables: the lock cannot tell what the DEL removed.
    deleted_other_holder = None


def test_generic_tracked_lock_with_the_apps_own_calls(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    """A naive lock's own calls, unchanged, measured through callables."""
    key = redis_prefix + "lock:generic"

    def tracked() -> TrackedLock:
        return track_lock(
            "generic",
            ttl=0.2,
            acquire=lambda token: client.set(key, token, nx=True, px=200),
            release=lambda token: client.delete(key),
            owner=lambda: client.get(key),
            sentry=sentry,
        )

    first = tracked()
    assert first.acquire()
    time.sleep(0.3)
    with tracked():
        assert first.release() is False
        assert client.get(key) is None  # the first one's DEL removed the second's key
    assert value(registry, EXPIRED, lock="generic") == 1
    assert value(registry, NOT_OWNED, lock="generic") == 2
    assert acquires(registry, "generic", "acquired") == 2


# --- redis-py Lock ------------------------------------------------------------------------


def test_redis_py_lock_not_owned_is_counted_and_reraised(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    lock = instrument_lock(client.lock(redis_prefix + "rp", timeout=0.1), name="rp", sentry=sentry)
    assert isinstance(lock, InstrumentedLock)
    assert lock.acquire(blocking=False)
    time.sleep(0.2)
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert value(registry, NOT_OWNED, lock="rp") == 1
    assert value(registry, EXPIRED, lock="rp") == 1
    assert acquires(registry, "rp", "acquired") == 1

    # The with form: the body's work outlives the TTL, __exit__ raises as redis-py does.
    with pytest.raises(LockNotOwnedError), lock:
        time.sleep(0.2)
    assert value(registry, NOT_OWNED, lock="rp") == 2
    assert value(registry, EXPIRED, lock="rp") == 2

    # raise_on_release_error=False: redis-py swallows it, so does the wrapper (counted).
    quiet = InstrumentedLock(
        client.lock(redis_prefix + "rp", timeout=0.1, raise_on_release_error=False),
        name="rp",
        sentry=sentry,
    )
    with quiet:
        time.sleep(0.2)
    assert value(registry, NOT_OWNED, lock="rp") == 3


def test_redis_py_lock_happy_path_extend_and_app_error(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    lock = InstrumentedLock(client.lock(redis_prefix + "ok", timeout=1.0), sentry=sentry)
    name = redis_prefix + "ok"  # the default label is the lock's key
    with lock:
        time.sleep(0.2)
        assert lock.extend(1.0)  # the lease is now 2 s
        time.sleep(0.2)
        assert lock.owned()
    assert value(registry, EXPIRED, lock=name) == 0
    assert value(registry, NOT_OWNED, lock=name) == 0
    ratio = value(registry, f"{RATIO}_sum", lock=name)
    assert 0.19 < ratio < 1.0  # 0.4 s or more of 2 s, and not past the lease

    error = KeyError("sku")
    with pytest.raises(KeyError) as info, lock:
        raise error
    assert info.value is error
    assert not lock.locked()

    # Extending a lost lock: LockNotOwnedError, counted as an extension failure.
    assert lock.acquire()
    time.sleep(1.1)
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)
    assert value(registry, EXTEND_FAILURES, lock=name) == 1
    with pytest.raises(LockNotOwnedError):
        lock.release()
    # Releasing twice: redis-py's LockError (no token), a release of a lock not owned.
    with pytest.raises(LockError):
        lock.release()
    assert value(registry, NOT_OWNED, lock=name) == 2
    assert value(registry, EXPIRED, lock=name) == 1


def test_redis_py_lock_acquire_timeout(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "busy"
    holder = client.lock(key, timeout=5)
    assert holder.acquire()
    try:
        lock = InstrumentedLock(
            client.lock(key, timeout=5, sleep=0.1, blocking_timeout=0.25),
            name="busy",
            sentry=sentry,
        )
        started = time.perf_counter()
        assert lock.acquire() is False
        # It waited, and gave up long before the holder's 5 s lock would go.
        assert 0.15 < time.perf_counter() - started < 5.0
        assert acquires(registry, "busy", "timeout") == 1
        # Attempts at 0, 0.1 and 0.2 s, the next past 0.25 s; a slow machine gets one retry.
        assert 1 <= value(registry, RETRIES, lock="busy") <= 2
        with pytest.raises(LockError, match="Unable to acquire lock"), lock:
            pytest.fail("entered a held lock")
        assert acquires(registry, "busy", "timeout") == 2
    finally:
        holder.release()


def test_second_holder_enters_after_expiry_in_threads(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    """redis-py's Lock is safe: A's release fails instead of deleting B's key."""
    key = redis_prefix + "threads"
    a = InstrumentedLock(client.lock(key, timeout=0.2), name="threads", sentry=sentry)
    b = InstrumentedLock(
        client.lock(key, timeout=5, sleep=0.01, blocking_timeout=3), name="threads", sentry=sentry
    )
    b_in = threading.Event()
    done = threading.Event()

    def second() -> None:
        with b:
            b_in.set()
            done.wait(5)

    assert a.acquire()
    thread = threading.Thread(target=second)
    thread.start()
    assert b_in.wait(3)
    with pytest.raises(LockNotOwnedError):
        a.release()
    assert client.get(key) is not None  # B's key survived
    done.set()
    thread.join(5)
    assert value(registry, EXPIRED, lock="threads") == 1
    assert value(registry, NOT_OWNED, lock="threads") == 1
    assert acquires(registry, "threads", "acquired") == 2


# --- asyncio ------------------------------------------------------------------------------


async def test_asyncio_redis_py_lock_in_tasks(
    redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        key = redis_prefix + "async"
        first = instrument_lock(client.lock(key, timeout=0.2), name="async", sentry=sentry)
        assert isinstance(first, InstrumentedAsyncLock)
        second = InstrumentedAsyncLock(
            client.lock(key, timeout=5, sleep=0.01, blocking_timeout=3),
            name="async",
            sentry=sentry,
        )
        entered = asyncio.Event()
        finish = asyncio.Event()

        async def holder_b() -> None:
            async with second:
                entered.set()
                await finish.wait()

        assert await first.acquire()
        task = asyncio.create_task(holder_b())
        await asyncio.wait_for(entered.wait(), 3)
        with pytest.raises(LockNotOwnedError):
            await first.release()
        finish.set()
        await task
        assert value(registry, EXPIRED, lock="async") == 1
        assert value(registry, NOT_OWNED, lock="async") == 1
        assert acquires(registry, "async", "acquired") == 2

    finally:
        await client.aclose()


# --- pottery Redlock ----------------------------------------------------------------------


def test_pottery_redlock_expiry_and_extension_failures(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    import pottery

    def redlock(**options: Any) -> pottery.Redlock:
        """A pottery Redlock on the test's key and its one Redis master."""
        return pottery.Redlock(key=redis_prefix + "redlock", masters={client}, **options)

    lock = instrument_lock(redlock(auto_release_time=1.0), name="redlock", sentry=sentry)
    assert isinstance(lock, InstrumentedRedlock)
    try:
        with lock:
            time.sleep(0.1)
            lock.extend()  # the lease is 0.1 + 1 s now
            time.sleep(0.15)
        assert value(registry, EXPIRED, lock="redlock") == 0
        assert value(registry, NOT_OWNED, lock="redlock") == 0

        assert lock.acquire()
        time.sleep(1.1)
        with pytest.raises(pottery.ExtendUnlockedLock):
            lock.extend()
        assert value(registry, EXTEND_FAILURES, lock="redlock") == 1
        with pytest.raises(pottery.ReleaseUnlockedLock):
            lock.release()
        assert value(registry, EXPIRED, lock="redlock") == 1
        assert value(registry, NOT_OWNED, lock="redlock") == 1

        limited = InstrumentedRedlock(
            redlock(auto_release_time=1, num_extensions=0), name="redlock", sentry=sentry
        )
        with limited, pytest.raises(pottery.TooManyExtensions):
            limited.extend()
        assert value(registry, EXTEND_FAILURES, lock="redlock") == 2

        # Timeout: another holder keeps the key; retries counted, QuorumNotAchieved raised.
        blocker = redlock(auto_release_time=5)
        assert blocker.acquire(blocking=False)
        waiting = InstrumentedRedlock(
            redlock(auto_release_time=1, context_manager_timeout=1.0),
            name="redlock",
            retry_delay=0.02,
            sentry=sentry,
        )
        with pytest.raises(pottery.QuorumNotAchieved), waiting:
            pytest.fail("entered a held Redlock")
        blocker.release()
        assert acquires(registry, "redlock", "timeout") == 1
        assert value(registry, RETRIES, lock="redlock") >= 3
        assert acquires(registry, "redlock", "acquired") == 3
    finally:
        client.delete("redlock:" + redis_prefix + "redlock")


async def test_pottery_aioredlock(
    redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    import pottery

    key = redis_prefix + "aioredlock"
    async with aioredlock(key, "aioredlock", sentry, auto_release_time=0.1) as lock:
        assert isinstance(lock, InstrumentedAsyncRedlock)
        with pytest.raises(pottery.ReleaseUnlockedLock):
            async with lock:
                await asyncio.sleep(0.2)
        assert value(registry, EXPIRED, lock="aioredlock") == 1
        assert value(registry, NOT_OWNED, lock="aioredlock") == 1
        assert acquires(registry, "aioredlock", "acquired") == 1


# --- odds and ends ------------------------------------------------------------------------


def test_instrument_lock_refuses_other_objects(sentry: Sentry) -> None:
    with pytest.raises(TypeError, match="use track_lock"):
        instrument_lock(threading.Lock(), sentry=sentry)  # type: ignore[call-overload]


def test_tracked_lock_set_up_errors_raise(sentry: Sentry) -> None:
    with pytest.raises(ValueError, match="ttl must be"):
        track_lock("bad", ttl=0, sentry=sentry)
    with pytest.raises(ValueError, match="retry_delay"):
        track_lock("bad", ttl=5, retry_delay=-1, sentry=sentry)
    bare = track_lock("bad", ttl=None, sentry=sentry)
    with pytest.raises(TypeError, match="acquire callable"):
        bare.acquire()
    with pytest.raises(ValueError, match="needs a ttl"):
        bare.extend()
    with pytest.raises(TypeError, match="no extend callable"):
        bare.extend(5)


def test_recorder_without_ttl_and_release_without_hold(
    registry: CollectorRegistry, sentry: Sentry
) -> None:
    recorder = LockRecorder("bare", sentry)
    hold = recorder.acquired(time.perf_counter(), token="t", ttl=None)  # noqa: S106 - a test token
    recorder.released(hold, owned=False, started=time.perf_counter())
    # No known lease: a token no longer ours is the only sign, and it counts as expiry.
    assert value(registry, EXPIRED, lock="bare") == 1
    assert value(registry, NOT_OWNED, lock="bare") == 1
    assert value(registry, f"{RATIO}_count", lock="bare") == 0
    recorder.released(None, owned=False, started=time.perf_counter())
    assert value(registry, NOT_OWNED, lock="bare") == 2
    assert value(registry, EXPIRED, lock="bare") == 1


def test_lock_label_is_bounded(registry: CollectorRegistry, sentry: Sentry) -> None:
    for n in range(60):
        LockRecorder(f"lock:product:{n}", sentry).not_acquired(time.perf_counter())
    names = {
        s.labels["lock"]
        for family in registry.collect()
        for s in family.samples
        if s.name == f"{ACQUIRE}_count"
    }
    assert len(names) == 51  # the small-label budget, plus __other__
    assert "__other__" in names
