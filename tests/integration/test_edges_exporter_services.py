"""Edge paths of the exporter against the real services: reconcile on a database lacking a
mapped column, the lock watcher behind a link that goes silent, and a Redis user that may
read but not set the notification flags."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa
from blackhole import Blackhole
from dbs import Db
from polling import async_wait_until
from privateredis import PrivateRedis
from prometheus_client import CollectorRegistry
from stocksentry.exporter.cli import main
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.lockwatch.watcher import LockWatcher

pytestmark = pytest.mark.integration

DDL = [
    "CREATE TABLE products (id INTEGER PRIMARY KEY, sku VARCHAR(64) UNIQUE NOT NULL,"
    " available_stock INTEGER NOT NULL, initial_stock INTEGER NOT NULL)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, external_ref VARCHAR(64),"
    " idempotency_key VARCHAR(64), status VARCHAR(16) NOT NULL, created_at {ts} NOT NULL)",
    "CREATE TABLE order_items (order_id INTEGER NOT NULL, product_id INTEGER NOT NULL,"
    " quantity INTEGER NOT NULL)",
]


def _shop(db: Db) -> None:
    """A clean shop: one SKU, one paid order of one unit within its allocation."""
    ts = "DATETIME(6)" if db.mysql else "TIMESTAMP WITH TIME ZONE"
    engine = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            for ddl in DDL:
                conn.exec_driver_sql(ddl.format(ts=ts))
            conn.exec_driver_sql("INSERT INTO products VALUES (1, 'EGG-01', 4, 5)")
            conn.exec_driver_sql(
                "INSERT INTO orders VALUES (1, 'ref-1', 'key-1', 'PAID', CURRENT_TIMESTAMP)"
            )
            conn.exec_driver_sql("INSERT INTO order_items VALUES (1, 1, 1)")
    finally:
        engine.dispose()


@pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)
def test_reconcile_on_a_database_lacking_the_allocation_column_is_incomplete(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    """A column the database does not have names that audit NOT AUDITED; the others run
    and the verdict is never an all-clear (exit 3)."""
    _shop(db)
    argv = ["reconcile", "--database", db.raw_url, "--allocation", "initial_stok"]
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert err == ""
    assert "verdict: INCOMPLETE" in out
    assert "every invariant holds" not in out
    (line,) = [x for x in out.splitlines() if x.startswith("oversold:")]
    assert line.startswith("oversold: NOT AUDITED — not in the database: ")
    assert "initial_stok" in line
    for kind in ("negative_stock", "duplicate_keys", "paid_without_items"):
        assert f"{kind}: audited, nothing found" in out

    assert main([*argv, "--format", "json"]) == 3
    out, err = capsys.readouterr()
    data = json.loads(out)
    assert data["checked"] == ["negative_stock", "duplicate_keys", "paid_without_items"]
    assert [(n["audit"], n["cause"]) for n in data["not_audited"]] == [
        ("oversold", "missing_table")
    ]
    assert err.count("\n") == 1
    assert err.startswith("stocksentry reconcile: oversold: NOT AUDITED — not in the database")

    # With the right column, the same shop holds every invariant.
    assert main(["reconcile", "--database", db.raw_url, "--allocation", "initial_stock"]) == 0
    assert "verdict: every invariant holds" in capsys.readouterr().out


def _samples(watcher: LockWatcher) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(watcher)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def _config(url: str, **extra: str) -> str:
    lines = [f"lock_watch:\n  url: {url}\n  patterns: ['lock:product:{{sku}}']"]
    lines += [f"  {k}: {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


async def test_a_lock_watcher_behind_a_silent_link_says_it_is_down_and_comes_back() -> None:
    """A partition closes nothing: only the health check's unanswered PING shows it. The
    watcher must say it is disconnected, drop what it followed, and subscribe again."""
    with PrivateRedis(notify="Kg$x") as server:
        async with Blackhole.before(server.url) as proxy:
            text = _config(
                proxy.url(server.url),
                health_check_interval="300ms",
                connect_timeout="500ms",
                reconnect_interval="100ms",
            )
            config = parse_config(text)
            assert config.lock_watch is not None
            watcher = LockWatcher(config.lock_watch)
            await watcher.start()
            client = aioredis.Redis.from_url(server.url)
            try:
                async with asyncio.timeout(10):
                    await watcher.wait_subscribed()
                await client.set("lock:product:EGG-01", "A", nx=True, px=60_000)
                await async_wait_until(
                    lambda: sum(
                        v
                        for (n, _), v in _samples(watcher).items()
                        if n == "stocksentry_lockwatch_events_total"
                    ),
                    timeout=10,
                    message="the lease followed",
                )
                proxy.cut()
                await async_wait_until(
                    lambda: not watcher.connected, timeout=10, message="the silence noticed"
                )
                down = _samples(watcher)
                assert down[("stocksentry_lockwatch_connected", ())] == 0.0
                assert (
                    down[("stocksentry_lockwatch_leases_lost_total", (("reason", "disconnect"),))]
                    == 1.0
                )
                await asyncio.sleep(0.3)
                assert (
                    _samples(watcher)[("stocksentry_lockwatch_disconnected_seconds_total", ())] > 0
                )
                proxy.heal()
                await async_wait_until(
                    lambda: watcher.reconnects, timeout=15, message="subscribed again"
                )
                back = _samples(watcher)
                assert back[("stocksentry_lockwatch_connected", ())] == 1.0
                assert back[("stocksentry_lockwatch_reconnects_total", ())] == 1.0
            finally:
                await client.aclose()
                await watcher.stop()


async def test_config_set_refused_says_so_and_the_flags_gauge_is_zero(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user that may read the flags but not set them: configure_notifications cannot
    help, and the watcher says which flags are missing rather than claiming they are set."""
    with PrivateRedis() as server:
        admin = aioredis.Redis.from_url(server.url)
        try:
            await admin.execute_command(
                "ACL", "SETUSER", "watcher", "on", ">pw", "~*", "&*", "+@all", "-config|set"
            )
        finally:
            await admin.aclose()
        url = f"redis://watcher:pw@127.0.0.1:{server.port}/0"
        text = (
            "lock_watch:\n  url_env: LOCKWATCH_URL\n  patterns: ['lock:product:{sku}']\n"
            "  configure_notifications: true\n"
        )
        config = parse_config(text, environ={"LOCKWATCH_URL": url})
        assert config.lock_watch is not None
        caplog.set_level(logging.INFO, "stocksentry.exporter.lockwatch")
        watcher = LockWatcher(config.lock_watch)
        await watcher.start()
        try:
            async with asyncio.timeout(10):
                await watcher.wait_subscribed()
            assert watcher.notifications is False
            assert _samples(watcher)[("stocksentry_lockwatch_notifications_enabled", ())] == 0.0
        finally:
            await watcher.stop()
        refused = [r.getMessage() for r in caplog.records if "CONFIG SET" in r.getMessage()]
        assert len(refused) == 1, refused
        assert "refused" in refused[0]
        assert not [r for r in caplog.records if "set it to" in r.getMessage()]


@pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)
def test_reconcile_as_a_user_who_may_not_read_a_table_audits_the_rest(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table the database user may not read is that audit's gap (NOT AUDITED, saying
    to grant SELECT), not an error that stops the others; exit 3, never an all-clear."""
    _shop(db)
    url = sa.engine.make_url(db.raw_url)
    user = f"ss_ro_{url.database}"[:32]
    admin = sa.create_engine(db.url, poolclass=sa.pool.NullPool)
    if db.mysql:
        # PyMySQL formats the statement: `%%` is the host wildcard `%`.
        setup = [
            f"CREATE USER '{user}'@'%%'",
            f"GRANT SELECT ON `{url.database}`.products TO '{user}'@'%%'",
            f"GRANT SELECT ON `{url.database}`.orders TO '{user}'@'%%'",
        ]
        teardown = [f"DROP USER IF EXISTS '{user}'@'%%'"]
    else:
        setup = [
            f'CREATE ROLE "{user}" LOGIN',
            f'GRANT SELECT ON products, orders TO "{user}"',
        ]
        teardown = [f'DROP OWNED BY "{user}"', f'DROP ROLE IF EXISTS "{user}"']
    try:
        with admin.begin() as conn:
            for statement in setup:
                conn.exec_driver_sql(statement)
        restricted = url.set(username=user, password=None).render_as_string(hide_password=False)
        argv = ["reconcile", "--database", restricted, "--allocation", "initial_stock"]
        assert main(argv) == 3
        out, err = capsys.readouterr()
        assert err == ""
        assert "verdict: INCOMPLETE" in out
        (line,) = [x for x in out.splitlines() if x.startswith("paid_without_items:")]
        assert line.startswith(
            "paid_without_items: NOT AUDITED — not readable by this database user: "
        ), line
        assert "grant it SELECT" in line
        for kind in ("negative_stock", "duplicate_keys"):
            assert f"{kind}: audited, nothing found" in out
        assert main([*argv, "--format", "json"]) == 3
        data = json.loads(capsys.readouterr().out)
        causes = {n["audit"]: n["cause"] for n in data["not_audited"]}
        assert causes["paid_without_items"] == "not_permitted"
        assert set(causes.values()) == {"not_permitted"}
    finally:
        with admin.begin() as conn:
            for statement in teardown:
                conn.exec_driver_sql(statement)
        admin.dispose()
