"""The probes' behaviours of MariaDB's own: the server's state, failures, election.

The behaviours both databases share are tested once, on both, in ``test_probes.py`` (the
``db`` fixture); this module holds MariaDB's shop (the same rows and known violations as
PostgreSQL's) and helpers, and the tests of what only MySQL/MariaDB do. MySQL 8 is not run
here (its differences are documented).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
import pymysql
import pytest
import yaml
from polling import async_wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from stocksentry.exporter.config import ExporterConfig, parse_config
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.base import ErrorLog
from stocksentry.exporter.probes.election import LeaderElection
from stocksentry.exporter.probes.my import MySQL, lock_name
from stocksentry.exporter.probes.pg import PostgreSQL
from test_probes import ALL_DB_PROBES, all_up, sample
from test_probes import make_config as pg_make_config
from test_probes import seed as pg_seed

pytestmark = pytest.mark.integration

WAIT = 20.0

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
    "CREATE INDEX reservations_held_idx ON reservations (released_at, expires_at)",
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
    database: dict[str, Any] | None = None,
    **options: Any,
) -> ExporterConfig:
    """test_probes' config, with an election key of its own."""
    # Unique per test: other suites elect on the same server at the same time.
    database = {"advisory_lock_key": random.randint(1, 2**62), **(database or {})}
    return pg_make_config(url, probes, database=database, **options)


def database_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


# --- the same families and samples as on PostgreSQL ------------------------------------------

# The probes whose figures depend on the shop's rows alone (the server-level ones read each
# server's own state: deadlocks are server-wide on MariaDB, database-wide on PostgreSQL).
SHOP_PROBES = ("negative_stock", "oversold", "duplicate_orders", "expired_reservations", "outbox")

# Beyond the seed, on both: three more SKUs below zero (five in all, two named with
# top_skus 2, three summed under __other__), and items for the duplicated keys' orders so
# that duplicate orders name SKUs: dup-1 (orders 6, 7) and idem-1 hold SKU-OK, dup-2 (8, 9)
# SKU-OK and SKU-OVER; the single order's SKU-OVER2 is no duplicate's.
EXTRA_VIOLATIONS = [
    "INSERT INTO products (id, sku, available_stock, initial_stock) VALUES"
    " (6, 'SKU-NEG38', -38, 50), (7, 'SKU-NEG2', -2, 10), (8, 'SKU-NEG1B', -1, 10)",
    "INSERT INTO order_items (order_id, product_id, quantity) VALUES"
    " (6, 4, 1), (7, 4, 1), (8, 4, 1), (9, 3, 1), (11, 5, 1)",
]


