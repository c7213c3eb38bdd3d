"""Every MySQL probe statement stays on index paths on a sizeable shop in MariaDB.

The MariaDB twin of ``test_probes_at_scale.py``: the scale benchmark's generator
(``benchmarks/scaleshop.generate_mysql``) at 100k products and 500k orders, its
``ANALYZE TABLE``, a little live traffic, then each probe of exporter/config.example.yaml
(without the PostgreSQL-only custom SQL and cache_drift) runs twice (the incremental
probes' second run takes their steady-state branches) and every statement it sent is
explained, with reconcile's ``--sku`` statements. No optimizer switch is touched.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Any

import pytest
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.mysql import MyDbProbe
from stocksentry.exporter.probes.mysql.common import statement
from test_probes_mysql import connect

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_scale import SessionRecorder, example_config  # noqa: E402
from benchmarks.scaleshop import generate_mysql  # noqa: E402

pytestmark = pytest.mark.integration

PRODUCTS = 100_000
ORDERS = 500_000
#: The aliases the statements give products, orders and order_items (and their names).
BIG = {"p", "q", "sp", "o", "oi", "i", "products", "orders", "order_items"}


def traffic(url: str, count: int) -> None:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            for n in range(count):
                cur.execute(
                    "INSERT INTO orders (external_ref, status, created_at)"
                    " VALUES (%s, 'PAID', now(6))",
                    (f"live-{n}",),
                )
                cur.execute(
                    "INSERT INTO order_items (order_id, product_id, quantity, stock_after)"
                    " VALUES (%s, %s, 1, 0)",
                    (cur.lastrowid, 1 + (n * 7919) % PRODUCTS),
                )
    finally:
        conn.close()


async def sent_by(probe: MyDbProbe) -> list[tuple[str, Any]]:
    async def capture(session: Any) -> list[tuple[str, Any]]:
        recorder: Any = SessionRecorder(session)
        await probe.query(recorder)
        return list(recorder.statements)

    return await probe.pool.read(capture)


def full_scans(url: str, text: str, params: Any) -> list[str]:
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


async def test_no_probe_plan_reads_the_big_tables_whole(mysql_database: str) -> None:
    conn = connect(mysql_database)
    try:
        facts = generate_mysql(conn, products=PRODUCTS, orders=ORDERS)
    finally:
        conn.close()
    assert facts.order_items > ORDERS
    config = example_config(mysql_database)
    runner = ProbeRunner(config)
    probes = [p for p in runner.probes if isinstance(p, MyDbProbe)]
    assert {"oversold", "duplicate_orders", "negative_stock"} <= {p.name for p in probes}
    sent: list[tuple[str, str, Any]] = []
    try:
        for probe in probes:
            await sent_by(probe)  # the first run (full read of the window, rebuild)
        traffic(mysql_database, 20)
        for probe in probes:
            sent.extend((probe.name, text, params) for text, params in await sent_by(probe))
    finally:
        await runner.stop()
    names = {name for name, _t, _p in sent}
    assert {"oversold", "duplicate_orders", "expired_reservations", "outbox"} <= names
    builder = InvariantSql(config.schema, dialect="mysql")
    for query in (
        builder.negative_stock(skus=["SKU-00000042"]),
        builder.oversold(skus=["SKU-00000042"], count_orders=True),
        builder.duplicate_keys("external_ref", skus=["SKU-00000042"]),
        builder.duplicate_keys(
            "external_ref",
            skus=["SKU-00000042"],
            since=dt.datetime.now() - dt.timedelta(hours=2),
        ),
    ):
        text, params = statement(query)
        sent.append(("reconcile --sku", text, params))
    found = [
        f"{name}: full scan of {', '.join(scans)}: {text[:120]}"
        for name, text, params in sent
        if (scans := full_scans(mysql_database, text, params))
    ]
    assert found == []
