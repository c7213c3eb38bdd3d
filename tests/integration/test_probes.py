"""The probes against a real PostgreSQL (and MariaDB) and Redis: exact figures, timeouts,
failover.

Each test seeds a fresh database with the default schema and known violations, runs a
:class:`ProbeRunner` on short intervals, and reads the figures back from a fresh registry,
as a scrape would. The tests taking the ``db`` fixture run on PostgreSQL and on MariaDB
(whose shop and helpers are in ``test_probes_mysql.py``); the others are PostgreSQL's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import redis.asyncio as aioredis
import yaml
from dbs import ALL_DB_PROBES, PG_SHOP_TABLES, Db
from polling import async_wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.probes import ProbeRunner, check_indexes
from stocksentry.exporter.probes.base import ErrorLog, ProbeResult
from stocksentry.exporter.probes.election import LeaderElection
from stocksentry.exporter.probes.pool import Pool

pytestmark = pytest.mark.integration

# The same Redis as the redis_prefix fixture of conftest.py.
REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")
# How long a test waits for a probe to get somewhere. Generous, because a loaded two-core
# machine is slow; a passing test waits only as long as the probes take.
WAIT = 20.0
INF = float("inf")

SCHEMA = (
    PG_SHOP_TABLES
    + """
CREATE TABLE reservations (
    id bigserial PRIMARY KEY,
    product_id bigint NOT NULL REFERENCES products (id),
    quantity integer NOT NULL,
    expires_at timestamptz NOT NULL,
    released_at timestamptz
);
CREATE TABLE outbox (
    id bigserial PRIMARY KEY,
    created_at timestamptz NOT NULL,
    published_at timestamptz
);
"""
)

INDEXES = """
CREATE INDEX products_stock_negative_idx ON products (available_stock)
    WHERE available_stock < 0;
CREATE INDEX orders_created_at_idx ON orders (created_at);
CREATE INDEX order_items_product_id_idx ON order_items (product_id);
CREATE INDEX order_items_order_id_idx ON order_items (order_id);
CREATE INDEX orders_external_ref_idx ON orders (external_ref);
CREATE INDEX orders_idempotency_key_idx ON orders (idempotency_key);
CREATE INDEX reservations_expires_at_idx ON reservations (expires_at) WHERE released_at IS NULL;
CREATE INDEX outbox_created_at_idx ON outbox (created_at) WHERE published_at IS NULL;
"""

# The truth the probes must find:
# - negative stock: SKU-NEG3 at -3, SKU-NEG1 at -1             -> 2 SKUs, 4 units
# - SKU-OVER: 3 + 4 paid units (a cancelled order's 2 do not count) over 5 -> oversold 2
# - SKU-OVER2: 4 paid units over 1                              -> oversold 3
# - SKU-OK: 5 paid of 20                                        -> not oversold
# - external_ref dup-1 twice and dup-2 three times in the window, old-dup twice two days
#   ago (outside the 1 h window), single once, two NULLs      -> 2 duplicated refs
# - idempotency key idem-1 twice                                -> 1 more when mapped
# - reservations: 3 expired and held, 2 expired and released, 1 held but not expired -> 3
# - outbox: pending rows 120 s and 30 s old, one published     -> 2 pending, lag 120 s
SEED = """
INSERT INTO products (id, sku, available_stock, initial_stock) VALUES
    (1, 'SKU-NEG3', -3, 10), (2, 'SKU-NEG1', -1, 10), (3, 'SKU-OVER', 0, 5),
    (4, 'SKU-OK', 15, 20), (5, 'SKU-OVER2', 0, 1);
INSERT INTO orders (id, status, external_ref, idempotency_key, created_at) VALUES
    (1, 'PAID', 'ref-a', NULL, now()),
    (2, 'COMPLETED', 'ref-b', NULL, now()),
    (3, 'CANCELLED', 'ref-c', NULL, now()),
    (4, 'PROCESSING', 'ref-d', NULL, now()),
    (5, 'PAID', 'ref-e', NULL, now()),
    (6, 'PAID', 'dup-1', 'idem-1', now()),
    (7, 'PAID', 'dup-1', 'idem-1', now()),
    (8, 'PAID', 'dup-2', NULL, now()),
    (9, 'PENDING', 'dup-2', NULL, now()),
    (10, 'CANCELLED', 'dup-2', NULL, now()),
    (11, 'PAID', 'single', NULL, now()),
    (12, 'PAID', 'old-dup', NULL, now() - interval '2 days'),
    (13, 'PAID', 'old-dup', NULL, now() - interval '2 days'),
    (14, 'PAID', NULL, NULL, now()),
    (15, 'PAID', NULL, NULL, now());
INSERT INTO order_items (order_id, product_id, quantity) VALUES
    (1, 3, 3), (2, 3, 4), (3, 3, 2), (4, 4, 5), (5, 5, 4);
INSERT INTO reservations (product_id, quantity, expires_at, released_at) VALUES
    (4, 1, now() - interval '1 minute', NULL),
    (4, 1, now() - interval '2 minutes', NULL),
    (4, 1, now() - interval '3 minutes', NULL),
    (4, 1, now() - interval '1 minute', now() - interval '30 seconds'),
    (4, 1, now() - interval '5 minutes', now()),
    (4, 1, now() + interval '5 minutes', NULL);
INSERT INTO outbox (created_at, published_at) VALUES
    (now() - interval '120 seconds', NULL),
    (now() - interval '30 seconds', NULL),
    (now() - interval '1 hour', now() - interval '59 minutes');
"""


async def seed(url: str, *, indexes: bool = True) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(SCHEMA)
        if indexes:
            await conn.execute(INDEXES)
        await conn.execute(SEED)


def make_config(
    url: str,
    probes: tuple[str, ...] = ALL_DB_PROBES,
    *,
    leader_election: bool = False,
    database: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
    promo_skus: tuple[str, ...] = ("SKU-OK",),
    environ: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
) -> ExporterConfig:
    """A config on ``url`` with only ``probes`` enabled, on 0.2 s intervals; ``settings``
    is laid over the probes' section."""
    probe_settings: dict[str, Any] = {"defaults": {"interval": "200ms", "timeout": "2s"}}
    for name in (*ALL_DB_PROBES, "cache_drift"):
        if name not in probes:
            probe_settings[name] = {"enabled": False}
    probe_settings.update(settings or {})
    db: dict[str, Any] = {
        "url": url,
        "leader_election": leader_election,
        "statement_timeout": "1s",
        "lock_timeout": "200ms",
        "connect_timeout": "2s",
        "leader_retry_interval": "200ms",
    }
    db.update(database or {})
    if "url_env" in db:
        del db["url"]
    document: dict[str, Any] = {
        "sku_guard": {"promo_skus": list(promo_skus)},
        "database": db,
        "schema": {
            "products": {"allocation": "initial_stock"},
            "reservations": {},
            "outbox": {},
            **(schema or {}),
        },
        "probes": probe_settings,
    }
    return parse_config(yaml.safe_dump(document), "test.yaml", environ=environ or {})


