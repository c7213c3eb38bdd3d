"""Distributed-lock instrumentation against the real Redis: a lock expiring mid-work, counted.

Every key lives under the test's ``redis_prefix`` (pottery adds its own ``redlock:``
namespace in front, so those keys are deleted by the tests themselves). Times are short
but far apart (TTL 0.2 s against 0.4 s of work), so the values asserted are exact.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
import structlog
from prometheus_client import CollectorRegistry
from redis.exceptions import LockError, LockNotOwnedError
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.locks import (
    InstrumentedAsyncLock,
    InstrumentedAsyncRedlock,
    InstrumentedLock,
    InstrumentedRedlock,
    LockNotAcquired,
    LockRecorder,
    TrackedLock,
    instrument_lock,
    token_hash,
    track_lock,
)
from stocksentry.instrumentation.logs import bind_correlation, configure_logging

pytestmark = pytest.mark.integration

ACQUIRE = "stock_lock_acquire_duration_seconds"
RATIO = "stock_lock_hold_ratio"
EXPIRED = "stock_lock_expired_while_held_total"
NOT_OWNED = "stock_lock_release_not_owned_total"
EXTEND_FAILURES = "stock_lock_extend_failures_total"
RETRIES = "stock_lock_acquire_retries_total"
ERRORS = "stocksentry_instrumentation_errors_total"
# The same Redis as the redis_prefix fixture of conftest.py.
REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def acquires(registry: CollectorRegistry, lock: str, outcome: str) -> float:
    return value(registry, f"{ACQUIRE}_count", lock=lock, outcome=outcome)


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    try:
        yield c
    finally:
        c.close()


def naive_lock(
    client: redis.Redis | redis.asyncio.Redis,
    key: str,
    *,
    name: str,
    ttl: float,
    blocking_timeout: float | None = 0.0,
    retry_delay: float = 0.05,
    sentry: Sentry | None = None,
) -> TrackedLock:
    """A home-made ``SET key token NX PX ttl`` lock released by a plain ``DEL``, measured.

    The release reads the key first (``owner``), then deletes whatever is there: the naive
    lock that deletes another holder's key once its own lease ran out. With an asyncio
    client the callables return coroutines, for ``async with``.
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


