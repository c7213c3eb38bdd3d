"""Real negative stock writes seen from the SQL, on PostgreSQL (psycopg 3 and asyncpg) and
MariaDB (PyMySQL; it has no ``UPDATE … RETURNING``, so only the read-back applies).

The application believes the stock it computed (``success(new_stock=available - 1)``); a
transaction without a lock that decrements ``stock = stock - :n`` leaves the row at what
the database says. These tests drive a row below zero and check that
``stock_inventory_negative_total`` counts the database's values, not the app's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from dbs import Db
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import create_async_engine
from stocksentry.instrumentation import Sentry, events
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy
from structlog.testing import capture_logs

pytestmark = pytest.mark.integration

NEGATIVE = "stock_inventory_negative_total"
ROWS = "('EGG-01', 'egg', 5), ('EGG-02', 'big egg', 5), ('EGG-03', 'egg', 2), ('EGG-04', 'egg', 2)"
pg_only = pytest.mark.parametrize("db", ["postgresql"], indirect=True)
DECREMENT = sa.text("UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku")
DECREMENT_RETURNING = sa.text(
    "UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku"
    " RETURNING available_stock"
)
SAFE = sa.text(
    "UPDATE products SET available_stock = available_stock - :n"
    " WHERE sku = :sku AND available_stock >= :n"
)
READ = sa.text("SELECT available_stock FROM products WHERE sku = :sku")
# RETURNING without the stock column: the rows say nothing of the stock left.
DECREMENT_RETURNING_ID = sa.text(
    "UPDATE products SET available_stock = available_stock - :n WHERE sku = :sku RETURNING id"
)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=True, trace=False)


def make_engine(db: Db, sentry: Sentry, **options: Any) -> sa.Engine:
    db.create_products(ROWS)
    engine = sa.create_engine(db.url, pool_size=2)
    instrument_sqlalchemy(engine, sentry=sentry, **options)
    return engine


@pytest.fixture(params=[{"read_back_stock": True}])
def engine(db: Db, sentry: Sentry, request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """An instrumented engine, with ``read_back_stock`` unless a test says its options."""
    engine = make_engine(db, sentry, **request.param)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


# The defaults: negative_writes=True, no read-back.
defaults = pytest.mark.parametrize("engine", [{}], indirect=True)


def negative_lines(lines: list[Any]) -> list[tuple[str, int]]:
    return [
        (line["sku"], line["stock"])
        for line in lines
        if line["event"] == events.INVENTORY_NEGATIVE.name
    ]


def test_relative_decrements_without_a_lock_count_the_real_negative_values(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with capture_logs() as lines, engine.begin() as conn:
        with sentry.reservation("EGG-01", strategy="naive") as r:
            available = conn.execute(READ, {"sku": "EGG-01"}).scalar_one()
            for _ in range(8):
                result = conn.execute(DECREMENT, {"n": 1, "sku": "EGG-01"})
                assert result.rowcount == 1  # the app's own result is untouched
            # What the app believes: one less than it read.
            r.success(old_stock=available, new_stock=available - 1)
        # Outside a reservation the row's key names it.
        conn.execute(DECREMENT, {"n": 7, "sku": "EGG-02"})
    # 5 - 8 = -3: the writes that left -1, -2 and -3 count, the app's 4 does not.
    assert value(registry, NEGATIVE, sku="EGG-01") == 3
    assert value(registry, NEGATIVE, sku="EGG-02") == 1
    assert negative_lines(lines) == [
        ("EGG-01", -1),
        ("EGG-01", -2),
        ("EGG-01", -3),
        ("EGG-02", -2),
    ]
    with engine.connect() as conn:
        assert conn.execute(READ, {"sku": "EGG-01"}).scalar_one() == -3


@pg_only
def test_returning_is_read_without_consuming_the_apps_rows(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    with engine.begin() as conn:
        seen = [
            conn.execute(DECREMENT_RETURNING, {"n": 3, "sku": "EGG-01"}).scalar_one()
            for _ in range(3)
        ]
        # The ORM-style fetch of every row still gets them.
        rows = conn.execute(DECREMENT_RETURNING, {"n": 1, "sku": "EGG-01"}).all()
    assert seen == [2, -1, -4]
    assert [tuple(row) for row in rows] == [(-5,)]
    assert value(registry, NEGATIVE, sku="EGG-01") == 3


@pg_only
def test_a_reservation_reporting_the_returned_value_is_counted_once(
    engine: sa.Engine, sentry: Sentry, registry: CollectorRegistry
) -> None:
    with capture_logs() as lines:
        for _ in range(7):
            with sentry.reservation("EGG-01", strategy="naive") as r, engine.begin() as conn:
                left = conn.execute(DECREMENT_RETURNING, {"n": 1, "sku": "EGG-01"}).scalar_one()
                # The app reports the real value it got back: the same write, not a second.
                r.success(old_stock=left + 1, new_stock=left)
    # 5 - 7 = -2: two negative writes, each counted and logged once.
    assert value(registry, NEGATIVE, sku="EGG-01") == 2
    assert negative_lines(lines) == [("EGG-01", -1), ("EGG-01", -2)]


def test_safe_atomic_decrement_counts_nothing(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    refused = 0
    with engine.begin() as conn:
        for _ in range(8):
            if conn.execute(SAFE, {"n": 1, "sku": "EGG-01"}).rowcount == 0:
                refused += 1
        assert conn.execute(READ, {"sku": "EGG-01"}).scalar_one() == 0
    assert refused == 3
    assert value(registry, NEGATIVE, sku="EGG-01") == 0


@pg_only
@defaults
def test_read_back_is_off_unless_configured(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    with engine.begin() as conn:
        for _ in range(7):
            conn.execute(DECREMENT, {"n": 1, "sku": "EGG-01"})
        # RETURNING needs no extra query: it is on by default.
        conn.execute(DECREMENT_RETURNING, {"n": 1, "sku": "EGG-02"}).all()
        for _ in range(5):
            conn.execute(DECREMENT_RETURNING, {"n": 1, "sku": "EGG-02"}).all()
    assert value(registry, NEGATIVE, sku="EGG-01") == 0
    assert value(registry, NEGATIVE, sku="EGG-02") == 1


@pg_only
@defaults
def test_returning_without_the_stock_column_is_read_back_by_default(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    with capture_logs() as lines, engine.begin() as conn:
        ids = [
            conn.execute(DECREMENT_RETURNING_ID, {"n": 1, "sku": "EGG-03"}).scalar_one()
            for _ in range(5)
        ]
        left = conn.execute(READ, {"sku": "EGG-03"}).scalar_one()
    # The app's rows are untouched by the read-back: each statement returned the row's id.
    assert len(set(ids)) == 1
    assert left == -3
    assert value(registry, NEGATIVE, sku="EGG-03") == 3
    assert negative_lines(lines) == [("EGG-03", -1), ("EGG-03", -2), ("EGG-03", -3)]


@pg_only
def test_read_back_names_unknown_tables_at_set_up(db: Db, sentry: Sentry) -> None:
    engine = sa.create_engine(db.url)
    try:
        with pytest.raises(ValueError, match="orders"):
            instrument_sqlalchemy(engine, sentry=sentry, read_back_stock=["orders"])
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()


@pg_only
async def test_asyncpg_returning_and_read_back(
    db: Db, sentry: Sentry, registry: CollectorRegistry
) -> None:
    db.create_products(ROWS)
    engine = create_async_engine(db.async_url)
    instrument_sqlalchemy(engine, sentry=sentry, read_back_stock=["products"])
    try:
        async with engine.begin() as conn:
            for _ in range(6):
                await conn.execute(DECREMENT, {"n": 1, "sku": "EGG-01"})
            returned = (
                await conn.execute(DECREMENT_RETURNING, {"n": 4, "sku": "EGG-02"})
            ).scalar_one()
            returned2 = (
                await conn.execute(DECREMENT_RETURNING, {"n": 4, "sku": "EGG-02"})
            ).scalar_one()
    finally:
        uninstrument_sqlalchemy(engine)
        await engine.dispose()
    assert (returned, returned2) == (1, -3)
    assert value(registry, NEGATIVE, sku="EGG-01") == 1
    assert value(registry, NEGATIVE, sku="EGG-02") == 1


def test_relative_decrements_read_back_leave_the_apps_rowcounts(
    engine: sa.Engine, registry: CollectorRegistry
) -> None:
    with engine.begin() as conn:
        counts = [conn.execute(DECREMENT, {"n": 1, "sku": "EGG-03"}).rowcount for _ in range(5)]
        refused = [conn.execute(SAFE, {"n": 1, "sku": "EGG-04"}).rowcount for _ in range(5)]
    assert counts == [1] * 5  # the app's rowcounts are untouched by the read-back
    assert refused == [1, 1, 0, 0, 0]
    # 2 - 5 = -3: the writes that left -1, -2, -3; the guarded decrements count nothing.
    assert value(registry, NEGATIVE, sku="EGG-03") == 3
    assert value(registry, NEGATIVE, sku="EGG-04") == 0


@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
def test_on_mariadb_negative_writes_need_read_back_stock(
    db: Db, sentry: Sentry, registry: CollectorRegistry
) -> None:
    """docs/sqlalchemy.md, "MySQL and MariaDB": no RETURNING there, so the default
    ``negative_writes=True`` alone sees nothing; ``read_back_stock`` does."""
    engine = make_engine(db, sentry)  # the defaults: negative_writes=True, no read-back
    try:
        with engine.begin() as conn:
            for _ in range(7):
                conn.execute(DECREMENT, {"n": 1, "sku": "EGG-01"})
            assert conn.execute(READ, {"sku": "EGG-01"}).scalar_one() == -2
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    assert value(registry, NEGATIVE, sku="EGG-01") == 0
    engine = sa.create_engine(db.url, pool_size=2)
    instrument_sqlalchemy(engine, sentry=sentry, read_back_stock=True)
    try:
        with engine.begin() as conn:
            conn.execute(DECREMENT, {"n": 1, "sku": "EGG-01"})
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    assert value(registry, NEGATIVE, sku="EGG-01") == 1