def mariadb() -> Any:
    """The MariaDB helpers (test_probes_mysql imports this module: imported when needed)."""
    import test_probes_mysql

    return test_probes_mysql


async def seed_db(db: Db, *, indexes: bool = True) -> None:
    if db.mysql:
        mariadb().seed(db.raw_url, indexes=indexes)
    else:
        await seed(db.raw_url, indexes=indexes)


def config_on(db: Db, probes: tuple[str, ...] = ALL_DB_PROBES, **options: Any) -> ExporterConfig:
    """:func:`make_config` of the database's test module."""
    return (mariadb().make_config if db.mysql else make_config)(db.raw_url, probes, **options)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def all_up(registry: CollectorRegistry, probes: tuple[str, ...]) -> Callable[[], bool]:
    return lambda: all(sample(registry, "stocksentry_probe_up", probe=p) == 1.0 for p in probes)


async def test_every_probe_reports_the_seeded_truth(db, registry):
    before_seed, before_seed_wall = time.monotonic(), time.time()
    await seed_db(db)
    config = config_on(db)
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(
            all_up(registry, ALL_DB_PROBES), timeout=WAIT, message="every probe up"
        )
        # Read once everything is up; one more round proves the figures are stable.
        await asyncio.sleep(0.3)
        assert sample(registry, "stock_inventory_negative_skus") == 2.0
        assert sample(registry, "stock_inventory_negative_units") == 4.0
        # Each SKU below zero by name, the promo SKU at 0; nothing left for __other__.
        per_sku = "stock_inventory_negative_sku_units"
        assert sample(registry, per_sku, sku="SKU-NEG3") == 3.0
        assert sample(registry, per_sku, sku="SKU-NEG1") == 1.0
        assert sample(registry, per_sku, sku="SKU-OK") == 0.0
        assert sample(registry, per_sku, sku="__other__") is None
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER") == 2.0
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER2") == 3.0
        # The promo SKU keeps its series at 0; the others are not oversold, so absent.
        assert sample(registry, "stock_oversold_units", sku="SKU-OK") == 0.0
        assert sample(registry, "stock_oversold_units", sku="SKU-NEG3") is None
        assert sample(registry, "stock_duplicate_order_keys") == 2.0
        assert sample(registry, "stock_db_lock_waiters") == 0.0
        assert sample(registry, "stock_db_lock_wait_max_seconds") == 0.0
        database = db.raw_url.rsplit("/", 1)[1]
        deadlocks = sample(registry, "stock_db_server_deadlock_total", database=database)
        if db.mysql:
            assert deadlocks is not None  # server-wide: other suites' deadlocks count too
            assert deadlocks >= 0.0
        else:
            assert deadlocks == 0.0
        assert sample(registry, "stock_db_long_transactions") == 0.0
        assert sample(registry, "stock_reservations_expired_unreleased") == 3.0
        assert sample(registry, "stock_outbox_pending_events") == 2.0
        # Beyond the default 30 s publish latency: the 120 s old row (the 30 s one has
        # aged past 30 s too by now, so one or both).
        assert sample(registry, "stock_outbox_stuck_events") in (1.0, 2.0)
        assert sample(registry, "stock_outbox_max_publish_latency_seconds") == 30.0
        lag = sample(registry, "stock_outbox_lag_seconds")
        assert lag is not None
        # The oldest pending row was 120 s old at seeding; it has aged since, by no more
        # than this test has run.
        assert 120.0 <= lag <= 120.0 + (time.monotonic() - before_seed) + 1.0
        assert sample(registry, "stocksentry_probe_leader") == 1.0
        assert runner.is_leader
        for probe in ALL_DB_PROBES:
            assert sample(registry, "stocksentry_probe_duration_seconds", probe=probe) < 2.0
            last = sample(
                registry, "stocksentry_probe_last_success_timestamp_seconds", probe=probe
            )
            assert last is not None
            assert before_seed_wall <= last <= time.time()
        await async_wait_until(
            lambda: runner.index_advice is not None, timeout=WAIT, message="the index check"
        )
        assert runner.index_advice == ()


async def test_oversold_skus_beyond_the_budget_fold_into_other(pg_database, registry):
    await seed(pg_database)
    # One SKU of budget beyond the promo SKU: the worst (SKU-OVER2, 3 units) keeps its
    # series, SKU-OVER's 2 units go to __other__.
    config = parse_config(
        yaml.safe_dump(
            {
                "sku_guard": {"promo_skus": ["SKU-OK"], "max_skus": 1},
                "database": {"url": pg_database, "leader_election": False},
                "schema": {"products": {"allocation": "initial_stock"}},
                "probes": {
                    "defaults": {"interval": "200ms"},
                    **{p: {"enabled": False} for p in ALL_DB_PROBES if p != "oversold"},
                },
            }
        )
    )
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, ("oversold",)), timeout=WAIT)
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER2") == 3.0
        assert sample(registry, "stock_oversold_units", sku="__other__") == 2.0
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER") is None
        assert sample(registry, "stock_oversold_units", sku="SKU-OK") == 0.0


async def test_negative_stock_names_the_worst_skus_and_sums_the_rest(pg_database, registry):
    await seed(pg_database)
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO products (id, sku, available_stock, initial_stock) VALUES"
            " (6, 'SKU-NEG38', -38, 50), (7, 'SKU-NEG2', -2, 10), (8, 'SKU-NEG1B', -1, 10)"
        )
    # Below zero: SKU-NEG38 -38, SKU-NEG3 -3, SKU-NEG2 -2, SKU-NEG1 -1, SKU-NEG1B -1.
    # The two worst by name, the other three's 4 units under __other__.
    document = {
        "sku_guard": {"promo_skus": ["SKU-OK"]},
        "database": {"url": pg_database, "leader_election": False},
        "schema": {"products": {"allocation": "initial_stock"}},
        "probes": {
            "defaults": {"interval": "200ms"},
            "negative_stock": {"top_skus": 2},
            **{p: {"enabled": False} for p in ALL_DB_PROBES if p != "negative_stock"},
        },
    }
    config = parse_config(yaml.safe_dump(document))
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, ("negative_stock",)), timeout=WAIT)
        per_sku = "stock_inventory_negative_sku_units"
        assert sample(registry, "stock_inventory_negative_skus") == 5.0
        assert sample(registry, "stock_inventory_negative_units") == 45.0
        assert sample(registry, per_sku, sku="SKU-NEG38") == 38.0
        assert sample(registry, per_sku, sku="SKU-NEG3") == 3.0
        assert sample(registry, per_sku, sku="__other__") == 4.0
        assert sample(registry, per_sku, sku="SKU-OK") == 0.0
        for sku in ("SKU-NEG2", "SKU-NEG1", "SKU-NEG1B"):
            assert sample(registry, per_sku, sku=sku) is None


