"""Partitions: the probes, the leader election and the lock watcher behind a TCP proxy that
goes silent (tests/blackhole.py) in front of the real PostgreSQL, MariaDB and Redis.

A silent network gives no error, only no answer: every bound below comes from the config
(a probe's ``timeout`` and ``interval``, the election's lease and the server's idle limit,
the watcher's ``health_check_interval`` and ``connect_timeout``) plus :data:`SLACK` for a
loaded two-core machine. Each test prints the figures it measured (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from blackhole import Blackhole
from dbs import ALL_DB_PROBES, Db
from polling import async_wait_until
from privateredis import PrivateRedis
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.lockwatch.watcher import LockWatcher
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.dialects import dialect_for
from test_probes import WAIT, config_on, seed_db

pytestmark = pytest.mark.integration

#: Seconds a bound may be late by on a loaded shared machine (the bounds are seconds).
SLACK = 1.5
#: The probes' schedule in these tests, as in the report of the silent network.
INTERVAL, TIMEOUT = 1.0, 2.0
MAX_CONNECTIONS = 3
#: The election's retry interval: the server ends a silent session after 3 s, the lease 2 s.
RETRY = 1.0
#: How long a partition lasts.
CUT = 8.0
SAMPLE = 0.1


@dataclass
class Samples:
    """What a 100 ms sampler saw, in seconds since the cut (negative: before it)."""

    cut_at: float = 0.0
    rows: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    def first(self, test: Callable[[dict[str, Any]], bool]) -> float | None:
        """Seconds from the cut to the first sample after it where ``test`` holds."""
        return next((t for t, row in self.rows if t >= 0 and test(row)), None)

    def during(self, key: str) -> list[Any]:
        return [row[key] for t, row in self.rows if t >= 0]


async def sample_every(
    period: float, read: Callable[[], dict[str, Any]], into: Samples, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        into.rows.append((time.monotonic() - into.cut_at, read()))
        await asyncio.sleep(period)


#: A custom probe whose query takes most of its interval: in flight when the network goes.
SLOW = "slow_query"


def probe_config(db: Db, url: str, *, slow: bool = False, **database: Any) -> Any:
    settings: dict[str, Any] = {
        "defaults": {"interval": f"{INTERVAL:g}s", "timeout": f"{TIMEOUT:g}s"}
    }
    if slow:
        sleep = (
            "SELECT SLEEP(0.8) AS value" if db.mysql else "SELECT 1 AS value FROM pg_sleep(0.8)"
        )
        settings["custom"] = [{"name": SLOW, "sql": sleep, "metric": "shop_slow_query"}]
    return config_on(
        db,
        ALL_DB_PROBES,
        database={
            "url": url,
            "max_connections": MAX_CONNECTIONS,
            "statement_timeout": "1s",
            "connect_timeout": "2s",
            "leader_retry_interval": f"{RETRY:g}s",
            **database,
        },
        settings=settings,
    )


async def test_every_probe_says_down_within_its_timeout_and_holds_its_connection_bound(
    db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    await seed_db(db)
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")
    probes = (*ALL_DB_PROBES, SLOW)
    async with Blackhole.before(db.raw_url) as proxy:
        config = probe_config(db, proxy.url(db.raw_url), slow=True)
        async with ProbeRunner(config) as runner:
            await async_wait_until(
                lambda: all((r := runner.results.get(p)) is not None and r.up for p in probes),
                timeout=WAIT,
                message="every probe up",
            )
            # Cut in the middle of the slow query: its run ended, the next starts 0.2 s
            # later and sleeps 0.8 s.
            ended = runner.results[SLOW].last_success
            await async_wait_until(
                lambda: runner.results[SLOW].last_success != ended,
                timeout=WAIT,
                message="a run of the slow query",
            )
            await asyncio.sleep(0.5)
            samples = Samples()
            stop = asyncio.Event()

            def read() -> dict[str, Any]:
                results = runner.results
                return {"connections": proxy.open_clients, **{p: results[p] for p in probes}}

            caplog.clear()
            samples.cut_at = time.monotonic()
            proxy.cut()
            sampler = asyncio.create_task(sample_every(SAMPLE, read, samples, stop))
            await asyncio.sleep(CUT)
            proxy.heal()
            healed = time.monotonic() - samples.cut_at
            await async_wait_until(
                lambda: all(runner.results[p].up for p in probes),
                timeout=WAIT,
                message="every probe up again after the partition",
            )
            back = time.monotonic() - samples.cut_at - healed
            stop.set()
            await sampler

    down_after = {p: samples.first(lambda row, p=p: not row[p].up) for p in probes}
    seen_down = [after for after in down_after.values() if after is not None]
    during = [row for t, row in samples.rows if 0 <= t <= CUT]
    durations = [row[p].duration for row in during for p in probes if not row[p].up]
    connections = [row["connections"] for row in during]
    print(
        f"\npartition figures ({db.name}): seconds from the cut to down, "
        f"{len(seen_down)} of {len(down_after)} probes: {min(seen_down, default=0):.2f} to "
        f"{max(seen_down, default=0):.2f}; "
        f"longest probe_duration_seconds while down {max(durations):.3f}; "
        f"max connections {max(connections)} (max_connections {MAX_CONNECTIONS}); "
        f"all up {back:.1f} s after the heal; the query in flight at the cut down after "
        f"{down_after[SLOW]} s"
    )
    for probe, after in down_after.items():
        assert after is not None, f"{probe} never said down"
        assert after <= TIMEOUT + INTERVAL + SLACK, (probe, after)
    # probe_duration_seconds is true: a run given up on lasts its timeout, not the time
    # a driver would spend waiting on a silent server.
    # (A driver waiting on a cancel request would take 10 s.)
    assert max(durations) <= TIMEOUT + SLACK
    # Down means no stale figures: a failed run exports nothing of its own.
    for row in during[-5:]:
        assert all(not row[p].up and row[p].families == () for p in probes)
    assert max(connections) <= MAX_CONNECTIONS
    # One log line per probe for the whole partition (the next within a minute are counted
    # and reported with the recovery), each with its reason.
    failed = [r for r in caplog.records if " failed: " in r.getMessage()]
    per_probe = {
        p: [r.getMessage() for r in failed if r.getMessage().startswith(f"probe {p} ")]
        for p in probes
    }
    assert all(len(lines) == 1 for lines in per_probe.values()), per_probe
    for lines in per_probe.values():
        assert "timed out after 2s" in lines[0] or "unreachable" in lines[0], lines[0]


async def test_a_probe_that_cannot_get_a_session_says_why(db: Db) -> None:
    await seed_db(db)
    async with Blackhole.before(db.raw_url) as proxy:
        config = probe_config(db, proxy.url(db.raw_url), max_connections=1)
        async with ProbeRunner(config) as runner:
            await async_wait_until(
                lambda: all(
                    (r := runner.results.get(p)) is not None and r.up for p in ALL_DB_PROBES
                ),
                timeout=WAIT,
                message="every probe up",
            )
            proxy.cut()
            # Eight probes, one session: those waiting for it say so when their time is up.
            await async_wait_until(
                lambda: [
                    runner.results[p].error
                    for p in ALL_DB_PROBES
                    if "waiting for a free database session (1 of 1 in use)"
                    in (runner.results[p].error or "")
                ],
                timeout=WAIT,
                message="a probe down for want of a session",
            )
            assert proxy.open_clients <= 1
            proxy.heal()


async def test_a_partitioned_leader_steps_down_before_another_takes_over(db: Db) -> None:
    key = random.randint(1, 2**62)
    await seed_db(db)
    async with Blackhole.before(db.raw_url) as proxy:
        first = probe_config(
            db, proxy.url(db.raw_url), leader_election=True, advisory_lock_key=key
        )
        second = probe_config(db, db.raw_url, leader_election=True, advisory_lock_key=key)
        assert first.database is not None
        lease = dialect_for(first.database).lease(first.database)
        idle = dialect_for(first.database).idle_limit(first.database)
        async with ProbeRunner(first) as leader:
            await async_wait_until(lambda: leader.is_leader, timeout=WAIT, message="a leader")
            async with ProbeRunner(second) as follower:
                # The follower has tried the lock at least once and lost.
                await async_wait_until(
                    lambda: "leader_election" in follower.results,
                    timeout=WAIT,
                    message="the follower tried",
                )
                assert not follower.is_leader
                samples = Samples()
                stop = asyncio.Event()

                def read() -> dict[str, Any]:
                    return {
                        "first": leader.is_leader,
                        "second": follower.is_leader,
                        "connections": proxy.open_clients,
                    }

                samples.cut_at = time.monotonic()
                proxy.cut()
                sampler = asyncio.create_task(sample_every(SAMPLE, read, samples, stop))
                await async_wait_until(
                    lambda: follower.is_leader, timeout=WAIT, message="the follower leads"
                )
                await asyncio.sleep(2.0)
                proxy.heal()
                # After the heal the old leader comes back as a follower.
                await async_wait_until(
                    lambda: (
                        leader.results.get("leader_election") is not None
                        and leader.results["leader_election"].up
                    ),
                    timeout=WAIT,
                    message="the old leader's election session is back",
                )
                await asyncio.sleep(3 * RETRY)
                stop.set()
                await sampler

    stepped_down = samples.first(lambda row: not row["first"])
    took_over = samples.first(lambda row: row["second"])
    leaders = [int(row["first"]) + int(row["second"]) for _, row in samples.rows]
    connections = samples.during("connections")
    print(
        f"\nelection figures ({db.name}): lease {lease:g} s, server idle limit {idle:g} s; "
        f"leader stepped down {stepped_down} s after the cut, follower took over {took_over} s "
        f"after it; max leaders per 100 ms sample {max(leaders)} over {len(leaders)} samples; "
        f"max connections of the partitioned one {max(connections)}"
    )
    assert stepped_down is not None
    assert took_over is not None
    assert max(leaders) == 1
    # The lease runs out within one interval of a cut (the ping before it renewed it).
    assert stepped_down <= lease + SLACK
    assert stepped_down < took_over
    assert took_over <= idle + 2 * RETRY + SLACK
    assert max(connections) <= MAX_CONNECTIONS + 1


async def test_the_lock_watcher_notices_a_silent_redis_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.lockwatch")
    hci, deadline = 1.0, 1.0
    with PrivateRedis() as server:
        async with Blackhole.before(server.url) as proxy:
            config = parse_config(
                f"lock_watch:\n  url: {proxy.url(server.url)}\n"
                "  patterns: ['lock:product:{sku}']\n  configure_notifications: true\n"
                f"  health_check_interval: {hci:g}s\n  connect_timeout: {deadline:g}s\n"
                "  reconnect_interval: 500ms\n"
            )
            assert config.lock_watch is not None
            watcher = LockWatcher(config.lock_watch, config.sku_guard)
            client = aioredis.Redis.from_url(server.url)
            await watcher.start()
            try:
                async with asyncio.timeout(WAIT):
                    await watcher.wait_subscribed()
                await client.set("lock:product:EGG-01", "a", nx=True, ex=60)
                await async_wait_until(
                    lambda: watcher.tracker.tracked == 1, timeout=WAIT, message="one lease"
                )
                caplog.clear()
                cut_at = time.monotonic()
                proxy.cut()
                await async_wait_until(
                    lambda: not watcher.connected, timeout=WAIT, message="disconnected"
                )
                detected = time.monotonic() - cut_at
                await asyncio.sleep(2.0)  # reconnect attempts into the silence
                proxy.heal()
                await async_wait_until(
                    lambda: watcher.connected, timeout=WAIT, message="subscribed again"
                )
            finally:
                await watcher.stop()
                await client.aclose()
    lost = [
        r.getMessage() for r in caplog.records if "lost the Redis subscription" in r.getMessage()
    ]
    print(
        f"\nlock watcher figures: disconnected {detected:.2f} s after the cut "
        f"(health_check_interval {hci:g} s + deadline {deadline:g} s)"
    )
    assert detected <= hci + deadline + SLACK
    assert watcher.tracker.lost["disconnect"] == 1
    assert len(lost) == 1, lost
    assert "no answer to PING within 1s" in lost[0]
    assert watcher.reconnects == 1
