"""The incremental oversold and duplicate_orders probes on MariaDB against a full recount.

The MariaDB twin of ``test_probes_incremental.py``: the probes run run by run and their
figures are compared with reconcile's full statements (``mysql`` dialect): a transaction
that commits late, late payments, refunds and cancellations of recent and old orders,
traffic, a restart and a change of leader (``GET_LOCK``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from typing import Any

import pymysql
import pytest
import yaml
from polling import async_wait_until
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner, families
from stocksentry.exporter.probes.mysql import DuplicateOrdersProbe, MyPool, OversoldProbe
from stocksentry.instrumentation.guard import LabelGuard
from test_probes_mysql import INDEXES, SCHEMA, connect, run_rows, run_sql

pytestmark = pytest.mark.integration

WAIT = 20.0


def config_for(url: str, *, leader_election: bool = False, **oversold: Any) -> ExporterConfig:
    settings: dict[str, Any] = {"scope": "all", "settle_after": 0, "clock_margin": 0}
    settings.update(oversold)
    document = {
        "database": {
            "url": url,
            "leader_election": leader_election,
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


def shop(url: str, products: int = 6) -> None:
    """Products SKU-1..n with an allocation of 3, no orders yet."""
    values = ", ".join(f"('SKU-{i}', 10, 3)" for i in range(1, products + 1))
    run_sql(
        url,
        [
            *SCHEMA,
            *INDEXES,
            f"INSERT INTO products (sku, available_stock, initial_stock) VALUES {values}",
        ],
    )


def order(
    conn: pymysql.connections.Connection[Any],
    sku: str,
    quantity: int,
    *,
    status: str = "PAID",
    age: dt.timedelta | None = None,
    ref: str | None = None,
) -> int:
    """One order of ``quantity`` units of ``sku``, ``age`` old (default: now(6))."""
    micros = (age or dt.timedelta(0)) // dt.timedelta(microseconds=1)
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO orders (status, external_ref, created_at)"
            " VALUES (%s, %s, now(6) - INTERVAL %s MICROSECOND)",
            (status, ref, micros),
        )
        order_id = int(cur.lastrowid)
        cur.execute(
            "INSERT INTO order_items (order_id, product_id, quantity)"
            " SELECT %s, id, %s FROM products WHERE sku = %s",
            (order_id, quantity, sku),
        )
    return order_id


def execute(conn: pymysql.connections.Connection[Any], sql: str, *params: Any) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, params or None)


def full_recount(url: str, config: ExporterConfig) -> dict[str, float]:
    """``{sku: oversold units}`` by reconcile's statement over the whole history."""
    rows = run_rows(url, InvariantSql(config.schema, dialect="mysql").oversold())
    return {str(sku): float(units) for sku, _a, _s, units in rows}


def full_duplicates(url: str, config: ExporterConfig) -> float:
    query = InvariantSql(config.schema, dialect="mysql").duplicate_key_totals(
        since=dt.timedelta(seconds=config.probes.duplicate_orders.window)
    )
    ((count,),) = run_rows(url, query)
    return float(count)


async def figures(probe: OversoldProbe) -> dict[str, float]:
    """One run of the probe: its ``stock_oversold_units`` samples."""
    (family,) = await probe.run()
    return {s.labels["sku"]: s.value for s in family.samples}


@pytest.fixture
def writer(mysql_database: str) -> Any:
    shop(mysql_database)
    conn = connect(mysql_database)
    try:
        yield conn
    finally:
        conn.close()


async def test_an_order_committed_late_is_counted_however_old_its_created_at(
    mysql_database: str, writer: Any
) -> None:
    config = config_for(mysql_database)
    pool = MyPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    late = connect(mysql_database, autocommit=False)
    try:
        order(writer, "SKU-1", 3, age=dt.timedelta(hours=2))
        assert await figures(probe) == {}
        # created_at is now(6) of the INSERT: older than every later boundary.
        late.begin()
        order(late, "SKU-1", 2)
        with late.cursor() as cur:
            cur.execute("SELECT now(6)")
            ((started,),) = cur.fetchall()
        for _ in range(3):
            await asyncio.sleep(0.3)
            order(writer, "SKU-2", 1)  # traffic that commits meanwhile
            assert await figures(probe) == {}
        # The open transaction held the boundary at its start (innodb_trx's second).
        assert probe.totals.boundary is not None
        assert probe.totals.boundary <= started
        late.commit()
        # One run after the commit: the oversell is seen, on a SKU that is no promo SKU.
        assert await figures(probe) == {"SKU-1": 2.0}
        assert await figures(probe) == full_recount(mysql_database, config)
    finally:
        late.close()
        await pool.close()


