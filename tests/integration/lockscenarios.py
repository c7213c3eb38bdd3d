"""The naive-lock scenarios against the real Redis, written once for every ``SET NX`` lock.

A lock that expires mid-work, and the holder whose plain ``DEL`` deletes the next holder's
lock, counted. :class:`NaiveLockScenarios` holds the scenarios as test methods; a test module
subclasses it (as ``Test…``) and says how to build its lock in :attr:`~NaiveLockScenarios.make`:
``test_locks.py`` runs them on a home-made lock measured through ``track_lock``,
``test_lab_naive_lock.py`` on the lab's ``SetNxLock``. The module also holds the metric names,
the sample readers and the fixtures both modules use (a module names a fixture at its top
level, ``client = lockscenarios.client``, so that pytest finds it there).

Every key lives under the test's ``redis_prefix``. Times are short but far apart (TTL 0.2 s
against 0.4 s of work), so the values asserted are exact.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import ClassVar

import pytest
import redis
import redis.asyncio
import structlog
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.locks import (
    InstrumentedAsyncRedlock,
    LockNotAcquired,
    TrackedLock,
    instrument_lock,
    token_hash,
    track_lock,
)
from stocksentry.instrumentation.logs import bind_correlation, configure_logging

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
    """The sample's value, 0 when the series does not exist (yet)."""
    sample = registry.get_sample_value(name, labels)
    return 0.0 if sample is None else sample


def acquires(registry: CollectorRegistry, lock: str, outcome: str) -> float:
    """How many acquisitions of ``lock`` ended with ``outcome``."""
    return value(registry, f"{ACQUIRE}_count", lock=lock, outcome=outcome)


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    """A sentry recording into the test's registry, without logs or traces."""
    return Sentry(registry=registry, log=False, trace=False)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    """A sync client of the test Redis, closed afterwards."""
    c = redis.Redis.from_url(REDIS_URL)
    try:
        yield c
    finally:
        c.close()


@contextlib.asynccontextmanager
async def aioredlock(
    key: str, name: str, sentry: Sentry, auto_release_time: float
) -> AsyncIterator[InstrumentedAsyncRedlock]:
    """An instrumented pottery ``AIORedlock`` on ``key``, its one master an asyncio client of
    the test Redis; the key (``redlock:`` in front) deleted and the client closed afterwards."""
    import pottery

    aclient = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        yield instrument_lock(
            pottery.AIORedlock(key=key, masters={aclient}, auto_release_time=auto_release_time),
            name=name,
            sentry=sentry,
        )
    finally:
        await aclient.delete("redlock:" + key)
        await aclient.aclose()


