"""Database URLs from the command line are parsed once and never shown with a password."""

from __future__ import annotations

import subprocess
import sys

import pytest
from stocksentry.exporter.dburl import UNPARSEABLE, parse_url, password, scrub, shown


def test_plain_postgresql_gets_psycopg() -> None:
    assert parse_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert parse_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert parse_url("sqlite:///x.db").drivername == "sqlite"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://u:hunter2@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgresql://u@h/db?password=hunter2", "postgresql+psycopg://u@h/db"),
        ("host=h user=u password=hunter2", UNPARSEABLE),
        (
            "postgresql://u:hunter2@h/db?sslmode=require&sslpassword=hunter2",
            "postgresql+psycopg://u:***@h/db?sslmode=require",
        ),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("sqlite:////var/lib/shop.db", "sqlite:////var/lib/shop.db"),
    ],
)
def test_shown_never_holds_the_password(text: str, expected: str) -> None:
    assert shown(text) == expected


def test_password_and_unparseable_input() -> None:
    assert password("postgresql://u:hunter2@h/db") == "hunter2"
    assert password("postgresql://u@h/db") is None
    with pytest.raises(ValueError, match="not a database URL") as caught:
        parse_url("host=h password=hunter2")
    assert "hunter2" not in str(caught.value)


def test_scrub_blanks_every_secret_of_the_url() -> None:
    url = "postgresql://u:s%40cret@h/db?password=hunter2"
    message = "auth failed: s@cret / s%40cret / hunter2"
    assert scrub(message, url) == "auth failed: *** / *** / ***"


def test_demo_does_not_echo_an_unparseable_database() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stocksentry.exporter",
            "demo",
            "--database",
            "host=h password=hunter2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "hunter2" not in done.stdout + done.stderr


def test_docstring_examples() -> None:
    import doctest

    from stocksentry.exporter import dburl

    result = doctest.testmod(dburl)
    assert (result.failed, result.attempted) == (0, 2)
