"""The ``db`` fixture: one test per behaviour, run on PostgreSQL and on MariaDB."""

from __future__ import annotations

import pytest
from shopdb import Db


@pytest.fixture(params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Db:
    if request.param == "mariadb":
        return Db(request.getfixturevalue("mysql_database"), "mysql")
    return Db(request.getfixturevalue("pg_database"), "postgresql")
