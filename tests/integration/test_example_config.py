"""exporter/config.example.yaml, exactly as shipped, on PostgreSQL and on MariaDB.

The example is what a new user copies first; docs/exporter-config.md says only the URL
changes for MySQL. Each database gets the seeded shop of test_probes.py (its known
truth), a Redis of the test's own, and the example file itself (only the two environment
variables it names are set): every probe it turns on, the custom one included, must be up
and report that truth.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from dbs import ALL_DB_PROBES, Db
from polling import async_wait_until
from privateredis import PrivateRedis
from stocksentry.exporter.config import load_config
from stocksentry.exporter.probes import ProbeRunner
from test_probes import WAIT, all_up, sample, seed_db

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "exporter" / "config.example.yaml"
#: Every probe the example turns on: the database's, cache_drift and its custom probe.
EXAMPLE_PROBES = (*ALL_DB_PROBES, "cache_drift", "recent_paid_orders")


async def test_the_example_config_runs_every_probe_on_both_databases(
    db: Db, registry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stocksentry.exporter.probes")
    await seed_db(db)
    with PrivateRedis() as redis:
        environ = {"STOCKSENTRY_DATABASE_URL": db.raw_url, "STOCKSENTRY_REDIS_URL": redis.url}
        config = load_config(EXAMPLE, environ=environ)
        assert config.database is not None
        assert config.database.dialect == db.dialect
        assert [c.name for c in config.probes.custom] == ["recent_paid_orders"]
        async with ProbeRunner(config, registry=registry) as runner:
            assert {p.name for p in runner.probes} == set(EXAMPLE_PROBES)
            await async_wait_until(
                all_up(registry, EXAMPLE_PROBES), timeout=WAIT, message="every probe up"
            )
            # The seed's paid orders created just now (PAID, PROCESSING, COMPLETED; the
            # two of two days ago are out of the five minutes).
            assert sample(registry, "shop_recent_paid_orders") == 10.0
            assert sample(registry, "stock_inventory_negative_units") == 4.0
            assert sample(registry, "stock_oversold_units", sku="SKU-OVER") == 2.0
            assert sample(registry, "stock_reservations_expired_unreleased") == 3.0
            assert sample(registry, "stock_outbox_pending_events") == 2.0
            assert sample(registry, "stocksentry_probe_leader") == 1.0
    # The start-up says which server the probes found, once, and what the example's
    # lock_timeout: 200ms became there.
    found = [r.getMessage() for r in caplog.records if r.getMessage().startswith("database: ")]
    assert len(found) == 1, found
    if db.mysql:
        assert re.fullmatch(
            r"database: MariaDB 10\.\d+\.\d+; lock_timeout 200ms became 1 s"
            r" \(lock waits take whole seconds here\)",
            found[0],
        ), found
    else:
        assert re.fullmatch(r"database: PostgreSQL \d+\.\d+", found[0]), found
