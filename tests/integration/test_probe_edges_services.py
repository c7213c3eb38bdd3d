"""Probe paths no other test reached, on the real PostgreSQL and MariaDB: the oversold probe
on its promo scope, reservations held by status, custom SQL whose rows have NULLs, missing
or non-numeric columns, or more label sets than allowed, a probe's own statement limit on
a shared session, a mapped table that does not exist, and a database URL that cannot be
parsed.

Each figure is compared with the SQL truth of the seeded rows; each failure must leave the
probe down with a message that says why (never an all-clear from a probe that could not
look).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from dbs import Db
from polling import async_wait_until
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ConfigError, ExporterConfig, parse_config
from stocksentry.exporter.probes import ProbeRunner, check_indexes
from stocksentry.exporter.probes.pool import Pool
from test_probes import config_on, seed_db

pytestmark = pytest.mark.integration

WAIT = 20.0


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def up(registry: CollectorRegistry, probe: str) -> float | None:
    return sample(registry, "stocksentry_probe_up", probe=probe)


def run_sql(db: Db, *statements: str) -> None:
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def custom_config(db: Db, *custom: dict[str, Any], database: dict[str, Any] | None = None) -> Any:
    """Only the custom probes, on 200 ms intervals."""
    builtin = ("negative_stock", "oversold", "duplicate_orders", "lock_waiters", "deadlocks")
    builtin += ("long_transactions", "expired_reservations", "outbox", "cache_drift")
    document = {
        "database": {"url": db.raw_url, "leader_election": False, **(database or {})},
        "probes": {
            "defaults": {"interval": "200ms", "timeout": "2s"},
            **{p: {"enabled": False} for p in builtin},
            "custom": list(custom),
        },
    }
    return parse_config(yaml.safe_dump(document), "test.yaml", environ={})


# --- oversold, scope: promo ------------------------------------------------------------------


async def test_oversold_on_promo_scope_reads_only_the_promo_skus(db, registry):
    # The seed: SKU-OVER oversold by 2, SKU-OVER2 by 3, SKU-OK not oversold.
    await seed_db(db, indexes=False)
    config = config_on(
        db,
        ("oversold",),
        promo_skus=("SKU-OVER", "SKU-OK"),
        settings={"oversold": {"scope": "promo"}},
    )
    assert config.probes.oversold.scope == "promo"
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(lambda: up(registry, "oversold") == 1.0, timeout=WAIT)
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER") == 2.0
        # A promo SKU not oversold keeps its series at 0; SKU-OVER2 is not a promo SKU.
        assert sample(registry, "stock_oversold_units", sku="SKU-OK") == 0.0
        assert sample(registry, "stock_oversold_units", sku="SKU-OVER2") is None
        assert sample(registry, "stock_oversold_units", sku="__other__") is None
        # A second start changes nothing: still one task per probe.
        await runner.start()
        assert runner.is_leader
    # The promo scope looks products up by SKU (unique: indexed) and never reads orders by
    # creation time, so its only missing index is order_items(product_id).
    pool = Pool(config.database)  # type: ignore[arg-type]
    try:
        advice = await check_indexes(pool, config)
    finally:
        await pool.close()
    # (InnoDB indexes every foreign key column by itself.)
    expected = [] if db.mysql else [("oversold", "order_items", "product_id")]
    assert [(a.probe, a.table, a.column) for a in advice] == expected


# --- reservations held by status -------------------------------------------------------------


async def test_expired_reservations_count_the_held_statuses(db, registry):
    # A status with a quote and a % in it: inlined as a literal on PostgreSQL (it must then
    # match a partial index's predicate), a parameter on MariaDB.
    held = ["HELD", "ON HOLD 'x' 50%"]
    ddl = (
        "CREATE TABLE holds (id BIGINT PRIMARY KEY, expires_at TIMESTAMP(6) NOT NULL,"
        " state VARCHAR(40) NOT NULL)"
    )
    now = "CURRENT_TIMESTAMP(6)" if db.mysql else "CURRENT_TIMESTAMP"
    run_sql(
        db,
        ddl.replace("TIMESTAMP(6)", "DATETIME(6)") if db.mysql else ddl,
        "INSERT INTO holds (id, expires_at, state) VALUES"
        f" (1, {now} - INTERVAL '1' HOUR, 'HELD'),"
        f" (2, {now} - INTERVAL '2' HOUR, 'HELD'),"
        f" (3, {now} - INTERVAL '1' HOUR, 'ON HOLD ''x'' 50%%'),"
        f" (4, {now} - INTERVAL '1' HOUR, 'RELEASED'),"
        f" (5, {now} - INTERVAL '1' HOUR, 'held'),"
        f" (6, {now} + INTERVAL '1' HOUR, 'HELD')",
    )
    schema = {"reservations": {"table": "holds", "status": "state", "held_statuses": held}}
    config = config_on(db, ("expired_reservations",), schema=schema)
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(lambda: up(registry, "expired_reservations") == 1.0, timeout=WAIT)
        # Rows 1, 2 and 3: expired and in a held status. MariaDB's default collation
        # compares without case, so its 'held' counts too, as the same SQL says there.
        truth = 4.0 if db.mysql else 3.0
        assert sample(registry, "stock_reservations_expired_unreleased") == truth


# --- custom probes ---------------------------------------------------------------------------


async def test_a_custom_probe_skips_null_values_and_labels_a_null_as_empty(db, registry):
    sql = (
        "SELECT 'a' AS kind, 2 AS value UNION ALL SELECT 'a', 3"
        " UNION ALL SELECT NULL, 5 UNION ALL SELECT 'b', NULL"
    )
    config = custom_config(
        db, {"name": "nulls", "metric": "shop_nulls", "sql": sql, "label_columns": ["kind"]}
    )
    async with ProbeRunner(config, registry=registry):
        await async_wait_until(lambda: up(registry, "nulls") == 1.0, timeout=WAIT)
        # Equal labels summed; a NULL label is the empty value (exported as __empty__,
        # like every empty label); a NULL value is no sample.
        assert sample(registry, "shop_nulls", kind="a") == 5.0
        assert sample(registry, "shop_nulls", kind="__empty__") == 5.0
        assert sample(registry, "shop_nulls", kind="b") is None


async def test_a_custom_probe_beyond_max_series_drops_the_rest_with_one_warning(
    db, registry, caplog
):
    caplog.set_level(logging.WARNING, logger="stocksentry.exporter.probes")
    sql = "SELECT 'x' AS k, 1 AS value UNION ALL SELECT 'y', 2 UNION ALL SELECT 'z', 4"
    config = custom_config(
        db,
        {
            "name": "capped",
            "metric": "shop_capped",
            "sql": sql + " UNION ALL SELECT 'x', 10",
            "label_columns": ["k"],
            "max_series": 2,
        },
    )
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(lambda: up(registry, "capped") == 1.0, timeout=WAIT)
        first = runner.results["capped"].last_success
        await async_wait_until(
            lambda: runner.results["capped"].last_success != first, timeout=WAIT
        )
        series = {
            s.labels["k"]: s.value
            for f in registry.collect()
            if f.name == "shop_capped"
            for s in f.samples
        }
    # Two label sets kept, the one already kept still summed (x: 1 + 10); z dropped.
    assert len(series) == 2
    assert set(series) <= {"x", "y", "z"}
    if "x" in series:
        assert series["x"] == 11.0
    warnings = [r for r in caplog.records if "label sets; the rest are dropped" in r.message]
    assert len(warnings) == 1
    assert "custom probe capped returned more than 2 label sets" in warnings[0].getMessage()


async def test_a_custom_probe_missing_its_column_is_down_and_names_it(db, registry):
    config = custom_config(
        db,
        {
            "name": "wrong_column",
            "metric": "shop_wrong",
            "sql": "SELECT 1 AS amount, 'a' AS sku",
            "label_columns": ["sku", "region"],
        },
    )
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(lambda: up(registry, "wrong_column") == 0.0, timeout=WAIT)
        error = runner.results["wrong_column"].error
        assert error is not None
        assert "the SQL returned no column value, region (columns: amount, sku)" in error
        assert sample(registry, "shop_wrong", sku="a") is None


async def test_a_custom_probe_with_a_non_numeric_value_is_down_and_says_so(db, registry):
    config = custom_config(
        db,
        {"name": "dated", "metric": "shop_dated", "sql": "SELECT CURRENT_DATE AS value"},
    )
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(lambda: up(registry, "dated") == 0.0, timeout=WAIT)
        error = runner.results["dated"].error
        assert error is not None
        assert "expected a number, got date" in error
        assert sample(registry, "shop_dated") is None


async def test_each_custom_probe_runs_under_its_own_statement_limit_on_one_session(db, registry):
    # One session shared by both probes: each transaction must carry its probe's limit.
    limit = (
        "SELECT @@max_statement_time AS value"
        if db.mysql
        else "SELECT extract(epoch FROM current_setting('statement_timeout')::interval) AS value"
    )
    config = custom_config(
        db,
        {"name": "own_limit", "metric": "shop_own_limit", "sql": limit, "statement_timeout": "3s"},
        {"name": "default_limit", "metric": "shop_default_limit", "sql": limit},
        database={"max_connections": 1, "statement_timeout": "1500ms"},
    )
    async with ProbeRunner(config, registry=registry) as runner:
        for name in ("own_limit", "default_limit"):
            await async_wait_until(lambda n=name: up(registry, n) == 1.0, timeout=WAIT)
        # A few rounds each, interleaved on the one session.
        marks = {n: runner.results[n].last_success for n in ("own_limit", "default_limit")}
        for name, mark in marks.items():
            await async_wait_until(
                lambda n=name, m=mark: runner.results[n].last_success != m, timeout=WAIT
            )
            assert sample(registry, "shop_own_limit") == 3.0
            assert sample(registry, "shop_default_limit") == 1.5


# --- a mapped table that does not exist ------------------------------------------------------


async def test_a_products_table_that_does_not_exist_is_named_by_the_probes(db, registry):
    await seed_db(db)
    config = config_on(
        db,
        ("negative_stock", "oversold"),
        schema={"products": {"table": "product", "allocation": "initial_stock"}},
    )
    async with ProbeRunner(config, registry=registry) as runner:
        for probe in ("negative_stock", "oversold"):
            await async_wait_until(lambda p=probe: up(registry, p) == 0.0, timeout=WAIT)
            error = runner.results[probe].error
            assert error is not None
            # The server's own word for it, naming the table the config maps.
            assert "product" in error, (probe, error)
            assert "returned no row" not in error, (probe, error)
        await async_wait_until(lambda: runner.index_advice is not None, timeout=WAIT)
        # No advice for a table that is not there: its probes report that.
        assert all(a.table != "product" for a in runner.index_advice or ())
    assert sample(registry, "stock_oversold_units", sku="SKU-OK") is None
    assert sample(registry, "stock_inventory_negative_skus") is None


# --- a database URL that cannot be parsed ----------------------------------------------------


def test_a_postgresql_url_with_an_unknown_option_is_a_config_error(pg_database):
    # A typo in an option (sslmod for sslmode): libpq refuses the URL at every connect.
    # That is the config's mistake, said once at load, not every probe down forever.
    url = pg_database.replace("postgres://", "postgresql://", 1) + "?sslmod=require"
    text = f"database:\n  url: {url}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "config.yaml", environ={})
    error = caught.value
    assert (error.line, error.path) == (2, "database.url")
    assert "cannot be parsed" in error.message


def test_a_postgresql_url_from_the_environment_is_checked_without_echoing_it(pg_database):
    bad_escape = "s3cr%zz-et"  # a broken %-escape inside the password
    base, _, database = pg_database.rpartition("/")
    scheme, _, rest = base.partition("://")
    host = rest.rpartition("@")[2]
    url = f"{scheme}://shop:{bad_escape}@{host}/{database}"
    text = "database:\n  url_env: SHOP_DB\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "config.yaml", environ={"SHOP_DB": url})
    assert (caught.value.line, caught.value.path) == (2, "database.url_env")
    assert "environment variable SHOP_DB" in caught.value.message
    assert bad_escape not in str(caught.value)
    assert "zz" not in str(caught.value)


def test_valid_postgresql_urls_and_conninfo_strings_are_still_taken(pg_database):
    for url in (pg_database + "?sslmode=disable&application_name=x", "host=db dbname=shop"):
        config: ExporterConfig = parse_config(
            yaml.safe_dump({"database": {"url": url}}), "config.yaml", environ={}
        )
        assert config.database is not None
        assert config.database.url.reveal() == url


@pytest.mark.parametrize("driver", ["postgresql+psycopg", "postgresql+asyncpg"])
async def test_a_driver_qualified_postgresql_url_is_probed(pg_database, registry, driver):
    # The config takes the app's SQLAlchemy URL as it is; the probes must connect with it.
    url = driver + "://" + pg_database.partition("://")[2]
    document = {
        "database": {"url": url, "leader_election": False},
        "probes": {
            "defaults": {"interval": "200ms", "timeout": "2s"},
            **{
                p: {"enabled": False}
                for p in ("negative_stock", "oversold", "duplicate_orders", "lock_waiters")
            },
            **{p: {"enabled": False} for p in ("long_transactions", "expired_reservations")},
            "outbox": {"enabled": False},
        },
    }
    config = parse_config(yaml.safe_dump(document), "test.yaml", environ={})
    async with ProbeRunner(config, registry=registry) as runner:
        await async_wait_until(lambda: runner.results.get("deadlocks") is not None, timeout=WAIT)
        assert runner.results["deadlocks"].error is None
        database = pg_database.rsplit("/", 1)[1]
        assert sample(registry, "stock_db_server_deadlock_total", database=database) == 0.0
