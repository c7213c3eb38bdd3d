"""The probes against a real MariaDB: exact figures, the server's state, failures, election.

The MySQL/MariaDB twin of ``test_probes.py``: each test seeds a fresh database
(``mysql_database``) with the same shop and the same known violations, runs a
:class:`ProbeRunner` on short intervals, and reads the figures back from a fresh registry,
as a scrape would. MySQL 8 is not run here (its differences are documented).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pymysql
import pytest
import yaml
from polling import async_wait_until
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.mysql.common import statement
from stocksentry.exporter.probes.postgres.common import composed
from test_probes import seed as pg_seed

pytestmark = pytest.mark.integration

WAIT = 20.0

ALL_DB_PROBES = (
    "negative_stock",
    "oversold",
    "duplicate_orders",
    "lock_waiters",
    "deadlocks",
    "long_transactions",
    "expired_reservations",
    "outbox",
)

SCHEMA = [
    """CREATE TABLE products (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        sku varchar(64) NOT NULL UNIQUE,
        available_stock int NOT NULL,
        initial_stock int NOT NULL
    ) ENGINE=InnoDB""",
    """CREATE TABLE orders (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        status varchar(32) NOT NULL,
        external_ref varchar(64),
        idempotency_key varchar(64),
        created_at datetime(6) NOT NULL DEFAULT now(6)
    ) ENGINE=InnoDB""",
    """CREATE TABLE order_items (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        order_id bigint NOT NULL,
        product_id bigint NOT NULL,
        quantity int NOT NULL,
        CONSTRAINT order_items_order_fk FOREIGN KEY (order_id) REFERENCES orders (id),
        CONSTRAINT order_items_product_fk FOREIGN KEY (product_id) REFERENCES products (id)
    ) ENGINE=InnoDB""",
    """CREATE TABLE reservations (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        product_id bigint NOT NULL,
        quantity int NOT NULL,
        expires_at datetime(6) NOT NULL,
        released_at datetime(6)
    ) ENGINE=InnoDB""",
    """CREATE TABLE outbox (
        id bigint AUTO_INCREMENT PRIMARY KEY,
        created_at datetime(6) NOT NULL,
        published_at datetime(6)
    ) ENGINE=InnoDB""",
]

# The foreign keys already index order_items(order_id) and (product_id).
INDEXES = [
    "CREATE INDEX products_stock_idx ON products (available_stock)",
    "CREATE INDEX orders_created_at_idx ON orders (created_at)",
    "CREATE INDEX orders_external_ref_idx ON orders (external_ref)",
    "CREATE INDEX orders_idempotency_key_idx ON orders (idempotency_key)",
    "CREATE INDEX reservations_expires_at_idx ON reservations (expires_at)",
    "CREATE INDEX outbox_pending_idx ON outbox (published_at, created_at)",
]

# The same truth as test_probes.py's SEED.
SEED = [
    """INSERT INTO products (id, sku, available_stock, initial_stock) VALUES
        (1, 'SKU-NEG3', -3, 10), (2, 'SKU-NEG1', -1, 10), (3, 'SKU-OVER', 0, 5),
        (4, 'SKU-OK', 15, 20), (5, 'SKU-OVER2', 0, 1)""",
    """INSERT INTO orders (id, status, external_ref, idempotency_key, created_at) VALUES
        (1, 'PAID', 'ref-a', NULL, now(6)),
        (2, 'COMPLETED', 'ref-b', NULL, now(6)),
        (3, 'CANCELLED', 'ref-c', NULL, now(6)),
        (4, 'PROCESSING', 'ref-d', NULL, now(6)),
        (5, 'PAID', 'ref-e', NULL, now(6)),
        (6, 'PAID', 'dup-1', 'idem-1', now(6)),
        (7, 'PAID', 'dup-1', 'idem-1', now(6)),
        (8, 'PAID', 'dup-2', NULL, now(6)),
        (9, 'PENDING', 'dup-2', NULL, now(6)),
        (10, 'CANCELLED', 'dup-2', NULL, now(6)),
        (11, 'PAID', 'single', NULL, now(6)),
        (12, 'PAID', 'old-dup', NULL, now(6) - INTERVAL 2 DAY),
        (13, 'PAID', 'old-dup', NULL, now(6) - INTERVAL 2 DAY),
        (14, 'PAID', NULL, NULL, now(6)),
        (15, 'PAID', NULL, NULL, now(6))""",
    """INSERT INTO order_items (order_id, product_id, quantity) VALUES
        (1, 3, 3), (2, 3, 4), (3, 3, 2), (4, 4, 5), (5, 5, 4)""",
    """INSERT INTO reservations (product_id, quantity, expires_at, released_at) VALUES
        (4, 1, now(6) - INTERVAL 1 MINUTE, NULL),
        (4, 1, now(6) - INTERVAL 2 MINUTE, NULL),
        (4, 1, now(6) - INTERVAL 3 MINUTE, NULL),
        (4, 1, now(6) - INTERVAL 1 MINUTE, now(6) - INTERVAL 30 SECOND),
        (4, 1, now(6) - INTERVAL 5 MINUTE, now(6)),
        (4, 1, now(6) + INTERVAL 5 MINUTE, NULL)""",
    """INSERT INTO outbox (created_at, published_at) VALUES
        (now(6) - INTERVAL 120 SECOND, NULL),
        (now(6) - INTERVAL 30 SECOND, NULL),
        (now(6) - INTERVAL 1 HOUR, now(6) - INTERVAL 59 MINUTE)""",
]


def connect(url: str, **options: Any) -> pymysql.connections.Connection[Any]:
    """A plain PyMySQL session on the test database (autocommit unless told otherwise)."""
    parts = urlsplit(url)
    return pymysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        database=parts.path.lstrip("/"),
        autocommit=options.pop("autocommit", True),
        **options,
    )


def run_sql(url: str, statements: list[str]) -> None:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def seed(url: str, *, indexes: bool = True) -> None:
    run_sql(url, SCHEMA + (INDEXES if indexes else []) + SEED)


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
    """A config on ``url`` with only ``probes`` enabled, on 0.2 s intervals."""
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
        # Unique per test: other suites elect on the same server at the same time.
        "advisory_lock_key": random.randint(1, 2**62),
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


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def all_up(registry: CollectorRegistry, probes: tuple[str, ...]) -> Callable[[], bool]:
    return lambda: all(sample(registry, "stocksentry_probe_up", probe=p) == 1.0 for p in probes)


def database_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


async def test_every_probe_reports_the_seeded_truth(mysql_database, registry):
    before_seed, before_seed_wall = time.monotonic(), time.time()
    seed(mysql_database)
    config = make_config(mysql_database)
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(
            all_up(registry, ALL_DB_PROBES), timeout=WAIT, message="every probe up"
        )
        await asyncio.sleep(0.3)
        assert sample(registry, "stock_negative_inventory_skus") == 2.0
        assert sample(registry, "stock_negative_inventory_units") == 4.0
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER") == 2.0
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER2") == 3.0
        assert sample(registry, "stock_oversold_units", sku="SKU-OK") == 0.0
        assert sample(registry, "stock_oversold_units", sku="SKU-NEG3") is None
        assert sample(registry, "stock_duplicate_order_keys") == 2.0
        assert sample(registry, "stock_db_lock_waiters") == 0.0
        assert sample(registry, "stock_db_lock_wait_max_seconds") == 0.0
        deadlocks = sample(
            registry, "stock_db_deadlocks_total", database=database_of(mysql_database)
        )
        assert deadlocks is not None  # server-wide: other suites' deadlocks count too
        assert deadlocks >= 0.0
        assert sample(registry, "stock_db_long_transactions") == 0.0
        assert sample(registry, "stock_reservations_expired_unreleased") == 3.0
        assert sample(registry, "stock_outbox_pending_events") == 2.0
        lag = sample(registry, "stock_outbox_lag_seconds")
        assert lag is not None
        assert 120.0 <= lag <= 120.0 + (time.monotonic() - before_seed) + 1.0
        assert sample(registry, "stocksentry_probe_leader") == 1.0
        assert runner.is_leader
        for probe in ALL_DB_PROBES:
            last = sample(
                registry, "stocksentry_probe_last_success_timestamp_seconds", probe=probe
            )
            assert last is not None
            assert before_seed_wall <= last <= time.time()
        await async_wait_until(
            lambda: runner.index_advice is not None, timeout=WAIT, message="the index check"
        )
        assert runner.index_advice == ()


# --- the invariant statements: the same rows on MariaDB as on PostgreSQL --------------------


def invariant_queries(builder: InvariantSql) -> dict[str, Any]:
    """Every statement InvariantSql builds, with arguments that return rows on the seed."""
    window = dt.timedelta(hours=1)
    long_ago = dt.datetime(2000, 1, 1)
    future = dt.datetime(2100, 1, 1)
    return {
        "negative_stock": builder.negative_stock(),
        "negative_stock_skus": builder.negative_stock(skus=["SKU-NEG1", "SKU-OK"]),
        "negative_stock_totals": builder.negative_stock_totals(),
        "oversold": builder.oversold(),
        "oversold_promo": builder.oversold(skus=["SKU-OVER", "SKU-OK"], worst_first=True),
        "oversold_orders": builder.oversold(worst_first=True, count_orders=True),
        "paid_units_created": builder.paid_units_created(start=long_ago, end=future),
        "paid_units_since": builder.paid_units_created(start=long_ago),
        "paid_units_of_products": builder.paid_units_of_products([3, 4, 5], end=future),
        "paid_units_chunk": builder.paid_units_chunk(after=None, limit=3, end=future),
        "paid_units_chunk_after": builder.paid_units_chunk(after=3, limit=10, end=future),
        "duplicate_keys": builder.duplicate_keys("external_ref", since=window),
        "duplicate_keys_all": builder.duplicate_keys("external_ref"),
        "duplicate_keys_since": builder.duplicate_keys("external_ref", since=long_ago),
        "duplicate_keys_skus": builder.duplicate_keys("external_ref", skus=["SKU-OVER"]),
        "keys_created": builder.keys_created("external_ref", start=long_ago),
        "key_expiry": builder.duplicate_key_expiry("external_ref", window=window),
        "key_expiry_keys": builder.duplicate_key_expiry(
            "external_ref", window=window, keys=["dup-1", "single", "old-dup"]
        ),
        "duplicate_key_totals": builder.duplicate_key_totals(since=window),
        "paid_without_items": builder.paid_without_items(since=window),
    }


def normalised(rows: list[tuple[Any, ...]], columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Rows comparable across drivers: numbers as floats, times dropped (each server's own
    clock), and in a fixed order where the statement leaves it open."""
    out = []
    for row in rows:
        values = []
        for _name, value in zip(columns, row, strict=True):
            if isinstance(value, dt.datetime):
                continue
            if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
                value = float(value)
            values.append(value if value is None or isinstance(value, float) else str(value))
        out.append(tuple(values))
    return sorted(out, key=repr)