def probe_samples(
    registry: CollectorRegistry,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scraped samples of the probes' own families (the stocksentry_* health series
    carry timings and timestamps of each run, so they are left out)."""
    return {k: v for k, v in scrape(registry).items() if not k[0].startswith("stocksentry_")}


def family_names(registry: CollectorRegistry) -> set[str]:
    return {
        family.name
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        if not family.name.startswith("stocksentry_")
    }


async def test_mariadb_exports_postgresql_s_families_and_samples(
    mysql_database, pg_database, caplog
):
    seed(mysql_database)
    run_sql(mysql_database, EXTRA_VIOLATIONS)
    await pg_seed(pg_database)
    async with await psycopg.AsyncConnection.connect(pg_database, autocommit=True) as conn:
        for sql in EXTRA_VIOLATIONS:
            await conn.execute(sql)
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")

    def config_of(url: str) -> ExporterConfig:
        return make_config(
            url,
            SHOP_PROBES,
            promo_skus=("SKU-OK", "SKU-PROMO"),
            schema={"orders": {"idempotency_key": "idempotency_key"}, "outbox": {"id": "id"}},
            settings={
                "negative_stock": {"top_skus": 2},
                "duplicate_orders": {"top_skus": 1},
                "outbox": {"max_publish_latency": "1m"},
            },
        )

    scraped: dict[str, tuple[set[str], dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for dialect, url in (("postgresql", pg_database), ("mariadb", mysql_database)):
        caplog.clear()
        registry = CollectorRegistry()
        async with ProbeRunner(config_of(url), registry=registry):
            await async_wait_until(
                all_up(registry, SHOP_PROBES), timeout=WAIT, message=f"{dialect}: probes up"
            )
            await async_wait_until(
                lambda: [r for r in caplog.records if r.getMessage().startswith("outbox stuck")],
                timeout=WAIT,
                message=f"{dialect}: the outbox stuck line",
            )
            scraped[dialect] = (family_names(registry), probe_samples(registry))
        stuck = [r.getMessage() for r in caplog.records if r.getMessage().startswith("outbox")]
        # One line for the transition (the next is due a minute later), naming the oldest.
        assert len(stuck) == 1, (dialect, stuck)
        assert stuck[0].startswith(
            "outbox stuck: 1 event(s) unpublished beyond 1m; the oldest, id 1, is 2m"
        ), (dialect, stuck)

    pg_names, pg_samples = scraped["postgresql"]
    my_names, my_samples = scraped["mariadb"]
    assert my_names == pg_names
    assert set(my_samples) == set(pg_samples)
    lag = ("stock_outbox_lag_seconds", ())
    # The lag is each server's clock against a row seeded a moment apart: close, not equal.
    assert abs(my_samples.pop(lag) - pg_samples.pop(lag)) < 10.0
    assert my_samples == pg_samples
    # Not equal by being empty: the seeded violations, sku labels included.
    negative = "stock_inventory_negative_sku_units"
    duplicate = "stock_duplicate_order_sku_keys"
    assert {k: v for k, v in my_samples.items() if k[0] in (negative, duplicate)} == {
        (negative, (("sku", "SKU-NEG38"),)): 38.0,
        (negative, (("sku", "SKU-NEG3"),)): 3.0,
        (negative, (("sku", "__other__"),)): 4.0,
        (negative, (("sku", "SKU-OK"),)): 0.0,
        (negative, (("sku", "SKU-PROMO"),)): 0.0,
        (duplicate, (("sku", "SKU-OK"),)): 3.0,
        (duplicate, (("sku", "__other__"),)): 1.0,
    }
    assert my_samples[("stock_inventory_negative_skus", ())] == 5.0
    assert my_samples[("stock_inventory_negative_units", ())] == 45.0
    assert my_samples[("stock_duplicate_order_keys", ())] == 3.0
    assert my_samples[("stock_outbox_stuck_events", ())] == 1.0
    assert my_samples[("stock_outbox_max_publish_latency_seconds", ())] == 60.0
    assert my_samples[("stock_oversold_units", (("sku", "SKU-OVER2"),))] == 4.0


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
                text, params = MySQL().render(query)
                with conn.cursor() as cur:
                    cur.execute(text, params)
                    got = [tuple(r) for r in cur.fetchall()]
                pg_statement, pg_params = PostgreSQL().render(on_pg[name])
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
    text, params = MySQL().render(query)
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(text, params)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


# --- the server's state: lock waiters, deadlocks, long transactions -------------------------


def global_deadlocks(url: str) -> float:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            ((_name, value),) = cur.fetchall()
            return float(value)
    finally:
        conn.close()


async def test_deadlocks_come_from_innodb_deadlocks(mysql_database, registry):
    seed(mysql_database)
    database = database_of(mysql_database)
    config = make_config(mysql_database, ("deadlocks",))
    first = connect(mysql_database, autocommit=False)
    second = connect(mysql_database, autocommit=False)
    try:
        async with ProbeRunner(config, registry=registry):
            await async_wait_until(all_up(registry, ("deadlocks",)), timeout=WAIT)
            before = sample(registry, "stock_db_server_deadlock_total", database=database)
            assert before is not None
            first.begin()
            second.begin()
            execute(first, "UPDATE products SET initial_stock = initial_stock WHERE id = 1")
            execute(second, "UPDATE products SET initial_stock = initial_stock WHERE id = 2")
            crossing = asyncio.create_task(
                asyncio.to_thread(
                    execute,
                    first,
                    "UPDATE products SET initial_stock = initial_stock WHERE id = 2",
                )
            )
            await asyncio.sleep(0.2)
            outcomes = await asyncio.gather(
                crossing,
                asyncio.to_thread(
                    execute,
                    second,
                    "UPDATE products SET initial_stock = initial_stock WHERE id = 1",
                ),
                return_exceptions=True,
            )
            errors = [o for o in outcomes if isinstance(o, pymysql.err.OperationalError)]
            assert [e.args[0] for e in errors] == [1213]
            # The counter is the server's: other suites' deadlocks may add to it, never
            # take from it.
            await async_wait_until(
                lambda: (
                    (sample(registry, "stock_db_server_deadlock_total", database=database) or 0)
                    >= before + 1
                ),
                timeout=WAIT,
                message="one more deadlock",
            )
            figure = sample(registry, "stock_db_server_deadlock_total", database=database)
            assert figure is not None
            assert figure <= global_deadlocks(mysql_database)
    finally:
        first.close()
        second.close()


def execute(conn: Any, sql: str) -> None:
    with conn.cursor() as cur:
        cur.execute(sql)
        cur.fetchall()


# --- failures: locks, an unreachable or vanishing server -------------------------------------


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


async def test_a_wrong_password_is_never_echoed(mysql_database, registry, caplog):
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")
    parts = urlsplit(mysql_database)
    url = f"mysql://stocksentry_nobody:s3cr3t-pw@{parts.hostname}:{parts.port or 3306}{parts.path}"
    config = make_config(
        mysql_database,
        ("negative_stock",),
        leader_election=True,
        database={"url_env": "STOCKSENTRY_DATABASE_URL"},
        environ={"STOCKSENTRY_DATABASE_URL": url},
    )
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(
            lambda: sample(registry, "stocksentry_probe_up", probe="leader_election") == 0.0,
            timeout=WAIT,
            message="the election down",
        )
        error = runner.results["leader_election"].error or ""
        assert "Access denied" in error
    assert "s3cr3t-pw" not in caplog.text
    assert "s3cr3t-pw" not in error


class Proxy:
    """A TCP forwarder to the MariaDB server that can be cut and restored: the server
    vanishes for the exporter (connections dropped, the port refusing) and comes back."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers.difference_update((writer, up_writer))


