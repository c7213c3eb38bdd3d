"""Database URLs from the command line are parsed once and never shown with a password."""

from __future__ import annotations

import subprocess
import sys

import pytest
from stocksentry.exporter.dburl import (
    UNPARSEABLE,
    dialect_of,
    mysql_connect_args,
    parse_url,
    scrub,
    shown,
)


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        # Plain PostgreSQL gets psycopg.
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite"),
        # MySQL and MariaDB URLs stay as written for SQLAlchemy.
        ("mysql://u@h/db", "mysql"),
        ("mariadb://u@h/db", "mariadb"),
        ("mysql+aiomysql://u@h/db", "mysql+aiomysql"),
    ],
)
def test_parse_url_gives_sqlalchemy_its_driver(text: str, driver: str) -> None:
    assert parse_url(text).drivername == driver


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


def test_unparseable_input_is_not_echoed() -> None:
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
    assert (result.failed, result.attempted) == (0, 3)


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        ("postgresql://u@h/db", "postgresql"),
        ("postgres://u@h/db", "postgresql"),
        ("host=h dbname=db", "postgresql"),
        ("mysql://u@h/db", "mysql"),
        ("mysql+pymysql://u@h/db", "mysql"),
        ("mariadb://u@h/db", "mariadb"),
        ("mariadb+aiomysql://u@h/db", "mariadb"),
        ("sqlite:///x.db", "sqlite"),
        ("mssql://u@h/db", None),
        ("not a url", None),
    ],
)
def test_the_dialect_of_a_url(text: str, dialect: str | None) -> None:
    assert dialect_of(text) == dialect


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mysql://u:hunter2@h:3306/db", "mysql://u:***@h:3306/db"),
        (
            "mariadb://u:hunter2@h/db?charset=utf8mb4",
            "mariadb://u:***@h/db?charset=utf8mb4",
        ),
        ("mysql+aiomysql://u:hunter2@h/db?password=hunter2", "mysql+aiomysql://u:***@h/db"),
    ],
)
def test_a_mysql_url_is_shown_without_its_password(text: str, expected: str) -> None:
    assert shown(text) == expected
    assert "hunter2" not in scrub(f"Access denied for {text} (hunter2)", text)


def test_mysql_connect_args_decode_the_url() -> None:
    args = mysql_connect_args(
        "mariadb+aiomysql://ap%40p:p%40ss@db.internal:3307/shop?charset=utf8mb4"
    )
    assert args == {
        "host": "db.internal",
        "port": 3307,
        "user": "ap@p",
        "password": "p@ss",
        "db": "shop",
        "charset": "utf8mb4",
    }
    assert mysql_connect_args("mysql://h")["port"] == 3306
    assert mysql_connect_args("mysql://u@h/db?unix_socket=/run/mysqld.sock")["unix_socket"] == (
        "/run/mysqld.sock"
    )


@pytest.mark.parametrize(
    "text",
    [
        "mysql://u:hunter2@h/db?passwd=hunter2",
        "mysql://u:hunter2@h/db?ssl_verify_cert=hunter2",
        "mysql://u:hunter2@h:notaport/db",
        "postgresql://u:hunter2@h/db",
    ],
)
def test_mysql_connect_args_refuse_without_echoing(text: str) -> None:
    with pytest.raises(ValueError, match="MySQL") as caught:
        mysql_connect_args(text)
    assert "hunter2" not in str(caught.value)