async def test_duplicate_orders_name_the_skus_of_their_keys(pg_database, registry):
    await seed(pg_database)
    # dup-1's two orders hold SKU-OK; dup-2's orders hold SKU-OK and SKU-OVER; the
    # single order holds SKU-OVER2 (not a duplicate). idem-1 (dup-1's orders) counts once
    # more for SKU-OK when idempotency keys are mapped.
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO order_items (order_id, product_id, quantity) VALUES"
            " (6, 4, 1), (7, 4, 1), (8, 4, 1), (9, 3, 1), (11, 5, 1)"
        )
    config = make_config(
        pg_database,
        ("duplicate_orders",),
        schema={"orders": {"idempotency_key": "idempotency_key"}},
    )
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, ("duplicate_orders",)), timeout=WAIT)
        per_sku = "stock_duplicate_order_sku_keys"
        # dup-1 and dup-2 by external_ref, idem-1 by idempotency key.
        assert sample(registry, "stock_duplicate_order_keys") == 3.0
        assert sample(registry, per_sku, sku="SKU-OK") == 3.0
        assert sample(registry, per_sku, sku="SKU-OVER") == 1.0
        assert sample(registry, per_sku, sku="SKU-OVER2") is None
        assert sample(registry, per_sku, sku="__other__") is None


async def test_outbox_names_its_stuck_events_in_one_line_per_transition(
    pg_database, registry, caplog
):
    await seed(pg_database)
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")
    document = {
        "database": {"url": pg_database, "leader_election": False},
        "schema": {"outbox": {"id": "id"}},
        "probes": {
            "defaults": {"interval": "100ms"},
            "outbox": {"max_publish_latency": "1m"},
            **{p: {"enabled": False} for p in ALL_DB_PROBES if p != "outbox"},
        },
    }
    config = parse_config(yaml.safe_dump(document))

    def lines(word: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith(word)]

    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, ("outbox",)), timeout=WAIT)
        # Only the 120 s old row is beyond the minute.
        assert sample(registry, "stock_outbox_stuck_events") == 1.0
        assert sample(registry, "stock_outbox_max_publish_latency_seconds") == 60.0
        await async_wait_until(lambda: lines("outbox stuck"), timeout=WAIT)
        # Many runs (every 100 ms) while it stays stuck: still the one line of the
        # transition, the next one is due a minute later.
        await asyncio.sleep(1.0)
        stuck = lines("outbox stuck")
        assert len(stuck) == 1, stuck
        assert stuck[0].startswith(
            "outbox stuck: 1 event(s) unpublished beyond 1m; the oldest, id 1,"
        )
        assert stuck[0].endswith(" old")
        record = next(r for r in caplog.records if r.getMessage() == stuck[0])
        assert record.levelno == logging.WARNING
        assert getattr(record, "stuck_events", None) == 1
        assert getattr(record, "oldest_event_id", None) == "1"
        async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as conn:
            await conn.execute("UPDATE outbox SET published_at = now()")
        await async_wait_until(lambda: lines("outbox recovered"), timeout=WAIT)
        # The probe says the line during its run; the runner stores the run's figures
        # after it: the gauge follows within the run, not with the line.
        await async_wait_until(
            lambda: sample(registry, "stock_outbox_stuck_events") == 0.0, timeout=WAIT
        )
        assert len(lines("outbox recovered")) == 1


async def test_custom_probe_exports_the_rows_as_a_gauge(db, registry):
    await seed_db(db)
    document = {
        "database": {"url": db.raw_url, "leader_election": False},
        "probes": {
            "defaults": {"interval": "200ms"},
            **{p: {"enabled": False} for p in ALL_DB_PROBES},
            "custom": [
                {
                    "name": "negative_by_sku",
                    # A % stays as written (no parameters are sent with custom SQL).
                    "sql": "SELECT sku, available_stock AS stock FROM products "
                    "WHERE available_stock < 0 AND sku LIKE 'SKU-%' -- a trailing comment;",
                    "metric": "shop_negative_stock",
                    "help": "Stock per SKU below zero.",
                    "value_column": "stock",
                    "label_columns": ["sku"],
                }
            ],
        },
    }
    config = parse_config(yaml.safe_dump(document))
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, ("negative_by_sku",)), timeout=WAIT)
        assert sample(registry, "shop_negative_stock", sku="SKU-NEG3") == -3.0
        assert sample(registry, "shop_negative_stock", sku="SKU-NEG1") == -1.0
        assert sample(registry, "shop_negative_stock", sku="SKU-OK") is None


async def test_custom_sql_cannot_write(db, registry):
    # On PostgreSQL a data-modifying CTE, on MariaDB a locking read: both refused by the
    # read-only transaction. More statements smuggled in are refused by the config
    # (test_config.py), and on PostgreSQL by the extended protocol too.
    statement = (
        "SELECT count(*) AS value FROM order_items WHERE 0 = (SELECT count(*)"
        " FROM products FOR UPDATE)"
        if db.mysql
        else "WITH gone AS (DELETE FROM order_items RETURNING 1)"
        " SELECT count(*) AS value FROM gone"
    )
    await seed_db(db)
    document = {
        "database": {"url": db.raw_url, "leader_election": False},
        "probes": {
            "defaults": {"interval": "200ms"},
            **{p: {"enabled": False} for p in ALL_DB_PROBES},
            "custom": [{"name": "sneaky", "sql": statement, "metric": "shop_sneaky"}],
        },
    }
    async with ProbeRunner(parse_config(yaml.safe_dump(document)), registry=registry) as runner:
        await async_wait_until(lambda: "sneaky" in runner.results, timeout=WAIT, message="one run")
        assert sample(registry, "stocksentry_probe_up", probe="sneaky") == 0.0
        assert sample(registry, "shop_sneaky") is None
        if db.mysql:
            assert "(1792," in (runner.results["sneaky"].error or "")
    conn = plain(db)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM order_items")
            assert tuple(cur.fetchone()) == (5,)
    finally:
        conn.close()


