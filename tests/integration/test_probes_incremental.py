"""The incremental oversold and duplicate_orders probes against a full SQL recount.

Each test drives the probes run by run on a real PostgreSQL and on a real MariaDB and
compares their figures with the statements ``stocksentry reconcile`` runs (the full
recount of :class:`~stocksentry.exporter.invariants.InvariantSql`, in the database's
dialect): a transaction that commits late, late payments, refunds and cancellations of
recent and of old orders, a restart and a leader change (an advisory lock, ``GET_LOCK``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import random
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import yaml
from dbs import Db
from polling import async_wait_until
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.invariants import InvariantSql, Query
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes import db as db_probes
from stocksentry.exporter.probes.db import DuplicateOrdersProbe, OversoldProbe
from stocksentry.exporter.probes.my import MySQL
from stocksentry.exporter.probes.pg import PostgreSQL
from stocksentry.exporter.probes.pool import Pool
from stocksentry.instrumentation.guard import LabelGuard
from test_probes import INDEXES, SCHEMA
from test_probes_mysql import INDEXES as MY_INDEXES
from test_probes_mysql import SCHEMA as MY_SCHEMA
from test_probes_mysql import connect

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


class Shop:
    """A plain session on the test database (autocommit unless told otherwise)."""

    def __init__(self, db: Db, *, autocommit: bool = True) -> None:
        self.db = db
        self.conn: Any = (
            connect(db.raw_url, autocommit=autocommit)
            if db.mysql
            else psycopg.connect(db.raw_url, autocommit=autocommit)
        )
        if db.mysql and not autocommit:
            self.conn.begin()

    def execute(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params or None)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def rows(self, query: Query) -> list[tuple[Any, ...]]:
        """The rows of an invariant statement, in this database's dialect."""
        text, params = (MySQL() if self.db.mysql else PostgreSQL()).render(query)
        with self.conn.cursor() as cur:
            cur.execute(text, params)
            return [tuple(r) for r in cur.fetchall()]

    def order(
        self,
        sku: str,
        quantity: int,
        *,
        status: str = "PAID",
        age: dt.timedelta | None = None,
        ref: str | None = None,
    ) -> int:
        """One order of ``quantity`` units of ``sku``, ``age`` old (default: now)."""
        age = age or dt.timedelta(0)
        if self.db.mysql:
            self.execute(
                "INSERT INTO orders (status, external_ref, created_at)"
                " VALUES (%s, %s, now(6) - INTERVAL %s MICROSECOND)",
                status,
                ref,
                age // dt.timedelta(microseconds=1),
            )
            order_id = int(self.conn.insert_id())
        else:
            ((order_id,),) = self.execute(
                "INSERT INTO orders (status, external_ref, created_at)"
                " VALUES (%s, %s, now() - %s) RETURNING id",
                status,
                ref,
                age,
            )
        self.execute(
            "INSERT INTO order_items (order_id, product_id, quantity)"
            " SELECT %s, id, %s FROM products WHERE sku = %s",
            order_id,
            quantity,
            sku,
        )
        return int(order_id)

    def now(self) -> dt.datetime:
        ((now,),) = self.execute("SELECT now(6)" if self.db.mysql else "SELECT now()")
        return now  # type: ignore[no-any-return]

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


def shop(db: Db, products: int = 6) -> None:
    """Products SKU-1..n with an allocation of 3, no orders yet."""
    values = ", ".join(f"('SKU-{i}', 10, 3)" for i in range(1, products + 1))
    writer = Shop(db)
    try:
        for statement in [*MY_SCHEMA, *MY_INDEXES] if db.mysql else [SCHEMA, INDEXES]:
            writer.execute(statement)
        writer.execute(
            f"INSERT INTO products (sku, available_stock, initial_stock) VALUES {values}"
        )
    finally:
        writer.close()


