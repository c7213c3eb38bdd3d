"""The ``db`` fixture: a fresh PostgreSQL, then a fresh MariaDB database (see dbs.py)."""

from __future__ import annotations

import pytest
from dbs import Db, mariadb, postgresql


@pytest.fixture(params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Db:
    """A fresh database of each kind in turn (``indirect`` parametrisation picks one)."""
    if request.param == "postgresql":
        return postgresql(request.getfixturevalue("pg_database"))
    return mariadb(request.getfixturevalue("mysql_database"))
