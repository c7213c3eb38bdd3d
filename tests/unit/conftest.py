"""Unit tests touch no service and start no service binary: :mod:`service_guard` refuses.

Each unit test runs with the guard on; the integration suite's fixtures are replaced by
ones that fail, so a unit test asking for a database says where it belongs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from service_guard import ServiceUsedInUnitTest, services_refused


@pytest.fixture(autouse=True)
def _no_services(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Switch the guard on for the test (and its fixtures)."""
    with services_refused(monkeypatch):
        yield


@pytest.fixture
def pg_database() -> str:
    """Unit tests get no PostgreSQL database: the fixture lives in the integration suite."""
    raise ServiceUsedInUnitTest("pg_database is for tests/integration")


@pytest.fixture
def redis_prefix() -> str:
    """Unit tests get no Redis: the fixture lives in the integration suite."""
    raise ServiceUsedInUnitTest("redis_prefix is for tests/integration")
