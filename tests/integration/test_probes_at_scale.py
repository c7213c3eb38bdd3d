"""Every probe statement of the example config stays on index paths on a sizeable shop.

The shop is the scale benchmark's generator (benchmarks/scaleshop.py) at 100k products
and 500k orders (600k items): big enough that a scan of ``orders`` or ``order_items``
costs the planner far more than an index path, and generated in seconds. After its
``VACUUM ANALYZE`` and a little live traffic, each probe of exporter/config.example.yaml
runs twice (the incremental probes' second run takes their steady-state branches) and
every statement it sent is explained; so are reconcile's ``--sku`` statements. No
``enable_*`` setting is touched: the plans are the planner's own.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from stocksentry.exporter.config import load_config
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.postgres import DbProbe
from stocksentry.exporter.probes.postgres.common import composed

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.scaleshop import StatementRecorder, explain, generate, seq_scans  # noqa: E402

pytestmark = pytest.mark.integration

PRODUCTS = 100_000
ORDERS = 500_000


async def _traffic(url: str, count: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for n in range(count):
            cursor = await conn.execute(
                "INSERT INTO orders (external_ref, status, created_at)"
                " VALUES (%s, 'PAID', now()) RETURNING id",
                (f"live-{n}",),
            )
            row = await cursor.fetchone()
            assert row is not None
            await conn.execute(
                "INSERT INTO order_items (order_id, product_id, quantity, stock_after)"
                " VALUES (%s, %s, 1, 0)",
                (row[0], 1 + (n * 7919) % PRODUCTS),
            )


async def _statements(probe: DbProbe) -> list[tuple[Any, Any]]:
    async def capture(conn: Any) -> list[tuple[Any, Any]]:
        recorder: Any = StatementRecorder(conn)
        query = getattr(probe, "_database_stock", None) or probe.query
        await query(recorder)
        return list(recorder.statements)

    return await probe.pool.read(capture)


async def test_no_probe_plan_reads_the_big_tables_by_seq_scan(pg_database: str) -> None:
    with psycopg.connect(pg_database, autocommit=True) as conn:
        facts = generate(conn, products=PRODUCTS, orders=ORDERS)
    assert facts.order_items > ORDERS
    config = load_config(
        ROOT / "exporter" / "config.example.yaml",
        environ={
            "STOCKSENTRY_DATABASE_URL": pg_database,
            "STOCKSENTRY_REDIS_URL": "redis://127.0.0.1:6379/0",
        },
    )
    runner = ProbeRunner(config)
    probes = [p for p in runner.probes if isinstance(p, DbProbe)]
    assert {"oversold", "duplicate_orders", "negative_stock"} <= {p.name for p in probes}
    sent: list[tuple[str, Any, Any]] = []
    try:
        for probe in probes:
            await _statements(probe)  # the first run (full read of the window, rebuild)
        await _traffic(pg_database, 20)
        for probe in probes:
            sent.extend((probe.name, q, p) for q, p in await _statements(probe))
    finally:
        await runner.stop()
    names = {name for name, _q, _p in sent}
    assert {"oversold", "duplicate_orders", "recent_paid_orders"} <= names
    # reconcile --sku: the statements of a one-SKU audit.
    builder = InvariantSql(config.schema)
    for query in (
        builder.negative_stock(skus=["SKU-00000042"]),
        builder.oversold(skus=["SKU-00000042"], count_orders=True),
        builder.duplicate_keys("external_ref", skus=["SKU-00000042"]),
        builder.duplicate_keys(
            "external_ref",
            skus=["SKU-00000042"],
            since=dt.datetime.now(dt.UTC) - dt.timedelta(hours=2),
        ),
    ):
        statement, params = composed(query)
        sent.append(("reconcile --sku", statement, params))

    found: list[str] = []
    async with await psycopg.AsyncConnection.connect(pg_database) as conn:
        for name, statement, params in sent:
            plan = await explain(conn, statement, params)
            scans = seq_scans(plan)
            if scans:
                found.append(f"{name}: Seq Scan on {', '.join(scans)}")
    assert found == []
