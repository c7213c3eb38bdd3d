"""The Redis lock watcher against a real, private redis-server.

Every test starts its own redis-server (it changes ``notify-keyspace-events`` and restarts
Redis, which the shared server must never see) and drives lock keys with redis-py the way
a naive ``SET NX EX`` / ``DEL`` lock and an owned compare-and-delete lock do; the counts
the watcher exports must equal what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis
from polling import async_wait_until
from privateredis import PrivateRedis
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.lab.naive_lock import SetNxLock
from stocksentry.exporter.lockwatch.watcher import LockWatcher
from stocksentry.instrumentation import Sentry

pytestmark = pytest.mark.integration

NOT_OWNED_TOTAL = "stock_lock_release_not_owned_total"
#: Compare-and-delete: what an owned lock (redlock, redis-py Lock) runs to release.
RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    with PrivateRedis() as redis_server:
        yield redis_server


def _config(url: str, **extra: object) -> str:
    # A URL with a password comes from the environment (LOCKWATCH_URL), as the loader wants.
    where = "url_env: LOCKWATCH_URL" if "@" in url else f"url: {url}"
    lines = [f"lock_watch:\n  {where}\n  patterns: ['lock:product:{{sku}}', 'lock:cart:*']"]
    lines += [f"  {k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in extra.items()]
    lines.append("sku_guard:\n  max_skus: 2\n  promo_skus: [EGG-01]")
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def subscribed(config: ExporterConfig) -> AsyncIterator[LockWatcher]:
    """A watcher of ``config``'s lock_watch, subscribed; stopped on exit."""
    assert config.lock_watch is not None
    watcher = LockWatcher(config.lock_watch, config.sku_guard)
    await watcher.start()
    try:
        async with asyncio.timeout(10):
            await watcher.wait_subscribed()
        yield watcher
    finally:
        await watcher.stop()


@pytest.fixture
async def watched(server: PrivateRedis) -> AsyncIterator[tuple[LockWatcher, aioredis.Redis]]:
    config = parse_config(_config(server.url, configure_notifications=True))
    async with subscribed(config) as watcher:
        client = aioredis.Redis.from_url(server.url)
        try:
            yield watcher, client
        finally:
            await client.aclose()


def samples(watcher: LockWatcher) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(watcher)
    out = {}
    for family in registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(watcher: LockWatcher, name: str, **labels: str) -> float:
    return samples(watcher).get((name, tuple(sorted(labels.items()))), 0.0)


async def settle(watcher: LockWatcher, events: int) -> None:
    """Wait until the watcher has received ``events`` notifications in all."""

    def total() -> float:
        return sum(
            v
            for (n, _), v in samples(watcher).items()
            if n == "stocksentry_lockwatch_events_total"
        )

    await async_wait_until(total, timeout=10, accept=lambda t: t >= events, message="events")


async def test_naive_lock_expiry_and_foreign_release_are_counted(
    watched: tuple[LockWatcher, aioredis.Redis],
) -> None:
    watcher, r = watched
    key, lock = "lock:product:EGG-01", "lock:product:EGG-01"
    # Holder A takes a 300 ms lease and works longer: the lease expires under it.
    assert await r.set(key, "A", nx=True, px=300)
    await async_wait_until(
        lambda: value(watcher, "stock_lock_expired_while_held_total", lock=lock), timeout=5
    )
    # B takes the free lock; A finishes and runs DEL in finally: B's lock is gone.
    assert await r.set(key, "B", nx=True, px=2000)
    await asyncio.sleep(0.05)
    await r.delete(key)
    # A normal lease on another SKU, released at about half its TTL: no problem counted.
    assert await r.set("lock:product:MILK", "C", nx=True, px=1000)
    await asyncio.sleep(0.5)
    await r.delete("lock:product:MILK")
    await settle(watcher, 9)  # set+expire, expired, set+expire, del, set+expire, del
    assert value(watcher, "stock_lock_acquisitions_total", lock=lock) == 2
    assert value(watcher, "stock_lock_expired_while_held_total", lock=lock) == 1
    assert value(watcher, "stock_lock_release_not_owned_total", lock=lock) == 1
    assert value(watcher, "stock_lock_release_not_owned_total", lock="lock:product:MILK") == 0
    assert value(watcher, "stock_lock_expired_while_held_total", lock="lock:product:MILK") == 0
    # Hold ratios: A's expiry at ~1, B's short hold, MILK's ~0.5.
    assert value(watcher, "stock_lock_hold_ratio_count", lock=lock) == 2
    assert value(watcher, "stock_lock_hold_ratio_bucket", lock=lock, le="0.9") == 1
    assert value(watcher, "stock_lock_hold_ratio_bucket", lock=lock, le="1.5") == 2
    milk = {
        le: value(watcher, "stock_lock_hold_ratio_bucket", lock="lock:product:MILK", le=le)
        for le in ("0.25", "0.75")
    }
    assert milk == {"0.25": 0, "0.75": 1}
    assert value(watcher, "stocksentry_lockwatch_events_total", event="set") == 3
    assert value(watcher, "stocksentry_lockwatch_events_total", event="expired") == 1
    assert value(watcher, "stocksentry_lockwatch_events_total", event="del") == 2


