"""The cache-drift probe at its defaults, against a real Redis and PostgreSQL.

The config names the Redis and the promo SKU and nothing else of the probe: its own
interval (1 s), ``redis.grace`` (2 s) and ``redis.tolerance`` (0) are the defaults. The
probe runs in the :class:`ProbeRunner` on its fixed-rate schedule while the test moves the
database stock and the cache as an app would, and a watcher reads
``stock_cache_drift_skus`` after every run (each run stamps
``stocksentry_probe_last_success_timestamp_seconds``):

- a cache left 5 s late (its value set once, never updated while the database sells a
  unit every 250 ms) is counted before it heals;
- a cache updated 100 ms after each change of the database is never counted.

Every key lives under the test's ``redis_prefix``, in the test's own database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import psycopg
import pytest
import redis.asyncio as aioredis
import yaml
from dbs import ALL_DB_PROBES
from polling import async_wait_until
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.probes import ProbeRunner

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
SKU = "SKU-CACHED"
START = 100
#: Seconds to wait for the probe to come up; far above its 1 s interval.
WAIT = 20.0


def defaults_config(database: str, key_template: str) -> ExporterConfig:
    """Only ``cache_drift`` on, and nothing of its schedule, grace or tolerance written."""
    document = {
        "sku_guard": {"promo_skus": [SKU]},
        "database": {"url": database, "leader_election": False},
        "redis": {"url": REDIS_URL, "key_template": key_template},
        "probes": {name: {"enabled": False} for name in ALL_DB_PROBES},
    }
    return parse_config(yaml.safe_dump(document), "test.yaml", environ={})


@dataclass
class Runs:
    """The gauge after each probe run, by the run's success timestamp."""

    values: dict[float, float] = field(default_factory=dict)

    def between(self, start: float, end: float) -> list[float]:
        return [v for at, v in sorted(self.values.items()) if start <= at <= end]


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def _watch(registry: CollectorRegistry, runs: Runs) -> None:
    # 20 ms polls against 1 s runs: every run's value is read before the next one. The
    # stamp is read on both sides of the value, so a run that ended in between is skipped
    # for this poll rather than given the previous run's value.
    def stamp() -> float | None:
        return _sample(
            registry, "stocksentry_probe_last_success_timestamp_seconds", probe="cache_drift"
        )

    while True:
        at = stamp()
        value = _sample(registry, "stock_cache_drift_skus", cache="redis")
        if at is not None and value is not None and stamp() == at:
            runs.values.setdefault(at, value)
        await asyncio.sleep(0.02)


