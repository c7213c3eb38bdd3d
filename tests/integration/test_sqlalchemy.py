"""The SQLAlchemy integration against real PostgreSQL (psycopg 3, asyncpg) and MariaDB
(PyMySQL, aiomysql): each test over the ``db`` fixture runs on both.

Real lock waits, real deadlocks (40P01 / 1213) and lock timeouts (55P03 / 1205) counted and
classified alike, and the detector rows that need row locks and isolation levels (SQLite
has neither), where InnoDB's isolation differs from PostgreSQL's (a plain read at
REPEATABLE READ does lose updates on InnoDB). What exists on one database only (RETURNING,
serialization failures at REPEATABLE READ, CLIENT.FOUND_ROWS) is tested there only.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from dbs import Db, error_code
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from polling import wait_until
from prometheus_client import CollectorRegistry
from pymysql.constants import CLIENT
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from stocksentry.instrumentation import Sentry, classify_exception, events
from stocksentry.instrumentation.events import LogEvent
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy
from structlog.testing import capture_logs

pytestmark = pytest.mark.integration

LOCK_WAIT = "stock_db_lock_wait_duration_seconds"
UNSAFE = "stock_unsafe_read_modify_write_total"
CONFLICT = "stock_reservation_conflict_total"
SUCCESS = "stock_reservation_success_total"
ERRORS = "stocksentry_instrumentation_errors_total"

ROWS = "('EGG-01', 'egg', 10), ('EGG-02', 'big egg', 10)"
EGG = {"sku": "EGG-01"}
READ = sa.text("SELECT available_stock FROM products WHERE sku = :sku")
FOR_UPDATE = sa.text("SELECT available_stock FROM products WHERE sku = :sku FOR UPDATE")
BLIND = sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku")
GUARDED = (
    "UPDATE products SET available_stock = available_stock - :qty"
    " WHERE sku = :sku AND available_stock >= :qty"
)
# MariaDB has no UPDATE ... RETURNING: there the atomic reservation is the guarded UPDATE.
ATOMIC = sa.text(GUARDED)
ATOMIC_RETURNING = sa.text(f"{GUARDED} RETURNING available_stock")


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


def atomic(db: Db) -> sa.TextClause:
    """The atomic reservation: with RETURNING where the database has it."""
    return ATOMIC_RETURNING if db.returning else ATOMIC


def matched(db: Db, result: sa.CursorResult[Any]) -> int:
    """Rows the atomic reservation matched (RETURNING rows are fetched, as an app does)."""
    return len(result.all()) if db.returning else result.rowcount


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=False, trace=False)


@pytest.fixture
def engine(db: Db, sentry: Sentry) -> Iterator[sa.Engine]:
    db.create_products(ROWS)
    engine = sa.create_engine(db.url, pool_size=4)
    instrument_sqlalchemy(engine, sentry=sentry)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


@pytest.fixture
async def async_engine(db: Db, sentry: Sentry) -> Any:
    db.create_products(ROWS)
    engine = create_async_engine(db.async_url)
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


pg_only = pytest.mark.parametrize("db", ["postgresql"], indirect=True)
mariadb_only = pytest.mark.parametrize("db", ["mariadb"], indirect=True)


# --- lock waits, deadlocks, lock timeouts -----------------------------------------------------


@pytest.mark.parametrize("shared", [False, True], ids=["for_update", "shared"])
def test_lock_wait_histogram_observes_a_real_wait(
    db: Db, engine: sa.Engine, registry: CollectorRegistry, shared: bool
) -> None:
    hold = 1.0  # seconds the holder keeps the row once the waiter is blocked on it
    locked = threading.Event()
    errors: list[BaseException] = []
    # A plain connection beside it for the waiter count, opened once: its statements are
    # not observed, and a busy server's connection limit cannot fail a probe half-way.
    watcher = sa.create_engine(engine.url, poolclass=sa.pool.NullPool)
    watching = watcher.connect().execution_options(isolation_level="AUTOCOMMIT")

    def holder() -> None:
        try:
            with engine.begin() as conn:
                conn.execute(FOR_UPDATE, EGG).all()
                locked.set()
                # The hold starts once the waiter is blocked: its wait is at least `hold`,
                # however slowly the waiter's thread got going. Polled slower than InnoDB
                # refreshes its information_schema transaction cache (every 0.1 s).
                wait_until(
                    lambda: int(watching.exec_driver_sql(db.lock_waiters_sql).scalar_one()),
                    timeout=30,
                    interval=0.25,
                    message="a blocked waiter",
                )
                time.sleep(hold)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert locked.wait(10)
        clause = db.share_clause if shared else "FOR UPDATE"
        with engine.begin() as conn:
            # Waits for the holder's commit.
            conn.execute(sa.text(f"{READ.text} {clause}"), EGG).all()
    finally:
        thread.join()
        watching.close()
        watcher.dispose()
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
    db: Db, engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    both_locked = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def buyer(first: str, second: str) -> None:
        try:
            with sentry.reservation("EGG-PAIR", strategy="for_update"), engine.begin() as conn:
                if db.name == "postgresql":
                    # Detect the deadlock after 100 ms instead of the default second (InnoDB
                    # finds the cycle at once).
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
    assert (line["table"], line["sqlstate"]) == ("products", db.deadlock)

    assert len(errors) == 1
    assert error_code(errors[0]) == db.deadlock
    assert classify_exception(errors[0]) == "deadlock"
    if db.name == "postgresql":
        assert "deadlock" in str(errors[0])
    else:
        assert isinstance(getattr(errors[0], "orig", None), pymysql.err.OperationalError)
    assert value(registry, "stock_db_deadlock_total", table="products") == 1
    assert value(registry, CONFLICT, sku="EGG-PAIR", reason="deadlock") == 1
    assert value(registry, SUCCESS, sku="EGG-PAIR", strategy="for_update") == 1
    assert value(registry, "stock_db_serialization_failure_total", table="products") == 0


LOCK_TIMEOUT_S = 1.0  # what db.lock_timeout_sql sets


def reserve_with_lock_timeout(db: Db, engine: sa.Engine, sentry: Sentry) -> None:
    with sentry.reservation("EGG-01", strategy="for_update"), engine.begin() as conn:
        conn.exec_driver_sql(db.lock_timeout_sql)
        conn.execute(FOR_UPDATE, EGG).all()


def test_lock_timeout_is_classified_and_its_wait_observed(
    db: Db, engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    sentry.log_enabled = True
    with engine.begin() as holder, capture_logs() as lines:
        holder.execute(FOR_UPDATE, EGG).all()
        with pytest.raises(sa.exc.OperationalError) as caught:
            reserve_with_lock_timeout(db, engine, sentry)
    assert error_code(caught.value) == db.lock_timeout
    line = logged(lines, events.DB_LOCK_TIMEOUT)
    assert (line["table"], line["sqlstate"]) == ("products", db.lock_timeout)
    assert value(registry, CONFLICT, sku="EGG-01", reason="lock_timeout") == 1
    # Both statements observed: the holder's (no wait: loosely, under half a second) and
    # the one that timed out (at least the timeout; loosely, under ten seconds).
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 2
    assert value(registry, f"{LOCK_WAIT}_bucket", table="products", le="0.5") == 1
    assert value(registry, f"{LOCK_WAIT}_bucket", table="products", le="10.0") == 2
    assert value(registry, f"{LOCK_WAIT}_sum", table="products") >= LOCK_TIMEOUT_S
    assert value(registry, "stock_db_deadlock_total", table="products") == 0


def test_a_lock_timeout_ends_its_lock_span_with_the_error_code(
    db: Db, registry: CollectorRegistry
) -> None:
    db.create_products(ROWS)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    engine = sa.create_engine(db.url)
    instrument_sqlalchemy(engine, sentry=sentry, spans="locking")
    try:
        with engine.begin() as holder:
            holder.execute(FOR_UPDATE, EGG).all()
            with pytest.raises(sa.exc.OperationalError):
                reserve_with_lock_timeout(db, engine, sentry)
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    failed = [s for s in exporter.get_finished_spans() if s.status.status_code.name == "ERROR"]
    lock_spans = [s for s in failed if s.name == "SELECT products"]
    assert len(lock_spans) == 1
    attributes = dict(lock_spans[0].attributes or {})
    assert attributes["db.response.status_code"] == db.lock_timeout
    assert attributes["db.system.name"] == ("postgresql" if db.returning else "mysql")
    assert attributes["stock.lock"] == "for update"


def test_nowait_on_a_locked_row_is_a_lock_timeout(
    db: Db, engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with engine.begin() as holder:
        holder.execute(FOR_UPDATE, EGG).all()
        with (
            pytest.raises(sa.exc.OperationalError) as caught,
            sentry.reservation("EGG-01", strategy="for_update"),
            engine.begin() as conn,
        ):
            conn.execute(sa.text(f"{FOR_UPDATE.text} NOWAIT"), EGG).all()
    # MariaDB answers NOWAIT with 1205 (MySQL 8 with 3572): a lock_timeout either way.
    assert error_code(caught.value) in (db.lock_timeout, "3572")
    assert value(registry, CONFLICT, sku="EGG-01", reason="lock_timeout") == 1
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 2


def test_skip_locked_is_timed_and_reads_nothing(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    with engine.begin() as holder:
        holder.execute(FOR_UPDATE, EGG).all()
        with engine.begin() as conn:
            rows = conn.execute(sa.text(f"{FOR_UPDATE.text} SKIP LOCKED"), EGG).all()
    assert rows == []
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 2


def reserve_after_a_concurrent_commit(engine: sa.Engine, sentry: Sentry) -> None:
    with (
        sentry.reservation("EGG-01", strategy="repeatable_read"),
        engine.connect().execution_options(isolation_level="REPEATABLE READ") as mine,
        mine.begin(),
    ):
        mine.execute(READ, EGG).all()  # the snapshot is taken here
        with engine.begin() as theirs:
            theirs.execute(ATOMIC_RETURNING, {"qty": 1, "sku": "EGG-01"}).all()
        mine.execute(ATOMIC_RETURNING, {"qty": 1, "sku": "EGG-01"}).all()


@pg_only
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


# --- conditional updates ------------------------------------------------------------------------


def test_conditional_update_without_a_row_marks_the_reservation(
    db: Db, engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
        assert matched(db, conn.execute(atomic(db), {"qty": 11, "sku": "EGG-01"})) == 0
    assert r.outcome == "out_of_stock"
    with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
        result = conn.execute(atomic(db), {"qty": 10, "sku": "EGG-01"})
        if db.returning:
            assert [tuple(row) for row in result] == [(0,)]
        else:
            assert result.rowcount == 1
    assert r.outcome is None
    assert stock(engine) == 0
    assert value(registry, CONFLICT, sku="EGG-01", reason="out_of_stock") == 1
    assert value(registry, SUCCESS, sku="EGG-01", strategy="atomic") == 1


def raw_engine(url: str, found_rows: bool) -> sa.Engine:
    """An engine over plain PyMySQL connections: SQLAlchemy's dialect would add FOUND_ROWS."""
    parts = sa.make_url(url)

    def connect() -> Any:
        return pymysql.connect(
            host=parts.host or "127.0.0.1",
            port=parts.port or 3306,
            user=parts.username or "root",
            password=parts.password or "",
            database=parts.database,
            client_flag=CLIENT.FOUND_ROWS if found_rows else 0,
        )

    return sa.create_engine(url, creator=connect)


