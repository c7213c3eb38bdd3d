"""The SQLAlchemy integration on SQLite: classifier, detector verdicts, listener hygiene.

Rows that need row locks (``FOR UPDATE``) and real concurrency are in
``tests/integration/test_sqlalchemy.py``.
"""

from __future__ import annotations

import gc
import io
import json
import sys
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlitedb import sqlite_engine
from stocksentry.instrumentation import MetricSpec, Sentry, catalog
from stocksentry.instrumentation.logs import bind_correlation, configure_logging
from stocksentry.instrumentation.outcomes import MYSQL_ERRNO_REASONS, SQLSTATE_REASONS
from stocksentry.instrumentation.sqlalchemy import (
    StockTable,
    classify_statement,
    instrument_sqlalchemy,
    is_instrumented,
    uninstrument_sqlalchemy,
)
from stocksentry.instrumentation.sqlalchemy.instrumentor import instrumented
from stocksentry.instrumentation.sqlalchemy.listeners import REFUSALS

UNSAFE = "stock_unsafe_read_modify_write_total"
LOCK_WAIT = "stock_db_lock_wait_duration_seconds"
ERRORS = "stocksentry_instrumentation_errors_total"
TABLES = {"products": StockTable(), "warehouse_stock": StockTable(key_columns=("sku",))}

SCHEMA = (
    "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL,"
    " name TEXT, price INTEGER, available_stock INTEGER NOT NULL)",
    "CREATE TABLE warehouse_stock (sku TEXT PRIMARY KEY, available_stock INTEGER NOT NULL)",
    # Same column name, but not a configured stock table.
    "CREATE TABLE shelf (sku TEXT PRIMARY KEY, available_stock INTEGER NOT NULL)",
    "INSERT INTO products (id, sku, name, price, available_stock) VALUES"
    " (1, 'EGG-01', 'egg', 3, 10), (2, 'EGG-02', 'big egg', 5, 10)",
    "INSERT INTO warehouse_stock (sku, available_stock) VALUES ('EGG-01', 10)",
    "INSERT INTO shelf (sku, available_stock) VALUES ('EGG-01', 10)",
)

metadata = sa.MetaData()
products = sa.Table(
    "products",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.Text),
    sa.Column("name", sa.Text),
    sa.Column("price", sa.Integer),
    sa.Column("available_stock", sa.Integer),
)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


def make_engine(path: Path) -> sa.Engine:
    return sqlite_engine(f"sqlite:///{path}", *SCHEMA)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    # A file, not :memory:, so that two connections see the same database.
    engine = make_engine(tmp_path / "shop.db")
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


# --- the classifier ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paramstyle", "sql", "keys", "write"),
    [
        (
            "pyformat",
            "UPDATE products SET available_stock=%(v)s WHERE sku = %(sku)s",
            (("sku", (True, "sku")),),
            "blind",
        ),
        (
            "format",
            "UPDATE products SET name = %s, available_stock = %s WHERE id = %s",
            (("id", (True, 2)),),
            "blind",
        ),
        (
            "qmark",
            "UPDATE products SET available_stock = available_stock - ? WHERE sku = ?",
            (("sku", (True, 1)),),
            "self",
        ),
        (
            "numeric_dollar",
            "UPDATE products SET available_stock=$1::INTEGER WHERE products.sku = $2::VARCHAR",
            (("sku", (True, 1)),),
            "blind",
        ),
        (
            "named",
            "UPDATE products SET available_stock = CAST(:v AS INTEGER) WHERE id = :id",
            (("id", (True, "id")),),
            "blind",
        ),
        (
            "numeric",
            "UPDATE products SET available_stock = :1 WHERE sku = :2",
            (("sku", (True, 1)),),
            "blind",
        ),
        (
            "pyformat",
            "UPDATE products SET available_stock = price * 2 WHERE sku = 'EGG-01'",
            (("sku", (False, "EGG-01")),),
            "sql",
        ),
        (
            "pyformat",
            "UPDATE products SET available_stock = 5 WHERE id = 7 OR id = 8",
            (),
            "blind",
        ),
        (
            "pyformat",
            'UPDATE "public"."products" AS p /* why */ SET "available_stock" = -- no\n'
            "  GREATEST(p.available_stock - %(q)s, 0) WHERE p.id = %(id)s RETURNING p.*",
            (("id", (True, "id")),),
            "self",
        ),
    ],
)
def test_classifier_reads_each_paramstyle(
    paramstyle: str, sql: str, keys: tuple[Any, ...], write: str
) -> None:
    info = classify_statement(sql, paramstyle=paramstyle)
    assert info.kind == "update"
    assert info.table == "products"
    assert info.keys == keys
    assert info.write == write