async def test_every_link_of_the_naive_lock_cascade_is_counted(
    watched: tuple[LockWatcher, aioredis.Redis],
) -> None:
    """The incident's cascade: a lease expires under its holder; the next request takes the
    lock; the first holder's DEL removes it, the next request takes it at once, and the
    robbed holder's own DEL removes *that* one, and so on. The lab's naive lock reads the
    key in the same step as its DEL, so it knows the truth; the watcher, outside, must
    count every foreign DEL, not only the first after the expiry."""
    watcher, r = watched
    key = "lock:product:EGG-01"
    truth = CollectorRegistry()
    sentry = Sentry(registry=truth, log=False, trace=False)
    holders = [
        SetNxLock(r, key, name="cascade", ttl=2.0, release="naive", sentry=sentry)
        for _ in range(6)
    ]
    assert await holders[0].aacquire()
    await async_wait_until(
        lambda: value(watcher, "stock_lock_expired_while_held_total", lock=key), timeout=10
    )
    assert await holders[1].aacquire()
    for robber in range(5):
        # Holder `robber` ends its work and DELs the lock of holder robber + 1, 0.2 s into
        # that holder's 2 s lease; the next request takes the lock at once.
        await asyncio.sleep(0.2)
        await holders[robber].arelease()
        if robber + 2 < len(holders):
            assert await holders[robber + 2].aacquire()
    # The last holder's lock is gone too; its own DEL would delete nothing (and Redis
    # sends nothing for it): the chain has five foreign DELs.
    # 1 set + expire + expired, 5 times set + expire, 5 del.
    await settle(watcher, 3 + 2 * 5 + 5)
    foreign = truth.get_sample_value(NOT_OWNED_TOTAL, {"lock": "cascade"})
    assert foreign == 5
    assert value(watcher, "stock_lock_expired_while_held_total", lock=key) == 1
    assert value(watcher, "stock_lock_acquisitions_total", lock=key) == 6
    assert value(watcher, "stock_lock_release_not_owned_total", lock=key) == foreign


async def test_owned_lock_with_extension_raises_nothing(
    watched: tuple[LockWatcher, aioredis.Redis],
) -> None:
    watcher, r = watched
    key = "lock:product:EGG-01"
    release = r.register_script(RELEASE)
    for holder in ("A", "B", "C"):
        # Acquire, work past the first TTL while extending, release only if still ours.
        # The previous holder released it: the key is free.
        assert await r.set(key, holder, nx=True, px=300)
        for _ in range(3):
            await asyncio.sleep(0.15)
            await r.pexpire(key, 300)
        assert await release(keys=[key], args=[holder]) == 1
    # A late compare-and-delete of a holder that is gone deletes nothing and emits nothing.
    assert await release(keys=[key], args=["A"]) == 0
    await settle(watcher, 3 * (2 + 3 + 1))
    assert value(watcher, "stock_lock_acquisitions_total", lock=key) == 3
    assert value(watcher, "stock_lock_expired_while_held_total", lock=key) == 0
    assert value(watcher, "stock_lock_release_not_owned_total", lock=key) == 0
    # Held ~0.45 s of leases extended to ~0.75 s: below 1, every one of them.
    assert value(watcher, "stock_lock_hold_ratio_bucket", lock=key, le="1.0") == 3