def full_recount(db: Db, config: ExporterConfig) -> dict[str, float]:
    """``{sku: oversold units}`` by reconcile's statement over the whole history."""
    reader = Shop(db)
    try:
        rows = reader.rows(InvariantSql(config.schema, db.dialect).oversold())
    finally:
        reader.close()
    return {str(sku): float(units) for sku, _a, _s, units in rows}


def full_duplicates(db: Db, config: ExporterConfig) -> float:
    query = InvariantSql(config.schema, db.dialect).duplicate_key_totals(
        since=dt.timedelta(seconds=config.probes.duplicate_orders.window)
    )
    reader = Shop(db)
    try:
        ((count,),) = reader.rows(query)
    finally:
        reader.close()
    return float(count)


@contextlib.asynccontextmanager
async def oversold_probe(config: ExporterConfig) -> AsyncIterator[OversoldProbe]:
    """The oversold probe on a pool of its own, closed after."""
    pool = Pool(config.database)  # type: ignore[arg-type]
    try:
        yield OversoldProbe(config, pool, LabelGuard(100))
    finally:
        await pool.close()


async def figures(probe: OversoldProbe) -> dict[str, float]:
    """One run of the probe: its ``stock_oversold_units`` samples."""
    (family,) = await probe.run()
    return {s.labels["sku"]: s.value for s in family.samples}


@pytest.fixture
def writer(db: Db) -> Any:
    shop(db)
    writer = Shop(db)
    try:
        yield writer
    finally:
        writer.close()


async def test_an_order_committed_late_is_counted_however_old_its_created_at(
    db: Db, writer: Shop
) -> None:
    config = config_for(db.raw_url)
    async with oversold_probe(config) as probe:
        writer.order("SKU-1", 3, age=dt.timedelta(hours=2))
        assert await figures(probe) == {}
        late = Shop(db, autocommit=False)
        try:
            # created_at is now() of this transaction (MariaDB: of the INSERT): older than
            # every later boundary.
            late.order("SKU-1", 2)
            started = late.now()
            for _ in range(3):
                await asyncio.sleep(0.3)
                writer.order("SKU-2", 1)  # traffic that commits meanwhile
                assert await figures(probe) == {}
            # The open transaction held the boundary at its start (innodb_trx's second).
            assert probe.totals.boundary is not None
            assert probe.totals.boundary <= started
            late.commit()
        finally:
            late.close()
        # One run after the commit: the oversell is seen, on a SKU that is no promo SKU.
        assert await figures(probe) == {"SKU-1": 2.0}
        assert await figures(probe) == full_recount(db, config)


async def test_payments_refunds_and_cancellations_recent_and_old(db: Db, writer: Shop) -> None:
    # A small shop: one chunk of the rolling recount covers every product, every run.
    config = config_for(db.raw_url, settle_after="1h")
    async with oversold_probe(config) as probe:
        old = writer.order("SKU-1", 4, age=dt.timedelta(days=3))
        recent = writer.order("SKU-2", 2, status="PENDING")
        writer.order("SKU-2", 2)
        writer.order("SKU-3", 5, age=dt.timedelta(days=2), status="CANCELLED")
        assert await figures(probe) == {"SKU-1": 1.0}
        # A late payment of a recent order: the next run.
        writer.execute("UPDATE orders SET status = 'PAID' WHERE id = %s", recent)
        assert await figures(probe) == {"SKU-1": 1.0, "SKU-2": 1.0}
        # Its refund: the next run.
        writer.execute("UPDATE orders SET status = 'REFUNDED' WHERE id = %s", recent)
        assert await figures(probe) == {"SKU-1": 1.0}
        # A refund and a reinstated order days old: the rolling recount's next chunk.
        writer.execute("UPDATE orders SET status = 'REFUNDED' WHERE id = %s", old)
        writer.execute("UPDATE orders SET status = 'PAID' WHERE status = 'CANCELLED'")
        assert await figures(probe) == {"SKU-3": 2.0}
        assert await figures(probe) == full_recount(db, config)


