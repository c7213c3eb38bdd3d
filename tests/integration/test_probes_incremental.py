"""The incremental oversold and duplicate_orders probes against a full SQL recount.

Each test drives the probes run by run on a real PostgreSQL and compares their figures
with the statements ``stocksentry reconcile`` runs (the full recount of
:class:`~stocksentry.exporter.invariants.InvariantSql`): a transaction that commits late,
late payments, refunds and cancellations of recent and of old orders, a restart and a
leader change.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from typing import Any

import psycopg
import pytest
import yaml
from polling import async_wait_until
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner, families
from stocksentry.exporter.probes.postgres import DuplicateOrdersProbe, OversoldProbe, PgPool
from stocksentry.exporter.probes.postgres.common import composed
from stocksentry.instrumentation.guard import LabelGuard
from test_probes import INDEXES, SCHEMA

pytestmark = pytest.mark.integration

WAIT = 20.0


def config_for(url: str, *, leader_election: bool = False, **oversold: Any) -> ExporterConfig:
    settings: dict[str, Any] = {"scope": "all", "settle_after": 0, "clock_margin": 0}
    settings.update(oversold)
    document = {
        "database": {
            "url": url,
            "leader_election": leader_election,
            # Unique per test: other suites elect on the same server at the same time.
            "advisory_lock_key": random.randint(1, 2**62),
            "leader_retry_interval": "200ms",
        },
        "schema": {"products": {"allocation": "initial_stock"}},
        "probes": {
            "defaults": {"interval": "200ms", "timeout": "5s"},
            "oversold": settings,
            "duplicate_orders": {"clock_margin": 0},
            **{
                name: {"enabled": False}
                for name in (
                    "negative_stock",
                    "lock_waiters",
                    "deadlocks",
                    "long_transactions",
                    "expired_reservations",
                    "outbox",
                    "cache_drift",
                )
            },
        },
    }
    return parse_config(yaml.safe_dump(document), environ={})


async def shop(url: str, products: int = 6) -> None:
    """Products SKU-1..n with an allocation of 3, no orders yet."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(SCHEMA)
        await conn.execute(INDEXES)
        await conn.execute(
            "INSERT INTO products (sku, available_stock, initial_stock)"
            " SELECT 'SKU-' || g, 10, 3 FROM generate_series(1, %s) AS g",
            (products,),
        )


async def order(
    conn: psycopg.AsyncConnection[Any],
    sku: str,
    quantity: int,
    *,
    status: str = "PAID",
    age: dt.timedelta | None = None,
    ref: str | None = None,
) -> int:
    """One order of ``quantity`` units of ``sku``, ``age`` old (default: now())."""
    cursor = await conn.execute(
        "INSERT INTO orders (status, external_ref, created_at)"
        " VALUES (%s, %s, now() - %s) RETURNING id",
        (status, ref, age or dt.timedelta(0)),
    )
    row = await cursor.fetchone()
    assert row is not None
    await conn.execute(
        "INSERT INTO order_items (order_id, product_id, quantity)"
        " SELECT %s, id, %s FROM products WHERE sku = %s",
        (row[0], quantity, sku),
    )
    return int(row[0])


async def full_recount(url: str, config: ExporterConfig) -> dict[str, float]:
    """``{sku: oversold units}`` by reconcile's statement over the whole history."""
    statement, params = composed(InvariantSql(config.schema).oversold())
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(statement, params)
        return {str(sku): float(units) for sku, _a, _s, units in await cursor.fetchall()}


async def full_duplicates(url: str, config: ExporterConfig) -> float:
    query = InvariantSql(config.schema).duplicate_key_totals(
        since=dt.timedelta(seconds=config.probes.duplicate_orders.window)
    )
    statement, params = composed(query)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute(statement, params)
        row = await cursor.fetchone()
        assert row is not None
        return float(row[0])