@mariadb_only
@pytest.mark.parametrize("found_rows", [True, False], ids=["found_rows", "changed_rows"])
def test_an_update_that_changes_nothing_is_no_conflict_either_way(
    db: Db, sentry: Sentry, registry: CollectorRegistry, found_rows: bool
) -> None:
    # `stock - 0` and a compare-and-set to the value it has both match the row and change
    # nothing: a driver without FOUND_ROWS reports 0 rows, which must not read as a lost race.
    db.create_products(ROWS)
    engine = raw_engine(db.url, found_rows)
    instrument_sqlalchemy(engine, sentry=sentry)
    cas = sa.text(
        "UPDATE products SET available_stock = :new WHERE sku = :sku AND available_stock = :seen"
    )
    try:
        with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
            reported = conn.execute(ATOMIC, {"qty": 0, "sku": "EGG-01"}).rowcount
        assert reported == (1 if found_rows else 0)
        assert r.outcome is None
        with sentry.reservation("EGG-01", strategy="cas") as r, engine.begin() as conn:
            conn.execute(cas, {"new": 10, "seen": 10, "sku": "EGG-01"})
        assert r.outcome is None
        with sentry.reservation("EGG-01", strategy="cas") as r, engine.begin() as conn:
            assert conn.execute(cas, {"new": 9, "seen": 7, "sku": "EGG-01"}).rowcount == 0
        assert r.outcome == "lost_race"
        with sentry.reservation("EGG-01", strategy="atomic") as r, engine.begin() as conn:
            assert conn.execute(ATOMIC, {"qty": 11, "sku": "EGG-01"}).rowcount == 0
        assert r.outcome == "out_of_stock"
        # An unsafe write of the value the row already has still counts as a write.
        with sentry.reservation("EGG-01", strategy="unsafe"):
            with engine.begin() as conn:
                available = int(conn.execute(READ, EGG).scalar_one())
            with engine.begin() as conn:
                conn.execute(BLIND, {"computed": available, "sku": "EGG-01"})
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    assert value(registry, CONFLICT, sku="EGG-01", reason="lost_race") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="out_of_stock") == 1
    assert value(registry, UNSAFE, table="products") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0


