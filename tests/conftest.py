"""Shared fixtures: a fresh registry per test, and throw-away PostgreSQL databases.

PostgreSQL and Redis are the real services (``make test`` starts them when they are down);
the URLs come from ``STOCKSENTRY_TEST_PG`` (a server URL whose database part is replaced)
and ``STOCKSENTRY_TEST_REDIS``. Each test run makes its own databases and keys and
removes them afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

PG_SERVER = os.environ.get("STOCKSENTRY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STOCKSENTRY_TEST_REDIS", "redis://127.0.0.1:6379/0")


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry of the test's own, so values start at zero."""
    return CollectorRegistry()


def _server_url(database: str) -> str:
    base, _, _ = PG_SERVER.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture
def pg_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database; yields its psycopg URL, dropped afterwards."""
    import psycopg

    name = f"stocksentry_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _server_url(name)
    finally:
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_sqlalchemy_url(pg_database: str) -> str:
    """The fresh database as a SQLAlchemy URL (psycopg 3 driver)."""
    return pg_database.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of the test's own in the real Redis; its keys are deleted afterwards."""
    import redis

    prefix = f"stocksentry-test:{uuid.uuid4().hex[:12]}:"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        yield prefix
    finally:
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)
        client.close()
