"""Shared fixtures: a fresh registry per test, throw-away PostgreSQL and MariaDB databases.

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

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from services import MYSQL_SERVER, PG_SERVER, REDIS_URL

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


def _mysql_params(url: str) -> dict[str, object]:
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
    }


@pytest.fixture
def mysql_database() -> Iterator[str]:
    """A fresh, empty MariaDB/MySQL database; yields its ``mysql://`` URL, dropped afterwards."""
    import pymysql

    name = f"stocksentry_test_{uuid.uuid4().hex[:12]}"
    params = _mysql_params(MYSQL_SERVER)
    conn = pymysql.connect(**params, autocommit=True)  # type: ignore[arg-type]
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    base, _, _ = MYSQL_SERVER.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        conn = pymysql.connect(**params, autocommit=True)  # type: ignore[arg-type]
        try:
            with conn.cursor() as cur:
                # Sessions a test left open would hold metadata locks and stall the drop.
                cur.execute(
                    "SELECT id FROM information_schema.processlist WHERE db = %s AND id <> "
                    "connection_id()",
                    (name,),
                )
                for (session,) in cur.fetchall():
                    # It may have ended on its own meanwhile.
                    with contextlib.suppress(pymysql.MySQLError):
                        cur.execute(f"KILL {int(session)}")
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            conn.close()


@pytest.fixture
def mysql_sqlalchemy_url(mysql_database: str) -> str:
    """The fresh MariaDB database as a SQLAlchemy URL (PyMySQL driver)."""
    return mysql_database.replace("mysql://", "mysql+pymysql://", 1)


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