# --- detector rows ------------------------------------------------------------------------------

Flow = Callable[[sa.Engine, Db], None]


def lab_unsafe(engine: sa.Engine, db: Db) -> None:
    """The lab's unsafe strategy: read in one transaction, write computed in another."""
    with engine.begin() as conn:
        available = int(conn.execute(READ, EGG).scalar_one())
    with engine.begin() as conn:
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def lab_atomic(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        matched(db, conn.execute(atomic(db), {"qty": 1, "sku": "EGG-01"}))


def lab_for_update(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        available = int(conn.execute(FOR_UPDATE, EGG).scalar_one())
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def for_update_then_write_later(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        available = int(conn.execute(FOR_UPDATE, EGG).scalar_one())
    with engine.begin() as conn:  # the lock went with the first commit
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def read_write_one_transaction(isolation: str | None, lock: str = "") -> Flow:
    def flow(engine: sa.Engine, db: Db) -> None:
        with engine.connect() as conn:
            if isolation is not None:
                conn = conn.execution_options(isolation_level=isolation)
            with conn.begin():
                shared = db.share_clause if lock == "share" else lock
                available = int(conn.execute(sa.text(f"{READ.text} {shared}"), EGG).scalar_one())
                conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})

    return flow


def orm_read_then_flush_later(engine: sa.Engine, db: Db) -> None:
    # Read by sku in one session transaction; the flush writes by primary key in the next.
    with Session(engine) as session:
        product = session.scalars(sa.select(Product).where(Product.sku == "EGG-01")).one()
        available = product.available_stock
        session.commit()
        product.available_stock = available - 1
        session.commit()


def orm_with_for_update(engine: sa.Engine, db: Db) -> None:
    with Session(engine) as session, session.begin():
        product = session.scalars(
            sa.select(Product).where(Product.sku == "EGG-01").with_for_update()
        ).one()
        product.available_stock -= 1


def set_transaction_serializable(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        available = int(conn.execute(READ, EGG).scalar_one())
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def lock_table_then_read_write(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("LOCK TABLE products IN SHARE ROW EXCLUSIVE MODE")
        available = int(conn.execute(READ, EGG).scalar_one())
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def decrement_then_read_then_write(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku"),
            EGG,
        )
        available = int(conn.execute(READ, EGG).scalar_one())  # under our own row lock
        conn.execute(BLIND, {"computed": available, "sku": "EGG-01"})


def autocommit_for_update(engine: sa.Engine, db: Db) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        available = int(conn.execute(FOR_UPDATE, EGG).scalar_one())  # lock gone at once
        conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})


def incident_qmark_style(engine: sa.Engine, db: Db) -> None:
    """The incident's shape: driver SQL with positional placeholders, read then write.

    PyMySQL takes ``%s`` where the incident's driver took ``?``; the classifier reads both
    (``?`` is checked in the unit tests and on SQLite).
    """
    with engine.begin() as conn:
        (available,) = conn.exec_driver_sql(
            "SELECT available_stock FROM products WHERE sku = %s", ("EGG-01",)
        ).one()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE products SET available_stock = %s WHERE sku = %s", (available - 1, "EGG-01")
        )