async def test_labels_are_bounded_by_the_sku_guard(
    watched: tuple[LockWatcher, aioredis.Redis],
) -> None:
    watcher, r = watched
    for sku in ("EGG-01", "A", "B", "C", "D\n<x>"):
        await r.set(f"lock:product:{sku}", "t", nx=True, px=5000)
    await r.set("lock:cart:42", "t", nx=True, px=5000)
    await r.set("unwatched:1", "t", px=5000)
    await settle(watcher, 12)
    locks = {
        dict(labels)["lock"]
        for (name, labels), _ in samples(watcher).items()
        if name == "stock_lock_acquisitions_total"
    }
    # The promo SKU, two admitted, the rest folded; a pattern without {sku} is its own label.
    assert locks == {
        "lock:product:EGG-01",
        "lock:product:A",
        "lock:product:B",
        "lock:product:__other__",
        "lock:cart:*",
    }
    assert value(watcher, "stock_lock_acquisitions_total", lock="lock:product:__other__") == 2


async def test_restart_reconnects_reapplies_flags_and_counts_the_gap(
    server: PrivateRedis, watched: tuple[LockWatcher, aioredis.Redis]
) -> None:
    watcher, r = watched
    await r.set("lock:product:EGG-01", "A", nx=True, px=60_000)
    await r.set("lock:product:A", "A", nx=True, px=60_000)
    await settle(watcher, 4)
    await r.aclose()
    server.restart()  # the runtime CONFIG SET is gone with it
    await async_wait_until(lambda: watcher.reconnects, timeout=15, message="reconnect")
    assert watcher.connected
    assert value(watcher, "stocksentry_lockwatch_leases_lost_total", reason="disconnect") == 2
    assert value(watcher, "stocksentry_lockwatch_disconnected_seconds_total") > 0
    assert value(watcher, "stocksentry_lockwatch_reconnects_total") == 1
    assert value(watcher, "stocksentry_lockwatch_notifications_enabled") == 1
    # Notifications flow again (the flags were set again after the restart).
    fresh = aioredis.Redis.from_url(server.url)
    try:
        reply = await fresh.config_get("notify-keyspace-events")
        assert set(str(next(iter(reply.values())))) >= set("Kg$x")
        await fresh.set("lock:product:EGG-01", "B", nx=True, px=100)
        await async_wait_until(
            lambda: value(
                watcher, "stock_lock_expired_while_held_total", lock="lock:product:EGG-01"
            ),
            timeout=5,
            message="expiry after the restart",
        )
    finally:
        await fresh.aclose()


async def test_without_permission_it_checks_and_says_which_flags(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "stocksentry.exporter.lockwatch")
    async with subscribed(parse_config(_config(server.url))) as watcher:
        assert watcher.notifications is False
        assert value(watcher, "stocksentry_lockwatch_notifications_enabled") == 0
    lines = [r.getMessage() for r in caplog.records if "notify-keyspace-events" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "lacks 'Kg$x'" in lines[0]
    assert "configure_notifications" in lines[0]
    # The server's setting was left alone.
    client = aioredis.Redis.from_url(server.url)
    try:
        reply = await client.config_get("notify-keyspace-events")
        assert list(reply.values()) in ([""], [b""])
    finally:
        await client.aclose()


async def test_config_refused_by_acl_leaves_the_gauge_absent(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    admin = aioredis.Redis.from_url(server.url)
    try:
        await admin.config_set("notify-keyspace-events", "Kg$x")
        await admin.execute_command(
            "ACL", "SETUSER", "watcher", "on", ">pw", "~*", "&*", "+@all", "-config"
        )
    finally:
        await admin.aclose()
    url = f"redis://watcher:pw@127.0.0.1:{server.port}/0"
    config = parse_config(
        _config(url, configure_notifications=True), environ={"LOCKWATCH_URL": url}
    )
    caplog.set_level(logging.INFO, "stocksentry.exporter.lockwatch")
    async with subscribed(config) as watcher:
        assert watcher.notifications is None
        assert ("stocksentry_lockwatch_notifications_enabled", ()) not in samples(watcher)
        user = aioredis.Redis.from_url(url)
        try:
            await user.set("lock:cart:1", "t", nx=True, px=50)
            await async_wait_until(
                lambda: value(watcher, "stock_lock_expired_while_held_total", lock="lock:cart:*"),
                timeout=5,
            )
        finally:
            await user.aclose()
    hint = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(hint) == 1, hint
    assert "'Kg$x'" in hint[0]
    assert "pw" not in " ".join(r.getMessage() for r in caplog.records)
