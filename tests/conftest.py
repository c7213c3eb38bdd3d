"""Shared fixtures: a fresh registry per test, and throw-away PostgreSQL databases.

PostgreSQL and Redis are the real services (``make test`` starts them when they are down);
the URLs (:mod:`services`) come from ``STOCKSENTRY_TEST_PG`` (a server URL whose database
part is replaced) and ``STOCKSENTRY_TEST_REDIS``. Each test run makes its own databases and
keys and removes them afterwards.

Every test under ``tests/integration`` carries the ``integration`` mark (a module's
``pytestmark = pytest.mark.integration``): collection fails otherwise, so that
``-m "not integration"`` and ``tests/unit`` stay free of services. ``tests/unit/conftest.py``
guards the other side: a unit test that reaches a service fails.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from services import PG_SERVER, REDIS_URL

INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fail the run when a test of ``tests/integration`` lacks the ``integration`` mark."""
    unmarked = sorted(
        {
            item.nodeid.split("::", 1)[0]
            for item in items
            if item.path.is_relative_to(INTEGRATION_DIR)
            and item.get_closest_marker("integration") is None
        }
    )
    if unmarked:
        raise pytest.UsageError(
            "tests without the integration mark in tests/integration (add "
            "`pytestmark = pytest.mark.integration` to the module): " + ", ".join(unmarked)
        )


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