def double_quoted_literal_key(engine: sa.Engine, db: Db) -> None:
    """MySQL's "..." string as the key (the default sql_mode, without ANSI_QUOTES)."""
    with engine.begin() as conn:
        (available,) = conn.exec_driver_sql(
            'SELECT available_stock FROM products WHERE sku = "EGG-01" # the hot SKU'
        ).one()
    with engine.begin() as conn:
        conn.exec_driver_sql(
            'UPDATE products SET available_stock = %s WHERE sku = "EGG-01"', (available - 1,)
        )


def atomic_driver_sql(engine: sa.Engine, db: Db) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE products SET available_stock = available_stock - 1"
            " WHERE sku = %s AND available_stock >= 1",
            ("EGG-01",),
        )


def lock_tables_then_read_write(engine: sa.Engine, db: Db) -> None:
    # MySQL's recipe: LOCK TABLES inside the transaction (autocommit off), COMMIT, then
    # UNLOCK TABLES; a LOCK TABLES would commit a transaction begun before it.
    with engine.connect() as conn:
        conn.exec_driver_sql("LOCK TABLES products WRITE")  # SQLAlchemy begins here
        try:
            available = int(conn.execute(READ, EGG).scalar_one())
            conn.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})
            conn.commit()
        finally:
            conn.exec_driver_sql("UNLOCK TABLES")
            conn.commit()