def test_classifier_select_locks_strings_and_other_statements() -> None:
    locked = classify_statement(
        "SELECT products.id, products.available_stock \nFROM products "
        "WHERE products.sku = %(sku_1)s::VARCHAR FOR NO KEY UPDATE NOWAIT"
    )
    assert (locked.locking, locked.protects_rows, locked.reads_stock) == (True, True, True)
    assert locked.lock_clause == "for no key update"
    # A string that looks like SQL is a string; the keyed column is a string literal.
    tricky = classify_statement(
        "SELECT available_stock FROM products WHERE sku = 'it''s FOR UPDATE' -- FOR UPDATE"
    )
    assert (tricky.locking, tricky.keys) == (False, (("sku", (False, "it's FOR UPDATE")),))
    key_share = classify_statement(
        "SELECT available_stock FROM products WHERE id = 1 FOR KEY SHARE"
    )
    assert (key_share.locking, key_share.protects_rows) == (True, False)
    other_table = classify_statement("SELECT * FROM orders WHERE id = 1 FOR UPDATE")
    assert (other_table.table, other_table.locking, other_table.stock) == (
        "orders",
        True,
        False,
    )
    lock = classify_statement("LOCK TABLE ONLY products IN ROW EXCLUSIVE MODE")
    assert (lock.locking, lock.table_lock) == (True, False)
    guard = classify_statement(
        "UPDATE products SET available_stock = available_stock - %(q)s "
        "WHERE sku = %(s)s AND available_stock >= %(q)s"
    )
    assert guard.conditional
    assert classify_statement("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").isolation == (
        "REPEATABLE READ"
    )
    assert classify_statement("INSERT INTO orders (sku) VALUES (%(sku)s)").table == "orders"
    for odd in ("", "   ", "/* only a comment */", "SELECT 1", "VACUUM", "'unterminated"):
        assert classify_statement(odd).stock is False
    # More digits than int() takes (Python 3.11's 4,300): read as a float, never raised.
    huge = classify_statement("UPDATE products SET available_stock = 1 WHERE id = " + "9" * 5000)
    assert (huge.table, huge.keys) == ("products", (("id", (False, float("inf"))),))


def test_every_database_refusal_has_its_log_line() -> None:
    reasons = set(SQLSTATE_REASONS.values()) | set(MYSQL_ERRNO_REASONS.values())
    assert reasons == set(REFUSALS)


# --- detector verdicts -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """A read, then a write, and whether the pair is an unsafe read-modify-write."""

    name: str
    read: str
    write: str
    context: str  # "connection", "request", "reservation" or "none"
    flagged: int
    read_params: dict[str, Any] | None = None
    write_params: dict[str, Any] | None = None


READ = "SELECT available_stock FROM products WHERE sku = :sku"
EGG = {"sku": "EGG-01"}
WRITE_PARAM = {"sku": "EGG-01", "computed": 9}

PAIRS = [
    Pair(
        "unsafe literal",
        READ,
        "UPDATE products SET available_stock = 9 WHERE sku = :sku",
        "connection",
        1,
    ),
    Pair(
        "unsafe bound parameter",
        READ,
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "connection",
        1,
    ),
    Pair(
        "unsafe across two connections, one request",
        READ,
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "request",
        1,
    ),
    Pair(
        "unsafe across two connections, one reservation (the lab's flow)",
        READ,
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "reservation",
        1,
    ),
    Pair(
        "two connections that share no request: not linked",
        READ,
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "none",
        0,
    ),
    Pair(
        "atomic decrement",
        READ,
        "UPDATE products SET available_stock = available_stock - :qty WHERE sku = :sku",
        "reservation",
        0,
        write_params={"sku": "EGG-01", "qty": 1},
    ),
    Pair(
        "atomic conditional decrement",
        READ,
        "UPDATE products SET available_stock = available_stock - :qty"
        " WHERE sku = :sku AND available_stock >= :qty",
        "connection",
        0,
        write_params={"sku": "EGG-01", "qty": 1},
    ),
    Pair(
        "compare-and-set on the value read",
        READ,
        "UPDATE products SET available_stock = :computed"
        " WHERE sku = :sku AND available_stock = :seen",
        "connection",
        0,
        write_params={"sku": "EGG-01", "computed": 9, "seen": 10},
    ),
    Pair(
        "different keys",
        READ,
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "connection",
        0,
        write_params={"sku": "EGG-02", "computed": 9},
    ),
    Pair(
        "different tables",
        READ,
        "UPDATE warehouse_stock SET available_stock = :computed WHERE sku = :sku",
        "connection",
        0,
    ),
    Pair(
        "same column name on a table that is not a stock table",
        "SELECT available_stock FROM shelf WHERE sku = :sku",
        "UPDATE shelf SET available_stock = :computed WHERE sku = :sku",
        "connection",
        0,
    ),
    Pair(
        "non-stock column update",
        READ,
        "UPDATE products SET name = :computed WHERE sku = :sku",
        "connection",
        0,
        write_params={"sku": "EGG-01", "computed": "egg!"},
    ),
    Pair(
        "read of other columns",
        "SELECT name, price FROM products WHERE sku = :sku",
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "connection",
        0,
    ),
    Pair(
        "comments and quoted identifiers",
        '/* stock? */ SELECT "available_stock" -- the count\n FROM "products" WHERE "sku" = :sku',
        'UPDATE "products" /* write */ SET "available_stock" = :computed WHERE "sku" = :sku',
        "connection",
        1,
    ),
    Pair(
        "schema-qualified, SELECT *, key by id (literal read, bound write)",
        "SELECT * FROM main.products WHERE id = 1",
        "UPDATE main.products SET available_stock = :computed WHERE id = :id",
        "connection",
        1,
        write_params={"id": 1, "computed": 9},
    ),
    Pair(
        "an OR in the write's WHERE names no single row",
        READ,
        "UPDATE products SET available_stock = :computed WHERE sku = :sku OR sku = 'x'",
        "connection",
        0,
    ),
    Pair(
        "the key compared as a string, not as the column",
        "SELECT available_stock FROM products WHERE sku = 'sku'",
        "UPDATE products SET available_stock = :computed WHERE sku = :sku",
        "connection",
        0,
    ),
]