async def test_payments_refunds_and_cancellations_recent_and_old(
    mysql_database: str, writer: Any
) -> None:
    config = config_for(mysql_database, settle_after="1h")
    pool = MyPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    try:
        old = order(writer, "SKU-1", 4, age=dt.timedelta(days=3))
        recent = order(writer, "SKU-2", 2, status="PENDING")
        order(writer, "SKU-2", 2)
        order(writer, "SKU-3", 5, age=dt.timedelta(days=2), status="CANCELLED")
        assert await figures(probe) == {"SKU-1": 1.0}
        execute(writer, "UPDATE orders SET status = 'PAID' WHERE id = %s", recent)
        assert await figures(probe) == {"SKU-1": 1.0, "SKU-2": 1.0}
        execute(writer, "UPDATE orders SET status = 'REFUNDED' WHERE id = %s", recent)
        assert await figures(probe) == {"SKU-1": 1.0}
        execute(writer, "UPDATE orders SET status = 'REFUNDED' WHERE id = %s", old)
        execute(writer, "UPDATE orders SET status = 'PAID' WHERE status = 'CANCELLED'")
        assert await figures(probe) == {"SKU-3": 2.0}
        assert await figures(probe) == full_recount(mysql_database, config)
    finally:
        await pool.close()


async def test_figures_equal_a_full_recount_under_traffic_with_old_orders_settled(
    mysql_database: str, writer: Any
) -> None:
    config = config_for(mysql_database)
    pool = MyPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    rng = random.Random(12)
    try:
        for _ in range(20):
            order(writer, f"SKU-{rng.randint(1, 6)}", rng.randint(1, 2))
        for _ in range(6):
            for _ in range(5):
                order(
                    writer,
                    f"SKU-{rng.randint(1, 6)}",
                    1,
                    status=rng.choice(("PAID", "COMPLETED", "PENDING")),
                )
            await asyncio.sleep(0.05)
            await figures(probe)
        assert probe.totals.boundary is not None
        assert await figures(probe) == full_recount(mysql_database, config)
        assert full_recount(mysql_database, config)  # the traffic did oversell
    finally:
        await pool.close()


async def test_a_restart_rebuilds_in_bounded_steps_and_a_new_leader_equals_the_recount(
    mysql_database: str,
) -> None:
    shop(mysql_database, products=500)
    writer = connect(mysql_database)
    for sku in ("SKU-450", "SKU-460", "SKU-470"):
        order(writer, sku, 3, age=dt.timedelta(days=1))
        order(writer, sku, 1)
    config = config_for(mysql_database, leader_election=True, recount_batch=1, settle_after="1h")
    truth = full_recount(mysql_database, config)
    assert truth == {"SKU-450": 1.0, "SKU-460": 1.0, "SKU-470": 1.0}

    pool = MyPool(config.database)  # type: ignore[arg-type]
    probe = OversoldProbe(config, pool, LabelGuard(100))
    try:
        seen = [await figures(probe) for _ in range(3)]
    finally:
        await pool.close()
    assert [len(s) for s in seen] == [1, 2, 3]
    assert seen[-1] == truth

    first, second = CollectorRegistry(), CollectorRegistry()
    try:
        async with ProbeRunner(config, registry=first) as leader:
            await async_wait_until(lambda: leader.is_leader, timeout=WAIT, message="a leader")
            async with ProbeRunner(config, registry=second) as follower:
                await asyncio.sleep(0.5)
                assert not follower.is_leader
                await leader.stop()  # the leader goes away: the follower takes over
                await async_wait_until(
                    lambda: follower.is_leader, timeout=WAIT, message="the takeover"
                )
                order(writer, "SKU-4", 4)  # sold after the change of leader
                truth = full_recount(mysql_database, config)

                def settled() -> bool:
                    return {
                        sku: second.get_sample_value("stock_oversold_units", {"sku": sku})
                        for sku in truth
                    } == truth

                await async_wait_until(settled, timeout=WAIT, message="the new leader's figures")
                taken = next(p for p in follower.probes if isinstance(p, OversoldProbe))
                assert taken.totals.pending == 0
    finally:
        writer.close()


@pytest.mark.parametrize("many_new_keys", [False, True])
async def test_duplicate_keys_incrementally_equal_the_full_query(
    mysql_database: str,
    writer: Any,
    monkeypatch: pytest.MonkeyPatch,
    many_new_keys: bool,
) -> None:
    if many_new_keys:  # every run has "too many" new keys: the window is read again
        monkeypatch.setattr(families, "MAX_NEW_KEYS", 0)
    config = config_for(mysql_database)
    pool = MyPool(config.database)  # type: ignore[arg-type]
    probe = DuplicateOrdersProbe(config, pool)

    async def count() -> float:
        keys, per_sku = await probe.run()
        value = float(keys.samples[0].value)
        # Every duplicated key's orders hold SKU-1: its series counts them all.
        by_sku = {s.labels["sku"]: s.value for s in per_sku.samples}
        assert by_sku == ({"SKU-1": value} if value else {})
        return value

    late = connect(mysql_database, autocommit=False)
    try:
        order(writer, "SKU-1", 1, ref="a")
        order(writer, "SKU-1", 1, ref="a")
        order(writer, "SKU-1", 1, ref="b", age=dt.timedelta(hours=2))
        assert await count() == 1.0 == full_duplicates(mysql_database, config)
        # A duplicate of an order outside the window is none; a late commit is one.
        order(writer, "SKU-1", 1, ref="b")
        late.begin()
        order(late, "SKU-1", 1, ref="c")
        order(writer, "SKU-1", 1, ref="c")
        await asyncio.sleep(0.3)
        assert await count() == 1.0
        late.commit()
        assert await count() == 2.0 == full_duplicates(mysql_database, config)
        probe.reset()
        assert await count() == 2.0
    finally:
        late.close()
        await pool.close()
