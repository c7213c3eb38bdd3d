"""The probes and ``stocksentry reconcile`` read the same figures from the same database.

Both build their statements with :class:`stocksentry.exporter.invariants.InvariantSql`:
the probes' gauges are aggregates over the rows reconcile lists, so on one database
they must agree exactly, whatever the seed.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
import yaml
from prometheus_client.core import Metric
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.investigate.reconcile import reconcile
from stocksentry.exporter.probes.db import DuplicateOrdersProbe, NegativeStockProbe, OversoldProbe
from stocksentry.exporter.probes.pool import Pool
from stocksentry.instrumentation.guard import LabelGuard

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE products (id bigint PRIMARY KEY, sku text NOT NULL UNIQUE,
                       available_stock integer NOT NULL, initial_stock integer NOT NULL);
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, external_ref text,
                     idempotency_key text, created_at timestamptz NOT NULL);
CREATE TABLE order_items (order_id bigint NOT NULL, product_id bigint NOT NULL,
                          quantity integer NOT NULL);
CREATE INDEX ON products (available_stock) WHERE available_stock < 0;
CREATE INDEX ON orders (created_at);
CREATE INDEX ON order_items (product_id);
"""
STATUSES = ("PAID", "COMPLETED", "PROCESSING", "CANCELLED", "PENDING")


def sku_guard(config: ExporterConfig) -> LabelGuard:
    """The SKU guard the runner builds from ``config``."""
    return LabelGuard(config.sku_guard.max_skus, always=config.sku_guard.promo_skus)


def seed(url: str, rng: random.Random) -> None:
    """60 SKUs with small allocations and 600 orders with colliding keys, a tenth of them
    from two days ago: every invariant is broken somewhere, by chance."""
    now = datetime.now(UTC)
    products = [(n, f"SKU-{n:02d}", rng.randint(-4, 6), rng.randint(1, 8)) for n in range(60)]
    orders, items = [], []
    for n in range(600):
        created = now - (timedelta(days=2) if n % 10 == 0 else timedelta(seconds=n))
        ref = f"ref-{rng.randrange(450)}" if rng.random() < 0.9 else None
        key = f"key-{rng.randrange(500)}" if rng.random() < 0.7 else None
        orders.append((n, rng.choice(STATUSES), ref, key, created))
        for _ in range(rng.randint(0, 2)):
            items.append((n, rng.randrange(60), rng.randint(1, 3)))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO products VALUES (%s, %s, %s, %s)", products)
            cur.executemany("INSERT INTO orders VALUES (%s, %s, %s, %s, %s)", orders)
            cur.executemany("INSERT INTO order_items VALUES (%s, %s, %s)", items)


def config_for(url: str) -> ExporterConfig:
    document = {
        "database": {"url": url},
        # A budget beyond every SKU, so each oversold SKU keeps a series of its own.
        "sku_guard": {"promo_skus": [], "max_skus": 100},
        "schema": {
            "products": {"allocation": "initial_stock"},
            "orders": {"idempotency_key": "idempotency_key"},
        },
        "probes": {"duplicate_orders": {"window": "1h"}},
    }
    return parse_config(yaml.safe_dump(document), "test.yaml", environ={})


def values(families: tuple[Metric, ...]) -> dict[tuple[str, tuple[str, ...]], float]:
    out: dict[tuple[str, tuple[str, ...]], float] = {}
    for family in families:
        for sample in family.samples:
            out[(sample.name, tuple(sample.labels.values()))] = sample.value
    return out


@pytest.mark.parametrize("seed_value", [1, 2, 3])
async def test_the_probes_count_what_reconcile_lists(
    pg_database: str, pg_sqlalchemy_url: str, seed_value: int
) -> None:
    seed(pg_database, random.Random(seed_value))
    config = config_for(pg_database)
    pool = Pool(config.database)
    guard = LabelGuard(max_values=100)
    try:
        negative = values(await NegativeStockProbe(config, pool, sku_guard(config)).run())
        # The incremental probe is complete once its first rolling recount has covered
        # every product (a chunk a run) and every active product is counted.
        probe = OversoldProbe(config, pool, guard)
        for _ in range(10):
            oversold = values(await probe.run())
            if probe.totals.passes and not probe.totals.pending:
                break
        assert probe.totals.passes == 1
        duplicates = values(await DuplicateOrdersProbe(config, pool, sku_guard(config)).run())
    finally:
        await pool.close()
    # The probe's window is one hour back from the server's clock; reconcile's --since is
    # computed on this side: the seed keeps every order far from that edge.
    since = datetime.now(UTC) - timedelta(hours=1)
    report = reconcile(pg_sqlalchemy_url, schema=config.schema, since=since)

    assert report.negative_stock, "the seed breaks every invariant"
    assert report.oversold
    assert report.duplicate_keys
    assert negative[("stock_inventory_negative_skus", ())] == len(report.negative_stock)
    assert negative[("stock_inventory_negative_units", ())] == -sum(
        row["stock"] for row in report.negative_stock
    )
    assert {labels[0]: v for (_, labels), v in oversold.items()} == {
        row["sku"]: row["oversold_units"] for row in report.oversold
    }
    assert duplicates[("stock_duplicate_order_keys", ())] == len(report.duplicate_keys)