async def test_figures_equal_a_full_recount_under_traffic_with_old_orders_settled(
    db: Db, writer: Shop
) -> None:
    config = config_for(db.raw_url)
    rng = random.Random(12)
    async with oversold_probe(config) as probe:
        for _ in range(20):
            writer.order(f"SKU-{rng.randint(1, 6)}", rng.randint(1, 2))
        for _ in range(6):
            for _ in range(5):
                writer.order(
                    f"SKU-{rng.randint(1, 6)}",
                    1,
                    status=rng.choice(("PAID", "COMPLETED", "PENDING")),
                )
            await asyncio.sleep(0.05)
            await figures(probe)
        assert probe.totals.boundary is not None
        assert await figures(probe) == full_recount(db, config)
        assert full_recount(db, config)  # the traffic did oversell


async def test_a_restart_rebuilds_in_bounded_steps_and_a_new_leader_equals_the_recount(
    db: Db,
) -> None:
    # 500 products: the rolling recount takes 50 a run and does not reach SKU-450.. in
    # these first runs, so only the first counts (recount_batch) find them.
    shop(db, products=500)
    writer = Shop(db)
    # Oversold SKUs with recent sales; after a start, one product's history a run.
    for sku in ("SKU-450", "SKU-460", "SKU-470"):
        writer.order(sku, 3, age=dt.timedelta(days=1))
        writer.order(sku, 1)
    config = config_for(db.raw_url, leader_election=True, recount_batch=1, settle_after="1h")
    truth = full_recount(db, config)
    assert truth == {"SKU-450": 1.0, "SKU-460": 1.0, "SKU-470": 1.0}

    async with oversold_probe(config) as probe:
        seen = [await figures(probe) for _ in range(3)]
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
            writer.order("SKU-4", 4)  # sold after the change of leader
            truth = full_recount(db, config)

            def settled() -> bool:
                return {
                    sku: second.get_sample_value("stock_oversold_units", {"sku": sku})
                    for sku in truth
                } == truth

            await async_wait_until(settled, timeout=WAIT, message="the new leader's figures")
            taken = next(p for p in follower.probes if isinstance(p, OversoldProbe))
            assert taken.totals.pending == 0
    writer.close()


@pytest.mark.parametrize("many_new_keys", [False, True])
async def test_duplicate_keys_incrementally_equal_the_full_query(
    db: Db,
    writer: Shop,
    monkeypatch: pytest.MonkeyPatch,
    many_new_keys: bool,
) -> None:
    if many_new_keys:  # every run has "too many" new keys: the window is read again
        monkeypatch.setattr(db_probes, "MAX_NEW_KEYS", 0)
    config = config_for(db.raw_url)
    pool = Pool(config.database)  # type: ignore[arg-type]
    probe = DuplicateOrdersProbe(
        config, pool, LabelGuard(config.sku_guard.max_skus, always=config.sku_guard.promo_skus)
    )

    async def count() -> float:
        keys, per_sku = await probe.run()
        value = float(keys.samples[0].value)
        # Every duplicated key's orders hold SKU-1: its series counts them all.
        by_sku = {s.labels["sku"]: s.value for s in per_sku.samples}
        assert by_sku == ({"SKU-1": value} if value else {})
        return value

    try:
        writer.order("SKU-1", 1, ref="a")
        writer.order("SKU-1", 1, ref="a")
        writer.order("SKU-1", 1, ref="b", age=dt.timedelta(hours=2))
        assert await count() == 1.0 == full_duplicates(db, config)
        # A duplicate of an order outside the window is none; a late commit is one.
        writer.order("SKU-1", 1, ref="b")
        late = Shop(db, autocommit=False)
        try:
            late.order("SKU-1", 1, ref="c")
            writer.order("SKU-1", 1, ref="c")
            await asyncio.sleep(0.3)
            assert await count() == 1.0
            late.commit()
        finally:
            late.close()
        assert await count() == 2.0 == full_duplicates(db, config)
        # A restart reads the window again.
        probe.reset()
        assert await count() == 2.0
    finally:
        await pool.close()
