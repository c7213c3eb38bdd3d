"""The rarely taken paths of the lock wrappers and of the freeze view, on the real Redis.

redis-py's ``reacquire`` and the asyncio ``extend`` / ``reacquire``, pottery's
``AIORedlock`` used without ``async with``, fencing tokens whose script fails on a master
(or on the only one) and lagging masters raised to the issued token; the freeze view given
a client, fed a broken message or a value outside the contract, and restarted by
``Sentry.reopen()``. Keys live under the test's ``redis_prefix`` (pottery adds
``redlock:`` in front: those, and the keys in the other databases, are deleted here).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from collections.abc import Iterator

import lockscenarios
import pottery
import pytest
import redis
import redis.asyncio
import test_freeze
from lockscenarios import EXPIRED, EXTEND_FAILURES, REDIS_URL, acquires, aioredlock, value
from polling import wait_until
from privateredis import PrivateRedis
from prometheus_client import CollectorRegistry
from redis.exceptions import LockNotOwnedError
from stocksentry.instrumentation import FreezeSettings, FreezeView, Sentry, SkuFrozen
from stocksentry.instrumentation.freeze import FreezeContractError, FreezeState, key_for
from stocksentry.instrumentation.freezeview import freeze_sku, read_frozen
from stocksentry.instrumentation.heldlocks import held_locks
from stocksentry.instrumentation.locks import (
    InstrumentedAsyncLock,
    InstrumentedLock,
    instrument_lock,
)
from test_freeze import ops

pytestmark = pytest.mark.integration

sentry = lockscenarios.sentry
client = lockscenarios.client
settings = test_freeze.settings

ERRORS = "stocksentry_instrumentation_errors_total"
# Three Redlock masters: three databases of the test Redis, apart from the default one.
MASTER_DBS = (1, 2, 3)


# --- redis-py Lock: reacquire, asyncio extend ---------------------------------------------------


def test_redis_py_reacquire_restarts_the_lease_and_a_lost_lock_is_an_extend_failure(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "re"
    lock = InstrumentedLock(client.lock(key, timeout=0.3), name="re", sentry=sentry)
    assert lock.acquire(blocking=False)
    time.sleep(0.2)
    assert lock.reacquire() is True  # the 0.3 s lease starts again: 0.4 s held, not expired
    time.sleep(0.2)
    lock.release()
    assert value(registry, EXPIRED, lock="re") == 0
    assert value(registry, f"{lockscenarios.RATIO}_count", lock="re") == 1

    assert lock.acquire(blocking=False)
    time.sleep(0.4)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()
    assert value(registry, EXTEND_FAILURES, lock="re") == 1
    assert value(registry, ERRORS, component="locks") == 0
    # The app gives the lost lock up: the release is refused (not owned), and the hold
    # leaves held_locks() (else it would stay there for the tests after this one).
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert value(registry, "stock_lock_release_not_owned_total", lock="re") == 1
    assert held_locks() == ()


async def test_asyncio_redis_py_extend_and_reacquire(
    redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    aclient = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        lock = InstrumentedAsyncLock(
            aclient.lock(redis_prefix + "are", timeout=0.3), name="are", sentry=sentry
        )
        async with lock:
            await asyncio.sleep(0.2)
            assert await lock.extend(0.3) is True  # the lease is 0.6 s now
            await asyncio.sleep(0.2)
            assert await lock.reacquire() is True  # 0.3 s from now: 0.7 s at most
            await asyncio.sleep(0.2)
        assert value(registry, EXPIRED, lock="are") == 0
        assert value(registry, EXTEND_FAILURES, lock="are") == 0

        assert await lock.acquire(blocking=False)
        await asyncio.sleep(0.4)
        with pytest.raises(LockNotOwnedError):
            await lock.extend(1)
        with pytest.raises(LockNotOwnedError):
            await lock.reacquire()
        assert value(registry, EXTEND_FAILURES, lock="are") == 2
        assert acquires(registry, "are", "acquired") == 2
    finally:
        await aclient.aclose()


def test_a_release_that_fails_on_a_dead_redis_ends_the_hold_and_records_no_outcome(
    registry: CollectorRegistry, sentry: Sentry
) -> None:
    def hold_then_lose_redis() -> tuple[list[str], list[str]]:
        with PrivateRedis() as server:
            own = redis.Redis.from_url(server.url, socket_connect_timeout=0.5)
            try:
                lock = InstrumentedLock(
                    own.lock("lock:sku:1", timeout=30), name="dead", sentry=sentry
                )
                assert lock.acquire(blocking=False)
                before = [h.name for h in held_locks()]
                server.stop()
                with pytest.raises(redis.ConnectionError):
                    lock.release()
                return before, [h.name for h in held_locks()]
            finally:
                own.close()

    # A context of its own, so that a hold left behind cannot leak into other tests.
    before, after = contextvars.Context().run(hold_then_lose_redis)
    assert before == ["dead"]
    # The release raised: the app left its critical section, what follows is not under
    # the lock (the unsafe-write detector reads held_locks()).
    assert after == []
    # Whether the key was still ours is not known: no release outcome is counted.
    assert value(registry, lockscenarios.NOT_OWNED, lock="dead") == 0
    assert value(registry, f"{lockscenarios.RATIO}_count", lock="dead") == 0
    assert value(registry, ERRORS, component="locks") == 0


# --- pottery AIORedlock without async with --------------------------------------------------


async def test_aioredlock_acquire_extend_and_release_by_hand(
    redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    async with aioredlock(redis_prefix + "aio", "aio", sentry, auto_release_time=0.3) as lock:
        assert await lock.acquire(blocking=False) is True
        await asyncio.sleep(0.2)
        await lock.extend()  # 0.3 s from now
        await asyncio.sleep(0.2)
        await lock.release()
        assert value(registry, EXPIRED, lock="aio") == 0
        assert acquires(registry, "aio", "acquired") == 1

        assert await lock.acquire(blocking=False) is True
        await asyncio.sleep(0.4)
        with pytest.raises(pottery.ExtendUnlockedLock):
            await lock.extend()
        assert value(registry, EXTEND_FAILURES, lock="aio") == 1


# --- fencing tokens ---------------------------------------------------------------------


def test_a_fencing_script_that_fails_leaves_the_token_none_counted_not_raised(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "fenced"
    # The counter's key holds a list (a name clash): the script fails with WRONGTYPE.
    client.rpush(f"{key}:fence", "not a counter")
    lock = instrument_lock(client.lock(key, timeout=5), name="fenced", sentry=sentry, fencing=True)
    with lock:
        assert lock.fencing_token is None  # not issued: do not write
        assert lock.owned()
    assert value(registry, ERRORS, component="locks") == 1
    assert acquires(registry, "fenced", "acquired") == 1


@pytest.fixture
def masters() -> Iterator[list[redis.Redis]]:
    """Three Redlock masters (databases 1-3 of the test Redis), emptied of the test's
    keys afterwards."""
    base = REDIS_URL.rsplit("/", 1)[0]
    clients = [redis.Redis.from_url(f"{base}/{db}") for db in MASTER_DBS]
    yield clients
    for c in clients:
        keys = list(c.scan_iter(match="*stocksentry-test:*"))
        if keys:
            c.delete(*keys)
        c.close()


def test_redlock_fencing_takes_the_majoritys_highest_token_and_raises_lagging_masters(
    masters: list[redis.Redis], redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    lock = instrument_lock(
        pottery.Redlock(key=redis_prefix + "rl", masters=set(masters), auto_release_time=5),
        name="rl",
        sentry=sentry,
        fencing=True,
    )
    fence = f"{lock.lock_key}:fence"
    first, lagging, broken = masters
    not_issued = 0
    for _ in range(5):
        first.set(fence, 5)
        lagging.set(fence, 2)
        broken.delete(fence)
        broken.rpush(fence, "not a counter")  # this master's script fails: the others decide
        with lock:
            token = lock.fencing_token
            if token is not None:
                assert token == 6
                assert int(first.get(fence) or 0) == 6
                assert int(lagging.get(fence) or 0) == 6  # raised to the issued token
                break
        # pottery returns at a quorum of two masters, the third one's SET still in flight
        # (its BailOutExecutor); with the broken master out, the fence needs both healthy
        # ones: on a loaded machine one may not hold the lock yet. Not issued (counted) is
        # the safe answer; the next acquire, once the in-flight calls have landed.
        not_issued += 1
        time.sleep(0.5)
    else:
        pytest.fail("no acquire of five was issued a fencing token")
    assert value(registry, ERRORS, component="locks") == not_issued
    assert acquires(registry, "rl", "acquired") == not_issued + 1


# --- the freeze view -------------------------------------------------------------------------


@pytest.fixture
def freeze_settings(client: redis.Redis, settings: FreezeSettings) -> FreezeSettings:
    """test_freeze's settings (the test's key template and channel) on a client the test
    owns (not a URL), resynced every 0.3 s and stale only after 5 s."""
    return dataclasses.replace(settings, redis=client, resync_interval=0.3, stale_after=5.0)


def freeze_egg_01(client: redis.Redis, settings: FreezeSettings, view: FreezeView) -> None:
    """A person freezes EGG-01 under the settings' key template and channel; back once the
    view holds the freeze."""
    freeze_sku(client, "EGG-01", reason="oversold", source="person", **ops(settings))
    wait_until(lambda: view.frozen("EGG-01"), accept=lambda s: s is not None, timeout=10)


def test_a_value_outside_the_contract_never_stops_the_full_read(
    client: redis.Redis, freeze_settings: FreezeSettings
) -> None:
    template = freeze_settings.key_template
    huge = "1" + "0" * 400  # valid JSON, too large for a float
    client.set(key_for(template, "HUGE"), f'{{"sku":"HUGE","source":"person","at":{huge}}}')
    # A value naming another SKU: the key decides.
    client.set(key_for(template, "EGG-01"), FreezeState("EGG-99", "r", "person", 1.0).to_json())
    client.set(key_for(template, ""), "matches the scan, names no SKU")
    states = read_frozen(client, template)
    assert sorted(states) == ["EGG-01", "HUGE"]
    assert states["HUGE"].reason == "unreadable freeze value"
    assert states["EGG-01"].sku == "EGG-01"


def test_the_view_on_a_client_reports_broken_messages_and_callbacks_and_keeps_going(
    client: redis.Redis, freeze_settings: FreezeSettings
) -> None:
    errors: list[BaseException] = []

    def on_change(action: str, sku: str, source: str) -> None:
        raise RuntimeError(f"the app's callback broke on {sku}")

    view = FreezeView(freeze_settings, on_error=errors.append, on_change=on_change)
    view.start()
    view.start()  # already running: no second thread
    try:
        assert view.wait_synced(10)
        channel = freeze_settings.channel
        client.publish(channel, "not json")
        client.publish(channel, '{"action":"thaw","sku":"EGG-01"}')
        huge = "1" + "0" * 400
        client.publish(
            channel,
            f'{{"action":"freeze","sku":"X","state":{{"sku":"X","source":"person","at":{huge}}}}}',
        )
        freeze_egg_01(client, freeze_settings, view)
        contract = [e for e in errors if isinstance(e, FreezeContractError)]
        callback = [e for e in errors if isinstance(e, RuntimeError)]
        assert len(contract) == 3
        assert [str(e) for e in callback] == ["the app's callback broke on EGG-01"]
        # The broken messages cost no reconnect: the same subscription took the freeze.
        assert [e for e in errors if not isinstance(e, (FreezeContractError, RuntimeError))] == []
        assert view.resyncs >= 1
    finally:
        view.stop()
    assert client.ping()  # the app's own client is not closed by the view


def test_reopen_restarts_the_freeze_view(
    client: redis.Redis, freeze_settings: FreezeSettings
) -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, freeze=freeze_settings, log=False, trace=False)
    try:
        view = sentry.freeze_view
        assert view is not None
        assert view.wait_synced(10)
        sentry.close()
        sentry.reopen()
        assert view.wait_synced(10)
        freeze_egg_01(client, freeze_settings, view)
        with pytest.raises(SkuFrozen), sentry.reservation("EGG-01"):
            pytest.fail("a frozen SKU was reserved")
        assert (
            value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="frozen") == 1
        )
        assert value(registry, ERRORS, component="freeze") == 0
    finally:
        sentry.close()
