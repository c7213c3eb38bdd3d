"""The ``db`` fixture: one test per behaviour, run on PostgreSQL and on MariaDB."""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Db:
    """A fresh, empty database: its URL and its dialect (``postgresql`` or ``mysql``)."""

    url: str
    dialect: str

    @property
    def mysql(self) -> bool:
        return self.dialect == "mysql"


@pytest.fixture(params=["postgresql", "mariadb"])
def db(request: pytest.FixtureRequest) -> Db:
    if request.param == "mariadb":
        return Db(request.getfixturevalue("mysql_database"), "mysql")
    return Db(request.getfixturevalue("pg_database"), "postgresql")