async def try_advisory_lock(url: str, key: int) -> bool:
    """Whether another session can take the advisory lock ``key`` (released at once)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", [key])
        row = await cursor.fetchone()
        return bool(row and row[0])


async def test_custom_sql_leaves_no_lock_behind(db, registry):
    await seed_db(db)
    key = random.randint(1, 2**62)
    name = f"stocksentry-test-{key}"
    sql = (
        f"SELECT GET_LOCK('{name}', 0) AS value"
        if db.mysql
        else f"SELECT 1 AS value FROM (SELECT pg_advisory_lock({key})) AS x"
    )
    document = {
        "database": {"url": db.raw_url, "leader_election": False},
        "probes": {
            # One run only, so none is in flight while the lock is checked.
            "defaults": {"interval": "1h"},
            **{p: {"enabled": False} for p in ALL_DB_PROBES},
            "custom": [{"name": "locker", "sql": sql, "metric": "shop_locker"}],
        },
    }
    async with ProbeRunner(parse_config(yaml.safe_dump(document)), registry=registry):
        await async_wait_until(all_up(registry, ("locker",)), timeout=WAIT, message="one run")
        assert sample(registry, "shop_locker") == 1.0
        # The pooled session is still open, but no longer holds the lock.
        if db.mysql:
            assert mariadb().lock_is_free(db.raw_url, name)
        else:
            assert await try_advisory_lock(db.raw_url, key)


# (probe, table, the column on PostgreSQL, on MariaDB: None where MariaDB's foreign keys
# already index order_items).
INDEX_ADVICE = [
    ("negative_stock", "products", "available_stock", "available_stock"),
    ("oversold", "order_items", "product_id", None),
    ("oversold", "orders", "created_at", "created_at"),
    ("oversold", "order_items", "order_id", None),
    ("duplicate_orders", "orders", "external_ref", "external_ref"),
    ("expired_reservations", "reservations", "expires_at", "released_at"),
    ("outbox", "outbox", "created_at", "published_at"),
]
# The first statement, and (index, what it holds) of later ones.
MY_INDEX_STATEMENTS = (
    "ALTER TABLE `products` ADD INDEX `products_available_stock_idx` (`available_stock`),"
    " ALGORITHM=INPLACE, LOCK=NONE;",
    [(3, "(`released_at`, `expires_at`)"), (4, "(`published_at`, `created_at`)")],
)
PG_INDEX_STATEMENTS = (
    'CREATE INDEX CONCURRENTLY IF NOT EXISTS "products_available_stock_partial_idx" '
    'ON "products" ("available_stock") WHERE "available_stock" < 0;',
    [(5, 'WHERE "released_at" IS NULL;')],
)


async def test_missing_indexes_are_reported_with_the_statement_to_add(db, registry, caplog):
    await seed_db(db, indexes=False)
    config = config_on(db, schema=None if db.mysql else {"orders": {"idempotency_key": None}})
    pool = Pool(config.database)  # type: ignore[arg-type]
    try:
        advice = await check_indexes(pool, config)
    finally:
        await pool.close()
    columns = [(p, t, my if db.mysql else pg) for p, t, pg, my in INDEX_ADVICE]
    assert [(a.probe, a.table, a.column) for a in advice] == [c for c in columns if c[2]]
    first, later = MY_INDEX_STATEMENTS if db.mysql else PG_INDEX_STATEMENTS
    assert advice[0].statement == first
    for at, part in later:
        assert part in advice[at].statement
    if not db.mysql:
        assert advice[5].statement.endswith(later[0][1])
    # The statements are valid SQL that create the very indexes asked for.
    if db.mysql:
        mariadb().run_sql(db.raw_url, [item.statement.rstrip(";") for item in advice])
    else:
        async with await psycopg.AsyncConnection.connect(db.raw_url, autocommit=True) as conn:
            for item in advice:
                await conn.execute(item.statement)
    caplog.set_level(logging.WARNING, logger="stocksentry.exporter.probes")
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(
            lambda: runner.index_advice is not None, timeout=WAIT, message="the index check"
        )
        assert runner.index_advice == ()
    assert "no index" not in caplog.text


async def test_the_runner_logs_each_missing_index(pg_database, registry, caplog):
    await seed(pg_database, indexes=False)
    caplog.set_level(logging.WARNING, logger="stocksentry.exporter.probes")
    config = make_config(pg_database, ("negative_stock", "duplicate_orders"))
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(
            lambda: runner.index_advice is not None, timeout=WAIT, message="the index check"
        )
        assert runner.index_advice is not None
        assert [(a.probe, a.table, a.column) for a in runner.index_advice] == [
            ("negative_stock", "products", "available_stock"),
            ("duplicate_orders", "orders", "created_at"),
            ("duplicate_orders", "orders", "external_ref"),
        ]
    lines = [r.getMessage() for r in caplog.records if "no index" in r.getMessage()]
    assert len(lines) == 3
    assert "CREATE INDEX CONCURRENTLY" in lines[0]
    assert "products" in lines[0]
    assert "orders" in lines[1]


def plain(db: Db, *, autocommit: bool = True) -> Any:
    """A plain DB-API session on the test database (psycopg or PyMySQL); without
    autocommit, in a transaction."""
    if not db.mysql:
        return psycopg.connect(db.raw_url, autocommit=autocommit)
    conn = mariadb().connect(db.raw_url, autocommit=autocommit)
    if not autocommit:
        conn.begin()
    return conn


def run(conn: Any, sql: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql)
        if cur.description:
            cur.fetchall()


async def test_lock_waiters_and_the_longest_wait(db, registry):
    await seed_db(db)
    holder = plain(db, autocommit=False)
    waiter = plain(db)
    update = "UPDATE products SET available_stock = available_stock WHERE id = 1"
    try:
        if db.mysql:
            for conn in (holder, waiter):
                run(conn, "SET SESSION innodb_lock_wait_timeout = 30")
        run(holder, update)  # holds the row lock in an open transaction
        waiting = asyncio.create_task(asyncio.to_thread(run, waiter, update))
        config = config_on(db, ("lock_waiters",))
        async with ProbeRunner(config, registry=registry):
            await async_wait_until(
                lambda: sample(registry, "stock_db_lock_waiters") == 1.0,
                timeout=WAIT,
                message="one waiter",
            )
            await async_wait_until(
                lambda: (sample(registry, "stock_db_lock_wait_max_seconds") or 0.0) > 0.2,
                timeout=WAIT,
                message="a growing wait",
            )
            holder.rollback()
            await waiting
            await async_wait_until(
                lambda: sample(registry, "stock_db_lock_waiters") == 0.0,
                timeout=WAIT,
                message="no waiter",
            )
            assert sample(registry, "stock_db_lock_wait_max_seconds") == 0.0
    finally:
        holder.close()
        waiter.close()


async def test_deadlocks_come_from_pg_stat_database(pg_database, registry):
    await seed(pg_database)
    first = await psycopg.AsyncConnection.connect(pg_database)
    second = await psycopg.AsyncConnection.connect(pg_database)
    for conn in (first, second):
        await conn.execute("SET deadlock_timeout = '50ms'")
        await conn.commit()
    await first.execute("UPDATE products SET initial_stock = initial_stock WHERE id = 1")
    await second.execute("UPDATE products SET initial_stock = initial_stock WHERE id = 2")
    crossing = asyncio.create_task(
        first.execute("UPDATE products SET initial_stock = initial_stock WHERE id = 2")
    )
    await asyncio.sleep(0.1)
    outcomes = await asyncio.gather(
        crossing,
        second.execute("UPDATE products SET initial_stock = initial_stock WHERE id = 1"),
        return_exceptions=True,
    )
    assert sum(isinstance(o, psycopg.errors.DeadlockDetected) for o in outcomes) == 1
    # Closing the sessions flushes their statistics.
    await first.close()
    await second.close()
    database = pg_database.rsplit("/", 1)[1]
    config = make_config(pg_database, ("deadlocks",))
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(
            lambda: sample(registry, "stock_db_server_deadlock_total", database=database) == 1.0,
            timeout=WAIT,
            message="one deadlock",
        )


async def test_long_transactions_on_stock_tables(db, registry):
    await seed_db(db)
    on_stock = plain(db, autocommit=False)
    elsewhere = plain(db, autocommit=False)
    try:
        run(on_stock, "SELECT available_stock FROM products WHERE id = 1")
        # Open too, but touches no stock table (MariaDB: no InnoDB table).
        run(elsewhere, "SELECT 1")
        config = parse_config(
            yaml.safe_dump(
                {
                    "database": {"url": db.raw_url, "leader_election": False},
                    "probes": {
                        "defaults": {"interval": "200ms"},
                        **{p: {"enabled": False} for p in ALL_DB_PROBES},
                        "long_transactions": {"threshold": "300ms"},
                    },
                }
            )
        )
        async with ProbeRunner(config, registry=registry):
            await async_wait_until(
                lambda: sample(registry, "stock_db_long_transactions") == 1.0,
                timeout=WAIT,
                message="one long transaction",
            )
            oldest = sample(registry, "stock_db_long_transaction_max_seconds")
            assert oldest is not None
            assert oldest >= 0.3
            on_stock.rollback()
            await async_wait_until(
                lambda: sample(registry, "stock_db_long_transactions") == 0.0,
                timeout=WAIT,
                message="none after rollback",
            )
    finally:
        on_stock.close()
        elsewhere.close()


async def test_a_locked_table_times_out_the_probe_then_it_recovers(db, registry):
    await seed_db(db)
    # On MariaDB a statement limit above the lock wait's whole second, so the lock wait
    # ends it.
    config = config_on(
        db,
        ("negative_stock", "lock_waiters"),
        database={"statement_timeout": "1500ms"} if db.mysql else None,
    )
    if db.mysql:
        locker: Any = mariadb().connect(db.raw_url)
    else:
        locker = await psycopg.AsyncConnection.connect(db.raw_url)
    try:
        async with ProbeRunner(config, registry=registry) as runner:
            await async_wait_until(all_up(registry, ("negative_stock",)), timeout=WAIT)
            if db.mysql:
                mariadb().execute(locker, "LOCK TABLES products WRITE")
            else:
                await locker.execute("LOCK TABLE products IN ACCESS EXCLUSIVE MODE")
            await async_wait_until(
                lambda: sample(registry, "stocksentry_probe_up", probe="negative_stock") == 0.0,
                timeout=WAIT,
                message="negative_stock down",
            )
            result = runner.results["negative_stock"]
            assert result.error is not None
            if db.mysql:
                # lock_wait_timeout (200 ms rounded up to the server's 1 s) ended the wait.
                assert "1205" in result.error
                assert "Lock wait timeout" in result.error
            else:
                # lock_timeout (200 ms) ended the wait (the error says so).
                assert "LockNotAvailable" in result.error
                assert "55P03" in result.error
            # Within the probe's own timeout.
            (probe,) = [p for p in runner.probes if p.name == "negative_stock"]
            assert result.duration < probe.timeout
            # Nothing stale: the figures are gone while the probe is down ...
            assert sample(registry, "stock_inventory_negative_skus") is None
            # ... the other probe is not hidden, and a scrape does no I/O: while the table
            # is still locked it answers at once with the stored results (the failed run's
            # own duration, not a new run's).
            assert sample(registry, "stocksentry_probe_up", probe="lock_waiters") == 1.0
            started = time.monotonic()
            scraped = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(generate_latest(registry).decode())
                for s in family.samples
            }
            assert time.monotonic() - started < probe.timeout
            key = (("probe", "negative_stock"),)
            assert scraped[("stocksentry_probe_up", key)] == 0.0
            assert scraped[("stocksentry_probe_duration_seconds", key)] == result.duration
            assert ("stock_inventory_negative_skus", ()) not in scraped
            if db.mysql:
                mariadb().execute(locker, "UNLOCK TABLES")
            else:
                await locker.rollback()
            await async_wait_until(
                lambda: sample(registry, "stocksentry_probe_up", probe="negative_stock") == 1.0,
                timeout=WAIT,
                message="negative_stock back up",
            )
            assert sample(registry, "stock_inventory_negative_skus") == 2.0
    finally:
        if db.mysql:
            locker.close()
        else:
            await locker.close()


@pytest.mark.parametrize("scheme", ["postgresql", "mysql"])
async def test_an_unreachable_database_is_reported_down_without_the_password(
    scheme, registry, caplog
):
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")
    # Port 1: nothing listens there, the connection is refused at once.
    config = (mariadb().make_config if scheme == "mysql" else make_config)(
        f"{scheme}://root@127.0.0.1:1/shop",
        ("negative_stock", "deadlocks"),
        database={"url_env": "STOCKSENTRY_DATABASE_URL"},
        environ={"STOCKSENTRY_DATABASE_URL": f"{scheme}://app:s3cr3t-pw@127.0.0.1:1/shop"},
    )
    runner = ProbeRunner(config, registry=registry)
    await runner.start()
    try:
        await async_wait_until(
            lambda: (
                sample(registry, "stocksentry_probe_up", probe="negative_stock") == 0.0
                and sample(registry, "stocksentry_probe_up", probe="deadlocks") == 0.0
            ),
            timeout=WAIT,
            message="both probes down",
        )
        assert sample(registry, "stock_inventory_negative_skus") is None
        assert sample(registry, "stocksentry_probe_last_success_timestamp_seconds",
                      probe="negative_stock") is None  # fmt: skip
        started = time.monotonic()
        scraped = mariadb().scrape(registry)
        assert time.monotonic() - started < 1.0
        assert scraped[("stocksentry_probe_up", (("probe", "negative_stock"),))] == 0.0
        # Keep failing for a while: no exception escapes, the loops keep going.
        await asyncio.sleep(0.5)
        assert runner.results["negative_stock"].up is False
        if scheme == "mysql":
            assert "2003" in (runner.results["negative_stock"].error or "")
    finally:
        await runner.stop()
    assert "s3cr3t-pw" not in caplog.text
    assert "failed" in caplog.text
    assert "probe negative_stock failed" in caplog.text
    assert all("s3cr3t-pw" not in (r.error or "") for r in runner.results.values())


async def test_an_unreachable_database_with_election_reports_the_election_down(registry):
    config = make_config(
        "postgresql://postgres@127.0.0.1:1/postgres", ("negative_stock",), leader_election=True
    )
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(
            lambda: sample(registry, "stocksentry_probe_up", probe="leader_election") == 0.0,
            timeout=WAIT,
            message="election down",
        )
        assert sample(registry, "stocksentry_probe_leader") == 0.0
        assert sample(registry, "stocksentry_probe_up", probe="negative_stock") is None
        assert not runner.is_leader


async def test_one_leader_runs_the_database_probes_and_the_other_takes_over(db):
    await seed_db(db)
    key = random.randint(1, 2**62)
    config = config_on(
        db,
        ("negative_stock",),
        leader_election=True,
        database={"advisory_lock_key": key},
    )
    first_registry, second_registry = CollectorRegistry(), CollectorRegistry()
    first = ProbeRunner(config, registry=first_registry)
    second = ProbeRunner(config, registry=second_registry)
    await first.start()
    try:
        await async_wait_until(
            all_up(first_registry, ("negative_stock",)), timeout=WAIT, message="first leads"
        )
        await second.start()
        await async_wait_until(
            lambda: (
                sample(second_registry, "stocksentry_probe_up", probe="leader_election") == 1.0
            ),
            timeout=WAIT,
            message="second in the election",
        )
        await asyncio.sleep(0.6)  # three retries of the follower
        assert (first.is_leader, second.is_leader) == (True, False)
        assert sample(first_registry, "stocksentry_probe_leader") == 1.0
        assert sample(second_registry, "stocksentry_probe_leader") == 0.0
        assert sample(second_registry, "stocksentry_probe_up", probe="negative_stock") is None
        assert sample(second_registry, "stock_inventory_negative_skus") is None

        await first.stop()
        await async_wait_until(
            lambda: (
                second.is_leader
                and sample(second_registry, "stocksentry_probe_up", probe="negative_stock") == 1.0
            ),
            timeout=WAIT,
            message="second takes over",
        )
        assert sample(second_registry, "stock_inventory_negative_skus") == 2.0
        assert sample(second_registry, "stocksentry_probe_leader") == 1.0
    finally:
        await first.stop()
        await second.stop()


# Runs a ProbeRunner in its own process (so that it can be frozen with SIGSTOP) and says
# "leading" once it leads.
LEADER_SCRIPT = """
import asyncio, sys
from stocksentry.exporter.config import load_config
from stocksentry.exporter.probes import ProbeRunner

