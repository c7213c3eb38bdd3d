"""Edges of the SQLAlchemy integration on SQLite that the main detector tests do not reach:
key forms of a WHERE, bounded memories, the write checks' quiet paths, failures inside the
instrumentation, and set-up without the optional span library.

Each test drives ``instrument_sqlalchemy`` on a real SQLite engine and checks what a user
sees: the metrics, the log lines, the counted instrumentation errors, the app's own rows.
PostgreSQL-only behaviour is in ``tests/integration/test_sqlalchemy_edges_pg.py``.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from failingmetrics import failing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from sqlitedb import sqlite_engine
from stocksentry.instrumentation import Sentry, catalog, events
from stocksentry.instrumentation.sqlalchemy import (
    StockTable,
    classify_statement,
    instrument_sqlalchemy,
    is_instrumented,
    uninstrument_sqlalchemy,
)
from structlog.testing import capture_logs
from test_sqlalchemy_detector import ERRORS, LOCK_WAIT, UNSAFE, value

NEGATIVE = "stock_inventory_negative_total"
STALE = "stock_lock_stale_fencing_token_total"

SCHEMA = (
    "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL, name TEXT,"
    " price INTEGER, available_stock INTEGER NOT NULL, fence_token INTEGER NOT NULL DEFAULT 0)",
    "INSERT INTO products (id, sku, name, price, available_stock) VALUES"
    " (1, 'EGG-01', 'egg', 3, 10), (2, 'EGG-02', 'big egg', 5, 10), (-7, 'EGG-07', 'old', 4, 10)",
)
READ = "SELECT available_stock FROM products WHERE sku = :sku"
BLIND_BY_SKU = sa.text("UPDATE products SET available_stock = :v WHERE sku = :sku")


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=True, trace=False)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = sqlite_engine(f"sqlite:///{tmp_path / 'shop.db'}", *SCHEMA)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


def stock_of(engine: sa.Engine, sku: str) -> int:
    with engine.connect() as conn:
        stock: int = conn.execute(sa.text(READ), {"sku": sku}).scalar_one()
    return stock


# --- which rows a WHERE names ------------------------------------------------------------


@pytest.mark.parametrize(
    ("read", "read_params", "write", "write_params"),
    [
        # Parentheses around the whole equality, and around the value alone.
        (
            "SELECT available_stock FROM products WHERE (sku = :sku)",
            {"sku": "EGG-01"},
            "UPDATE products SET available_stock = :v WHERE sku = (:sku)",
            {"sku": "EGG-01", "v": 9},
        ),
        # CAST(:x AS type) on either side: documented as a key form.
        (
            "SELECT available_stock FROM products WHERE sku = CAST(:sku AS TEXT)",
            {"sku": "EGG-01"},
            "UPDATE products SET available_stock = :v WHERE CAST(:sku AS TEXT) = sku",
            {"sku": "EGG-01", "v": 9},
        ),
        # A BETWEEN's AND is not the AND between two conditions: the key after it counts.
        (
            "SELECT available_stock FROM products WHERE price BETWEEN 1 AND 10 AND sku = :sku",
            {"sku": "EGG-01"},
            "UPDATE products SET available_stock = :v WHERE sku = :sku",
            {"sku": "EGG-01", "v": 9},
        ),
        # A negative literal key.
        (
            "SELECT available_stock FROM products WHERE id = -7",
            {},
            "UPDATE products SET available_stock = :v WHERE id = -7",
            {"v": 9},
        ),
        # The same key read as an int and written as a float (an ORM attribute of a
        # Float column, a JSON payload): 1 and 1.0 are one row.
        (
            "SELECT available_stock FROM products WHERE id = :id",
            {"id": 1},
            "UPDATE products SET available_stock = :v WHERE id = :id",
            {"id": 1.0, "v": 9},
        ),
    ],
    ids=["parenthesised", "cast", "between", "negative-literal", "int-and-float"],
)
def test_key_forms_name_the_row_read_then_written(
    engine: sa.Engine,
    sentry: Sentry,
    registry: CollectorRegistry,
    read: str,
    read_params: dict[str, Any],
    write: str,
    write_params: dict[str, Any],
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    with engine.connect() as conn:
        conn.execute(sa.text(read), read_params).all()
        conn.commit()
        assert conn.execute(sa.text(write), write_params).rowcount == 1
        conn.commit()
    assert value(registry, UNSAFE, table="products") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0


@pytest.mark.parametrize(
    ("where", "keys"),
    [
        # SQLAlchemy's asyncpg dialect casts each parameter to its column's type, length
        # and precision included: String(64), Numeric(10, 0), an ARRAY's [].
        ("products.sku = $2::VARCHAR(64)", (("sku", (True, 1)),)),
        ("products.id = $2::NUMERIC(10, 0)[]", (("id", (True, 1)),)),
        # A cast value inside an expression is not the key.
        ("products.id = $2::NUMERIC(10, 0) + 1", ()),
    ],
)
def test_asyncpg_casts_with_a_length_keep_the_key(
    where: str, keys: tuple[tuple[str, tuple[bool, object]], ...]
) -> None:
    sql = f"UPDATE products SET available_stock = $1::INTEGER WHERE {where}"
    assert classify_statement(sql, paramstyle="numeric_dollar").keys == keys


def test_a_key_computed_from_a_cast_names_no_row(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # `id = CAST(:id AS INTEGER) + 1` writes row id + 1: the parameter alone is not the key.
    # Taking it as the key pinned the write on row 1, which was read but never written: a
    # false unsafe read-modify-write (and the real row 2 went unseen).
    instrument_sqlalchemy(engine, sentry=sentry)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT available_stock FROM products WHERE id = :id"), {"id": 1})
        conn.commit()
        conn.execute(
            sa.text(
                "UPDATE products SET available_stock = :v WHERE id = CAST(:id AS INTEGER) + 1"
            ),
            {"v": 4, "id": 1},
        )
        conn.commit()
    assert (stock_of(engine, "EGG-01"), stock_of(engine, "EGG-02")) == (10, 4)
    assert value(registry, UNSAFE, table="products") == 0
    assert value(registry, ERRORS, component="sqlalchemy") == 0


def test_odd_dotted_names_are_left_to_the_database(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry)
    with engine.connect() as conn:
        # A dotted name cut short: the database's own error reaches the app, unchanged.
        with pytest.raises(sa.exc.OperationalError, match="incomplete input") as caught:
            conn.exec_driver_sql("UPDATE products SET available_stock = 1 WHERE products.")
        assert type(caught.value.orig) is sqlite3.OperationalError
        conn.rollback()
        # SQLite's [bracket] quoting after a dot: a name the classifier does not read.
        sql = "SELECT available_stock FROM main.[products] WHERE sku = 'EGG-01'"
        assert conn.exec_driver_sql(sql).all() == [(10,)]
    assert value(registry, ERRORS, component="sqlalchemy") == 0


def test_a_connection_remembers_only_its_last_64_keys(
    tmp_path: Path, sentry: Sentry, registry: CollectorRegistry
) -> None:
    rows = ", ".join(f"('SKU-{n:03}', 10)" for n in range(65))
    engine = sqlite_engine(
        f"sqlite:///{tmp_path / 'many.db'}",
        "CREATE TABLE products (sku TEXT PRIMARY KEY, available_stock INTEGER NOT NULL)",
        f"INSERT INTO products (sku, available_stock) VALUES {rows}",
    )
    instrument_sqlalchemy(engine, sentry=sentry, stock_tables={"products": StockTable()})
    try:
        with engine.connect() as conn:
            for n in range(65):
                conn.execute(sa.text(READ), {"sku": f"SKU-{n:03}"}).all()
            conn.commit()
            # The 65th read pushed out the first: its write has no read to match any more.
            conn.execute(BLIND_BY_SKU, {"v": 9, "sku": "SKU-000"})
            assert value(registry, UNSAFE, table="products") == 0
            conn.execute(BLIND_BY_SKU, {"v": 9, "sku": "SKU-064"})
            conn.commit()
        assert value(registry, UNSAFE, table="products") == 1
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()


# --- real negative writes: the quiet paths ------------------------------------------------


def test_a_decrement_that_matched_no_row_is_not_a_negative_write(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry, read_back_stock=True)
    relative = (
        "UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku"
        " AND name = :name"
    )
    with capture_logs() as lines, engine.begin() as conn:
        # A blind write is the app's own value: not looked at (the detector's case).
        conn.execute(BLIND_BY_SKU, {"v": -3, "sku": "EGG-01"})
        # Matches no row (another name): the row's -3 is not this statement's doing.
        assert conn.execute(sa.text(relative), {"sku": "EGG-01", "name": "x"}).rowcount == 0
        assert value(registry, NEGATIVE, sku="EGG-01") == 0
        # The same statement matching the row left -4 there: counted once.
        assert conn.execute(sa.text(relative), {"sku": "EGG-01", "name": "egg"}).rowcount == 1
    assert value(registry, NEGATIVE, sku="EGG-01") == 1
    negative = [line for line in lines if line["event"] == events.INVENTORY_NEGATIVE.name]
    assert [(line["sku"], line["stock"]) for line in negative] == [("EGG-01", -4)]
    assert value(registry, ERRORS, component="sqlalchemy") == 0


def test_a_table_whose_name_needs_quoting_is_not_read_back_and_breaks_nothing(
    tmp_path: Path, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # The read-back SELECT is built from the configured names, used as written: only plain
    # identifiers are. Another name is not read back (a quiet limit), rather than sent as
    # SQL that fails (on PostgreSQL that failure would abort the app's transaction).
    engine = sqlite_engine(
        f"sqlite:///{tmp_path / 'quoted.db'}",
        'CREATE TABLE "stock items" (sku TEXT PRIMARY KEY, available_stock INTEGER NOT NULL,'
        " fence_token INTEGER NOT NULL DEFAULT 0)",
        "INSERT INTO \"stock items\" (sku, available_stock, fence_token) VALUES ('EGG-01', 1, 5)",
    )
    instrument_sqlalchemy(
        engine,
        sentry=sentry,
        stock_tables={"stock items": StockTable(key_columns=("sku",))},
        read_back_stock=True,
        fencing={"stock items": "fence_token"},
    )
    try:
        with engine.begin() as conn:
            decrement = sa.text(
                'UPDATE "stock items" SET available_stock = available_stock - 3 WHERE sku = :sku'
            )
            assert conn.execute(decrement, {"sku": "EGG-01"}).rowcount == 1
            fenced = sa.text(
                'UPDATE "stock items" SET available_stock = 0, fence_token = :t'
                " WHERE sku = :sku AND fence_token < :t"
            )
            assert conn.execute(fenced, {"t": 2, "sku": "EGG-01"}).rowcount == 0
            stock = conn.execute(sa.text('SELECT available_stock FROM "stock items"')).scalar()
        assert stock == -2
        assert value(registry, NEGATIVE, sku="EGG-01") == 0
        assert value(registry, STALE, lock="unknown", table="stock items") == 0
        assert value(registry, ERRORS, component="sqlalchemy") == 0
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()


# --- fencing tokens: set-up and the writes that are not stale ------------------------------


def test_a_fencing_entry_without_a_column_name_raises_at_set_up(
    engine: sa.Engine, sentry: Sentry
) -> None:
    with pytest.raises(ValueError, match="must be a column name"):
        instrument_sqlalchemy(engine, sentry=sentry, fencing={"products": ""})
    assert not is_instrumented(engine)


FENCED = sa.text(
    "UPDATE products SET available_stock = :v, fence_token = :t"
    " WHERE sku = :sku AND fence_token < :t"
)


def test_fenced_writes_that_are_not_stale_tokens(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(
        engine,
        sentry=sentry,
        stock_tables={"products": StockTable()},
        fencing={"products": "fence_token"},
    )
    stock_guarded = sa.text(
        "UPDATE products SET available_stock = available_stock - :q, fence_token = :t"
        " WHERE sku = :sku AND available_stock >= :q"
    )
    with engine.begin() as conn:
        assert conn.execute(FENCED, {"v": 9, "t": 5, "sku": "EGG-01"}).rowcount == 1
        # Refused by the stock guard, not by a token comparison: token 3 is below the 5
        # stored, but this statement does not compare tokens, so it is not a stale refusal.
        assert conn.execute(stock_guarded, {"q": 50, "t": 3, "sku": "EGG-01"}).rowcount == 0
        # A compared token on a row that does not exist: no row, no token matter.
        assert conn.execute(FENCED, {"v": 1, "t": 1, "sku": "NO-SUCH"}).rowcount == 0
        # A token that is not a number (a UUID-style lease id) is not compared at all,
        # not even with the number seen for the row before.
        assert conn.execute(FENCED, {"v": 9, "t": 5, "sku": "EGG-02"}).rowcount == 1
        conn.execute(
            sa.text("UPDATE products SET available_stock = :v, fence_token = :t WHERE sku = :sku"),
            {"v": 8, "t": "a1b2-c3", "sku": "EGG-02"},
        )
    assert value(registry, STALE, lock="unknown", table="products") == 0
    assert value(registry, ERRORS, component="sqlalchemy") == 0
    # The check itself still works on this engine: a token below the stored one, refused.
    with engine.begin() as conn:
        assert conn.execute(FENCED, {"v": 1, "t": 4, "sku": "EGG-01"}).rowcount == 0
    assert value(registry, STALE, lock="unknown", table="products") == 1


# --- failures inside the instrumentation -------------------------------------------------


def test_a_failing_negative_write_counter_is_counted_and_the_line_still_written(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry, read_back_stock=True)
    failing(sentry, monkeypatch, catalog.INVENTORY_NEGATIVE)
    relative = sa.text(
        "UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku"
    )
    with capture_logs() as lines, engine.begin() as conn:
        assert conn.execute(relative, {"n": 12, "sku": "EGG-01"}).rowcount == 1
    assert stock_of(engine, "EGG-01") == -2
    assert value(registry, ERRORS, component="sqlalchemy") == 1
    assert [
        line["stock"] for line in lines if line["event"] == events.INVENTORY_NEGATIVE.name
    ] == [-2]


def test_a_failing_stale_token_counter_is_counted_and_the_line_still_written(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    instrument_sqlalchemy(engine, sentry=sentry, fencing={"products": "fence_token"})
    failing(sentry, monkeypatch, catalog.LOCK_STALE_FENCING_TOKEN)
    with capture_logs() as lines, engine.begin() as conn:
        assert conn.execute(FENCED, {"v": 9, "t": 5, "sku": "EGG-01"}).rowcount == 1
        assert conn.execute(FENCED, {"v": 1, "t": 4, "sku": "EGG-01"}).rowcount == 0
    assert stock_of(engine, "EGG-01") == 9
    assert value(registry, ERRORS, component="sqlalchemy") == 1
    (stale,) = [line for line in lines if line["event"] == events.STALE_FENCING_TOKEN.name]
    assert (stale["token"], stale["highest"], stale["refused"]) == (4, 5, True)


class _BrokenTracer:
    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracer backend on fire")


class _BrokenProvider(TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> Any:
        return _BrokenTracer()


def test_a_failing_span_start_leaves_the_statement_to_sqlalchemy(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    instrument_sqlalchemy(
        engine, sentry=sentry, spans="locking", tracer_provider=_BrokenProvider()
    )
    with engine.begin() as conn:
        result = conn.execute(BLIND_BY_SKU, {"v": 4, "sku": "EGG-01"})
        assert result.rowcount == 1
    assert stock_of(engine, "EGG-01") == 4  # run once, by SQLAlchemy
    assert value(registry, ERRORS, component="sqlalchemy") == 1
    # Not timed: the listener gave the statement back before running it.
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 0


def test_a_detection_without_any_application_frame_is_still_reported(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # Code with a generated file name ("<string>": python -c, exec) on a thread of its own:
    # no frame on the stack is the application's file, so the location is "unknown".
    instrument_sqlalchemy(engine, sentry=sentry)
    source = (
        "def flow(engine, sa, failures):\n"
        "    try:\n"
        "        with engine.connect() as conn:\n"
        "            conn.execute(sa.text(READ), {'sku': 'EGG-01'}).all()\n"
        "            conn.commit()\n"
        "            conn.execute(sa.text(WRITE), {'v': 9, 'sku': 'EGG-01'})\n"
        "            conn.commit()\n"
        "    except BaseException as exc:\n"
        "        failures.append(exc)\n"
    )
    namespace: dict[str, Any] = {"READ": READ, "WRITE": str(BLIND_BY_SKU)}
    exec(compile(source, "<string>", "exec"), namespace)  # noqa: S102 - the test's own code
    failures: list[BaseException] = []
    with capture_logs() as lines:
        # The generated function is the thread's target: no frame of this file runs it.
        thread = threading.Thread(target=namespace["flow"], args=(engine, sa, failures))
        thread.start()
        thread.join()
    assert failures == []
    (warning,) = [line for line in lines if line["event"] == events.UNSAFE_READ_MODIFY_WRITE.name]
    assert (warning["code"], warning["function"]) == ("unknown", "unknown")
    assert value(registry, UNSAFE, table="products") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0


# --- spans="all" set-up -----------------------------------------------------------------


def test_spans_all_without_the_span_library_raises_and_leaves_the_engine_bare(
    engine: sa.Engine, sentry: Sentry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sqlalchemy extra brings opentelemetry-instrumentation-sqlalchemy; an install
    # without it gets the ImportError at set-up, and no half-instrumented engine.
    monkeypatch.setitem(sys.modules, "opentelemetry.instrumentation.sqlalchemy", None)
    with pytest.raises(ImportError):
        instrument_sqlalchemy(engine, sentry=sentry, spans="all")
    assert not is_instrumented(engine)
    assert not any(
        len(getattr(engine.dialect.dispatch, name))
        for name in ("do_execute", "do_execute_no_params", "do_executemany")
    )
    assert not engine._has_events


def test_spans_all_on_an_unsupported_sqlalchemy_makes_no_spans_and_counts_an_error(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the library's own version check says on SQLAlchemy 2.1 (the extra pins < 2.1):
    # a conflict. Then no spans rather than wrong ones; the lock-wait metrics still work.
    import opentelemetry.instrumentation.dependencies as dependencies

    monkeypatch.setattr(
        dependencies,
        "get_dependency_conflicts",
        lambda deps: dependencies.DependencyConflict(
            "sqlalchemy >= 1.0.0, < 2.1.0", "sqlalchemy 2.1.0"
        ),
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrument_sqlalchemy(engine, sentry=sentry, spans="all", tracer_provider=provider)
    assert is_instrumented(engine)
    with engine.begin() as conn:
        conn.execute(BLIND_BY_SKU, {"v": 4, "sku": "EGG-01"})
    assert exporter.get_finished_spans() == ()
    assert value(registry, ERRORS, component="sqlalchemy") == 1
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 1
    assert stock_of(engine, "EGG-01") == 4