def test_happy_path_acquire_hold_release(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "lock:product:8891"
    with naive_lock(client, key, name="checkout", ttl=1.0, sentry=sentry) as lock:
        assert client.get(key) == lock.token.encode()
        time.sleep(0.15)
    assert client.get(key) is None
    assert acquires(registry, "checkout", "acquired") == 1
    assert acquires(registry, "checkout", "timeout") == 0
    assert value(registry, f"{RATIO}_count", lock="checkout") == 1
    assert 0.14 < value(registry, f"{RATIO}_sum", lock="checkout") < 0.25
    # 0.15 s of a 1 s TTL: in the 0.25 bucket, not in the 0.1 one.
    assert value(registry, f"{RATIO}_bucket", lock="checkout", le="0.25") == 1
    assert value(registry, f"{RATIO}_bucket", lock="checkout", le="0.1") == 0
    assert value(registry, EXPIRED, lock="checkout") == 0
    assert value(registry, NOT_OWNED, lock="checkout") == 0
    assert value(registry, RETRIES, lock="checkout") == 0


def test_naive_del_deletes_the_second_holders_lock(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    """Holder A works 0.4 s on a 0.2 s TTL; B enters at expiry; A's DEL removes B's key."""
    key = redis_prefix + "lock:product:8891"
    b_inside = threading.Event()
    a_released = threading.Event()
    seen_by_b: list[bytes | None] = []

    def holder_b() -> None:
        lock = naive_lock(
            client,
            key,
            name="checkout",
            ttl=5.0,
            blocking_timeout=3.0,
            retry_delay=0.01,
            sentry=sentry,
        )
        with lock:
            b_inside.set()
            a_released.wait(5)
            # B is still working: the key that guarded it is gone.
            seen_by_b.append(client.get(key))

    lock_a = naive_lock(client, key, name="checkout", ttl=0.2, sentry=sentry)
    assert lock_a.acquire()
    b = threading.Thread(target=holder_b)
    b.start()
    assert b_inside.wait(3), "B never got in after A's TTL ran out"
    time.sleep(0.2)  # A goes on working: 0.4 s in all
    b_token = client.get(key)
    assert b_token is not None
    assert b_token != lock_a.token.encode()
    assert lock_a.release() is False
    # The bug, proven: A's DEL deleted B's key while B still holds "the lock".
    assert client.get(key) is None
    assert value(registry, EXPIRED, lock="checkout") == 1
    assert value(registry, NOT_OWNED, lock="checkout") == 1
    a_released.set()
    b.join(5)
    assert seen_by_b == [None]
    # B's own release then finds the key empty: not owned, but B did not outlive its TTL.
    assert value(registry, NOT_OWNED, lock="checkout") == 2
    assert value(registry, EXPIRED, lock="checkout") == 1
    assert acquires(registry, "checkout", "acquired") == 2
    assert value(registry, RETRIES, lock="checkout") > 0
    assert value(registry, f"{RATIO}_count", lock="checkout") == 2
    # A held 0.4 s of 0.2 s (ratio 2, above the 1.5 bucket); B a fraction of its 5 s.
    assert value(registry, f"{RATIO}_bucket", lock="checkout", le="1.5") == 1
    assert value(registry, f"{RATIO}_bucket", lock="checkout", le="5.0") == 2


def test_acquire_timeout_and_retries(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "lock:busy"
    client.set(key, b"held-by-another", px=5000)
    lock = naive_lock(
        client, key, name="busy", ttl=1, blocking_timeout=0.3, retry_delay=0.05, sentry=sentry
    )
    started = time.perf_counter()
    with pytest.raises(LockNotAcquired) as info, lock:
        pytest.fail("entered a held lock")
    assert 0.2 < time.perf_counter() - started < 1.0
    assert info.value.name == "busy"
    assert acquires(registry, "busy", "timeout") == 1
    assert acquires(registry, "busy", "acquired") == 0
    assert value(registry, RETRIES, lock="busy") >= 3
    # A naive lock's single try: blocking_timeout=0 gives up at once, no retry.
    single = naive_lock(client, key, name="single", ttl=1, sentry=sentry)
    assert single.acquire() is False
    assert acquires(registry, "single", "timeout") == 1
    assert value(registry, RETRIES, lock="single") == 0
    assert client.get(key) == b"held-by-another"


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


def test_app_exceptions_pass_through_and_the_lock_is_released(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "lock:app-error"
    error = RuntimeError("pricing service down")
    with (
        pytest.raises(RuntimeError) as info,
        naive_lock(client, key, name="app", ttl=1, sentry=sentry),
    ):
        raise error
    assert info.value is error
    assert client.get(key) is None
    assert value(registry, NOT_OWNED, lock="app") == 0

    def broken_acquire(token: str) -> object:
        raise ConnectionError("redis went away")

    with pytest.raises(ConnectionError):
        track_lock("app", ttl=1, acquire=broken_acquire, release=print, sentry=sentry).acquire()
    assert acquires(registry, "app", "error") == 1


def test_instrumentation_failures_never_reach_the_app(
    client: redis.Redis,
    redis_prefix: str,
    registry: CollectorRegistry,
    sentry: Sentry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("metrics broke")

    monkeypatch.setattr(sentry.metrics, "lock_acquire_duration", boom)
    monkeypatch.setattr(sentry.metrics, "lock_hold_ratio", boom)
    key = redis_prefix + "lock:broken"
    with naive_lock(client, key, name="broken", ttl=1, sentry=sentry) as lock:
        assert lock.hold is not None
    assert client.get(key) is None
    assert value(registry, ERRORS, component="locks") == 2


def test_logs_carry_lock_correlation_ids_and_only_a_token_hash(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry
) -> None:
    stream = io.StringIO()
    previous = structlog.get_config()
    configure_logging("INFO", stream=stream, bridge_stdlib=False)
    try:
        sentry = Sentry(registry=registry, trace=False)
        key = redis_prefix + "lock:logged"
        with bind_correlation(request_id="req-a", sku="SKU-8891"):
            lock_a = naive_lock(client, key, name="logged", ttl=0.1, sentry=sentry)
            assert lock_a.acquire()
            time.sleep(0.2)
            client.set(key, b"token-of-b", px=5000)
            lock_a.release()
    finally:
        structlog.configure(**previous)
    events = {e["event"]: e for e in map(json.loads, stream.getvalue().splitlines())}
    acquired = events["lock_acquired"]
    expired = events["lock_expired_while_held"]
    not_owned = events["lock_release_not_owned"]
    for event in (acquired, expired, not_owned):
        assert event["lock"] == "logged"
        assert event["request_id"] == "req-a"
        assert event["sku"] == "SKU-8891"
        assert event["holder"] == token_hash(lock_a.token)
    assert expired["level"] == not_owned["level"] == "warning"
    assert expired["ttl_s"] == pytest.approx(0.1)
    assert expired["held_s"] > 0.19
    assert not_owned["current_holder"] == token_hash(b"token-of-b")
    assert lock_a.token not in stream.getvalue()
    assert "token-of-b" not in stream.getvalue()


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
    lock = InstrumentedLock(client.lock(redis_prefix + "ok", timeout=0.3), sentry=sentry)
    name = redis_prefix + "ok"  # the default label is the lock's key
    with lock:
        time.sleep(0.2)
        assert lock.extend(0.3)  # the lease is now 0.6 s
        time.sleep(0.2)
        assert lock.owned()
    assert value(registry, EXPIRED, lock=name) == 0
    assert value(registry, NOT_OWNED, lock=name) == 0
    ratio = value(registry, f"{RATIO}_sum", lock=name)
    assert 0.6 < ratio < 1.0  # 0.4 s of 0.6 s

    error = KeyError("sku")
    with pytest.raises(KeyError) as info, lock:
        raise error
    assert info.value is error
    assert not lock.locked()

    # Extending a lost lock: LockNotOwnedError, counted as an extension failure.
    assert lock.acquire()
    time.sleep(0.4)
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
        assert 0.15 < time.perf_counter() - started < 0.5
        assert acquires(registry, "busy", "timeout") == 1
        # Attempts at 0, 0.1 and 0.2 s; the next would be past 0.25 s.
        assert value(registry, RETRIES, lock="busy") == 2
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


async def test_asyncio_redis_py_lock_and_naive_lock_in_tasks(
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

        # A naive lock in tasks: A deletes B's key.
        naive_key = redis_prefix + "async-naive"
        a = naive_lock(client, naive_key, name="async-naive", ttl=0.1, sentry=sentry)
        assert await a.aacquire()
        b = naive_lock(
            client,
            naive_key,
            name="async-naive",
            ttl=5,
            blocking_timeout=3,
            retry_delay=0.01,
            sentry=sentry,
        )
        async with b:
            assert await a.arelease() is False
            assert await client.get(naive_key) is None
        assert value(registry, EXPIRED, lock="async-naive") == 1
        assert value(registry, NOT_OWNED, lock="async-naive") == 2
        assert value(registry, RETRIES, lock="async-naive") > 0
    finally:
        await client.aclose()


# --- pottery Redlock ----------------------------------------------------------------------


def test_pottery_redlock_expiry_and_extension_failures(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    import pottery

    redlock = pottery.Redlock(
        key=redis_prefix + "redlock", masters={client}, auto_release_time=0.2
    )
    lock = instrument_lock(redlock, name="redlock", sentry=sentry)
    assert isinstance(lock, InstrumentedRedlock)
    try:
        with lock:
            time.sleep(0.1)
            lock.extend()  # the lease is 0.1 + 0.2 s now
            time.sleep(0.15)
        assert value(registry, EXPIRED, lock="redlock") == 0
        assert value(registry, NOT_OWNED, lock="redlock") == 0

        assert lock.acquire()
        time.sleep(0.3)
        with pytest.raises(pottery.ExtendUnlockedLock):
            lock.extend()
        assert value(registry, EXTEND_FAILURES, lock="redlock") == 1
        with pytest.raises(pottery.ReleaseUnlockedLock):
            lock.release()
        assert value(registry, EXPIRED, lock="redlock") == 1
        assert value(registry, NOT_OWNED, lock="redlock") == 1

        limited = InstrumentedRedlock(
            pottery.Redlock(
                key=redis_prefix + "redlock",
                masters={client},
                auto_release_time=1,
                num_extensions=0,
            ),
            name="redlock",
            sentry=sentry,
        )
        with limited, pytest.raises(pottery.TooManyExtensions):
            limited.extend()
        assert value(registry, EXTEND_FAILURES, lock="redlock") == 2

        # Timeout: another holder keeps the key; retries counted, QuorumNotAchieved raised.
        blocker = pottery.Redlock(
            key=redis_prefix + "redlock", masters={client}, auto_release_time=5
        )
        assert blocker.acquire(blocking=False)
        waiting = InstrumentedRedlock(
            pottery.Redlock(
                key=redis_prefix + "redlock",
                masters={client},
                auto_release_time=1,
                context_manager_timeout=0.2,
            ),
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

    client = redis.asyncio.Redis.from_url(REDIS_URL)
    key = redis_prefix + "aioredlock"
    try:
        lock = instrument_lock(
            pottery.AIORedlock(key=key, masters={client}, auto_release_time=0.1),
            name="aioredlock",
            sentry=sentry,
        )
        assert isinstance(lock, InstrumentedAsyncRedlock)
        with pytest.raises(pottery.ReleaseUnlockedLock):
            async with lock:
                await asyncio.sleep(0.2)
        assert value(registry, EXPIRED, lock="aioredlock") == 1
        assert value(registry, NOT_OWNED, lock="aioredlock") == 1
        assert acquires(registry, "aioredlock", "acquired") == 1
    finally:
        await client.delete("redlock:" + key)
        await client.aclose()


# --- odds and ends ------------------------------------------------------------------------


def test_instrument_lock_refuses_other_objects(sentry: Sentry) -> None:
    with pytest.raises(TypeError, match="use track_lock"):
        instrument_lock(threading.Lock(), sentry=sentry)  # type: ignore[call-overload]


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


async def test_asyncio_client_in_a_sync_with_is_a_clear_error(
    redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        lock = naive_lock(client, redis_prefix + "mixed", name="mixed", ttl=1, sentry=sentry)
        with pytest.raises(TypeError, match="use async with"), lock:
            pytest.fail("entered")
        assert acquires(registry, "mixed", "error") == 1
        assert await client.get(redis_prefix + "mixed") is None
    finally:
        await client.aclose()


def test_a_lock_wrapped_before_configure_records_into_the_configured_sentry(
    client: redis.Redis, redis_prefix: str
) -> None:
    from stocksentry.instrumentation import configure, get_sentry

    before = get_sentry()
    lock = naive_lock(client, redis_prefix + "early", name="early", ttl=5)  # no sentry given
    registry = CollectorRegistry()
    configured = configure(registry=registry, log=False, trace=False)
    try:
        with lock:
            pass
        assert (
            registry.get_sample_value(
                "stock_lock_acquire_duration_seconds_count",
                {"lock": "early", "outcome": "acquired"},
            )
            == 1.0
        )
    finally:
        configured.close()
        assert before is not configured