async def main():
    async with ProbeRunner(load_config(sys.argv[1])) as runner:
        while not runner.is_leader:
            await asyncio.sleep(0.05)
        print("leading", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_frozen_leader_loses_the_lock_to_a_follower(pg_database, tmp_path):
    await seed(pg_database)
    document = {
        "database": {
            "url": pg_database,
            "advisory_lock_key": random.randint(1, 2**62),
            "leader_retry_interval": "500ms",
            "statement_timeout": "1s",
            "connect_timeout": "2s",
        },
        "probes": {
            "defaults": {"interval": "200ms"},
            **{p: {"enabled": False} for p in ALL_DB_PROBES if p != "negative_stock"},
        },
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document))
    leader = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LEADER_SCRIPT, str(path), stdout=asyncio.subprocess.PIPE
    )
    follower_registry = CollectorRegistry()
    follower = ProbeRunner(parse_config(path.read_text()), registry=follower_registry)
    try:
        assert leader.stdout is not None
        line = await asyncio.wait_for(leader.stdout.readline(), timeout=WAIT)
        assert line == b"leading\n"
        await follower.start()
        await async_wait_until(
            lambda: (
                sample(follower_registry, "stocksentry_probe_up", probe="leader_election") == 1.0
            ),
            timeout=WAIT,
            message="follower in the election",
        )
        assert not follower.is_leader

        # Frozen: its sessions stay open (the kernel still answers TCP), nothing is sent.
        leader.send_signal(signal.SIGSTOP)
        # The server ends the silent session after 3 x 500 ms; the next try takes over.
        await async_wait_until(
            lambda: follower.is_leader, timeout=WAIT, message="follower takes over"
        )
        await async_wait_until(
            all_up(follower_registry, ("negative_stock",)), timeout=WAIT, message="probes run"
        )
    finally:
        await follower.stop()
        with contextlib.suppress(ProcessLookupError):
            leader.send_signal(signal.SIGCONT)
            leader.kill()
        await leader.wait()