async def figures(probe: OversoldProbe) -> dict[str, float]:
    """One run of the probe: its ``stock_oversold_units`` samples."""
    (family,) = await probe.run()
    return {s.labels["sku"]: s.value for s in family.samples}


@pytest.fixture
async def writer(pg_database: str) -> Any:
    await shop(pg_database)
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as conn:
        yield conn


async def test_an_order_committed_late_is_counted_however_old_its_created_at(
    pg_database: str, writer: psycopg.AsyncConnection[Any]
) -> None:
    config = config_for(pg_database)
    pool = PgPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    try:
        await order(writer, "SKU-1", 3, age=dt.timedelta(hours=2))
        assert await figures(probe) == {}
        async with await psycopg.AsyncConnection.connect(pg_database) as late:
            # created_at is now() of this transaction: older than every later boundary.
            await order(late, "SKU-1", 2)
            cursor = await late.execute("SELECT now()")
            row = await cursor.fetchone()
            assert row is not None
            started = row[0]
            for _ in range(3):
                await asyncio.sleep(0.3)
                await order(writer, "SKU-2", 1)  # traffic that commits meanwhile
                assert await figures(probe) == {}
            # The open transaction held the boundary at its start.
            assert probe.totals.boundary is not None
            assert probe.totals.boundary <= started
            await late.commit()
        # One run after the commit: the oversell is seen, on a SKU that is no promo SKU.
        assert await figures(probe) == {"SKU-1": 2.0}
        assert await figures(probe) == await full_recount(pg_database, config)
    finally:
        await pool.close()


async def test_payments_refunds_and_cancellations_recent_and_old(
    pg_database: str, writer: psycopg.AsyncConnection[Any]
) -> None:
    # A small shop: one chunk of the rolling recount covers every product, every run.
    config = config_for(pg_database, settle_after="1h")
    pool = PgPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    try:
        old = await order(writer, "SKU-1", 4, age=dt.timedelta(days=3))
        recent = await order(writer, "SKU-2", 2, status="PENDING")
        await order(writer, "SKU-2", 2)
        await order(writer, "SKU-3", 5, age=dt.timedelta(days=2), status="CANCELLED")
        assert await figures(probe) == {"SKU-1": 1.0}
        # A late payment of a recent order: the next run.
        await writer.execute("UPDATE orders SET status = 'PAID' WHERE id = %s", (recent,))
        assert await figures(probe) == {"SKU-1": 1.0, "SKU-2": 1.0}
        # Its refund: the next run.
        await writer.execute("UPDATE orders SET status = 'REFUNDED' WHERE id = %s", (recent,))
        assert await figures(probe) == {"SKU-1": 1.0}
        # A refund and a reinstated order days old: the rolling recount's next chunk.
        await writer.execute("UPDATE orders SET status = 'REFUNDED' WHERE id = %s", (old,))
        await writer.execute("UPDATE orders SET status = 'PAID' WHERE status = 'CANCELLED'")
        assert await figures(probe) == {"SKU-3": 2.0}
        assert await figures(probe) == await full_recount(pg_database, config)
    finally:
        await pool.close()


async def test_figures_equal_a_full_recount_under_traffic_with_old_orders_settled(
    pg_database: str, writer: psycopg.AsyncConnection[Any]
) -> None:
    config = config_for(pg_database)
    pool = PgPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    rng = random.Random(12)
    try:
        for _ in range(20):
            await order(writer, f"SKU-{rng.randint(1, 6)}", rng.randint(1, 2))
        for _ in range(6):
            for _ in range(5):
                await order(
                    writer,
                    f"SKU-{rng.randint(1, 6)}",
                    1,
                    status=rng.choice(("PAID", "COMPLETED", "PENDING")),
                )
            await asyncio.sleep(0.05)
            await figures(probe)
        assert probe.totals.boundary is not None
        assert await figures(probe) == await full_recount(pg_database, config)
        assert await full_recount(pg_database, config)  # the traffic did oversell
    finally:
        await pool.close()