@dataclass(frozen=True)
class Row:
    name: str
    flow: Flow
    flagged: int
    units_sold: int = 1


def repeatable_read(flagged: int) -> Row:
    """A plain read and a computed write in one REPEATABLE READ transaction."""
    flow = read_write_one_transaction("REPEATABLE READ")
    return Row("plain read, computed write, one REPEATABLE READ txn", flow, flagged)


BOTH = [
    Row("lab unsafe: read and computed write in two transactions", lab_unsafe, 1),
    Row("lab atomic conditional update", lab_atomic, 0),
    Row("lab FOR UPDATE then computed write, one transaction", lab_for_update, 0),
    Row("FOR UPDATE, then computed write after commit", for_update_then_write_later, 1),
    Row(
        "plain read, computed write, one txn at the default level",
        read_write_one_transaction(None),
        1,
    ),
    Row(
        "plain read, computed write, one READ COMMITTED txn",
        read_write_one_transaction("READ COMMITTED"),
        1,
    ),
    Row(
        "plain read, computed write, one SERIALIZABLE txn",
        read_write_one_transaction("SERIALIZABLE"),
        0,
    ),
    Row("shared row lock protects", read_write_one_transaction(None, "share"), 0),
    Row("ORM: read by sku, flush by id after commit", orm_read_then_flush_later, 1),
    Row("ORM: with_for_update, flush in the same transaction", orm_with_for_update, 0),
]
POSTGRESQL = [
    # PostgreSQL's REPEATABLE READ aborts the computed write with 40001 rather than lose it.
    repeatable_read(flagged=0),
    Row("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", set_transaction_serializable, 0),
    Row("FOR KEY SHARE does not", read_write_one_transaction(None, "FOR KEY SHARE"), 1),
    Row("LOCK TABLE in SHARE ROW EXCLUSIVE mode", lock_table_then_read_write, 0),
    Row("read under our own UPDATE's row lock", decrement_then_read_then_write, 0),
    Row("FOR UPDATE on an AUTOCOMMIT connection", autocommit_for_update, 1),
]
MARIADB = [
    # InnoDB's default: the plain read is a snapshot read, the write overwrites the latest row.
    repeatable_read(flagged=1),
    Row("incident shape: positional driver SQL, read then write", incident_qmark_style, 1),
    Row("MySQL double-quoted literal key and # comment", double_quoted_literal_key, 1),
    Row("atomic UPDATE stock = stock - 1 WHERE stock >= 1, driver SQL", atomic_driver_sql, 0),
    Row("LOCK TABLES products WRITE", lock_tables_then_read_write, 0),
]
CASES = [("postgresql", row) for row in BOTH + POSTGRESQL] + [
    ("mariadb", row) for row in BOTH + MARIADB
]


