"""The incident's schema: an ``orders`` row is the line, one unit of one product per order.

The shop of the incident's Node.js app has ``orders(product_id, user_id, status)`` and no
``order_items``; it maps with ``order_items`` pointing at ``orders`` itself and
``quantity: 1`` (docs/exporter-config.md, "One unit per order"). The probes and
``stocksentry reconcile`` must count the same oversell from that mapping, on PostgreSQL
and on MariaDB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from dbs import Db
from polling import async_wait_until
from stocksentry.exporter.config import load_config
from stocksentry.exporter.probes import ProbeRunner
from test_probes import WAIT, all_up, sample

pytestmark = pytest.mark.integration

DDL = [
    """CREATE TABLE products (id INTEGER PRIMARY KEY, sku VARCHAR(64) UNIQUE NOT NULL,
       available_stock INTEGER NOT NULL, initial_stock INTEGER NOT NULL)""",
    """CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL,
       product_id INTEGER NOT NULL, status VARCHAR(16) NOT NULL,
       created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)""",
    "CREATE INDEX orders_product_id_idx ON orders (product_id)",
    "CREATE INDEX orders_created_at_idx ON orders (created_at)",
]

# The incident's sale: PS5-01 had 2 units and sold 5 (three buyers oversold), its stock
# written to -1 by the lost updates; EGG-01 sold 3 of 10. Cancelled orders never count.
SEED = [
    "INSERT INTO products (id, sku, available_stock, initial_stock) VALUES"
    " (1, 'PS5-01', -1, 2), (2, 'EGG-01', 7, 10)",
    "INSERT INTO orders (id, user_id, product_id, status) VALUES"
    " (1, 101, 1, 'PAID'), (2, 102, 1, 'PAID'), (3, 103, 1, 'PAID'), (4, 104, 1, 'PAID'),"
    " (5, 105, 1, 'PAID'), (6, 106, 1, 'CANCELLED'),"
    " (7, 201, 2, 'PAID'), (8, 202, 2, 'PAID'), (9, 203, 2, 'PAID'), (10, 204, 2, 'CANCELLED')",
]

#: The mapping docs/exporter-config.md gives for this schema.
MAPPING: dict[str, Any] = {
    "products": {"allocation": "initial_stock"},
    "orders": {"table": "orders", "external_ref": None},
    "order_items": {"table": "orders", "order_id": "id", "quantity": 1},
}
PROBES = ("negative_stock", "oversold")


def write_config(tmp_path: Path, db: Db) -> Path:
    off = ("duplicate_orders", "lock_waiters", "deadlocks", "long_transactions", "cache_drift")
    document = {
        "database": {"url": db.raw_url, "leader_election": False},
        "sku_guard": {"promo_skus": ["EGG-01"]},
        "schema": MAPPING,
        "probes": {
            "defaults": {"interval": "200ms", "timeout": "2s"},
            **{name: {"enabled": False} for name in off},
        },
    }
    path = tmp_path / "shop.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def seed(db: Db) -> None:
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for sql in DDL + SEED:
                conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


async def test_the_probes_count_one_unit_per_order(db: Db, registry: Any, tmp_path: Path) -> None:
    seed(db)
    config = load_config(write_config(tmp_path, db), environ={})
    assert config.schema.order_items.quantity == 1
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, PROBES), timeout=WAIT, message="probes up")
        assert sample(registry, "stock_oversold_units", sku="PS5-01") == 3.0
        assert sample(registry, "stock_oversold_units", sku="EGG-01") == 0.0
        assert sample(registry, "stock_inventory_negative_units") == 1.0


def test_reconcile_counts_one_unit_per_order(db: Db, tmp_path: Path) -> None:
    seed(db)
    path = write_config(tmp_path, db)
    argv = ["reconcile", "--config", str(path), "--database", db.raw_url, "--format", "json"]
    done = subprocess.run(
        [sys.executable, "-m", "stocksentry.exporter", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    rows = [
        (r["sku"], r["sold_units"], r["paid_orders"], r["oversold_units"])
        for r in report["oversold"]
    ]
    assert rows == [("PS5-01", 5, 5, 3)]
    assert report["negative_stock"] == [{"sku": "PS5-01", "stock": -1}]
    assert report["paid_without_items"] == []