async def test_every_invariant_statement_gives_postgresql_s_rows(mysql_database, pg_database):
    seed(mysql_database)
    await pg_seed(pg_database)
    schema = make_config(mysql_database).schema
    on_mysql = invariant_queries(InvariantSql(schema, dialect="mysql"))
    on_pg = invariant_queries(InvariantSql(schema))
    conn = connect(mysql_database)
    try:
        async with await psycopg.AsyncConnection.connect(pg_database) as pg:
            for name, query in on_mysql.items():
                text, params = statement(query)
                with conn.cursor() as cur:
                    cur.execute(text, params)
                    got = [tuple(r) for r in cur.fetchall()]
                pg_statement, pg_params = composed(on_pg[name])
                cursor = await pg.execute(pg_statement, pg_params)
                want = [tuple(r) for r in await cursor.fetchall()]
                assert normalised(got, query.columns) == normalised(want, query.columns), name
                # The seed has no duplicate among the orders with items.
                assert want or name == "duplicate_keys_skus", f"{name} returns no row"
    finally:
        conn.close()
    # The seed's truth, spelled out for the two that matter most.
    assert normalised(
        [tuple(r) for r in run_rows(mysql_database, on_mysql["oversold"])], ("a", "b", "c", "d")
    ) == [("SKU-OVER", 5.0, 7.0, 2.0), ("SKU-OVER2", 1.0, 4.0, 3.0)]


def run_rows(url: str, query: Any) -> list[tuple[Any, ...]]:
    text, params = statement(query)
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(text, params)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()
