"""The SQLAlchemy integration against real PostgreSQL: psycopg 3 (sync) and asyncpg (async).

Real lock waits, a real deadlock, a real serialization failure and lock timeout, and the
detector rows that need row locks and isolation levels (SQLite has neither).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from polling import wait_until
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from stocksentry.instrumentation import Sentry, events
from stocksentry.instrumentation.events import LogEvent
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy
from structlog.testing import capture_logs

pytestmark = pytest.mark.integration

LOCK_WAIT = "stock_db_lock_wait_duration_seconds"
UNSAFE = "stock_unsafe_read_modify_write_total"
CONFLICT = "stock_reservation_conflict_total"
SUCCESS = "stock_reservation_success_total"

SCHEMA = (
    "CREATE TABLE products (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " sku TEXT UNIQUE NOT NULL, name TEXT, available_stock INTEGER NOT NULL)",
    "INSERT INTO products (sku, name, available_stock) VALUES"
    " ('EGG-01', 'egg', 10), ('EGG-02', 'big egg', 10)",
)
EGG = {"sku": "EGG-01"}
READ = sa.text("SELECT available_stock FROM products WHERE sku = :sku")
FOR_UPDATE = sa.text("SELECT available_stock FROM products WHERE sku = :sku FOR UPDATE")
BLIND = sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku")
ATOMIC = sa.text(
    "UPDATE products SET available_stock = available_stock - :qty"
    " WHERE sku = :sku AND available_stock >= :qty RETURNING available_stock"
)


class Base(DeclarativeBase):
    pass


class Product(Base):
    __tablename__ = "products"
    id: Mapped[int] = mapped_column(primary_key=True)
    sku: Mapped[str]
    name: Mapped[str | None]
    available_stock: Mapped[int]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


@pytest.fixture
def engine(pg_sqlalchemy_url: str, sentry: Sentry) -> Iterator[sa.Engine]:
    engine = sa.create_engine(pg_sqlalchemy_url, pool_size=4)
    with engine.begin() as conn:
        for statement in SCHEMA:
            conn.exec_driver_sql(statement)
    instrument_sqlalchemy(engine, sentry=sentry)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


@pytest.fixture
async def async_engine(pg_database: str, sentry: Sentry) -> Any:
    url = pg_database.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        for statement in SCHEMA:
            await conn.exec_driver_sql(statement)
    instrument_sqlalchemy(engine, sentry=sentry)
    yield engine
    uninstrument_sqlalchemy(engine)
    await engine.dispose()


def logged(lines: list[MutableMapping[str, Any]], event: LogEvent) -> MutableMapping[str, Any]:
    """The one line of ``event`` among ``lines`` (capture_logs), as the catalog says it."""
    (line,) = [line for line in lines if line["event"] == event.name]
    assert line["log_level"] == event.level
    assert set(line) - {"event", "log_level"} == set(event.fields)
    return line


def stock(engine: sa.Engine, sku: str = "EGG-01") -> int:
    with engine.connect() as conn:
        return int(conn.execute(READ, {"sku": sku}).scalar_one())


# --- lock waits, deadlocks, serialization failures, lock timeouts ----------------------------


def lock_waiters(url: str) -> int:
    """How many sessions of the database at ``url`` wait for a lock now."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def test_lock_wait_histogram_observes_a_real_wait(
    engine: sa.Engine, registry: CollectorRegistry, pg_database: str
) -> None:
    hold = 1.0  # seconds the holder keeps the row once the waiter is blocked on it
    locked = threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with engine.begin() as conn:
                conn.execute(FOR_UPDATE, EGG).all()
                locked.set()
                # The hold starts once the waiter is blocked: its wait is at least `hold`,
                # however slowly the waiter's thread got going.
                wait_until(
                    lambda: lock_waiters(pg_database), timeout=30, message="a blocked waiter"
                )
                time.sleep(hold)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=holder)
    thread.start()
    assert locked.wait(10)
    with engine.begin() as conn:
        conn.execute(FOR_UPDATE, EGG).all()  # waits for the holder's commit
    thread.join()
    assert errors == []

    def bucket(le: str) -> float:
        return value(registry, f"{LOCK_WAIT}_bucket", table="products", le=le)

    # The holder's own statement did not wait (loosely: well under half a second); the
    # waiter waited at least the hold (and, loosely, less than ten seconds).
    assert bucket("0.5") == 1
    assert bucket("10.0") == 2
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 2
    assert value(registry, f"{LOCK_WAIT}_sum", table="products") >= hold


