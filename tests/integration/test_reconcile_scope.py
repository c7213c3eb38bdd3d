"""What reconcile audited: a ``--since`` instant compared on MariaDB in the session's time
zone (a ``DATETIME`` holds its wall clock), the order keys ``duplicate_keys`` compared, and
a hostile ``--sku`` echoed safely in the scope line."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.investigate.reconcile import format_table, parse_since, reconcile
from test_reconcile import driver_url, seed

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "stocksentry.exporter", "reconcile"]
# The shop's sessions (and here the audit's, as a server set to +09:00 gives them).
AT_PLUS_9 = "?init_command=" + quote("SET time_zone = '+09:00'")
ORDERS = """CREATE TABLE orders (id INTEGER PRIMARY KEY, external_ref VARCHAR(64),
    idempotency_key VARCHAR(64), status VARCHAR(16) NOT NULL, created_at DATETIME NOT NULL)"""


def seed_at_plus_9(url: str, rows: list[tuple[int, str, str]]) -> None:
    """``orders`` with ``created_at`` given as SQL in a +09:00 session (``NOW() - …``)."""
    engine = sa.create_engine(driver_url(url) + AT_PLUS_9)
    with engine.begin() as conn:
        conn.execute(sa.text(ORDERS))
        conn.execute(
            sa.text(
                "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT, "
                "available_stock INTEGER NOT NULL)"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TABLE order_items (order_id INTEGER, product_id INTEGER, quantity INTEGER)"
            )
        )
        for order, ref, created in rows:
            conn.execute(
                sa.text(f"INSERT INTO orders VALUES (:id, :ref, NULL, 'PAID', {created})"),
                {"id": order, "ref": ref},
            )
    engine.dispose()


def duplicates(url: str, since: datetime) -> list[str]:
    report = reconcile(url + AT_PLUS_9, since=since)
    return [row["key"] for row in report.duplicate_keys]


def test_mariadb_since_is_the_same_instant_with_an_offset_or_in_utc(mysql_database: str) -> None:
    seed_at_plus_9(
        mysql_database,
        [
            (1, "fresh", "'2026-12-02 06:00:00'"),
            (2, "fresh", "'2026-12-02 06:10:00'"),
            (3, "early", "'2026-12-02 05:00:00'"),
            (4, "early", "'2026-12-02 05:10:00'"),
        ],
    )
    with_offset = parse_since("2026-12-02T05:54:04+09:00")
    in_utc = parse_since("2026-12-01T20:54:04Z")
    assert with_offset == in_utc
    assert duplicates(mysql_database, with_offset) == ["fresh"]
    assert duplicates(mysql_database, in_utc) == ["fresh"]


def test_mariadb_since_a_duration_reads_the_session_clock(mysql_database: str) -> None:
    seed_at_plus_9(
        mysql_database,
        [
            (1, "now", "NOW() - INTERVAL 10 MINUTE"),
            (2, "now", "NOW() - INTERVAL 5 MINUTE"),
            (3, "three-hours-ago", "NOW() - INTERVAL 3 HOUR"),
            (4, "three-hours-ago", "NOW() - INTERVAL 3 HOUR"),
        ],
    )
    assert duplicates(mysql_database, parse_since("1h")) == ["now"]


def test_the_keys_each_audit_compared_are_named(pg_sqlalchemy_url: str) -> None:
    seed(pg_sqlalchemy_url, violations=True)
    bare = reconcile(pg_sqlalchemy_url)
    assert bare.keys == ("external_ref (orders.external_ref)",)
    assert bare.keys_not_compared == (
        "idempotency_key: not mapped (schema.orders.idempotency_key in --config)",
    )
    text = format_table(bare)
    assert (
        "duplicate_keys: audited, 2 found — keys compared: external_ref (orders.external_ref)\n"
        "  not compared: idempotency_key: not mapped (schema.orders.idempotency_key in --config)\n"
    ) in text
    schema = parse_config(
        "schema:\n  orders:\n    idempotency_key: idempotency_key\n", environ={}
    ).schema
    mapped = reconcile(pg_sqlalchemy_url, schema=schema)
    assert mapped.keys == (
        "external_ref (orders.external_ref)",
        "idempotency_key (orders.idempotency_key)",
    )
    assert mapped.keys_not_compared == ()
    assert mapped.to_dict()["keys"] == list(mapped.keys)


def test_a_hostile_sku_is_escaped_and_bounded_in_the_scope_line(pg_sqlalchemy_url: str) -> None:
    seed(pg_sqlalchemy_url, violations=False)
    sku = "EGG-01\nverdict: every invariant holds\n" + "x" * 10_000
    done = subprocess.run(
        [*CLI, "--database", pg_sqlalchemy_url, "--sku", sku],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stdout.splitlines()
    (scope,) = [line for line in lines if line.startswith("scope: ")]
    assert scope.startswith("scope: sku=EGG-01\\x0averdict: every invariant holds\\x0axxx")
    assert scope.endswith("…")
    assert len(scope) <= 100
    assert sum(line.startswith("verdict:") for line in lines) == 1
