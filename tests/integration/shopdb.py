"""What the ``db`` fixture (conftest.py) gives a test: one database, either dialect."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Db:
    """A fresh, empty database: its URL and its dialect (``postgresql`` or ``mysql``)."""

    url: str
    dialect: str

    @property
    def mysql(self) -> bool:
        return self.dialect == "mysql"
