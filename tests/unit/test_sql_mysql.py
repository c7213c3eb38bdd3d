"""MySQL and MariaDB in the SQLAlchemy integration, without a server: the classifier's MySQL
syntax in the ``%s`` / ``%(name)s`` / ``?`` paramstyles, error numbers → refusals, and the
matched-rows reading of an ``UPDATE``'s 0. Against the real MariaDB:
``tests/integration/test_sqlalchemy.py``.
"""

from __future__ import annotations

from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from pymysql.constants import CLIENT
from sqlitedb import sqlite_engine
from stocksentry.instrumentation import ReservationConflict, Sentry, classify_exception
from stocksentry.instrumentation.outcomes import mysql_errno_of, refusal_of, status_code_of
from stocksentry.instrumentation.sqlalchemy import (
    classify_statement,
    instrument_sqlalchemy,
    uninstrument_sqlalchemy,
)
from stocksentry.instrumentation.sqlalchemy.dialects import (
    lossless_levels,
    mysql_matched_rows,
    zero_rows_check,
)

STYLES = {"format": "%s", "pyformat": "%s", "qmark": "?"}


@pytest.mark.parametrize("paramstyle", sorted(STYLES))
@pytest.mark.parametrize(
    ("suffix", "clause"),
    [
        ("FOR UPDATE", "for update"),
        ("FOR UPDATE NOWAIT", "for update"),
        ("FOR UPDATE SKIP LOCKED", "for update"),
        ("FOR UPDATE WAIT 3", "for update"),
        ("FOR SHARE", "for share"),
        ("FOR SHARE OF products NOWAIT", "for share"),
        ("LOCK IN SHARE MODE", "lock in share mode"),
        ("LIMIT 1 LOCK IN SHARE MODE", "lock in share mode"),
        ("LIMIT 1 FOR UPDATE", "for update"),
    ],
)
def test_mysql_locking_reads_are_locking_and_keyed(
    paramstyle: str, suffix: str, clause: str
) -> None:
    mark = STYLES[paramstyle]
    info = classify_statement(
        f"SELECT `available_stock` FROM `products` WHERE `sku` = {mark} {suffix}",
        paramstyle=paramstyle,
    )
    assert (info.kind, info.table, info.locking, info.protects_rows) == (
        "select",
        "products",
        True,
        True,
    )
    assert info.lock_clause == clause
    assert info.reads_stock
    assert info.keys == (("sku", (True, 0)),)


def test_a_column_named_lock_is_not_a_lock_clause() -> None:
    info = classify_statement(
        "SELECT available_stock FROM products WHERE sku = %s AND `lock` = 1", paramstyle="format"
    )
    assert (info.locking, info.keys) == (False, (("sku", (True, 0)),))


@pytest.mark.parametrize("paramstyle", sorted(STYLES))
def test_mysql_updates_and_deletes_with_modifiers_and_limit(paramstyle: str) -> None:
    m = STYLES[paramstyle]
    blind = classify_statement(
        f"UPDATE products SET available_stock = {m} WHERE sku = {m} LIMIT 1",
        paramstyle=paramstyle,
    )
    assert (blind.write, blind.conditional, blind.keys) == ("blind", False, (("sku", (True, 1)),))
    atomic = classify_statement(
        f"UPDATE LOW_PRIORITY IGNORE products SET available_stock = available_stock - {m}"
        f" WHERE sku = {m} AND available_stock >= {m} ORDER BY id LIMIT 1",
        paramstyle=paramstyle,
    )
    assert (atomic.table, atomic.write, atomic.conditional) == ("products", "self", True)
    assert atomic.keys == (("sku", (True, 1)),)
    delete = classify_statement(
        f"DELETE LOW_PRIORITY QUICK FROM products WHERE id = {m} LIMIT 1", paramstyle=paramstyle
    )
    assert (delete.kind, delete.table, delete.keys) == ("delete", "products", (("id", (True, 0)),))


def test_named_pyformat_parameters_of_the_pymysql_dialect() -> None:
    info = classify_statement(
        "UPDATE products SET available_stock=%(computed)s WHERE products.sku = %(sku_1)s",
        paramstyle="pyformat",
    )
    assert (info.write, info.keys) == ("blind", (("sku", (True, "sku_1")),))