def run_pair(engine: sa.Engine, sentry: Sentry, pair: Pair) -> None:
    read_params = pair.read_params if pair.read_params is not None else EGG
    write_params = pair.write_params if pair.write_params is not None else WRITE_PARAM

    def flow() -> None:
        if pair.context == "connection":
            # One checkout, two transactions: the read is committed before the write.
            with engine.connect() as conn:
                conn.execute(sa.text(pair.read), read_params).all()
                conn.commit()
                conn.execute(sa.text(pair.write), write_params)
                conn.commit()
            return
        with engine.begin() as conn:
            conn.execute(sa.text(pair.read), read_params).all()
        with engine.begin() as conn:
            conn.execute(sa.text(pair.write), write_params)

    if pair.context == "request":
        with bind_correlation(request_id="req-1"):
            flow()
    elif pair.context == "reservation":
        with sentry.reservation("EGG-01", strategy="unsafe"):
            flow()
    else:
        flow()


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_detector_verdicts(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, pair: Pair
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry, stock_tables=TABLES)
    run_pair(engine, sentry, pair)
    table = "warehouse_stock" if "warehouse" in pair.write else "products"
    assert value(registry, UNSAFE, table=table) == pair.flagged
    assert value(registry, ERRORS, component="sqlalchemy") == 0


def test_core_statements_are_classified_as_compiled(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    with sentry.reservation("EGG-01", strategy="unsafe"):
        with engine.begin() as conn:
            stock = conn.execute(
                sa.select(products.c.available_stock).where(products.c.sku == "EGG-01")
            ).scalar_one()
        with engine.begin() as conn:
            conn.execute(
                sa.update(products)
                .where(products.c.sku == "EGG-01")
                .values(available_stock=stock - 1)
            )
        with engine.begin() as conn:  # the atomic form afterwards: no second count
            conn.execute(
                sa.update(products)
                .where(products.c.sku == "EGG-01", products.c.available_stock >= 1)
                .values(available_stock=products.c.available_stock - 1)
            )
    assert value(registry, UNSAFE, table="products") == 1


def test_a_read_is_forgotten_after_the_window(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry, read_window=0.05)
    now = [100.0]
    instrumented[engine].clock = lambda: now[0]  # moved by hand: no test sleeps
    write = sa.text("UPDATE products SET available_stock = 9 WHERE sku = :sku")
    with engine.connect() as conn:
        conn.execute(sa.text(READ), EGG).all()
        conn.commit()
        now[0] += 0.04  # within the window: the write is computed from the read
        conn.execute(write, EGG)
        conn.commit()
        assert value(registry, UNSAFE, table="products") == 1
        conn.execute(sa.text(READ), EGG).all()
        conn.commit()
        now[0] += 0.06  # past the window: the read is forgotten
        conn.execute(write, EGG)
        conn.commit()
    assert value(registry, UNSAFE, table="products") == 1


def test_one_read_counts_one_write(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    write = sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku")
    with engine.connect() as conn:
        conn.execute(sa.text(READ), EGG).all()
        conn.execute(write, WRITE_PARAM)
        conn.execute(write, WRITE_PARAM)  # no new read: the write used it up
        conn.commit()
    assert value(registry, UNSAFE, table="products") == 1


def test_sqlite_transaction_begun_by_the_app_is_serializable(
    tmp_path: Path, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # The recipe from SQLAlchemy's pysqlite docs: the driver stays out of transaction
    # control, the app sends BEGIN, so the read happens inside the write's transaction.
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'shop.db'}", isolation_level=None)

    @sa.event.listens_for(engine, "begin")
    def begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    with engine.begin() as conn:
        for statement in SCHEMA:
            conn.exec_driver_sql(statement)
    instrument_sqlalchemy(engine, sentry=sentry)
    with engine.begin() as conn:
        conn.execute(sa.text(READ), EGG).all()
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            WRITE_PARAM,
        )
    assert value(registry, UNSAFE, table="products") == 0
    # Default pysqlite (no BEGIN before the SELECT): the same code is flagged.
    plain = make_engine(tmp_path / "plain.db")
    instrument_sqlalchemy(plain, sentry=sentry)
    with plain.begin() as conn:
        conn.execute(sa.text(READ), EGG).all()
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            WRITE_PARAM,
        )
    assert value(registry, UNSAFE, table="products") == 1
    for e in (engine, plain):
        uninstrument_sqlalchemy(e)
        e.dispose()