@dataclass
class Shop:
    """The product row and its cache key; ``sell`` moves the database only."""

    db: psycopg.AsyncConnection
    cache: aioredis.Redis
    key: str

    async def sell(self) -> int:
        cursor = await self.db.execute(
            "UPDATE products SET available_stock = available_stock - 1 WHERE sku = %s"
            " RETURNING available_stock",
            [SKU],
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    async def cache_set(self, stock: int) -> None:
        await self.cache.set(self.key, str(stock))


@asynccontextmanager
async def running(
    pg_database: str, redis_prefix: str, registry: CollectorRegistry
) -> AsyncIterator[tuple[Shop, Runs, ExporterConfig]]:
    """The product at 100 in the database and the cache, the probe running and watched."""
    db = await psycopg.AsyncConnection.connect(pg_database, autocommit=True)
    cache = aioredis.Redis.from_url(REDIS_URL)
    shop = Shop(db, cache, f"{redis_prefix}stock:{SKU}")
    runs = Runs()
    try:
        await db.execute(
            "CREATE TABLE products (id bigserial PRIMARY KEY, sku text NOT NULL UNIQUE,"
            " available_stock integer NOT NULL)"
        )
        await db.execute(
            "INSERT INTO products (sku, available_stock) VALUES (%s, %s)", [SKU, START]
        )
        await shop.cache_set(START)
        config = defaults_config(pg_database, f"{redis_prefix}stock:{{sku}}")
        async with ProbeRunner(config, registry=registry):
            watcher = asyncio.create_task(_watch(registry, runs))
            try:
                # Two runs on the equal values before the test moves anything.
                await async_wait_until(
                    lambda: len(runs.values), accept=lambda n: n >= 2, timeout=WAIT
                )
                yield shop, runs, config
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
    finally:
        await cache.aclose()
        await db.close()


def test_the_defaults_are_those_the_tests_reason_about(pg_database: str) -> None:
    config = defaults_config(pg_database, "stock:{sku}")
    assert config.redis is not None
    assert (config.probes.cache_drift.interval, config.redis.grace, config.redis.tolerance) == (
        1.0,
        2.0,
        0,
    )


async def test_a_cache_five_seconds_late_is_counted(
    pg_database: str, redis_prefix: str, registry: CollectorRegistry
) -> None:
    async with running(pg_database, redis_prefix, registry) as (shop, runs, _):
        loop = asyncio.get_running_loop()
        assert set(runs.values.values()) == {0.0}
        # The cache keeps 100 for 5 s while the database sells a unit every 250 ms.
        began = loop.time()
        # The runs are stamped with time.time(): the test's marks are on that clock.
        wall_began = time.time()
        stock = START
        for step in range(1, 21):
            stock = await shop.sell()
            await asyncio.sleep(max(0.0, began + 0.25 * step - loop.time()))
        late_until = time.time()
        await shop.cache_set(stock)  # healed: the cache has the database's value again
        # Two more runs, on the equal values.
        await async_wait_until(
            lambda: len(runs.between(late_until + 0.01, 1e12)),
            accept=lambda n: n >= 2,
            timeout=WAIT,
        )
    during = runs.between(wall_began, late_until)
    assert len(during) >= 4, runs.values  # the probe ran through the late stretch
    assert 1.0 in during, during
    first = min(at for at, v in runs.values.items() if v == 1.0)
    print(f"\ncache 5 s late: counted {first - wall_began:.2f} s after the first sale")
    assert first - wall_began < 5.0
    assert runs.between(late_until + 1.5, 1e12)[-1:] == [0.0]


async def test_a_cache_updated_within_100ms_is_not_counted(
    pg_database: str, redis_prefix: str, registry: CollectorRegistry
) -> None:
    """A sale every 0.7 s, the cache set to the database's value 100 ms after each one.

    Runs 1 s apart land 0.3 s apart in the sale's 0.7 s cycle, so over seven runs they
    pass through every tenth of it: some run falls in a 100 ms lag (the cache differs),
    and the run after it never does. A difference seen on single runs is no drift.
    """
    async with running(pg_database, redis_prefix, registry) as (shop, runs, _):
        loop = asyncio.get_running_loop()
        began = loop.time()
        wall_began = time.time()
        for step in range(15):
            await asyncio.sleep(max(0.0, began + 0.7 * step - loop.time()))
            stock = await shop.sell()
            await asyncio.sleep(0.1)
            await shop.cache_set(stock)
        ended = time.time()
    during = runs.between(wall_began, ended)
    assert len(during) >= 9, runs.values  # the probe ran throughout the sale
    assert set(during) == {0.0}, runs.values


async def test_a_cache_refreshed_behind_a_fast_sale_is_not_counted(
    pg_database: str, redis_prefix: str, registry: CollectorRegistry
) -> None:
    """A sale every 50 ms and the cache set 100 ms after each: at every run the cache is
    a unit or two behind the database, for 4 s, twice the grace. It is being refreshed,
    so it is not stale: every run's value changed since the run before."""
    async with running(pg_database, redis_prefix, registry) as (shop, runs, _):
        loop = asyncio.get_running_loop()
        began = loop.time()
        wall_began = time.time()
        pending: list[tuple[float, int]] = []
        step = 0
        while loop.time() - began < 4.0:
            step += 1
            stock = await shop.sell()
            pending.append((loop.time() + 0.1, stock))
            # The refreshes due by now, oldest first: the cache trails by 100 ms.
            while pending and pending[0][0] <= loop.time():
                await shop.cache_set(pending.pop(0)[1])
            await asyncio.sleep(max(0.0, began + 0.05 * step - loop.time()))
        ended = time.time()
        behind = int((await shop.cache.get(shop.key)) or 0) - stock
    during = runs.between(wall_began, ended)
    assert len(during) >= 3, runs.values  # the probe ran throughout the sale
    assert behind > 0  # the cache was really behind the database
    assert set(during) == {0.0}, runs.values