@pytest.mark.parametrize(
    ("db", "row"), CASES, ids=[f"{name}: {row.name}" for name, row in CASES], indirect=["db"]
)
def test_detector_rows(
    db: Db, engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry, row: Row
) -> None:
    with sentry.reservation("EGG-01", strategy="lab"):
        row.flow(engine, db)
    assert value(registry, UNSAFE, table="products") == row.flagged
    assert stock(engine) == 10 - row.units_sold
    assert value(registry, ERRORS, component="sqlalchemy") == 0


def test_lab_style_flow_across_threads_only_flags_its_own_reservations(
    db: Db, engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # Concurrent buyers, each in its own reservation on its own thread: every unsafe buyer
    # is flagged once, no atomic buyer is, and no buyer is linked to another's read.
    def unsafe_buyer() -> None:
        with sentry.reservation("EGG-01", strategy="unsafe"):
            lab_unsafe(engine, db)

    def atomic_buyer() -> None:
        with sentry.reservation("EGG-01", strategy="atomic"):
            lab_atomic(engine, db)

    threads = [threading.Thread(target=unsafe_buyer) for _ in range(3)]
    threads += [threading.Thread(target=atomic_buyer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert value(registry, UNSAFE, table="products") == 3


@mariadb_only
def test_repeatable_read_loses_the_update_the_detector_flags(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    # Why REPEATABLE READ is flagged on InnoDB: a buyer commits between our snapshot read
    # and our computed write, and its unit is lost (PostgreSQL would raise 40001 instead).
    with (
        sentry.reservation("EGG-01", strategy="repeatable_read"),
        engine.connect() as mine,
        mine.begin(),
    ):
        available = int(mine.execute(READ, EGG).scalar_one())  # the snapshot is taken here
        with engine.begin() as theirs:
            theirs.execute(ATOMIC, {"qty": 1, "sku": "EGG-01"})
        assert int(mine.execute(READ, EGG).scalar_one()) == available  # still the snapshot
        mine.execute(BLIND, {"computed": available - 1, "sku": "EGG-01"})
    assert stock(engine) == 9  # two units sold, one taken off
    assert value(registry, UNSAFE, table="products") == 1


# --- asyncio drivers: asyncpg, aiomysql -----------------------------------------------------


async def test_async_detector_conditional_and_lock_wait(
    db: Db, async_engine: AsyncEngine, sentry: Sentry, registry: CollectorRegistry
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
        rows = matched(db, await conn.execute(atomic(db), {"qty": 99, "sku": "EGG-01"}))
    assert rows == 0
    assert r.outcome == "out_of_stock"
    async with (
        sentry.reservation("EGG-01", strategy="atomic") as r,
        async_engine.begin() as conn,
    ):
        # Matched, nothing changed.
        matched(db, await conn.execute(atomic(db), {"qty": 0, "sku": "EGG-01"}))
    assert r.outcome is None
    assert value(registry, UNSAFE, table="products") == 1
    # Locking statements: the blind UPDATE, the FOR UPDATE and its UPDATE, the two atomic.
    assert value(registry, f"{LOCK_WAIT}_count", table="products") == 5
    assert value(registry, CONFLICT, sku="EGG-01", reason="out_of_stock") == 1
    assert value(registry, ERRORS, component="sqlalchemy") == 0


async def reserve_after_a_concurrent_commit_async(engine: AsyncEngine, sentry: Sentry) -> None:
    async with (
        sentry.reservation("EGG-01", strategy="repeatable_read"),
        engine.connect() as plain,
    ):
        mine = await plain.execution_options(isolation_level="REPEATABLE READ")
        async with mine.begin():
            await mine.execute(READ, EGG)  # the snapshot is taken here
            async with engine.begin() as theirs:
                await theirs.execute(ATOMIC_RETURNING, {"qty": 1, "sku": "EGG-01"})
            await mine.execute(ATOMIC_RETURNING, {"qty": 1, "sku": "EGG-01"})


async def reserve_with_lock_timeout_async(engine: AsyncEngine, sentry: Sentry, sql: str) -> None:
    async with sentry.reservation("EGG-01", strategy="for_update"), engine.begin() as conn:
        await conn.exec_driver_sql(sql)
        await conn.execute(FOR_UPDATE, EGG)


@pg_only
async def test_asyncpg_sqlstates(
    async_engine: AsyncEngine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with pytest.raises(sa.exc.DBAPIError) as serialization:
        await reserve_after_a_concurrent_commit_async(async_engine, sentry)
    async with async_engine.begin() as holder:
        await holder.execute(FOR_UPDATE, EGG)
        with pytest.raises(sa.exc.DBAPIError) as timeout:
            await reserve_with_lock_timeout_async(
                async_engine, sentry, "SET LOCAL lock_timeout = '50ms'"
            )
    # SQLAlchemy's asyncpg adapter carries the driver's SQLSTATE on its own error class.
    assert getattr(serialization.value.orig, "sqlstate", None) == "40001"
    assert getattr(timeout.value.orig, "sqlstate", None) == "55P03"
    assert value(registry, "stock_db_serialization_failure_total", table="products") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="serialization_failure") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="lock_timeout") == 1


@mariadb_only
async def test_aiomysql_deadlock_and_lock_wait_timeout(
    db: Db, async_engine: AsyncEngine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    both_locked = asyncio.Barrier(2)
    errors: list[BaseException] = []

    async def buyer(first: str, second: str) -> None:
        try:
            async with (
                sentry.reservation("EGG-PAIR", strategy="for_update"),
                async_engine.begin() as conn,
            ):
                await conn.execute(FOR_UPDATE, {"sku": first})
                await both_locked.wait()
                await conn.execute(FOR_UPDATE, {"sku": second})
        except sa.exc.DBAPIError as exc:
            errors.append(exc)

    await asyncio.wait_for(
        asyncio.gather(buyer("EGG-01", "EGG-02"), buyer("EGG-02", "EGG-01")), timeout=30
    )
    async with async_engine.begin() as holder:
        await holder.execute(FOR_UPDATE, EGG)
        with pytest.raises(sa.exc.OperationalError) as timeout:
            await reserve_with_lock_timeout_async(async_engine, sentry, db.lock_timeout_sql)
    assert len(errors) == 1
    assert getattr(errors[0], "orig", None) is not None
    assert errors[0].orig.args[0] == 1213  # type: ignore[attr-defined]  # checked just above
    assert timeout.value.orig is not None
    assert timeout.value.orig.args[0] == 1205
    assert value(registry, "stock_db_deadlock_total", table="products") == 1
    assert value(registry, CONFLICT, sku="EGG-PAIR", reason="deadlock") == 1
    assert value(registry, CONFLICT, sku="EGG-01", reason="lock_timeout") == 1


# --- spans ------------------------------------------------------------------------------------


@pg_only
def test_spans_all_produces_sql_spans(db: Db, registry: CollectorRegistry) -> None:
    # This also guards the SQLAlchemy < 2.1 pin: on a version the OpenTelemetry
    # instrumentation does not support, no spans appear and this fails.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sentry = Sentry(registry=registry, log=False, tracer_provider=provider)
    engine = sa.create_engine(db.url)
    instrument_sqlalchemy(engine, sentry=sentry, spans="all", tracer_provider=provider)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(db.products_ddl)
            conn.exec_driver_sql(
                f"INSERT INTO products (sku, name, available_stock) VALUES {ROWS}"
            )
        with sentry.reservation("EGG-01", strategy="atomic"), engine.begin() as conn:
            conn.execute(ATOMIC_RETURNING, {"qty": 1, "sku": "EGG-01"}).all()
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    spans = exporter.get_finished_spans()
    database = sa.make_url(db.url).database
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