def test_real_deadlock_counts_once_and_ends_the_reservation_as_deadlock(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    both_locked = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def buyer(first: str, second: str) -> None:
        try:
            with sentry.reservation("EGG-PAIR", strategy="for_update"), engine.begin() as conn:
                # Detect the deadlock after 100 ms instead of the default second.
                conn.exec_driver_sql("SET LOCAL deadlock_timeout = '100ms'")
                conn.execute(FOR_UPDATE, {"sku": first}).all()
                both_locked.wait()
                conn.execute(FOR_UPDATE, {"sku": second}).all()
        except sa.exc.DBAPIError as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=buyer, args=("EGG-01", "EGG-02")),
        threading.Thread(target=buyer, args=("EGG-02", "EGG-01")),
    ]
    sentry.log_enabled = True
    with capture_logs() as lines:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    line = logged(lines, events.DB_DEADLOCK)
    assert (line["table"], line["sqlstate"]) == ("products", "40P01")

    assert len(errors) == 1
    assert "deadlock" in str(errors[0])
    assert value(registry, "stock_db_deadlock_total", table="products") == 1
    assert value(registry, CONFLICT, sku="EGG-PAIR", reason="deadlock") == 1
    assert value(registry, SUCCESS, sku="EGG-PAIR", strategy="for_update") == 1
    assert value(registry, "stock_db_serialization_failure_total", table="products") == 0


def reserve_after_a_concurrent_commit(engine: sa.Engine, sentry: Sentry) -> None:
    with (
        sentry.reservation("EGG-01", strategy="repeatable_read"),
        engine.connect().execution_options(isolation_level="REPEATABLE READ") as mine,
        mine.begin(),
    ):
        mine.execute(READ, EGG).all()  # the snapshot is taken here
        with engine.begin() as theirs:
            theirs.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"}).all()
        mine.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"}).all()


def test_serialization_failure_at_repeatable_read(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    sentry.log_enabled = True
    with capture_logs() as lines, pytest.raises(sa.exc.OperationalError) as caught:
        reserve_after_a_concurrent_commit(engine, sentry)
    assert getattr(caught.value.orig, "sqlstate", None) == "40001"
    line = logged(lines, events.DB_SERIALIZATION_FAILURE)
    assert (line["table"], line["sqlstate"]) == ("products", "40001")
    assert value(registry, "stock_db_serialization_failure_total", table="products") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="serialization_failure") == 1
    assert value(registry, "stock_db_deadlock_total", table="products") == 0


LOCK_TIMEOUT_S = 1.0


def reserve_with_lock_timeout(engine: sa.Engine, sentry: Sentry) -> None:
    with sentry.reservation("EGG-01", strategy="for_update"), engine.begin() as conn:
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT_S:g}s'")
        conn.execute(FOR_UPDATE, EGG).all()