async def test_a_leader_stops_its_probes_before_its_session_goes(pg_database):
    key = random.randint(1, 2**62)
    config = make_config(pg_database, leader_election=True, database={"advisory_lock_key": key})
    assert config.database is not None
    taken_while_deposing: list[bool] = []

    async def on_elected() -> None:
        pass

    async def on_deposed() -> None:
        # The probes stop here; until this returns, no other sidecar may lead.
        for _ in range(10):
            taken_while_deposing.append(await try_advisory_lock(pg_database, key))
            await asyncio.sleep(0.05)

    def on_result(result: ProbeResult) -> None:
        pass

    election = LeaderElection(
        config.database,
        on_elected=on_elected,
        on_deposed=on_deposed,
        on_result=on_result,
        errors=ErrorLog(logging.getLogger("test-election")),
    )
    try:
        await election.step()
        assert election.leading
        # The next ping does not answer in time (as behind a slow network), while the
        # session is still alive and holds the lock.
        election.timeout = 0.0
        await election.step()
        assert not election.leading
        assert taken_while_deposing == [False] * 10
        # Once deposed, the session is closed and the lock free (as soon as the server
        # has ended the session).
        await async_wait_until(
            lambda: try_advisory_lock(pg_database, key), timeout=WAIT, message="the lock is free"
        )
    finally:
        await election.close()


async def db_sessions(db: Db) -> set[int]:
    """The exporter's sessions of the test's own database."""
    if db.mysql:
        return set(mariadb().exporter_sessions(db.raw_url))
    return await exporter_sessions(db.raw_url)


async def exporter_sessions(url: str) -> set[int]:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'stocksentry-exporter'"
        )
        return {pid for (pid,) in await cursor.fetchall()}


