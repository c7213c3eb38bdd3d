"""Edges of the SQLAlchemy integration that are PostgreSQL's own: NUMERIC and aliased
``RETURNING`` columns, a serialization failure at ``COMMIT``, ``FOR UPDATE OF`` lists,
non-blocking ``LOCK TABLE`` modes, ``Decimal`` and ``UUID`` key values.

Each test makes its own database (``pg_database``) and checks the metrics, the log lines
and the app's own results.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
import test_negative_writes
from failingmetrics import failing
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry, catalog, events
from stocksentry.instrumentation.sqlalchemy import (
    StockTable,
    instrument_sqlalchemy,
    uninstrument_sqlalchemy,
)
from structlog.testing import capture_logs
from test_negative_writes import value

pytestmark = pytest.mark.integration

UNSAFE = "stock_unsafe_read_modify_write_total"
NEGATIVE = "stock_inventory_negative_total"
SERIALIZATION = "stock_db_serialization_failure_total"
ERRORS = "stocksentry_instrumentation_errors_total"

SCHEMA = (
    "CREATE TABLE products (id BIGINT PRIMARY KEY, sku TEXT UNIQUE NOT NULL,"
    " ref UUID UNIQUE NOT NULL, available_stock INTEGER NOT NULL)",
    "CREATE TABLE orders (id BIGINT PRIMARY KEY, product_id BIGINT NOT NULL)",
    "INSERT INTO products VALUES (1, 'EGG-01', '6f1c0a52-1d0c-4d8e-9d6f-3b1f7f3a9e01', 10),"
    " (2, 'EGG-02', '6f1c0a52-1d0c-4d8e-9d6f-3b1f7f3a9e02', 10)",
    "INSERT INTO orders VALUES (1, 1), (2, 2)",
)
TABLES = {"products": StockTable(key_columns=("id", "sku", "ref"))}
BLIND = sa.text("UPDATE products SET available_stock = :v WHERE sku = :sku")


sentry = test_negative_writes.sentry


@pytest.fixture
def make_engine(pg_sqlalchemy_url: str, sentry: Sentry) -> Iterator[Callable[..., sa.Engine]]:
    """An instrumented engine on the fresh database after ``statements`` ran."""
    engines: list[sa.Engine] = []

    def make(*statements: str, **options: Any) -> sa.Engine:
        engine = sa.create_engine(pg_sqlalchemy_url, pool_size=2)
        engines.append(engine)
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
        instrument_sqlalchemy(engine, sentry=sentry, **options)
        return engine

    yield make
    for engine in engines:
        uninstrument_sqlalchemy(engine)
        engine.dispose()


# --- real negative writes read from RETURNING ----------------------------------------------


def test_a_numeric_stock_column_is_read_from_returning(
    make_engine: Callable[..., sa.Engine], registry: CollectorRegistry
) -> None:
    # psycopg hands NUMERIC cells over as text with the scale ("-3.00"): still a whole,
    # negative stock.
    engine = make_engine(
        "CREATE TABLE products (sku TEXT PRIMARY KEY, available_stock NUMERIC(12, 2) NOT NULL)",
        "INSERT INTO products VALUES ('EGG-01', 2)",
        stock_tables={"products": StockTable(key_columns=("sku",))},
    )
    decrement = sa.text(
        "UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku"
        " RETURNING available_stock"
    )
    with capture_logs() as lines, engine.begin() as conn:
        left = conn.execute(decrement, {"n": 5, "sku": "EGG-01"}).scalar_one()
    assert left == Decimal("-3.00")  # the app's rows, untouched
    assert value(registry, NEGATIVE, sku="EGG-01") == 1
    negative = [line for line in lines if line["event"] == events.INVENTORY_NEGATIVE.name]
    assert [(line["sku"], line["stock"]) for line in negative] == [("EGG-01", -3)]


@pytest.mark.parametrize(
    "returning",
    ["available_stock AS remaining", "available_stock + 0", "products.available_stock"],
)
def test_a_stock_returned_under_another_name_is_still_counted(
    make_engine: Callable[..., sa.Engine], registry: CollectorRegistry, returning: str
) -> None:
    # The RETURNING names the stock column, so it is not read back; its rows carry it under
    # another name (an alias, an expression), so they cannot say it either. Before the fix
    # the write that left -3 went uncounted.
    engine = make_engine(*SCHEMA, stock_tables=TABLES)
    decrement = sa.text(
        "UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku"
        f" RETURNING {returning}"
    )
    with engine.begin() as conn:
        assert conn.execute(decrement, {"n": 13, "sku": "EGG-01"}).all() == [(-3,)]
    assert value(registry, NEGATIVE, sku="EGG-01") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0


# --- a refusal at COMMIT ------------------------------------------------------------------


@pytest.mark.parametrize("counter", ["working", "failing"])
def test_a_serialization_failure_at_commit_is_counted_for_the_table_last_written(
    make_engine: Callable[..., sa.Engine],
    sentry: Sentry,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
    counter: str,
) -> None:
    # Write skew at SERIALIZABLE: each transaction reads both rows and writes one. The
    # second COMMIT fails with 40001; COMMIT names no table, so the connection's last stock
    # table is the label. A counter that fails is counted, and the app's error is unchanged.
    engine = make_engine(*SCHEMA, stock_tables=TABLES)
    if counter == "failing":
        failing(sentry, monkeypatch, catalog.DB_SERIALIZATION_FAILURE)
    serializable = engine.execution_options(isolation_level="SERIALIZABLE")
    total = sa.text("SELECT sum(available_stock) FROM products")
    one = sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku")
    with serializable.connect() as first, serializable.connect() as second:
        first.execute(total).scalar_one()
        second.execute(total).scalar_one()
        first.execute(one, {"sku": "EGG-01"})
        second.execute(one, {"sku": "EGG-02"})
        first.commit()
        with capture_logs() as lines, pytest.raises(sa.exc.OperationalError) as caught:
            second.commit()
    assert getattr(caught.value.orig, "sqlstate", None) == "40001"
    if counter == "working":
        assert value(registry, SERIALIZATION, table="products") == 1
        assert value(registry, ERRORS, component="sqlalchemy") == 0
    else:
        assert value(registry, ERRORS, component="sqlalchemy") == 1
    assert value(registry, SERIALIZATION, table="unknown") == 0
    if counter == "working":
        (line,) = [x for x in lines if x["event"] == events.DB_SERIALIZATION_FAILURE.name]
        assert (line["table"], line["sqlstate"]) == ("products", "40001")


# --- which reads are locked ----------------------------------------------------------------


JOINED = "products p JOIN orders o ON o.product_id = p.id"


@pytest.mark.parametrize(
    ("source", "qualifier", "lock", "flagged"),
    [
        # The OF list names the stock table (second, after another table): its rows are locked.
        (JOINED, "p", "FOR UPDATE OF o, p", 0),
        (
            "products JOIN orders ON orders.product_id = products.id",
            "products",
            "FOR UPDATE OF orders, products",
            0,
        ),
        # The OF list names only the other table: the stock row is not locked.
        (JOINED, "p", "FOR UPDATE OF o", 1),
    ],
)
def test_for_update_of_a_list_locks_the_tables_it_names(
    make_engine: Callable[..., sa.Engine],
    registry: CollectorRegistry,
    source: str,
    qualifier: str,
    lock: str,
    flagged: int,
) -> None:
    engine = make_engine(*SCHEMA, stock_tables=TABLES)
    read = sa.text(
        f"SELECT {qualifier}.available_stock FROM {source} WHERE {qualifier}.sku = :sku {lock}"
    )
    with engine.begin() as conn:
        stock = conn.execute(read, {"sku": "EGG-01"}).scalar_one()
        conn.execute(BLIND, {"v": stock - 1, "sku": "EGG-01"})
    assert value(registry, UNSAFE, table="products") == flagged
    assert value(registry, ERRORS, component="sqlalchemy") == 0


@pytest.mark.parametrize(
    ("mode", "flagged"),
    [("ROW SHARE", 1), ("ROW EXCLUSIVE", 1), ("SHARE", 0), ("EXCLUSIVE", 0)],
)
def test_only_a_lock_table_mode_that_blocks_writers_makes_a_plain_read_safe(
    make_engine: Callable[..., sa.Engine], registry: CollectorRegistry, mode: str, flagged: int
) -> None:
    engine = make_engine(*SCHEMA, stock_tables=TABLES)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"LOCK TABLE products IN {mode} MODE")
        stock = conn.execute(
            sa.text("SELECT available_stock FROM products WHERE sku = :sku"), {"sku": "EGG-01"}
        ).scalar_one()
        conn.execute(BLIND, {"v": stock - 1, "sku": "EGG-01"})
    assert value(registry, UNSAFE, table="products") == flagged
    assert value(registry, ERRORS, component="sqlalchemy") == 0


# --- key values of other Python types ----------------------------------------------------


@pytest.mark.parametrize(
    ("column", "read_key", "write_key"),
    [
        # An id from a NUMERIC column or a JSON decoder, and the int the ORM writes with.
        ("id", Decimal("1"), 1),
        ("id", 1, Decimal("1.000")),
        # A UUID object read, its text written (and the other way round).
        (
            "ref",
            uuid.UUID("6f1c0a52-1d0c-4d8e-9d6f-3b1f7f3a9e01"),
            "6f1c0a52-1d0c-4d8e-9d6f-3b1f7f3a9e01",
        ),
        (
            "ref",
            "6f1c0a52-1d0c-4d8e-9d6f-3b1f7f3a9e01",
            uuid.UUID("6f1c0a52-1d0c-4d8e-9d6f-3b1f7f3a9e01"),
        ),
    ],
)
def test_key_values_of_another_type_name_the_same_row(
    make_engine: Callable[..., sa.Engine],
    registry: CollectorRegistry,
    column: str,
    read_key: object,
    write_key: object,
) -> None:
    engine = make_engine(*SCHEMA, stock_tables=TABLES)
    with engine.connect() as conn:
        conn.execute(
            sa.text(f"SELECT available_stock FROM products WHERE {column} = :k"),
            {"k": read_key},
        ).all()
        conn.commit()
        written = conn.execute(
            sa.text(f"UPDATE products SET available_stock = :v WHERE {column} = :k"),
            {"v": 9, "k": write_key},
        )
        assert written.rowcount == 1
        conn.commit()
    assert value(registry, UNSAFE, table="products") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0