def unsafe_reserve(engine: sa.Engine, sku: str) -> None:
    """The lab's unsafe strategy: read in one transaction, write a computed value in another."""
    with engine.begin() as conn:
        stock = conn.execute(
            sa.text("SELECT available_stock FROM products WHERE sku = :sku"), {"sku": sku}
        ).scalar_one()
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            {"computed": stock - 1, "sku": sku},
        )


def logging_sentry(
    engine: sa.Engine | AsyncEngine, registry: CollectorRegistry
) -> tuple[Sentry, io.StringIO]:
    """``engine`` instrumented by a Sentry that logs JSON lines into the returned buffer."""
    out = io.StringIO()
    configure_logging(stream=out, bridge_stdlib=False)
    sentry = Sentry(registry=registry, trace=False)
    instrument_sqlalchemy(engine, sentry=sentry)
    return sentry, out


def test_warning_line_names_the_code_and_carries_the_correlation_ids(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    sentry, out = logging_sentry(engine, registry)
    with (
        bind_correlation(request_id="req-7", idempotency_key="idem-7"),
        sentry.reservation("EGG-01", strategy="unsafe"),
    ):
        unsafe_reserve(engine, "EGG-01")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    (warning,) = [line for line in lines if line["event"] == "unsafe_read_modify_write"]
    write_line = unsafe_reserve.__code__.co_firstlineno + 7
    assert warning["level"] == "warning"
    assert warning["table"] == "products"
    assert (warning["key_column"], warning["key"]) == ("sku", "EGG-01")
    assert warning["code"].endswith(f"test_sqlalchemy_detector.py:{write_line}")
    assert warning["function"] == "unsafe_reserve"
    assert (warning["request_id"], warning["idempotency_key"], warning["sku"]) == (
        "req-7",
        "idem-7",
        "EGG-01",
    )
    assert (warning["read_locked"], warning["same_transaction"]) == (False, False)
    assert value(registry, UNSAFE, table="products") == 1


def read_then_write(engine: sa.Engine, sku: str, pause: float = 0.0) -> None:
    """Read in one transaction, write the computed value in another, ``pause`` between."""
    with engine.begin() as conn:
        stock = conn.execute(sa.text(READ), {"sku": sku}).scalar_one()
    time.sleep(pause)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            {"computed": stock - 1, "sku": sku},
        )


def in_process_lock(sentry: Sentry, ttl: float) -> Any:
    """A home-made lock over a dict, measured by the lock wrappers (no lock server needed:
    what is checked is what the wrappers tell the detector)."""
    from stocksentry.instrumentation.locks import track_lock

    store: dict[str, str] = {}

    def acquire(token: str) -> bool:
        return store.setdefault("lock", token) == token

    def release(token: str) -> bool:
        return store.pop("lock", None) == token

    return track_lock("lock:EGG-01", ttl=ttl, acquire=acquire, release=release, sentry=sentry)