async def test_probes_reconnect_after_their_sessions_are_killed(pg_database, registry):
    await seed(pg_database)
    config = make_config(pg_database, ("negative_stock",), leader_election=True)
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(all_up(registry, ("negative_stock",)), timeout=WAIT)
        before = await exporter_sessions(pg_database)
        # The election's session and the pool's (one per concurrent probe run; the index
        # check at the start may have needed a second one).
        assert 2 <= len(before) <= 1 + config.database.max_connections
        async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY(%s)",
                [list(before)],
            )

        # Back by themselves: new sessions, leading again, the probe up with its figures.
        async def reconnected() -> tuple[set[int], bool, float | None]:
            return (
                await exporter_sessions(pg_database),
                runner.is_leader,
                sample(registry, "stocksentry_probe_up", probe="negative_stock"),
            )

        await async_wait_until(
            reconnected,
            accept=lambda s: len(s[0]) >= 2 and not s[0] & before and s[1] and s[2] == 1.0,
            timeout=WAIT,
            interval=0.1,
            message="reconnected (sessions, leading, probe up)",
        )
        assert sample(registry, "stock_inventory_negative_skus") == 2.0


async def test_cache_drift_counts_skus_that_stay_apart_beyond_the_grace(
    db, registry, redis_prefix
):
    await seed_db(db)
    client = aioredis.Redis.from_url(REDIS_URL)
    key = f"{redis_prefix}stock:{{sku}}"
    try:
        # SKU-OK: database 15. SKU-OVER: 0, SKU-NEG1: -1, SKU-NEG3: -3 (no key).
        await client.set(f"{redis_prefix}stock:SKU-OK", "15")  # equal
        await client.set(f"{redis_prefix}stock:SKU-OVER", "3")  # 3 apart: drifts
        await client.set(f"{redis_prefix}stock:SKU-NEG1", "0")  # 1 apart: within tolerance
        config = parse_config(
            yaml.safe_dump(
                {
                    "sku_guard": {"promo_skus": ["SKU-OK", "SKU-OVER", "SKU-NEG1", "SKU-NEG3"]},
                    "database": {"url": db.raw_url, "leader_election": False},
                    "redis": {
                        "url": REDIS_URL,
                        "key_template": key,
                        "tolerance": 1,
                        "grace": "500ms",
                    },
                    "probes": {
                        "defaults": {"interval": "100ms"},
                        **{p: {"enabled": False} for p in ALL_DB_PROBES},
                    },
                }
            )
        )
        async with ProbeRunner(config, registry=registry):
            await async_wait_until(all_up(registry, ("cache_drift",)), timeout=WAIT)
            # Within the grace the difference does not count yet.
            assert sample(registry, "stock_cache_drift_skus", cache="redis") == 0.0
            await async_wait_until(
                lambda: sample(registry, "stock_cache_drift_skus", cache="redis") == 1.0,
                timeout=WAIT,
                message="one drifting SKU after the grace",
            )
            # Named by its own series, 3 units apart; the others at 0, nothing left over.
            per_sku = "stock_cache_drift_sku_units"
            assert sample(registry, per_sku, cache="redis", sku="SKU-OVER") == 3.0
            for sku in ("SKU-OK", "SKU-NEG1", "SKU-NEG3"):
                assert sample(registry, per_sku, cache="redis", sku=sku) == 0.0
            assert sample(registry, per_sku, cache="redis", sku="__other__") is None
            # A value that is not a number drifts too; a fixed value stops drifting.
            await client.set(f"{redis_prefix}stock:SKU-OK", "lots")
            await client.set(f"{redis_prefix}stock:SKU-OVER", "0")
            await async_wait_until(
                lambda: sample(registry, "stock_cache_drift_skus", cache="redis") == 0.0,
                timeout=WAIT,
                message="the fixed SKU no longer drifts, the garbled one within its grace",
            )
            assert sample(registry, per_sku, cache="redis", sku="SKU-OVER") == 0.0
            await async_wait_until(
                lambda: sample(registry, "stock_cache_drift_skus", cache="redis") == 1.0,
                timeout=WAIT,
                message="the garbled SKU after the grace",
            )
    finally:
        await client.aclose()


async def test_cache_drift_names_the_skus_drifting_the_most(pg_database, registry, redis_prefix):
    await seed(pg_database)
    client = aioredis.Redis.from_url(REDIS_URL)
    per_sku = "stock_cache_drift_sku_units"
    skus = ("SKU-OK", "SKU-OVER", "SKU-NEG3", "SKU-NEG1")

    def units() -> dict[str, float | None]:
        names = (*skus, "__other__")
        return {sku: sample(registry, per_sku, cache="redis", sku=sku) for sku in names}

    async def units_once(sku: str, value: float, message: str) -> dict[str, float | None]:
        """The figures once ``sku``'s is ``value``."""
        await async_wait_until(
            units, accept=lambda u: u[sku] == value, timeout=WAIT, message=message
        )
        return units()

    try:
        # Database: SKU-OK 15, SKU-OVER 0, SKU-NEG3 -3, SKU-NEG1 -1.
        await client.set(f"{redis_prefix}stock:SKU-OK", "15")  # in step
        await client.set(f"{redis_prefix}stock:SKU-OVER", "3")  # 3 apart
        await client.set(f"{redis_prefix}stock:SKU-NEG3", "7")  # 10 apart
        await client.set(f"{redis_prefix}stock:SKU-NEG1", "lots")  # not a number
        config = parse_config(
            yaml.safe_dump(
                {
                    "sku_guard": {"promo_skus": list(skus)},
                    "database": {"url": pg_database, "leader_election": False},
                    "redis": {
                        "url": REDIS_URL,
                        "key_template": f"{redis_prefix}stock:{{sku}}",
                        "grace": "500ms",
                    },
                    "probes": {
                        "defaults": {"interval": "100ms"},
                        "cache_drift": {"top_skus": 2},
                        **{p: {"enabled": False} for p in ALL_DB_PROBES},
                    },
                }
            )
        )
        async with ProbeRunner(config, registry=registry):
            await async_wait_until(all_up(registry, ("cache_drift",)), timeout=WAIT)
            # Within the grace: every compared SKU has its series, at 0.
            assert units() == dict.fromkeys(skus, 0.0) | {"__other__": None}
            # The two worst by name (the unreadable value first), SKU-OVER's 3 units
            # under __other__ while its own series stays at 0.
            named = await units_once("SKU-NEG3", 10.0, "the drifting SKUs named after the grace")
            assert named == (
                dict.fromkeys(skus, 0.0) | {"SKU-NEG3": 10.0, "SKU-NEG1": INF, "__other__": 3.0}
            )
            assert sample(registry, "stock_cache_drift_skus", cache="redis") == 3.0
            await client.set(f"{redis_prefix}stock:SKU-NEG3", "-3")
            await client.set(f"{redis_prefix}stock:SKU-NEG1", "-1")
            # SKU-OVER is now among the two worst: named, nothing left for __other__.
            assert await units_once("SKU-NEG1", 0.0, "the fixed SKUs back at 0") == (
                dict.fromkeys(skus, 0.0) | {"SKU-OVER": 3.0, "__other__": None}
            )
    finally:
        await client.aclose()