async def test_a_restart_rebuilds_in_bounded_steps_and_a_new_leader_equals_the_recount(
    pg_database: str,
) -> None:
    # 500 products: the rolling recount takes 50 a run and does not reach SKU-450.. in
    # these first runs, so only the first counts (recount_batch) find them.
    await shop(pg_database, products=500)
    writer = await psycopg.AsyncConnection.connect(pg_database, autocommit=True)
    # Oversold SKUs with recent sales; after a start, one product's history a run.
    for sku in ("SKU-450", "SKU-460", "SKU-470"):
        await order(writer, sku, 3, age=dt.timedelta(days=1))
        await order(writer, sku, 1)
    config = config_for(pg_database, leader_election=True, recount_batch=1, settle_after="1h")
    truth = await full_recount(pg_database, config)
    assert truth == {"SKU-450": 1.0, "SKU-460": 1.0, "SKU-470": 1.0}

    pool = PgPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    try:
        seen = [await figures(probe) for _ in range(3)]
    finally:
        await pool.close()
    # A restart reads at most recount_batch products' histories a run (plus one chunk).
    assert [len(s) for s in seen] == [1, 2, 3]
    assert seen[-1] == truth

    first, second = CollectorRegistry(), CollectorRegistry()
    async with ProbeRunner(config, registry=first) as leader:
        await async_wait_until(lambda: leader.is_leader, timeout=WAIT, message="a leader")
        async with ProbeRunner(config, registry=second) as follower:
            await asyncio.sleep(0.5)
            assert not follower.is_leader
            await leader.stop()  # the leader goes away: the follower takes over
            await async_wait_until(
                lambda: follower.is_leader, timeout=WAIT, message="the takeover"
            )
            await order(writer, "SKU-4", 4)  # sold after the change of leader
            truth = await full_recount(pg_database, config)

            def settled() -> bool:
                return {
                    sku: second.get_sample_value("stock_oversold_units", {"sku": sku})
                    for sku in truth
                } == truth

            await async_wait_until(settled, timeout=WAIT, message="the new leader's figures")
            taken = next(p for p in follower.probes if isinstance(p, OversoldProbe))
            assert taken.totals.pending == 0
    await writer.close()


@pytest.mark.parametrize("many_new_keys", [False, True])
async def test_duplicate_keys_incrementally_equal_the_full_query(
    pg_database: str,
    writer: psycopg.AsyncConnection[Any],
    monkeypatch: pytest.MonkeyPatch,
    many_new_keys: bool,
) -> None:
    if many_new_keys:  # every run has "too many" new keys: the window is read again
        monkeypatch.setattr(families, "MAX_NEW_KEYS", 0)
    config = config_for(pg_database)
    pool = PgPool(config.database)  # type: ignore[arg-type]
    probe = DuplicateOrdersProbe(config, pool)

    async def count() -> float:
        keys, per_sku = await probe.run()
        value = float(keys.samples[0].value)
        # Every duplicated key's orders hold SKU-1: its series counts them all.
        by_sku = {s.labels["sku"]: s.value for s in per_sku.samples}
        assert by_sku == ({"SKU-1": value} if value else {})
        return value

    try:
        await order(writer, "SKU-1", 1, ref="a")
        await order(writer, "SKU-1", 1, ref="a")
        await order(writer, "SKU-1", 1, ref="b", age=dt.timedelta(hours=2))
        assert await count() == 1.0 == await full_duplicates(pg_database, config)
        # A duplicate of an order outside the window is none; a late commit is one.
        await order(writer, "SKU-1", 1, ref="b")
        async with await psycopg.AsyncConnection.connect(pg_database) as late:
            await order(late, "SKU-1", 1, ref="c")
            await order(writer, "SKU-1", 1, ref="c")
            await asyncio.sleep(0.3)
            assert await count() == 1.0
            await late.commit()
        assert await count() == 2.0 == await full_duplicates(pg_database, config)
        # A restart reads the window again.
        probe.reset()
        assert await count() == 2.0
    finally:
        await pool.close()