def test_lock_timeout_is_classified_and_its_wait_observed(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    sentry.log_enabled = True
    with engine.begin() as holder, capture_logs() as lines:
        holder.execute(FOR_UPDATE, EGG).all()
        with pytest.raises(sa.exc.OperationalError) as caught:
            reserve_with_lock_timeout(engine, sentry)
    assert getattr(caught.value.orig, "sqlstate", None) == "55P03"
    line = logged(lines, events.DB_LOCK_TIMEOUT)
    assert (line["table"], line["sqlstate"]) == ("products", "55P03")
    assert value(registry, CONFLICT, sku="EGG-01", reason="lock_timeout") == 1
    # Both statements observed: the holder's (no wait: loosely, under half a second) and
    # the one that timed out (at least the lock_timeout; loosely, under ten seconds).
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 2
    assert value(registry, f"{LOCK_WAIT}_bucket", table="products", le="0.5") == 1
    assert value(registry, f"{LOCK_WAIT}_bucket", table="products", le="10.0") == 2
    assert value(registry, f"{LOCK_WAIT}_sum", table="products") >= LOCK_TIMEOUT_S
    assert value(registry, "stock_db_deadlock_total", table="products") == 0


def test_conditional_update_without_a_row_marks_the_reservation(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
        assert conn.execute(ATOMIC, {"qty": 11, "sku": "EGG-01"}).all() == []
    assert r.outcome == "out_of_stock"
    with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
        assert [tuple(row) for row in conn.execute(ATOMIC, {"qty": 10, "sku": "EGG-01"})] == [(0,)]
    assert r.outcome is None
    assert value(registry, CONFLICT, sku="EGG-01", reason="out_of_stock") == 1
    assert value(registry, SUCCESS, sku="EGG-01", strategy="atomic") == 1


# --- detector rows that need PostgreSQL ------------------------------------------------------


def lab_unsafe(engine: sa.Engine) -> None:
    """The lab's unsafe strategy: read in one transaction, write computed in another."""
    with engine.begin() as conn:
        available = int(conn.execute(READ, EGG).scalar_one())
    with engine.begin() as conn:
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def lab_atomic(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"}).all()


def lab_for_update(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        available = int(conn.execute(FOR_UPDATE, EGG).scalar_one())
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def for_update_then_write_later(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        available = int(conn.execute(FOR_UPDATE, EGG).scalar_one())
    with engine.begin() as conn:  # the lock went with the first commit
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def read_write_one_transaction(
    isolation: str | None, lock: str = ""
) -> Callable[[sa.Engine], None]:
    def flow(engine: sa.Engine) -> None:
        with engine.connect() as conn:
            if isolation is not None:
                conn = conn.execution_options(isolation_level=isolation)
            with conn.begin():
                available = int(conn.execute(sa.text(f"{READ.text} {lock}"), EGG).scalar_one())
                conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})

    return flow


def set_transaction_serializable(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        available = int(conn.execute(READ, EGG).scalar_one())
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def lock_table_then_read_write(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("LOCK TABLE products IN SHARE ROW EXCLUSIVE MODE")
        available = int(conn.execute(READ, EGG).scalar_one())
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def decrement_then_read_then_write(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku"),
            EGG,
        )
        available = int(conn.execute(READ, EGG).scalar_one())  # under our own row lock
        conn.execute(BLIND, {"computed": available, "sku": "EGG-01"})


def autocommit_for_update(engine: sa.Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        available = int(conn.execute(FOR_UPDATE, EGG).scalar_one())  # lock gone at once
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def orm_read_then_flush_later(engine: sa.Engine) -> None:
    # Read by sku in one session transaction; the flush writes by primary key in the next.
    with Session(engine) as session:
        product = session.scalars(sa.select(Product).where(Product.sku == "EGG-01")).one()
        available = product.available_stock
        session.commit()
        product.available_stock = available - 1
        session.commit()


def orm_with_for_update(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        product = session.scalars(
            sa.select(Product).where(Product.sku == "EGG-01").with_for_update()
        ).one()
        product.available_stock -= 1


@dataclass(frozen=True)
class Row:
    name: str
    flow: Callable[[sa.Engine], None]
    flagged: int
    units_sold: int = 1


ROWS = [
    Row("lab unsafe: read and computed write in two transactions", lab_unsafe, 1),
    Row("lab atomic conditional update", lab_atomic, 0),
    Row("lab FOR UPDATE then computed write, one transaction", lab_for_update, 0),
    Row("FOR UPDATE, then computed write after commit", for_update_then_write_later, 1),
    Row("plain read, computed write, one READ COMMITTED txn", read_write_one_transaction(None), 1),
    Row(
        "plain read, computed write, one REPEATABLE READ txn",
        read_write_one_transaction("REPEATABLE READ"),
        0,
    ),
    Row("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", set_transaction_serializable, 0),
    Row("FOR SHARE protects", read_write_one_transaction(None, "FOR SHARE"), 0),
    Row("FOR KEY SHARE does not", read_write_one_transaction(None, "FOR KEY SHARE"), 1),
    Row("LOCK TABLE in SHARE ROW EXCLUSIVE mode", lock_table_then_read_write, 0),
    Row("read under our own UPDATE's row lock", decrement_then_read_then_write, 0),
    Row("FOR UPDATE on an AUTOCOMMIT connection", autocommit_for_update, 1),
    Row("ORM: read by sku, flush by id after commit", orm_read_then_flush_later, 1),
    Row("ORM: with_for_update, flush in the same transaction", orm_with_for_update, 0),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_detector_rows_on_postgresql(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, row: Row
) -> None:
    with sentry.reservation("EGG-01", strategy="lab"):
        row.flow(engine)
    assert value(registry, UNSAFE, table="products") == row.flagged
    assert stock(engine) == 10 - row.units_sold
    assert value(registry, "stocksentry_instrumentation_errors_total", component="sqlalchemy") == 0


def test_lab_style_flow_across_threads_only_flags_its_own_reservations(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # Concurrent buyers, each in its own reservation on its own thread: every unsafe buyer
    # is flagged once, no atomic buyer is, and no buyer is linked to another's read.
    def unsafe_buyer() -> None:
        with sentry.reservation("EGG-01", strategy="unsafe"):
            lab_unsafe(engine)

    def atomic_buyer() -> None:
        with sentry.reservation("EGG-01", strategy="atomic"):
            lab_atomic(engine)

    threads = [threading.Thread(target=unsafe_buyer) for _ in range(3)]
    threads += [threading.Thread(target=atomic_buyer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert value(registry, UNSAFE, table="products") == 3


# --- asyncpg ----------------------------------------------------------------------------------


async def test_asyncpg_detector_conditional_and_lock_wait(
    async_engine: AsyncEngine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    async with sentry.reservation("EGG-01", strategy="unsafe"):
        async with async_engine.begin() as conn:
            available = int((await conn.execute(READ, EGG)).scalar_one())
        async with async_engine.begin() as conn:
            await conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})
    async with (
        sentry.reservation("EGG-01", strategy="for_update"),
        async_engine.begin() as conn,
    ):
        available = int((await conn.execute(FOR_UPDATE, EGG)).scalar_one())
        await conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})
    async with (
        sentry.reservation("EGG-01", strategy="atomic") as r,
        async_engine.begin() as conn,
    ):
        rows = (await conn.execute(ATOMIC, {"qty": 99, "sku": "EGG-01"})).all()
    assert rows == []
    assert r.outcome == "out_of_stock"
    assert value(registry, UNSAFE, table="products") == 1
    # Locking statements: the blind UPDATE, the FOR UPDATE and its UPDATE, the atomic one.
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 4
    assert value(registry, CONFLICT, sku="EGG-01", reason="out_of_stock") == 1


async def reserve_after_a_concurrent_commit_async(engine: AsyncEngine, sentry: Sentry) -> None:
    async with (
        sentry.reservation("EGG-01", strategy="repeatable_read"),
        engine.connect() as plain,
    ):
        mine = await plain.execution_options(isolation_level="REPEATABLE READ")
        async with mine.begin():
            await mine.execute(READ, EGG)  # the snapshot is taken here
            async with engine.begin() as theirs:
                await theirs.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"})
            await mine.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"})


async def reserve_with_lock_timeout_async(engine: AsyncEngine, sentry: Sentry) -> None:
    async with sentry.reservation("EGG-01", strategy="for_update"), engine.begin() as conn:
        await conn.exec_driver_sql("SET LOCAL lock_timeout = '50ms'")
        await conn.execute(FOR_UPDATE, EGG)


async def test_asyncpg_sqlstates(
    async_engine: AsyncEngine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with pytest.raises(sa.exc.DBAPIError) as serialization:
        await reserve_after_a_concurrent_commit_async(async_engine, sentry)
    async with async_engine.begin() as holder:
        await holder.execute(FOR_UPDATE, EGG)
        with pytest.raises(sa.exc.DBAPIError) as timeout:
            await reserve_with_lock_timeout_async(async_engine, sentry)
    # SQLAlchemy's asyncpg adapter carries the driver's SQLSTATE on its own error class.
    assert getattr(serialization.value.orig, "sqlstate", None) == "40001"
    assert getattr(timeout.value.orig, "sqlstate", None) == "55P03"
    assert value(registry, "stock_db_serialization_failure_total", table="products") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="serialization_failure") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="lock_timeout") == 1


# --- spans ------------------------------------------------------------------------------------


def test_spans_all_produces_sql_spans(pg_sqlalchemy_url: str, registry: CollectorRegistry) -> None:
    # This also guards the SQLAlchemy < 2.1 pin: on a version the OpenTelemetry
    # instrumentation does not support, no spans appear and this fails.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    engine = sa.create_engine(pg_sqlalchemy_url)
    instrument_sqlalchemy(engine, sentry=sentry, spans="all", tracer_provider=provider)
    try:
        with engine.begin() as conn:
            for statement in SCHEMA:
                conn.exec_driver_sql(statement)
        with sentry.reservation("EGG-01", strategy="atomic"), engine.begin() as conn:
            conn.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"}).all()
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    spans = exporter.get_finished_spans()
    database = sa.make_url(pg_sqlalchemy_url).database
    sql = [
        s
        for s in spans
        if s.instrumentation_scope is not None
        and s.instrumentation_scope.name.endswith("sqlalchemy")
    ]
    assert [s.name for s in sql] == [
        f"CREATE {database}",
        f"INSERT {database}",
        f"UPDATE {database}",
    ]
    reserve = next(s for s in spans if s.name == "stock.reserve")
    assert sql[-1].parent is not None
    assert sql[-1].parent.span_id == reserve.context.span_id
    assert sql[-1].attributes is not None
    assert sql[-1].attributes.get("db.system") == "postgresql"
