"""Every probe statement of the example config stays on index paths on a sizeable shop.

The shop is the scale benchmark's generator (benchmarks/scaleshop.py) at 100k products
and 500k orders (600k items): big enough that a scan of ``orders`` or ``order_items``
costs the planner far more than an index path, and generated in seconds. After its
``VACUUM ANALYZE`` / ``ANALYZE TABLE`` and a little live traffic, each probe of
exporter/config.example.yaml (on MariaDB without cache_drift) runs twice (the
incremental probes' second run takes their steady-state branches) and every statement
it sent is explained; so are reconcile's ``--sku`` statements.
No planner or optimizer setting is touched: the plans are the server's own.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbs import Db
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.db import DbProbe
from test_probes_mysql import connect

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_scale import SessionRecorder, example_config  # noqa: E402
from benchmarks.scaleshop import explain, generate, generate_mysql, seq_scans  # noqa: E402

pytestmark = pytest.mark.integration

PRODUCTS = 100_000
ORDERS = 500_000
#: The aliases the statements give products, orders and order_items (and their names).
BIG = {"p", "q", "sp", "o", "oi", "i", "products", "orders", "order_items"}


def _traffic(db: Db, count: int) -> None:
    conn: Any = connect(db.raw_url) if db.mysql else psycopg.connect(db.raw_url, autocommit=True)
    try:
        with conn.cursor() as cur:
            for n in range(count):
                cur.execute(
                    "INSERT INTO orders (external_ref, status, created_at)"
                    f" VALUES (%s, 'PAID', {'now(6)' if db.mysql else 'now()'})"
                    + ("" if db.mysql else " RETURNING id"),
                    (f"live-{n}",),
                )
                order_id = cur.lastrowid if db.mysql else cur.fetchone()[0]
                cur.execute(
                    "INSERT INTO order_items (order_id, product_id, quantity, stock_after)"
                    " VALUES (%s, %s, 1, 0)",
                    (order_id, 1 + (n * 7919) % PRODUCTS),
                )
    finally:
        conn.close()


async def _statements(probe: DbProbe) -> list[tuple[Any, Any]]:
    async def capture(session: Any) -> list[tuple[Any, Any]]:
        recorder: Any = SessionRecorder(session)
        query = getattr(probe, "database_stock", None) or probe.query
        await query(recorder)
        return list(recorder.statements)

    return await probe.pool.read(capture)


def _mysql_full_scans(url: str, text: str, params: Any) -> list[str]:
    """The big tables ``EXPLAIN`` reads whole (access type ALL, or a full index scan)."""
    if "information_schema" in text or not text.lstrip().upper().startswith("SELECT"):
        return []
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("EXPLAIN " + text, params)
            # id, select_type, table, type, possible_keys, key, key_len, ref, rows, Extra
            return sorted(
                {str(r[2]) for r in cur.fetchall() if r[3] in ("ALL", "index") and r[2] in BIG}
            )
    finally:
        conn.close()


async def test_no_probe_plan_reads_the_big_tables_whole(db: Db) -> None:
    if db.mysql:
        conn: Any = connect(db.raw_url)
        try:
            facts = generate_mysql(conn, products=PRODUCTS, orders=ORDERS)
        finally:
            conn.close()
    else:
        with psycopg.connect(db.raw_url, autocommit=True) as conn:
            facts = generate(conn, products=PRODUCTS, orders=ORDERS)
    assert facts.order_items > ORDERS
    config = example_config(db.raw_url)
    runner = ProbeRunner(config)
    probes = [p for p in runner.probes if isinstance(p, DbProbe)]
    assert {"oversold", "duplicate_orders", "negative_stock"} <= {p.name for p in probes}
    sent: list[tuple[str, Any, Any]] = []
    try:
        for probe in probes:
            await _statements(probe)  # the first run (full read of the window, rebuild)
        _traffic(db, 20)
        for probe in probes:
            sent.extend((probe.name, q, p) for q, p in await _statements(probe))
    finally:
        await runner.stop()
    names = {name for name, _q, _p in sent}
    assert {"oversold", "duplicate_orders", "recent_paid_orders"} <= names
    if db.mysql:
        assert {"expired_reservations", "outbox"} <= names
    # reconcile --sku: the statements of a one-SKU audit.
    builder = InvariantSql(config.schema, db.dialect)
    now = dt.datetime.now() if db.mysql else dt.datetime.now(dt.UTC)
    for query in (
        builder.negative_stock(skus=["SKU-00000042"]),
        builder.oversold(skus=["SKU-00000042"], count_orders=True),
        builder.duplicate_keys("external_ref", skus=["SKU-00000042"]),
        builder.duplicate_keys(
            "external_ref", skus=["SKU-00000042"], since=now - dt.timedelta(hours=2)
        ),
    ):
        sent.append(("reconcile --sku", *runner_render(runner, query)))

    found: list[str] = []
    if db.mysql:
        found = [
            f"{name}: full scan of {', '.join(scans)}: {text[:120]}"
            for name, text, params in sent
            if (scans := _mysql_full_scans(db.raw_url, text, params))
        ]
    else:
        async with await psycopg.AsyncConnection.connect(db.raw_url) as conn:
            for name, statement, params in sent:
                scans = seq_scans(await explain(conn, statement, params))
                if scans:
                    found.append(f"{name}: Seq Scan on {', '.join(scans)}")
    assert found == []


def runner_render(runner: ProbeRunner, query: Any) -> tuple[str, Any]:
    """``query`` as the runner's probes send it (the dialect's text and parameters)."""
    probe = next(p for p in runner.probes if isinstance(p, DbProbe))
    return probe.dialect.render(query)