class NaiveLockScenarios:
    """The scenarios of a ``SET NX`` lock whose release can be a plain ``DEL``.

    A subclass sets :attr:`make` and :attr:`deleted_other_holder`.
    """

    #: Builds the lock under test: ``make(client, key, *, name, ttl, naive_del=False,
    #: blocking_timeout=0.0, retry_delay=0.05, sentry=None)``, a ``redis.Redis`` client for
    #: ``with`` or a ``redis.asyncio.Redis`` one for ``async with``. ``naive_del``: the
    #: scenario needs the release to be a plain ``DEL`` that deletes another holder's key (a
    #: lock that has only that release ignores it); the other options are ``TrackedLock``'s.
    make: ClassVar[Callable[..., TrackedLock]]
    #: What the ``lock_release_not_owned`` log line says in ``deleted_other_holder`` after a
    #: naive release deleted another holder's key (``None``: the field is absent, the lock
    #: cannot tell).
    deleted_other_holder: ClassVar[bool | None]

    def next_holder(
        self, client: redis.Redis | redis.asyncio.Redis, key: str, name: str, sentry: Sentry
    ) -> TrackedLock:
        """The naive lock of a second holder: it waits up to 3 s for ``key``, trying every
        10 ms, then holds it for 5 s."""
        return self.make(
            client,
            key,
            name=name,
            ttl=5.0,
            naive_del=True,
            blocking_timeout=3.0,
            retry_delay=0.01,
            sentry=sentry,
        )

    def test_happy_path_acquire_hold_release(
        self, client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
    ) -> None:
        key = redis_prefix + "lock:product:8891"
        with self.make(client, key, name="checkout", ttl=1.0, sentry=sentry) as lock:
            assert client.get(key) == lock.token.encode()
            time.sleep(0.15)
        assert client.get(key) is None
        assert acquires(registry, "checkout", "acquired") == 1
        assert acquires(registry, "checkout", "timeout") == 0
        assert value(registry, f"{RATIO}_count", lock="checkout") == 1
        # At least the 0.15 s slept, of a 1 s TTL: above the 0.1 bucket and under the TTL
        # (however slow the machine, short of a hold that really outlived its lock).
        assert 0.14 < value(registry, f"{RATIO}_sum", lock="checkout") < 1.0
        assert value(registry, f"{RATIO}_bucket", lock="checkout", le="1.0") == 1
        assert value(registry, f"{RATIO}_bucket", lock="checkout", le="0.1") == 0
        assert value(registry, EXPIRED, lock="checkout") == 0
        assert value(registry, NOT_OWNED, lock="checkout") == 0
        assert value(registry, RETRIES, lock="checkout") == 0

    def test_naive_del_deletes_the_second_holders_lock(
        self, client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
    ) -> None:
        """Holder A works 0.4 s on a 0.2 s TTL; B enters at expiry; A's DEL removes B's key."""
        key = redis_prefix + "lock:product:8891"
        b_inside = threading.Event()
        a_released = threading.Event()
        seen_by_b: list[bytes | None] = []

        def holder_b() -> None:
            lock = self.next_holder(client, key, "checkout", sentry)
            with lock:
                b_inside.set()
                a_released.wait(5)
                # B is still working: the key that guarded it is gone.
                seen_by_b.append(client.get(key))

        lock_a = self.make(client, key, name="checkout", ttl=0.2, naive_del=True, sentry=sentry)
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
        # B's ratio is a fraction of its lease; A's grows with a slow machine, so only B's
        # side of the 1.0 edge is certain.
        assert value(registry, f"{RATIO}_bucket", lock="checkout", le="1.0") == 1

    def test_acquire_timeout_and_retries(
        self, client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
    ) -> None:
        key = redis_prefix + "lock:busy"
        client.set(key, b"held-by-another", px=5000)
        lock = self.make(
            client, key, name="busy", ttl=1, blocking_timeout=1.0, retry_delay=0.05, sentry=sentry
        )
        started = time.perf_counter()
        with pytest.raises(LockNotAcquired) as info, lock:
            pytest.fail("entered a held lock")
        # It waited its blocking timeout, and gave up long before the holder's 5 s key went.
        assert 0.9 < time.perf_counter() - started < 5.0
        assert info.value.name == "busy"
        assert acquires(registry, "busy", "timeout") == 1
        assert acquires(registry, "busy", "acquired") == 0
        assert value(registry, RETRIES, lock="busy") >= 3
        # A naive lock's single try: blocking_timeout=0 gives up at once, no retry.
        single = self.make(client, key, name="single", ttl=1, sentry=sentry)
        assert single.acquire() is False
        assert acquires(registry, "single", "timeout") == 1
        assert value(registry, RETRIES, lock="single") == 0
        assert client.get(key) == b"held-by-another"

    def test_app_exceptions_pass_through_and_the_lock_is_released(
        self, client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
    ) -> None:
        key = redis_prefix + "lock:app-error"
        error = RuntimeError("pricing service down")
        with (
            pytest.raises(RuntimeError) as info,
            self.make(client, key, name="app", ttl=1, sentry=sentry),
        ):
            raise error
        assert info.value is error
        assert client.get(key) is None
        assert value(registry, NOT_OWNED, lock="app") == 0

        def broken_acquire(token: str) -> object:
            raise ConnectionError("redis went away")

        with pytest.raises(ConnectionError):
            track_lock(
                "app", ttl=1, acquire=broken_acquire, release=print, sentry=sentry
            ).acquire()
        assert acquires(registry, "app", "error") == 1

    def test_instrumentation_failures_never_reach_the_app(
        self,
        client: redis.Redis,
        redis_prefix: str,
        registry: CollectorRegistry,
        sentry: Sentry,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        def boom(*args: object) -> None:
            raise RuntimeError("metrics broke")

        # The two observations of a hold: its acquire duration and its hold ratio.
        monkeypatch.setattr(sentry.metrics, "observe", boom)
        key = redis_prefix + "lock:broken"
        with self.make(client, key, name="broken", ttl=1, sentry=sentry) as lock:
            assert lock.hold is not None
        assert client.get(key) is None
        assert value(registry, ERRORS, component="locks") == 2

    def test_logs_carry_lock_correlation_ids_and_only_a_token_hash(
        self, client: redis.Redis, redis_prefix: str, registry: CollectorRegistry
    ) -> None:
        stream = io.StringIO()
        previous = structlog.get_config()
        configure_logging("INFO", stream=stream, bridge_stdlib=False)
        try:
            sentry = Sentry(registry=registry, trace=False)
            key = redis_prefix + "lock:logged"
            with bind_correlation(request_id="req-a", sku="SKU-8891"):
                lock_a = self.make(
                    client, key, name="logged", ttl=0.1, naive_del=True, sentry=sentry
                )
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
        if self.deleted_other_holder is None:
            assert "deleted_other_holder" not in not_owned
        else:
            assert not_owned["deleted_other_holder"] is self.deleted_other_holder
        assert lock_a.token not in stream.getvalue()
        assert "token-of-b" not in stream.getvalue()

    async def test_naive_lock_in_asyncio_tasks(
        self, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
    ) -> None:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            # The naive lock in tasks: A deletes B's key.
            naive_key = redis_prefix + "async-naive"
            a = self.make(
                client, naive_key, name="async-naive", ttl=0.1, naive_del=True, sentry=sentry
            )
            assert await a.aacquire()
            b = self.next_holder(client, naive_key, "async-naive", sentry)
            async with b:
                assert await a.arelease() is False
                assert await client.get(naive_key) is None
            assert value(registry, EXPIRED, lock="async-naive") == 1
            assert value(registry, NOT_OWNED, lock="async-naive") == 2
            assert value(registry, RETRIES, lock="async-naive") > 0
        finally:
            await client.aclose()

    async def test_asyncio_client_in_a_sync_with_is_a_clear_error(
        self, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
    ) -> None:
        client = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            lock = self.make(client, redis_prefix + "mixed", name="mixed", ttl=1, sentry=sentry)
            with pytest.raises(TypeError, match="use async with"), lock:
                pytest.fail("entered")
            assert acquires(registry, "mixed", "error") == 1
            assert await client.get(redis_prefix + "mixed") is None
        finally:
            await client.aclose()

    def test_a_lock_wrapped_before_configure_records_into_the_configured_sentry(
        self, client: redis.Redis, redis_prefix: str
    ) -> None:
        from stocksentry.instrumentation import configure, get_sentry

        before = get_sentry()
        # No sentry given: the lock records into whichever one is configured when it is used.
        lock = self.make(client, redis_prefix + "early", name="early", ttl=5)
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
