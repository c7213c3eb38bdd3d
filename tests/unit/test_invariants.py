"""The one builder of the invariant SQL: its text, its parameters, and what it finds.

The statements run here on an in-memory SQLite database (the standard library's), so the
builder is checked without a server; tests/integration/test_probes_match_reconcile.py
checks that the probes and reconcile read the same figures from PostgreSQL through it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from stocksentry.exporter.config import OrdersTable, SchemaConfig, parse_config
from stocksentry.exporter.invariants import INVARIANTS, InvariantSql, Param, Query, quote

SCHEMA = parse_config(
    "schema:\n  products:\n    allocation: initial_stock\n  orders:\n"
    "    idempotency_key: idempotency_key\n",
    environ={},
).schema
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def shop() -> sqlite3.Connection:
    """EGG-01 at -2, 5 paid of 2; EGG-02 at -1, 3 paid of 3; EGG-03 fine; ref-1 twice
    (once cancelled), key-x three times (one of them paid without items), an old
    duplicate two days ago."""
    db = sqlite3.connect(":memory:")
    db.executescript(
        """
        CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT, available_stock INTEGER,
                               initial_stock INTEGER);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, external_ref TEXT, idempotency_key TEXT,
                             status TEXT, created_at TEXT);
        CREATE TABLE order_items (order_id INTEGER, product_id INTEGER, quantity INTEGER);
        INSERT INTO products VALUES (1, 'EGG-01', -2, 2), (2, 'EGG-02', -1, 3),
                                    (3, 'EGG-03', 7, 10);
        """
    )
    # As sqlite3 binds a datetime, so that the text comparison orders them right.
    now, old = str(NOW), str(NOW - timedelta(days=2))
    orders = [(n, f"ref-{n}", None, "PAID", now) for n in range(1, 6)]
    orders += [(10 + n, f"r2-{n}", None, "COMPLETED", now) for n in range(3)]
    orders += [
        (20, "ref-1", None, "CANCELLED", now),
        (21, "x-a", "key-x", "PAID", now),
        (22, "x-b", "key-x", "PAID", now),
        (23, "x-c", "key-x", "PAID", now),
        (30, "old", None, "PAID", old),
        (31, "old", None, "PAID", old),
    ]
    items = [(n, 1, 1) for n in range(1, 6)] + [(10 + n, 2, 1) for n in range(3)]
    items += [(20, 3, 50), (21, 3, 1), (22, 3, 1), (30, 3, 1), (31, 3, 1)]
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", orders)
    db.executemany("INSERT INTO order_items VALUES (?, ?, ?)", items)
    return db


def rows(db: sqlite3.Connection, query: Query) -> list[tuple[object, ...]]:
    return db.execute(query.text("named"), query.params).fetchall()


def test_identifiers_are_quoted_in_one_place() -> None:
    assert quote("products") == '"products"'
    assert quote("shop.products") == '"shop"."products"'
    assert quote("orders", "mysql") == "`orders`"
    assert quote("odd`name", "mariadb") == "`odd``name`"
    assert InvariantSql(SchemaConfig(), "sqlite").quote("a.b") == '"a"."b"'


def test_a_query_renders_in_both_parameter_styles() -> None:
    query = InvariantSql(SCHEMA).paid_without_items(since=NOW, limit=7)
    for placeholder in (":paid0", ":since", ":limit"):
        assert placeholder in query.text()
    assert "%(paid0)s" in query.text("pyformat")
    assert query.params == {
        "paid0": "PAID",
        "paid1": "PROCESSING",
        "paid2": "COMPLETED",
        "since": NOW,
        "limit": 7,
    }
    constants = {p.name for p in query.parts if isinstance(p, Param) and p.constant}
    # The config's values may be inlined as literals; the run-time ones never are.
    assert constants == {"paid0", "paid1", "paid2"}


def test_the_statements_only_read() -> None:
    sql = InvariantSql(SCHEMA)
    statements = [
        sql.negative_stock(),
        sql.negative_stock_totals(),
        sql.oversold(count_orders=True),
        sql.duplicate_keys("external_ref", since=timedelta(hours=1)),
        sql.duplicate_key_totals(since=NOW),
        sql.paid_without_items(),
    ]
    for query in statements:
        text = query.text().upper()
        assert text.startswith("SELECT ")
        for word in ("INSERT", "UPDATE", "DELETE", "DROP", "ALTER", ";"):
            assert word not in text.replace("UPDATED", "")


def test_each_invariant_finds_exactly_the_seeded_rows() -> None:
    db = shop()
    sql = InvariantSql(SCHEMA, "sqlite")
    assert rows(db, sql.negative_stock()) == [("EGG-01", -2), ("EGG-02", -1)]
    assert rows(db, sql.negative_stock(skus=["EGG-02"])) == [("EGG-02", -1)]
    assert rows(db, sql.negative_stock_totals()) == [(2, 3)]
    # sku, allocation, sold, oversold, paid orders: the cancelled order's 50 never count.
    assert rows(db, sql.oversold(count_orders=True)) == [("EGG-01", 2, 5, 3, 5)]
    assert rows(db, sql.oversold(skus=["EGG-03"])) == []
    since = NOW - timedelta(hours=1)
    # Every order counts, whatever its status: ref-1 was also used by a cancelled one.
    assert rows(db, sql.duplicate_keys("external_ref", since=since)) == [("ref-1", 2)]
    assert rows(db, sql.duplicate_keys("external_ref")) == [("old", 2), ("ref-1", 2)]
    assert rows(db, sql.duplicate_keys("idempotency_key", since=since)) == [("key-x", 3)]
    # Only orders with an item of the SKU: order 23 has none.
    assert rows(db, sql.duplicate_keys("idempotency_key", skus=["EGG-03"])) == [("key-x", 2)]
    assert rows(db, sql.duplicate_key_totals(since=since)) == [(2,)]
    assert rows(db, sql.duplicate_key_totals()) == [(3,)]
    assert rows(db, sql.paid_without_items()) == [(23, "PAID")]
    assert rows(db, sql.paid_without_items(since=NOW + timedelta(hours=1))) == []


def test_the_most_oversold_come_first_for_the_probe() -> None:
    db = shop()
    db.execute("UPDATE products SET initial_stock = 1 WHERE sku = 'EGG-02'")
    sql = InvariantSql(SCHEMA, "sqlite")
    assert [r[0] for r in rows(db, sql.oversold())] == ["EGG-01", "EGG-02"]
    db.execute("UPDATE products SET initial_stock = 4 WHERE sku = 'EGG-01'")
    assert [r[0] for r in rows(db, sql.oversold(worst_first=True))] == ["EGG-02", "EGG-01"]


def test_a_missing_mapping_is_refused() -> None:
    with pytest.raises(ValueError, match="allocation"):
        InvariantSql(SchemaConfig()).oversold()
    no_keys = replace(SchemaConfig(), orders=OrdersTable(external_ref=None))
    assert InvariantSql(no_keys).key_columns() == []
    with pytest.raises(ValueError, match="external_ref or idempotency_key"):
        InvariantSql(no_keys).duplicate_key_totals()


def test_the_invariants_are_the_ones_reconcile_reports() -> None:
    from stocksentry.exporter.investigate.reconcile import FINDING_KINDS

    assert FINDING_KINDS == INVARIANTS


def test_docstring_examples() -> None:
    import doctest

    from stocksentry.exporter import invariants
    from stocksentry.exporter.investigate import scope

    # scope holds reconcile's --since and --sku handling (parse_since, shown_sku).
    for module in (invariants, scope):
        result = doctest.testmod(module)
        assert result.failed == 0, module.__name__
        assert result.attempted > 0, module.__name__


def test_quantity_1_counts_a_unit_per_row_and_reads_no_column():
    """The incident's schema: the orders row is the line (``order_items`` mapped onto
    ``orders`` itself, ``quantity: 1``)."""
    schema = parse_config(
        "schema:\n  products:\n    allocation: initial_stock\n  orders:\n"
        "    external_ref: null\n  order_items:\n    table: orders\n    order_id: id\n"
        "    quantity: 1\n",
        environ={},
    ).schema
    db = sqlite3.connect(":memory:")
    db.executescript(
        """
        CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT, available_stock INTEGER,
                               initial_stock INTEGER);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, product_id INTEGER, user_id INTEGER,
                             status TEXT, created_at TEXT);
        INSERT INTO products VALUES (1, 'PS5-01', -1, 2), (2, 'EGG-01', 7, 10);
        INSERT INTO orders VALUES (1, 1, 101, 'PAID', '2026-11-29'),
            (2, 1, 102, 'PAID', '2026-11-29'), (3, 1, 103, 'PAID', '2026-11-29'),
            (4, 1, 104, 'CANCELLED', '2026-11-29'), (5, 2, 201, 'PAID', '2026-11-29');
        """
    )
    sql = InvariantSql(schema, "sqlite")
    for query in (sql.oversold(), sql.oversold(count_orders=True), sql.paid_without_items()):
        assert '"quantity"' not in query.text()
    assert db.execute(sql.oversold().text(), sql.oversold().params).fetchall() == [
        ("PS5-01", 2, 3, 1)
    ]
    paid_without_items = sql.paid_without_items()
    assert db.execute(paid_without_items.text(), paid_without_items.params).fetchall() == []