async def test_a_server_that_goes_away_is_down_then_recovers_without_restart(
    mysql_database, registry
):
    seed(mysql_database)
    parts = urlsplit(mysql_database)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 3306)
    await proxy.start()
    url = f"mysql://{parts.username or 'root'}@127.0.0.1:{proxy.port}{parts.path}"
    config = make_config(url, ("negative_stock", "oversold"), leader_election=True)
    try:
        async with ProbeRunner(config, registry=registry) as runner:
            await async_wait_until(
                all_up(registry, ("negative_stock", "oversold", "leader_election")),
                timeout=WAIT,
            )
            await proxy.cut()
            # Once the election's session is gone the probes stop (a follower's figures
            # would be stale); each probe that ran last reports its own failure or goes.
            await async_wait_until(
                lambda: sample(registry, "stocksentry_probe_up", probe="leader_election") == 0.0,
                timeout=WAIT,
                message="the election down",
            )
            # Stepping down stops the probes and drops their figures (just after the
            # election's own result is recorded).
            await async_wait_until(
                lambda: (
                    not runner.is_leader
                    and sample(registry, "stock_inventory_negative_skus") is None
                ),
                timeout=WAIT,
                message="the probes stopped, their figures gone",
            )
            started = time.monotonic()
            scrape(registry)
            assert time.monotonic() - started < 1.0
            await proxy.start()  # the same port again
            await async_wait_until(
                all_up(registry, ("negative_stock", "oversold", "leader_election")),
                timeout=WAIT,
                message="everything back",
            )
            assert runner.is_leader
            assert sample(registry, "stock_inventory_negative_skus") == 2.0
            assert sample(registry, "stock_oversold_units", sku="SKU-OVER") == 2.0
    finally:
        if proxy._server is not None:
            await proxy.cut()


# --- leader election with GET_LOCK -----------------------------------------------------------