def test_lock_tables() -> None:
    write = classify_statement("LOCK TABLES orders READ LOCAL, products AS p LOW_PRIORITY WRITE")
    assert (write.kind, write.table, write.locking, write.table_lock) == (
        "lock",
        "products",
        True,
        True,
    )
    assert write.lock_clause == "lock tables"
    other = classify_statement("LOCK TABLES orders WRITE")
    assert (other.table, other.locking, other.stock, other.table_lock) == (
        "orders",
        True,
        False,
        False,
    )


# --- error numbers ----------------------------------------------------------------------------


def wrapped(number: int, message: str) -> sa.exc.OperationalError:
    """A PyMySQL error as SQLAlchemy hands it to the application."""
    orig = pymysql.err.OperationalError(number, message)
    return sa.exc.OperationalError("SELECT 1", {}, orig)


def test_mysql_error_numbers_classify_like_their_sqlstates() -> None:
    deadlock = wrapped(1213, "Deadlock found when trying to get lock")
    timeout = wrapped(1205, "Lock wait timeout exceeded; try restarting transaction")
    nowait = wrapped(3572, "Statement aborted because lock(s) could not be acquired")
    assert [classify_exception(e) for e in (deadlock, timeout, nowait)] == [
        "deadlock",
        "lock_timeout",
        "lock_timeout",
    ]
    assert refusal_of(deadlock) == ("deadlock", "1213")
    assert refusal_of(timeout) == ("lock_timeout", "1205")
    assert mysql_errno_of(deadlock) == 1213
    assert status_code_of(wrapped(1146, "Table 'shop.x' doesn't exist")) == "1146"
    assert classify_exception(wrapped(1146, "Table 'shop.x' doesn't exist")) == "error"
    assert refusal_of(wrapped(2013, "Lost connection to MySQL server")) is None


def test_errno_attribute_wins_over_a_deadlocks_sqlstate() -> None:
    # MySQL Connector carries errno and sqlstate; a deadlock's SQLSTATE is 40001, which on
    # PostgreSQL would be a serialization failure.
    class DatabaseError(Exception):
        def __init__(self) -> None:
            super().__init__("1213 (40001): Deadlock found")
            self.errno = 1213
            self.sqlstate = "40001"

    DatabaseError.__module__ = "mysql.connector.errors"
    assert classify_exception(DatabaseError()) == "deadlock"


def test_other_libraries_integer_args_are_not_error_numbers() -> None:
    assert mysql_errno_of(OSError(1213, "not a database")) is None
    assert classify_exception(OSError(1213, "not a database")) == "error"
    assert classify_exception(ReservationConflict("out_of_stock")) == "out_of_stock"


# --- isolation and matched rows ---------------------------------------------------------------


def test_only_serializable_keeps_an_innodb_read_then_write() -> None:
    assert lossless_levels("mysql") == lossless_levels("mariadb") == {"SERIALIZABLE"}
    assert lossless_levels("postgresql") == {"REPEATABLE READ", "SERIALIZABLE"}
    assert lossless_levels("mssql") == frozenset()


class _Result:
    def __init__(self, message: bytes) -> None:
        self.message = message


class _Connection:
    def __init__(self, client_flag: int) -> None:
        self.client_flag = client_flag


class _DriverCursor:
    """What PyMySQL and aiomysql cursors keep after an UPDATE: the server's info text."""

    def __init__(self, message: bytes, client_flag: int) -> None:
        self._result = _Result(message)
        self.connection = _Connection(client_flag)


class _AdaptedCursor:
    """SQLAlchemy's asyncio adapter keeps the driver's cursor as ``_cursor``."""

    def __init__(self, inner: Any) -> None:
        self._cursor = inner