async def test_cache_drift_is_down_while_redis_is_unreachable(pg_database, registry):
    await seed(pg_database)
    config = parse_config(
        yaml.safe_dump(
            {
                "sku_guard": {"promo_skus": ["SKU-OK"]},
                "database": {"url": pg_database, "leader_election": False},
                "redis": {"url": "redis://127.0.0.1:1/0"},
                "probes": {
                    "defaults": {"interval": "100ms", "timeout": "1s"},
                    **{p: {"enabled": False} for p in ALL_DB_PROBES if p != "negative_stock"},
                },
            }
        )
    )
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(
            lambda: (
                sample(registry, "stocksentry_probe_up", probe="cache_drift") == 0.0
                and sample(registry, "stocksentry_probe_up", probe="negative_stock") == 1.0
            ),
            timeout=WAIT,
            message="cache drift down, the database probe unaffected",
        )
        assert sample(registry, "stock_cache_drift_skus", cache="redis") is None


async def test_the_probe_timeout_stops_a_slow_query_in_the_server(db, registry):
    document = {
        "database": {
            "url": db.raw_url,
            "leader_election": False,
            "statement_timeout": "10s",
            "lock_timeout": "10s",
        },
        "probes": {
            **{p: {"enabled": False} for p in ALL_DB_PROBES},
            "custom": [
                {
                    "name": "slow",
                    "sql": "SELECT SLEEP(3) AS value"
                    if db.mysql
                    else "SELECT 1 AS value FROM pg_sleep(3)",
                    "metric": "shop_slow",
                    "interval": "300ms",  # a timeout may not outlast its interval
                    "timeout": "300ms",
                }
            ],
        },
    }
    async with ProbeRunner(parse_config(yaml.safe_dump(document)), registry=registry) as runner:
        await async_wait_until(lambda: "slow" in runner.results, timeout=WAIT, message="one run")
        result = runner.results["slow"]
        assert (result.up, result.error) == (
            False,
            "timed out after 300ms waiting for the database's reply",
        )
        # Ended by the 300 ms timeout (the error says so), not by the query's own 3 s.
        assert result.duration < 3.0
        if db.mysql:
            # Killed in the server, not left sleeping behind the exporter: the runner
            # retries every 200 ms, so one may be in flight (and one being killed); never
            # a pile of them.
            for _ in range(10):  # watched for a second or more
                (active,) = mariadb().run_rows_text(
                    db.raw_url, SLEEPING + " AND command = 'Query'"
                )[0]
                assert active <= 2
                await asyncio.sleep(0.1)
        else:
            # Cancelled in the server, not left running behind the exporter.
            async with await psycopg.AsyncConnection.connect(db.raw_url, autocommit=True) as conn:
                for _ in range(10):  # watched for a second or more
                    cursor = await conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND query LIKE '%%pg_sleep(3)%%' AND state = 'active'"
                        " AND pid <> pg_backend_pid()"
                    )
                    (active,) = await cursor.fetchone() or (None,)
                    # The runner retries every 200 ms, so one may be in flight, and the one
                    # abandoned at its timeout may still be being cancelled from the side
                    # session (more so on a loaded machine); never a pile.
                    assert active is not None
                    assert active <= 2
                    await asyncio.sleep(0.1)
    if db.mysql:
        # Once the exporter stopped, nothing of it sleeps on.
        await async_wait_until(
            lambda: mariadb().run_rows_text(db.raw_url, SLEEPING)[0][0] == 0,
            timeout=2.5,
            message="no query left sleeping",
        )


#: MariaDB's sessions running the slow custom query (not this one).
SLEEPING = (
    "SELECT count(*) FROM information_schema.processlist"
    " WHERE info LIKE '%SLEEP(3)%' AND info NOT LIKE '%processlist%'"
)


async def test_stop_leaves_no_session_behind(db, registry):
    await seed_db(db)
    config = config_on(db, ALL_DB_PROBES, leader_election=True)
    runner = ProbeRunner(config, registry=registry)
    await runner.start()
    await async_wait_until(all_up(registry, ALL_DB_PROBES), timeout=WAIT)
    sessions = await db_sessions(db)
    # The election's and the pool's (at most max_connections).
    assert 2 <= len(sessions) <= 1 + config.database.max_connections  # type: ignore[union-attr]
    await runner.stop()
    await runner.stop()  # idempotent
    await async_wait_until(
        lambda: db_sessions(db),
        accept=lambda sessions: not sessions,
        timeout=WAIT,
        message="no session left open",
    )
    assert not runner.is_leader


# --- the pieces that need no service: error logs and backoff --------------------------------


async def test_a_custom_probe_s_sql_error_quotes_the_sql_as_written(db, registry):
    """The probe runs the SQL inside ``SELECT * FROM (…) AS stocksentry_custom``; the error
    the operator reads quotes their SQL, not that wrapper. PostgreSQL's interval literal
    is the error MariaDB gives a config written for PostgreSQL."""
    sql = (
        "SELECT count(*) AS value FROM orders\n"
        "WHERE created_at >= now() - interval '5 minutes' minutes"
    )
    document = {
        "database": {"url": db.raw_url, "leader_election": False},
        "probes": {
            **{p: {"enabled": False} for p in ALL_DB_PROBES},
            "custom": [{"name": "broken", "sql": sql, "metric": "shop_broken"}],
        },
    }
    await seed_db(db)
    async with ProbeRunner(parse_config(yaml.safe_dump(document)), registry=registry) as runner:
        await async_wait_until(lambda: "broken" in runner.results, timeout=WAIT, message="one run")
        result = runner.results["broken"]
    assert not result.up
    assert result.error is not None
    assert "stocksentry_custom" not in result.error
    assert "SELECT * FROM (" not in result.error
    if db.mysql:
        assert result.error.startswith("ProgrammingError (SQLSTATE 42000): (1064, ")
        assert result.error.endswith("near 'minutes' at line 2\")"), result.error
    else:
        assert result.error.startswith("SyntaxError (SQLSTATE 42601): ")
        assert "LINE 2: WHERE created_at >= now() - interval '5 minutes' minutes" in (
            result.error
        ), result.error