def lock_is_free(url: str, name: str) -> bool:
    """Whether another session can take the named lock ``name`` (released at once)."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (name,))
            ((got,),) = cur.fetchall()
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))
            return bool(got == 1)
    finally:
        conn.close()


async def test_a_silent_leader_s_session_is_ended_by_the_server(mysql_database):
    config = make_config(mysql_database, ("negative_stock",), leader_election=True)
    assert config.database is not None
    name = lock_name(database_of(mysql_database), config.database.advisory_lock_key)

    async def nothing() -> None:
        pass

    election = LeaderElection(
        config.database,
        on_elected=nothing,
        on_deposed=nothing,
        on_result=lambda result: None,
        errors=ErrorLog(logging.getLogger("test-election")),
    )
    try:
        await election.step()
        assert election.leading
        assert not lock_is_free(mysql_database, name)
        # The leader stops pinging (frozen, cut off): wait_timeout (3 x 200 ms, at least
        # 1 s) ends its session on the server, which releases the lock.
        await async_wait_until(
            lambda: lock_is_free(mysql_database, name), timeout=WAIT, message="the lock is free"
        )
        # Its next step finds the session gone and steps down.
        await election.step()
        assert not election.leading
    finally:
        await election.close()


# --- the index check, and no session left behind ---------------------------------------------


def exporter_sessions(url: str) -> set[int]:
    """The other sessions of the test's own database: the exporter's, in these tests."""
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT id FROM information_schema.processlist"
                " WHERE db = database() AND id <> connection_id()"
            )
            return {int(pid) for (pid,) in cur.fetchall()}
    finally:
        conn.close()


# --- custom SQL -------------------------------------------------------------------------------


def custom_document(url: str, custom: dict[str, Any], interval: str = "200ms") -> str:
    return yaml.safe_dump(
        {
            "database": {"url": url, "leader_election": False},
            "probes": {
                "defaults": {"interval": interval},
                **{p: {"enabled": False} for p in ALL_DB_PROBES},
                "custom": [custom],
            },
        }
    )


async def test_a_custom_probe_reads_a_status_value_that_mysql_returns_as_text(
    mysql_database, registry
):
    # information_schema.global_status holds its values as text: read as a number the
    # way the dialect's own probes read them, not refused as a non-number.
    custom = {
        "name": "server_threads",
        "sql": "SELECT variable_value AS threads FROM information_schema.global_status"
        " WHERE variable_name = 'THREADS_CONNECTED'",
        "metric": "shop_threads_connected",
        "help": "Connected threads.",
        "value_column": "threads",
    }
    config = parse_config(custom_document(mysql_database, custom))
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(all_up(registry, ("server_threads",)), timeout=WAIT)
        threads = sample(registry, "shop_threads_connected")
        assert threads is not None
        assert threads >= 1.0  # the probe's own session at least


def run_rows_text(url: str, sql: str) -> list[tuple[Any, ...]]:
    conn = connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return [tuple(r) for r in cur.fetchall()]
    finally:
        conn.close()


# --- cache drift ------------------------------------------------------------------------------


async def test_without_process_the_probes_that_read_innodb_trx_are_down(mysql_database, registry):
    seed(mysql_database)
    database = database_of(mysql_database)
    user = f"ss_noproc_{random.randint(0, 16**8):08x}"
    password = f"pw-{random.randint(0, 16**12):012x}"
    run_sql(
        mysql_database,
        [
            f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
            f"GRANT SELECT ON `{database}`.* TO '{user}'@'%'",
        ],
    )
    parts = urlsplit(mysql_database)
    url = f"mysql://{user}:{password}@{parts.hostname}:{parts.port or 3306}/{database}"
    config = make_config(
        mysql_database,
        leader_election=True,
        database={"url_env": "SHOP_URL"},
        environ={"SHOP_URL": url},
    )
    needs_process = ("oversold", "duplicate_orders", "lock_waiters", "long_transactions")
    others = ("negative_stock", "deadlocks", "expired_reservations", "outbox", "leader_election")
    try:
        async with ProbeRunner(config, registry=registry) as runner:
            await async_wait_until(
                lambda: (
                    all(
                        sample(registry, "stocksentry_probe_up", probe=p) == 0.0
                        for p in needs_process
                    )
                    and all(
                        sample(registry, "stocksentry_probe_up", probe=p) == 1.0 for p in others
                    )
                ),
                timeout=WAIT,
                message="the innodb_trx probes down, the others up",
            )
            for name in needs_process:
                assert "(1227," in (runner.results[name].error or ""), name
                assert password not in (runner.results[name].error or "")
            assert sample(registry, "stock_inventory_negative_skus") == 2.0
    finally:
        run_sql(mysql_database, [f"DROP USER IF EXISTS '{user}'@'%'"])
