"""Fencing tokens, end to end on real Redis and PostgreSQL.

Two holders of one lock: the first one's lease runs out mid-work, the second acquires it
(a higher token) and writes, then the first writes with its stale token. The database
refuses that write when the UPDATE compares the token (``AND fence_token < :t``) and the
SQLAlchemy integration counts it either way; the normal path counts nothing. TTLs are
short but far from the work's pauses (0.2 s against 0.4 s), so the values are exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import lockscenarios
import pottery
import pytest
import redis
import redis.asyncio
import sqlalchemy as sa
from lockscenarios import value
from prometheus_client import CollectorRegistry
from redis.exceptions import LockNotOwnedError
from services import REDIS_URL
from sqlalchemy.ext.asyncio import create_async_engine
from stocksentry.instrumentation import Sentry, events
from stocksentry.instrumentation.heldlocks import held_locks
from stocksentry.instrumentation.locks import (
    InstrumentedAsyncLock,
    InstrumentedLock,
    InstrumentedRedlock,
    instrument_lock,
)
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy, uninstrument_sqlalchemy
from stocksentry.instrumentation.sqlalchemy.fencing import FencePlan, fence_plan
from stocksentry.instrumentation.sqlalchemy.tokens import tokenize
from structlog.testing import capture_logs

pytestmark = pytest.mark.integration

# The Redis client fixture of lockscenarios, named here so that pytest finds it.
client = lockscenarios.client

STALE = "stock_lock_stale_fencing_token_total"
SCHEMA = (
    "CREATE TABLE products (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " sku TEXT UNIQUE NOT NULL, available_stock INTEGER NOT NULL,"
    " fence_token BIGINT NOT NULL DEFAULT 0)",
    "INSERT INTO products (sku, available_stock) VALUES ('EGG-01', 10)",
)
READ = sa.text("SELECT available_stock FROM products WHERE sku = :sku")
# The pattern the docs give: the database refuses a token not above the stored one.
FENCED = sa.text(
    "UPDATE products SET available_stock = :v, fence_token = :t"
    " WHERE sku = :sku AND fence_token < :t"
)
UNGUARDED = sa.text("UPDATE products SET available_stock = :v, fence_token = :t WHERE sku = :sku")
TTL = 0.2
WORK = 0.4


@pytest.fixture
def sentry(registry: CollectorRegistry) -> Sentry:
    return Sentry(registry=registry, log=True, trace=False)


def fenced_engine(url: str, sentry: Sentry) -> sa.Engine:
    engine = sa.create_engine(url, pool_size=4)
    with engine.begin() as conn:
        for statement in SCHEMA:
            conn.exec_driver_sql(statement)
    instrument_sqlalchemy(engine, sentry=sentry, fencing={"products": "fence_token"})
    return engine


@pytest.fixture
def engine(pg_sqlalchemy_url: str, sentry: Sentry) -> Iterator[sa.Engine]:
    engine = fenced_engine(pg_sqlalchemy_url, sentry)
    yield engine
    uninstrument_sqlalchemy(engine)
    engine.dispose()


def row(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        stock, token = conn.execute(
            sa.text("SELECT available_stock, fence_token FROM products WHERE sku = 'EGG-01'")
        ).one()
    return int(stock), int(token)


def reserve_one(engine: sa.Engine, statement: sa.TextClause, token: int) -> int:
    """Read, compute, write with ``token``: the rowcount of the write."""
    with engine.begin() as conn:
        available = conn.execute(READ, {"sku": "EGG-01"}).scalar_one()
        result = conn.execute(statement, {"v": available - 1, "t": token, "sku": "EGG-01"})
        return int(result.rowcount)


def second_holder(make_lock: Callable[[], Any], engine: sa.Engine, statement: Any) -> list[int]:
    """Acquire in another thread, write with the (higher) token, release; its token."""
    tokens: list[int] = []

    def run() -> None:
        lock = make_lock()
        assert lock.acquire(blocking=False)
        tokens.append(lock.fencing_token)
        assert reserve_one(engine, statement, lock.fencing_token) == 1
        lock.release()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return tokens


def test_fence_plan_reads_the_token_and_the_guard() -> None:
    def plan_of(sql: str, paramstyle: str) -> FencePlan | None:
        return fence_plan(tokenize(sql, paramstyle), "fence_token")

    plan = plan_of(
        "UPDATE products SET stock = %(v)s, fence_token = %(t)s"
        " WHERE sku = %(s)s AND fence_token <= %(t)s",
        "pyformat",
    )
    assert plan is not None
    assert (plan.token, plan.guard) == ((True, "t"), "<=")
    assert plan_of("UPDATE products SET stock = 1 WHERE sku = 'x'", "named") is None
    unguarded = plan_of("UPDATE p SET fence_token = 7 WHERE sku = 'x'", "named")
    assert unguarded is not None
    assert (unguarded.token, unguarded.guard) == ((False, 7), None)


@pytest.mark.parametrize("statement", [FENCED, UNGUARDED], ids=["refused", "unguarded"])
def test_redis_py_holder_whose_lock_expired_writes_a_stale_token(
    engine: sa.Engine,
    client: redis.Redis,
    redis_prefix: str,
    sentry: Sentry,
    registry: CollectorRegistry,
    statement: sa.TextClause,
) -> None:
    def make_lock() -> InstrumentedLock:
        raw = client.lock(redis_prefix + "sku:EGG-01", timeout=TTL)
        return InstrumentedLock(raw, name="checkout", sentry=sentry, fencing=True)

    first = make_lock()
    with capture_logs() as lines:
        assert first.acquire(blocking=False)
        token = first.fencing_token
        assert token is not None
        assert [h.fencing_token for h in held_locks()] == [token]
        with engine.connect() as conn:
            available = conn.execute(READ, {"sku": "EGG-01"}).scalar_one()
        time.sleep(WORK)  # the lease runs out: a second holder gets in
        (second,) = second_holder(make_lock, engine, statement)
        assert second > token
        with engine.begin() as conn:
            result = conn.execute(statement, {"v": available - 1, "t": token, "sku": "EGG-01"})
            written = result.rowcount
        with pytest.raises(LockNotOwnedError):
            first.release()
    stale = [line for line in lines if line["event"] == events.STALE_FENCING_TOKEN.name]
    assert value(registry, STALE, lock="checkout", table="products") == 1
    (line,) = stale
    assert set(line) - {"event", "log_level"} == set(events.STALE_FENCING_TOKEN.fields)
    assert (line["lock"], line["table"], line["key"]) == ("checkout", "products", "EGG-01")
    assert (line["token"], line["highest"]) == (token, second)
    if statement is FENCED:
        # The database refused it: the second holder's write stands.
        assert written == 0
        assert line["refused"] is True
        assert row(engine) == (9, second)
    else:
        # Without the comparison it went through (the lost update fencing exists to stop).
        assert written == 1
        assert line["refused"] is False
        assert row(engine) == (9, token)


def test_normal_path_counts_nothing_and_tokens_increase(
    engine: sa.Engine,
    client: redis.Redis,
    redis_prefix: str,
    sentry: Sentry,
    registry: CollectorRegistry,
) -> None:
    raw = client.lock(redis_prefix + "sku:EGG-01", timeout=5)
    lock = instrument_lock(raw, name="checkout", sentry=sentry, fencing=True)
    tokens = []
    for _ in range(4):
        with lock:
            token = lock.fencing_token
            assert token is not None
            tokens.append(token)
            assert reserve_one(engine, FENCED, token) == 1
            # The same holder writing again with the same token is not stale either.
            assert reserve_one(engine, UNGUARDED, token) == 1
        assert lock.fencing_token is None  # released
    assert tokens == sorted(set(tokens))
    assert len(tokens) == 4
    assert row(engine) == (2, tokens[-1])
    assert value(registry, STALE, lock="checkout", table="products") == 0
    # A wrapper without fencing=True costs no round trip and hands out nothing.
    plain = InstrumentedLock(client.lock(redis_prefix + "plain", timeout=5), sentry=sentry)
    with plain:
        assert plain.fencing_token is None
    assert client.get(redis_prefix + "plain:fence") is None


def test_pottery_redlock_tokens_and_a_stale_holder(
    engine: sa.Engine,
    client: redis.Redis,
    redis_prefix: str,
    sentry: Sentry,
    registry: CollectorRegistry,
) -> None:
    key = redis_prefix + "redlock"

    def make_lock() -> InstrumentedRedlock:
        raw = pottery.Redlock(key=key, masters={client}, auto_release_time=TTL)
        return InstrumentedRedlock(raw, name="redlock", sentry=sentry, fencing=True)

    try:
        first = make_lock()
        assert first.acquire(blocking=False)
        token = first.fencing_token
        assert token is not None
        with engine.connect() as conn:
            available = conn.execute(READ, {"sku": "EGG-01"}).scalar_one()
        time.sleep(WORK)
        (second,) = second_holder(make_lock, engine, FENCED)
        assert second == token + 1
        with engine.begin() as conn:
            refused = conn.execute(FENCED, {"v": available - 1, "t": token, "sku": "EGG-01"})
            assert refused.rowcount == 0
        with pytest.raises(pottery.ReleaseUnlockedLock):
            first.release()
        assert value(registry, STALE, lock="redlock", table="products") == 1
        assert row(engine) == (9, second)
    finally:
        client.delete("redlock:" + key, "redlock:" + key + ":fence")


async def test_asyncio_lock_hands_out_increasing_tokens(
    pg_database: str, redis_prefix: str, sentry: Sentry, registry: CollectorRegistry
) -> None:
    url = pg_database.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        for statement in SCHEMA:
            await conn.exec_driver_sql(statement)
    instrument_sqlalchemy(engine, sentry=sentry, fencing={"products": "fence_token"})
    aclient = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        lock = InstrumentedAsyncLock(
            aclient.lock(redis_prefix + "sku:EGG-01", timeout=5),
            name="checkout",
            sentry=sentry,
            fencing=True,
        )
        tokens = []
        for _ in range(2):
            async with lock:
                tokens.append(lock.fencing_token)
        assert tokens[0] is not None
        assert tokens[1] == tokens[0] + 1
        async with engine.begin() as conn:
            ok = await conn.execute(FENCED, {"v": 5, "t": tokens[1], "sku": "EGG-01"})
            stale = await conn.execute(FENCED, {"v": 4, "t": tokens[0], "sku": "EGG-01"})
        assert (ok.rowcount, stale.rowcount) == (1, 0)
        assert value(registry, STALE, lock="unknown", table="products") == 1
    finally:
        await aclient.aclose()
        uninstrument_sqlalchemy(engine)
        await engine.dispose()


def test_fencing_names_unknown_tables_at_set_up(pg_sqlalchemy_url: str, sentry: Sentry) -> None:
    engine = sa.create_engine(pg_sqlalchemy_url)
    try:
        with pytest.raises(ValueError, match="orders"):
            instrument_sqlalchemy(engine, sentry=sentry, fencing={"orders": "fence_token"})
    finally:
        engine.dispose()