def test_a_read_modify_write_under_an_owned_lock_is_safe(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    sentry, out = logging_sentry(engine, registry)
    for _ in range(30):
        with sentry.reservation("EGG-01", strategy="redis_lock"), in_process_lock(sentry, 10):
            read_then_write(engine, "EGG-01")
    assert value(registry, UNSAFE, table="products") == 0
    assert "unsafe_read_modify_write" not in out.getvalue()
    # Without the lock the same code is flagged every time.
    with sentry.reservation("EGG-01", strategy="unsafe"):
        read_then_write(engine, "EGG-01")
    assert value(registry, UNSAFE, table="products") == 1


def test_a_lock_that_expired_before_the_write_is_named(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    sentry, out = logging_sentry(engine, registry)
    with sentry.reservation("EGG-01", strategy="naive_lock"), in_process_lock(sentry, 0.02):
        read_then_write(engine, "EGG-01", pause=0.1)  # the work outlives the lease
    assert value(registry, UNSAFE, table="products") == 1
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    (warning,) = [line for line in lines if line["event"] == "unsafe_read_modify_write"]
    assert (warning["lock"], warning["reason"]) == ("lock:EGG-01", "lock expired before the write")
    # The same lock's own series say it outlived its TTL.
    assert (
        registry.get_sample_value("stock_lock_expired_while_held_total", {"lock": "lock:EGG-01"})
        == 1
    )


def test_a_lock_released_before_the_write_does_not_cover_it(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    sentry, out = logging_sentry(engine, registry)
    with sentry.reservation("EGG-01", strategy="short_lock"):
        with in_process_lock(sentry, 10), engine.begin() as conn:
            stock = conn.execute(sa.text(READ), EGG).scalar_one()
        with engine.begin() as conn:  # the lock is gone: another buyer may have written
            conn.execute(
                sa.text("UPDATE products SET available_stock = :v WHERE sku = :sku"),
                {"v": stock - 1, "sku": "EGG-01"},
            )
    assert value(registry, UNSAFE, table="products") == 1
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    (warning,) = [line for line in lines if line["event"] == "unsafe_read_modify_write"]
    assert warning["reason"] == "lock released before the write"


async def test_async_engine_detects_and_finds_the_coroutine(
    tmp_path: Path, registry: CollectorRegistry
) -> None:
    make_engine(tmp_path / "shop.db").dispose()
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'shop.db'}")
    sentry, out = logging_sentry(engine, registry)
    assert is_instrumented(engine.sync_engine)

    async def reserve() -> None:
        async with sentry.reservation("EGG-01", strategy="unsafe"):
            async with engine.begin() as conn:
                stock = (await conn.execute(sa.text(READ), EGG)).scalar_one()
            async with engine.begin() as conn:
                await conn.execute(
                    sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
                    {"computed": stock - 1, "sku": "EGG-01"},
                )

    await reserve()
    await engine.dispose()
    uninstrument_sqlalchemy(engine)
    assert value(registry, UNSAFE, table="products") == 1
    (warning,) = [
        json.loads(line)
        for line in out.getvalue().splitlines()
        if "unsafe_read_modify_write" in line
    ]
    assert warning["function"] == "reserve"
    assert warning["code"].startswith("tests/unit/test_sqlalchemy_detector.py:")


# --- conditional updates -------------------------------------------------------------------------


def test_conditional_update_without_a_row_marks_the_reservation(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    guarded = sa.text(
        "UPDATE products SET available_stock = available_stock - :qty"
        " WHERE sku = :sku AND available_stock >= :qty"
    )
    cas = sa.text(
        "UPDATE products SET available_stock = :new WHERE sku = :sku AND available_stock = :seen"
    )
    with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
        conn.execute(guarded, {"qty": 99, "sku": "EGG-01"})
    assert r.outcome == "out_of_stock"
    with sentry.reservation("EGG-01", strategy="cas") as r, engine.begin() as conn:
        conn.execute(cas, {"new": 4, "seen": 5, "sku": "EGG-01"})
    assert r.outcome == "lost_race"
    with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
        conn.execute(guarded, {"qty": 1, "sku": "EGG-01"})  # a row matched
    assert r.outcome is None
    # Outside a reservation nothing is counted (there is no reservation to mark).
    with engine.begin() as conn:
        conn.execute(guarded, {"qty": 99, "sku": "EGG-01"})
    conflict = "stock_reservation_conflict_total"
    assert value(registry, conflict, sku="EGG-01", reason="out_of_stock") == 1
    assert value(registry, conflict, sku="EGG-01", reason="lost_race") == 1
    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="atomic") == 1


# --- listener hygiene ----------------------------------------------------------------------------

DIALECT_EVENTS = ("do_execute", "do_execute_no_params", "do_executemany", "handle_error")
ENGINE_EVENTS = ("before_cursor_execute", "after_cursor_execute")
EVENTS = DIALECT_EVENTS + ENGINE_EVENTS


def listeners_of(engine: sa.Engine, name: str) -> int:
    # listen(engine, ...) files a dialect event under the engine's own dialect.
    dispatch = engine.dialect.dispatch if name in DIALECT_EVENTS else engine.dispatch
    return len(getattr(dispatch, name))


def listener_count(engine: sa.Engine) -> int:
    return sum(listeners_of(engine, name) for name in EVENTS)


def test_instrument_twice_listens_once_and_uninstrument_removes_all(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    instrument_sqlalchemy(engine, sentry=sentry, spans="all")  # does nothing more
    assert listener_count(engine) == 4
    # No engine event: SQLAlchemy's per-execute event path stays off.
    assert not engine._has_events
    listeners = [(name, fn) for name, fn in instrumented[engine].listeners]
    assert all(sa.event.contains(engine, name, fn) for name, fn in listeners)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE products SET available_stock = 5 WHERE id = 1"))
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 1

    uninstrument_sqlalchemy(engine)
    uninstrument_sqlalchemy(engine)  # harmless
    assert not is_instrumented(engine)
    assert not any(sa.event.contains(engine, name, fn) for name, fn in listeners)
    assert listener_count(engine) == 0
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE products SET available_stock = 5 WHERE id = 1"))
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 1


def test_spans_all_adds_and_removes_the_opentelemetry_listeners(
    engine: sa.Engine, sentry: Sentry
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = {name: listeners_of(engine, name) for name in EVENTS}
    instrument_sqlalchemy(engine, sentry=sentry, spans="all", tracer_provider=provider)
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT available_stock FROM products WHERE id = 1")).all()
    spans = exporter.get_finished_spans()
    # opentelemetry-instrumentation-sqlalchemy names the span "<operation> <database>".
    assert [s.name for s in spans] == [f"SELECT {engine.url.database}"]
    assert spans[0].attributes is not None
    assert "SELECT available_stock" in str(spans[0].attributes.get("db.statement"))
    uninstrument_sqlalchemy(engine)
    assert {name: listeners_of(engine, name) for name in EVENTS} == before
    assert len(engine.pool.dispatch.checkout) == 0
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT 1")).all()
    assert len(exporter.get_finished_spans()) == 1


def test_spans_all_uninstrument_of_one_engine_keeps_the_other_s_spans(
    engine: sa.Engine, sentry: Sentry, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    other = make_engine(tmp_path / "other.db")
    for each in (engine, other):
        instrument_sqlalchemy(each, sentry=sentry, spans="all", tracer_provider=provider)
    uninstrument_sqlalchemy(engine)
    for each in (engine, other):
        with each.begin() as conn:
            conn.execute(sa.text("SELECT available_stock FROM products WHERE id = 1")).all()
    assert [s.name for s in exporter.get_finished_spans()] == [f"SELECT {other.url.database}"]
    uninstrument_sqlalchemy(other)
    other.dispose()
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT 1")).all()
    assert len(exporter.get_finished_spans()) == 1


def test_spans_all_leaves_an_application_s_own_instrumentor_alone(
    engine: sa.Engine, sentry: Sentry
) -> None:
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = SQLAlchemyInstrumentor()
    instrumentor.instrument(engine=engine, tracer_provider=provider)
    try:
        apps = {name: listeners_of(engine, name) for name in ENGINE_EVENTS}
        instrument_sqlalchemy(engine, sentry=sentry, spans="all", tracer_provider=provider)
        assert {name: listeners_of(engine, name) for name in ENGINE_EVENTS} == apps
        uninstrument_sqlalchemy(engine)
        assert {name: listeners_of(engine, name) for name in ENGINE_EVENTS} == apps
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT available_stock FROM products WHERE id = 1")).all()
        names = [s.name for s in exporter.get_finished_spans() if s.name != "connect"]
        assert names == [f"SELECT {engine.url.database}"]  # the application's, once
    finally:
        instrumentor.uninstrument()


def locking_spans(
    engine: sa.Engine, registry: CollectorRegistry
) -> tuple[Sentry, InMemorySpanExporter]:
    """``engine`` instrumented with ``spans="locking"``; its finished spans in the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    instrument_sqlalchemy(engine, sentry=sentry, spans="locking")
    return sentry, exporter


def test_spans_locking_wraps_locking_statements_only(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    sentry, exporter = locking_spans(engine, registry)
    with sentry.reservation("EGG-01") as r, engine.begin() as conn:
        conn.execute(sa.text(READ), EGG).all()
        conn.execute(sa.text("UPDATE products SET available_stock = 3 WHERE sku = 'EGG-01'"))
        carrier = r.trace_context()
    names = [s.name for s in exporter.get_finished_spans()]
    # OpenTelemetry's database span name: "{db.operation.name} {db.collection.name}".
    assert names == ["UPDATE products", "stock.reserve"]
    lock_span, reserve_span = exporter.get_finished_spans()
    assert lock_span.parent is not None
    assert lock_span.parent.span_id == reserve_span.context.span_id
    assert lock_span.attributes == {
        "db.system.name": "sqlite",
        "db.collection.name": "products",
        "db.operation.name": "UPDATE",
        "db.namespace": engine.url.database,
        "stock.lock": "update",
    }
    (exemplar,) = [
        s.exemplar
        for m in sentry.metrics.metric(catalog.DB_LOCK_WAIT).collect()
        for s in m.samples
        if s.exemplar is not None
    ]
    assert exemplar.labels["trace_id"] == carrier["traceparent"].split("-")[1]
    assert exemplar.labels["span_id"] == format(lock_span.context.span_id, "016x")


def test_a_failing_listener_never_reaches_the_app(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, monkeypatch: Any
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)

    count = sentry.metrics.count

    def broken(spec: MetricSpec, *args: Any, **kwargs: Any) -> None:
        if spec in (catalog.DB_LOCK_WAIT, catalog.UNSAFE_READ_MODIFY_WRITE):
            raise RuntimeError("metrics backend on fire")
        count(spec, *args, **kwargs)  # the instrumentation errors' counter keeps working

    monkeypatch.setattr(sentry.metrics, "observe", broken)  # only the lock wait observes
    monkeypatch.setattr(sentry.metrics, "count", broken)
    with engine.begin() as conn:
        conn.execute(sa.text(READ), EGG).all()
        result = conn.execute(
            sa.text("UPDATE products SET available_stock = 7 WHERE sku = 'EGG-01'")
        )
        assert result.rowcount == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text(READ), EGG).scalar_one() == 7
    # Two failures: the lock-wait observation and the unsafe-write count of the UPDATE.
    assert value(registry, ERRORS, component="sqlalchemy") == 2


def test_app_errors_pass_unchanged(engine: sa.Engine, sentry: Sentry) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as conn:
        conn.execute(sa.text("UPDATE nowhere SET available_stock = 1"))
    assert "no such table" in str(caught.value)


def test_the_apps_own_do_execute_listeners_still_run(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # The integration executes the statement inside SQLAlchemy's do_execute event; a
    # listener the app registers before or after it must see every statement as before,
    # and one that executes the statement itself must not see it run twice.
    seen: list[str] = []

    def watcher(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        seen.append("before:" + statement.split()[0])
        return False

    def executor(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        seen.append("after:" + statement.split()[0])
        cursor.execute(statement, parameters)
        return True

    sa.event.listen(engine, "do_execute", watcher)
    instrument_sqlalchemy(engine, sentry=sentry)
    sa.event.listen(engine, "do_execute", executor)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku"),
            EGG,
        )
    assert seen == ["before:UPDATE", "after:UPDATE"]
    with engine.connect() as conn:
        assert conn.execute(sa.text(READ), EGG).scalar_one() == 9  # decremented once
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 1
    uninstrument_sqlalchemy(engine)
    sa.event.remove(engine, "do_execute", watcher)
    sa.event.remove(engine, "do_execute", executor)


def test_a_failing_locking_statement_ends_its_span_as_an_error(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    _, exporter = locking_spans(engine, registry)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text("UPDATE products SET sku = NULL WHERE sku = 'EGG-01'"))
    (span,) = exporter.get_finished_spans()
    assert span.name == "UPDATE products"
    assert span.status.status_code.name == "ERROR"
    assert span.attributes is not None
    assert span.attributes["error.type"] == "IntegrityError"
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0


def test_listeners_do_not_keep_the_engine_alive(tmp_path: Path, sentry: Sentry) -> None:
    engine = make_engine(tmp_path / "gone.db")
    instrument_sqlalchemy(engine, sentry=sentry, spans="locking")
    with engine.begin() as conn:
        conn.execute(sa.text(READ), EGG).all()
    engine.dispose()
    ref = weakref.ref(engine)
    del engine, conn
    gc.collect()
    assert ref() is None


def test_importing_the_package_does_not_import_sqlalchemy() -> None:
    import subprocess

    code = (
        "import sys, stocksentry.instrumentation as i\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'sqlalchemy']\n"
        "import stocksentry.instrumentation.sqlalchemy\n"
        "assert 'sqlalchemy' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_arguments_raise_at_set_up(engine: sa.Engine, sentry: Sentry) -> None:
    with pytest.raises(ValueError, match="spans"):
        instrument_sqlalchemy(engine, sentry=sentry, spans="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="read_window"):
        instrument_sqlalchemy(engine, sentry=sentry, read_window=0)
    with pytest.raises(ValueError, match="stock_column"):
        StockTable(stock_column="")
    with pytest.raises(TypeError):
        instrument_sqlalchemy(engine, sentry=sentry, stock_tables={"p": "available"})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        instrument_sqlalchemy(object(), sentry=sentry)  # type: ignore[arg-type]
    assert not is_instrumented(engine)


def test_a_retry_that_matches_undoes_the_implied_conflict(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    """Conditional update retried inside one reservation: the final match wins; an
    unmatched update alone still ends the reservation as out_of_stock."""
    instrument_sqlalchemy(engine, sentry=sentry)
    guarded = sa.text(
        "UPDATE products SET available_stock = available_stock - :q "
        "WHERE sku = 'EGG-01' AND available_stock >= :q"
    )
    with sentry.reservation("EGG-01", strategy="retry") as r:
        with engine.begin() as conn:
            assert conn.execute(guarded, {"q": 50}).rowcount == 0  # first attempt: too many
        assert r.outcome == "out_of_stock"  # implied by the unmatched update
        with engine.begin() as conn:
            assert conn.execute(guarded, {"q": 1}).rowcount == 1  # the retry matches
        assert r.outcome is None
    assert value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="retry") == 1
    conflict = "stock_reservation_conflict_total"
    assert value(registry, conflict, sku="EGG-01", reason="out_of_stock") == 0
    with sentry.reservation("EGG-01", strategy="alone"), engine.begin() as conn:
        conn.execute(guarded, {"q": 50})
    assert value(registry, conflict, sku="EGG-01", reason="out_of_stock") == 1


def test_statements_with_nothing_to_time_are_left_to_sqlalchemy(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # A statement that neither locks nor touches a stock table is not run by the
    # integration: its do_execute listener declines it, so SQLAlchemy hands it to the
    # listeners registered after it and then to the dialect, as without the integration.
    seen: list[str] = []

    def after(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        seen.append(statement.split()[0])
        return False

    instrument_sqlalchemy(engine, sentry=sentry)
    sa.event.listen(engine, "do_execute", after)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS notes (body TEXT)"))
        conn.execute(sa.text("INSERT INTO notes (body) VALUES (:b)"), {"b": "hello"})
        conn.execute(
            sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku"),
            EGG,
        )
        assert conn.execute(sa.text("SELECT count(*) FROM notes")).scalar_one() == 1
    assert seen == ["CREATE", "INSERT", "UPDATE", "SELECT"]
    # Only the UPDATE of the stock table was timed.
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0
    sa.event.remove(engine, "do_execute", after)


def test_the_lock_wait_takes_its_exemplar_from_the_apps_current_span(
    engine: sa.Engine, sentry: Sentry
) -> None:
    # spans="off": no span of the integration's own, but the application's current span
    # (any provider's) is the lock-wait observation's exemplar; none without one.
    provider = TracerProvider()
    instrument_sqlalchemy(engine, sentry=sentry)
    update = sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku")
    with engine.begin() as conn:
        conn.execute(update, EGG)
    assert not [
        s
        for m in sentry.metrics.metric(catalog.DB_LOCK_WAIT).collect()
        for s in m.samples
        if s.exemplar is not None
    ]
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("checkout") as span, engine.begin() as conn:
        conn.execute(update, EGG)
    (exemplar,) = [
        s.exemplar
        for m in sentry.metrics.metric(catalog.DB_LOCK_WAIT).collect()
        for s in m.samples
        if s.exemplar is not None
    ]
    assert exemplar.labels["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert exemplar.labels["span_id"] == format(span.get_span_context().span_id, "016x")


def test_a_fenced_update_with_returning_on_sqlite_is_not_a_stale_token(tmp_path: Path) -> None:
    # pysqlite reports rowcount 0 for UPDATE ... RETURNING until its rows are fetched: a
    # fenced write that succeeded must not read as one the database refused.
    engine = sqlite_engine(
        f"sqlite:///{tmp_path / 'fenced.db'}",
        "CREATE TABLE products (sku TEXT PRIMARY KEY, available_stock INTEGER NOT NULL,"
        " fence_token INTEGER NOT NULL DEFAULT 0)",
        "INSERT INTO products (sku, available_stock) VALUES ('EGG-01', 10)",
    )
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, log=False, trace=False)
    instrument_sqlalchemy(
        engine,
        sentry=sentry,
        stock_tables={"products": StockTable(key_columns=("sku",))},
        fencing={"products": "fence_token"},
    )
    fenced = sa.text(
        "UPDATE products SET available_stock = available_stock - 1, fence_token = :t"
        " WHERE sku = :sku AND fence_token < :t RETURNING available_stock"
    )
    try:
        for token in (1, 2, 3):
            with engine.begin() as conn:
                assert (
                    conn.execute(fenced, {"t": token, "sku": "EGG-01"}).scalar_one() == 10 - token
                )
        stale = registry.get_sample_value(
            "stock_lock_stale_fencing_token_total", {"lock": "unknown", "table": "products"}
        )
        assert (stale or 0.0) == 0.0
        assert value(registry, ERRORS, component="sqlalchemy") == 0
        # A token that really is stale is still counted (refused: no row matched).
        with engine.begin() as conn:
            assert conn.execute(fenced, {"t": 2, "sku": "EGG-01"}).all() == []
        stale = registry.get_sample_value(
            "stock_lock_stale_fencing_token_total", {"lock": "unknown", "table": "products"}
        )
        assert stale == 1.0
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()


def test_every_locking_update_is_observed(engine: sa.Engine) -> None:
    registry = CollectorRegistry()
    instrument_sqlalchemy(engine, sentry=Sentry(registry=registry, log=False, trace=False))
    for _ in range(5):
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE products SET available_stock = 5 WHERE sku = :sku"), EGG)
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 5
    assert value(registry, f"{LOCK_WAIT}_bucket", table="products", le="+Inf") == 5


def test_an_overflowed_table_label_counts_its_overflow_on_every_update(engine: sa.Engine) -> None:
    from stocksentry.instrumentation.guard import LabelGuard

    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, log=False, trace=False)
    # No table label admitted: every lock wait folds into __other__ and must say so.
    sentry.metrics._small_guards["table"] = LabelGuard(0)
    instrument_sqlalchemy(engine, sentry=sentry)
    for _ in range(3):
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE products SET available_stock = 5 WHERE sku = :sku"), EGG)
    assert value(registry, f"{LOCK_WAIT}_count", table=catalog.OVERFLOW_VALUE) == 3
    overflow = value(
        registry, "stocksentry_label_overflow_total", metric=catalog.DB_LOCK_WAIT.name
    )
    assert overflow == 3