@pytest.mark.parametrize(
    ("message", "flag", "matched"),
    [
        (b"(Rows matched: 1  Changed: 0  Warnings: 0", 0, 1),
        (b"(Rows matched: 0  Changed: 0  Warnings: 0", 0, 0),
        (b"(Rows matched: 3  Changed: 0  Warnings: 0", CLIENT.FOUND_ROWS, 3),
        (b"", CLIENT.FOUND_ROWS, 0),  # no info text: with FOUND_ROWS the 0 is the matched rows
        (b"", 0, -1),  # neither: unknown
    ],
)
def test_matched_rows_from_the_info_text_or_the_flag(
    message: bytes, flag: int, matched: int
) -> None:
    assert mysql_matched_rows(_DriverCursor(message, flag)) == matched
    assert mysql_matched_rows(_AdaptedCursor(_DriverCursor(message, flag))) == matched


def test_zero_rows_check_is_mysql_only() -> None:
    assert zero_rows_check("mysql") is mysql_matched_rows
    assert zero_rows_check("mariadb") is mysql_matched_rows
    assert zero_rows_check("postgresql") is None
    assert zero_rows_check("sqlite") is None


# --- the incident's `?` placeholders through the listeners (SQLite's qmark driver) -----------


def test_qmark_driver_sql_read_then_write_is_flagged() -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, log=False, trace=False)
    engine = sqlite_engine(
        "sqlite://",
        "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT, available_stock INTEGER)",
        "INSERT INTO products VALUES (1, 'EGG-01', 5)",
    )
    assert engine.dialect.paramstyle == "qmark"
    instrument_sqlalchemy(engine, sentry=sentry)
    try:
        with sentry.reservation("EGG-01", strategy="unsafe"):
            with engine.begin() as conn:
                (available,) = conn.exec_driver_sql(
                    "SELECT available_stock FROM products WHERE sku = ?", ("EGG-01",)
                ).one()
            with engine.begin() as conn:
                conn.exec_driver_sql(
                    "UPDATE products SET available_stock = ? WHERE sku = ?",
                    (available - 1, "EGG-01"),
                )
        with sentry.reservation("EGG-01", strategy="atomic"), engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE products SET available_stock = available_stock - 1"
                " WHERE sku = ? AND available_stock >= 1",
                ("EGG-01",),
            )
    finally:
        uninstrument_sqlalchemy(engine)
        engine.dispose()
    assert (
        registry.get_sample_value("stock_unsafe_read_modify_write_total", {"table": "products"})
        == 1
    )


# --- MySQL's lexical rules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "locking", "keys"),
    [
        # A backslash-escaped quote stays inside the string; # starts a comment.
        (
            r"SELECT available_stock FROM products WHERE sku = 'it\'s FOR UPDATE' # FOR UPDATE",
            False,
            (("sku", (False, "it's FOR UPDATE")),),
        ),
        (
            r"SELECT available_stock FROM products WHERE sku = 'a\\' FOR UPDATE",
            True,
            (("sku", (False, "a\\")),),
        ),
        # Double quotes make a string (without ANSI_QUOTES), so the key is a value.
        (
            'SELECT available_stock FROM products WHERE sku = "EGG-01"',
            False,
            (("sku", (False, "EGG-01")),),
        ),
        (
            "SELECT available_stock FROM products WHERE sku = _utf8mb4'EGG' LOCK IN SHARE MODE",
            True,
            (("sku", (False, "EGG")),),
        ),
        (
            "SELECT available_stock FROM products WHERE sku = 'unterminated\\",
            False,
            (("sku", (False, "unterminated\\")),),
        ),
    ],
)
def test_mysql_lexical_rules(sql: str, locking: bool, keys: tuple[Any, ...]) -> None:
    for dialect in ("mysql", "mariadb"):
        info = classify_statement(sql, paramstyle="format", dialect=dialect)
        assert (info.locking, info.keys) == (locking, keys)


def test_without_the_mysql_dialect_its_escapes_are_not_read() -> None:
    sql = r"SELECT available_stock FROM products WHERE sku = 'it\'s FOR UPDATE' # x"
    assert classify_statement(sql, paramstyle="format", dialect="mysql").locking is False
    # PostgreSQL's rules: the backslash is a character and the string ends at \', so the
    # FOR UPDATE inside it is read as SQL. The listeners pass the engine's dialect.
    assert classify_statement(sql, paramstyle="format").locking is True
