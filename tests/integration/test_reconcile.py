"""`stocksentry reconcile` finds exactly the seeded violations, on PostgreSQL, MariaDB and
SQLite."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from stocksentry.exporter.commandline import ExitCode
from stocksentry.exporter.config import SchemaConfig, parse_config
from stocksentry.exporter.investigate.reconcile import (
    ReconcileError,
    Report,
    exit_status,
    format_table,
    parse_since,
    read_only,
    reconcile,
)

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "stocksentry.exporter", "reconcile"]
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

DDL = [
    """CREATE TABLE products (id INTEGER PRIMARY KEY, sku VARCHAR(64) UNIQUE NOT NULL,
       available_stock INTEGER NOT NULL, initial_stock INTEGER NOT NULL)""",
    """CREATE TABLE orders (id INTEGER PRIMARY KEY, external_ref VARCHAR(64),
       idempotency_key VARCHAR(64), status VARCHAR(16) NOT NULL,
       created_at TIMESTAMP WITH TIME ZONE NOT NULL)""",
    """CREATE TABLE order_items (order_id INTEGER NOT NULL, product_id INTEGER NOT NULL,
       quantity INTEGER NOT NULL)""",
]


def driver_url(url: str) -> str:
    """``url`` with a driver SQLAlchemy has here (``mysql://`` would want mysqlclient)."""
    return url.replace("mysql://", "mysql+pymysql://", 1)


def create_tables(conn: sa.Connection) -> None:
    for ddl in DDL:
        if conn.dialect.name in ("mysql", "mariadb"):
            # MySQL has no time zone in a column type: the times are UTC.
            ddl = ddl.replace("TIMESTAMP WITH TIME ZONE", "DATETIME(6)")
        conn.execute(sa.text(ddl))


def seed(url: str, *, violations: bool) -> None:
    """Three SKUs; with violations: EGG-01 at -2 and oversold by 3 (5 paid of 2), one
    external_ref with two orders, one idempotency key with three, one paid order without
    items, and one old duplicate before the sale."""
    engine = sa.create_engine(driver_url(url))
    with engine.begin() as conn:
        create_tables(conn)
        conn.execute(
            sa.text(
                "INSERT INTO products VALUES (1, 'EGG-01', :s, 2), (2, 'EGG-02', 0, 3),"
                " (3, 'EGG-03', 7, 10)"
            ),
            {"s": -2 if violations else 0},
        )
        orders = []
        items = []
        paid_egg01 = 5 if violations else 2
        for n in range(paid_egg01):
            orders.append((n + 1, f"ref-{n}", f"key-{n}", "PAID", NOW))
            items.append((n + 1, 1, 1))
        base = 100
        for n in range(3):  # EGG-02: exactly its allocation
            orders.append((base + n, f"ref2-{n}", None, "COMPLETED", NOW))
            items.append((base + n, 2, 1))
        orders.append((200, "ref3-0", None, "CANCELLED", NOW))  # not paid: never counts
        items.append((200, 3, 50))
        if violations:
            orders.append((300, "ref-0", None, "PAID", NOW))  # second order of ref-0
            items.append((300, 3, 1))
            orders.append((301, "dup-a", "key-x", "PAID", NOW))
            orders.append((302, "dup-b", "key-x", "PAID", NOW))
            orders.append((303, "dup-c", "key-x", "PAID", NOW))
            items.extend([(301, 3, 1), (302, 3, 1)])  # 303 is paid without items
            orders.append((400, "old", None, "PAID", NOW - timedelta(days=3)))
            orders.append((401, "old", None, "PAID", NOW - timedelta(days=3)))
            items.extend([(400, 3, 1), (401, 3, 1)])
        conn.execute(
            sa.text("INSERT INTO orders VALUES (:id, :ref, :key, :status, :at)"),
            [dict(zip(("id", "ref", "key", "status", "at"), row, strict=True)) for row in orders],
        )
        conn.execute(
            sa.text("INSERT INTO order_items VALUES (:o, :p, :q)"),
            [{"o": o, "p": p, "q": q} for o, p, q in items],
        )
    engine.dispose()


SCHEMA = parse_config(
    "schema:\n  products:\n    allocation: initial_stock\n  orders:\n"
    "    idempotency_key: idempotency_key\n",
    environ={},
).schema


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shop.db'}"
    elif request.param == "mariadb":
        # The plain mysql:// URL a user gives: reconcile picks the driver.
        yield request.getfixturevalue("mysql_database")
    else:
        yield request.getfixturevalue("pg_sqlalchemy_url")


def test_finds_exactly_the_seeded_violations(database: str) -> None:
    seed(database, violations=True)
    report = reconcile(database, schema=SCHEMA, since=NOW - timedelta(hours=1))
    assert report.negative_stock == [{"sku": "EGG-01", "stock": -2}]
    assert report.oversold == [
        {"sku": "EGG-01", "allocation": 2, "sold_units": 5, "paid_orders": 5, "oversold_units": 3}
    ]
    assert report.duplicate_keys == [
        {"kind": "external_ref", "key": "ref-0", "orders": 2},
        {"kind": "idempotency_key", "key": "key-x", "orders": 3},
    ]
    assert report.paid_without_items == [{"order_id": "303", "status": "PAID"}]
    assert report.violations == 5
    # Without --since, the old duplicate before the sale shows too.
    everything = reconcile(database, schema=SCHEMA)
    assert {"kind": "external_ref", "key": "old", "orders": 2} in everything.duplicate_keys


def test_clean_database_holds_every_invariant(database: str) -> None:
    seed(database, violations=False)
    report = reconcile(database, schema=SCHEMA)
    assert report.violations == 0
    assert report.checked == ("negative_stock", "oversold", "duplicate_keys", "paid_without_items")


def test_one_sku_and_no_allocation(database: str) -> None:
    seed(database, violations=True)
    report = reconcile(database, schema=SCHEMA, sku="EGG-02")
    assert report.violations == 0
    report = reconcile(database, schema=SCHEMA, sku="EGG-03")
    # Findings are listed per kind: external references first, then idempotency keys.
    assert report.duplicate_keys == [
        {"kind": "external_ref", "key": "old", "orders": 2},
        {"kind": "idempotency_key", "key": "key-x", "orders": 2},
    ]
    plain = reconcile(database, schema=SchemaConfig())
    assert "oversold" not in plain.checked
    assert plain.oversold == []
    assert plain.negative_stock == [{"sku": "EGG-01", "stock": -2}]
    assert [(n.audit, n.cause) for n in plain.not_audited] == [("oversold", "no_allocation")]
    assert "--allocation" in plain.not_audited[0].reason
    assert exit_status(plain) == ExitCode.FINDINGS  # the negative stock is still a finding


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``stocksentry reconcile *argv``, run to its end."""
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60)


def findings_of_cli(database: str) -> dict[str, Any]:
    """The JSON report of ``stocksentry reconcile`` on ``database``, which found violations."""
    done = cli("--database", database, "--allocation", "initial_stock", "--format", "json")
    assert done.returncode == 1, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_cli_json_and_exit_codes(pg_sqlalchemy_url: str, pg_database: str) -> None:
    seed(pg_sqlalchemy_url, violations=True)
    data = findings_of_cli(pg_database)
    assert set(data) >= {"negative_stock", "oversold", "duplicate_keys", "paid_without_items"}
    assert data["negative_stock"] == [{"sku": "EGG-01", "stock": -2}]
    assert data["violations"] == 5  # ref-0, old (no --since) and no idempotency mapping

    table = cli("--database", pg_database, "--allocation", "initial_stock", "--sku", "EGG-02")
    assert table.returncode == 0, table.stderr
    assert "verdict: every invariant holds" in table.stdout
    # paid_without_items names no SKU: out of the scope of --sku, not a gap in the audit.
    assert "paid_without_items: not in scope" in table.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--database", "postgresql://u:pw@127.0.0.1:1/x"], "connection"),
        (["--database", "nosuchdriver://x"], "--database"),
        (["--database", "sqlite:///:memory:", "--since", "yesterday"], "--since"),
        (["--database", "sqlite:///:memory:", "--allocation", "a;drop"], "--allocation"),
        (["--database", "sqlite:///:memory:"], "no such table"),
        ([], "--database is required"),
        (["--database", "sqlite:///:memory:", "--since", "999999999d"], "--since"),
        (["--database", "mysql://u:pw@127.0.0.1:1/x"], "database mysql://u:***@127.0.0.1:1/x"),
        (["--database", "mysql+nosuchdriver://u:pw@127.0.0.1/x"], "--database"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str) -> None:
    done = cli(*argv)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert "pw@" not in lines[0]


def test_parse_since() -> None:
    assert parse_since("2h", now=NOW) == NOW - timedelta(hours=2)
    assert parse_since("2026-11-29T10:00:00Z") == datetime(2026, 11, 29, 10, tzinfo=UTC)
    assert parse_since("2026-11-29T10:00:00") == datetime(2026, 11, 29, 10, tzinfo=UTC)
    with pytest.raises(ReconcileError, match="--since"):
        parse_since("soon")
    # One duration grammar, Prometheus's: compound units and days both work.
    assert parse_since("1m30s", now=NOW) == NOW - timedelta(seconds=90)
    assert parse_since("1d", now=NOW) == NOW - timedelta(days=1)
    assert parse_since("2w", now=NOW) == NOW - timedelta(weeks=2)
    for refused in ("1.5h", "30m1h", "-2h", "2x"):
        with pytest.raises(ReconcileError, match="--since"):
            parse_since(refused, now=NOW)


@pytest.mark.parametrize(
    "url",
    [
        "host=127.0.0.1 port=1 user=postgres password=hunter2 dbname=x",
        "postgresql://:hunter2@127.0.0.1:1/x",
        "postgresql://u:hunter2@127.0.0.1:1/x?password=hunter2",
        "postgresql://u@127.0.0.1:1/x?password=hunter2",
    ],
)
def test_no_password_ever_reaches_the_message(url: str) -> None:
    done = cli("--database", url)
    assert done.returncode == 2, done.stdout + done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "soon"])
def test_statement_timeout_must_be_a_positive_finite_number(value: str) -> None:
    done = cli("--database", "sqlite:///:memory:", "--statement-timeout", value)
    assert done.returncode == 2
    assert "--statement-timeout" in done.stderr
    assert "Traceback" not in done.stderr


def test_since_does_not_hide_an_oversell(database: str) -> None:
    """The allocation covers the whole sale: orders before --since still count."""
    seed(database, violations=True)
    report = reconcile(database, schema=SCHEMA, since=NOW + timedelta(hours=1))
    assert [r["sku"] for r in report.oversold] == ["EGG-01"]
    assert report.duplicate_keys == []  # the window does narrow the duplicate check
    assert any("--since" in note for note in report.notes)


def reconcile_with_order_items_locked(url: str, raw_url: str, *, violations: bool) -> Report:
    """Reconcile on PostgreSQL while a writer holds order_items: the audits that read it
    wait until their 300 ms timeout."""
    import psycopg

    seed(url, violations=violations)
    with psycopg.connect(raw_url) as blocker:
        blocker.execute("LOCK TABLE order_items IN ACCESS EXCLUSIVE MODE")
        return reconcile(url, schema=SCHEMA, statement_timeout=0.3)


def assert_the_order_items_audits_skipped(report: Report) -> None:
    """The audits of order_items named as skipped, the others finished with what is there."""
    assert [line.split(":")[0] for line in report.skipped] == ["oversold", "paid_without_items"]
    assert "300ms statement timeout" in report.skipped[0]
    assert report.negative_stock == [{"sku": "EGG-01", "stock": -2}]
    assert {"kind": "idempotency_key", "key": "key-x", "orders": 3} in report.duplicate_keys
    assert not report.complete


def test_an_audit_out_of_time_is_skipped_by_name_and_the_others_still_run(
    pg_sqlalchemy_url: str, pg_database: str
) -> None:
    report = reconcile_with_order_items_locked(pg_sqlalchemy_url, pg_database, violations=True)
    assert_the_order_items_audits_skipped(report)
    assert "--sku" in report.skipped[0]
    text = format_table(report)
    assert "oversold: NOT AUDITED — cancelled by the 300ms statement timeout" in text
    assert "there may be more" in text
    assert report.to_dict()["skipped"] == list(report.skipped)
    assert [n["audit"] for n in report.to_dict()["not_audited"]] == [
        "oversold",
        "paid_without_items",
    ]
    assert "oversold" not in report.checked
    assert exit_status(report) == ExitCode.FINDINGS


def test_an_audit_out_of_time_on_a_clean_shop_is_incomplete(
    pg_sqlalchemy_url: str, pg_database: str
) -> None:
    report = reconcile_with_order_items_locked(pg_sqlalchemy_url, pg_database, violations=False)
    assert report.violations == 0
    assert exit_status(report) == ExitCode.INCOMPLETE
    assert report.verdict == "incomplete"
    text = format_table(report)
    assert "every invariant holds" not in text
    assert "verdict: INCOMPLETE" in text


def test_an_audit_out_of_time_is_skipped_on_mariadb(mysql_database: str) -> None:
    import pymysql

    seed(mysql_database, violations=True)
    url = sa.make_url(mysql_database)
    # Another session holding order_items: the audits that read it wait until their time
    # runs out (max_statement_time, or lock_wait_timeout for the table's metadata lock).
    blocker = pymysql.connect(
        host=url.host, port=url.port or 3306, user=url.username, database=url.database
    )
    try:
        with blocker.cursor() as cur:
            cur.execute("LOCK TABLES order_items WRITE")
        report = reconcile(mysql_database, schema=SCHEMA, statement_timeout=0.3)
    finally:
        blocker.close()
    assert_the_order_items_audits_skipped(report)


def test_the_audit_transaction_is_read_only_on_mariadb(mysql_database: str) -> None:
    seed(mysql_database, violations=False)
    engine = sa.create_engine(driver_url(mysql_database), poolclass=sa.pool.NullPool)
    try:
        with read_only(engine, 1.0) as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM products")).scalar_one() == 3
            with pytest.raises(sa.exc.DBAPIError) as refused:
                conn.execute(sa.text("DELETE FROM products"))
            assert refused.value.orig is not None
            assert refused.value.orig.args[0] == 1792  # ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
            assert conn.execute(sa.text("SELECT @@max_statement_time")).scalar_one() == 1.0
    finally:
        engine.dispose()


def test_cli_on_mariadb(mysql_database: str) -> None:
    seed(mysql_database, violations=True)
    data = findings_of_cli(mysql_database)
    assert data["oversold"] == [
        {"sku": "EGG-01", "allocation": 2, "sold_units": 5, "paid_orders": 5, "oversold_units": 3}
    ]
    assert data["violations"] == 5


def seed_quiet_oversell(url: str) -> None:
    """EGG-01 oversold by 400 (5 paid orders of 100 against an allocation of 100) while its
    stock stopped at 0, not below: nothing but the allocation shows it."""
    engine = sa.create_engine(driver_url(url))
    with engine.begin() as conn:
        create_tables(conn)
        conn.execute(sa.text("INSERT INTO products VALUES (1, 'EGG-01', 0, 100)"))
        conn.execute(
            sa.text("INSERT INTO orders VALUES (:id, :ref, NULL, 'PAID', :at)"),
            [{"id": n, "ref": f"ref-{n}", "at": NOW} for n in range(1, 6)],
        )
        conn.execute(
            sa.text("INSERT INTO order_items VALUES (:o, 1, 100)"),
            [{"o": n} for n in range(1, 6)],
        )
    engine.dispose()


def test_an_oversell_without_an_allocation_is_never_an_all_clear(database: str) -> None:
    seed_quiet_oversell(database)
    done = cli("--database", database)
    shown = f"exit {done.returncode}\n{done.stdout}{done.stderr}"
    assert done.returncode == ExitCode.INCOMPLETE == 3, shown
    assert "every invariant holds" not in done.stdout, shown
    assert "verdict: INCOMPLETE" in done.stdout, shown
    assert re.search(
        r"^oversold: NOT AUDITED — no allocation: pass --allocation COLUMN or --config",
        done.stdout,
        re.MULTILINE,
    ), shown
    # The audits that did run say so, one line each.
    for kind in ("negative_stock", "duplicate_keys", "paid_without_items"):
        assert f"{kind}: audited, nothing found" in done.stdout, shown

    as_json = cli("--database", database, "--format", "json")
    assert as_json.returncode == 3, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["verdict"] == "incomplete"
    assert data["complete"] is False
    assert [(n["audit"], n["cause"]) for n in data["not_audited"]] == [
        ("oversold", "no_allocation")
    ]
    assert "oversold: NOT AUDITED" in as_json.stderr

    allocated = cli("--database", database, "--allocation", "initial_stock")
    shown = f"exit {allocated.returncode}\n{allocated.stdout}{allocated.stderr}"
    assert allocated.returncode == ExitCode.FINDINGS == 1, shown
    assert "NOT AUDITED" not in allocated.stdout, shown
    assert re.search(r"^\s+EGG-01\s+100\s+500\s+5\s+400$", allocated.stdout, re.MULTILINE), shown


def test_a_table_missing_from_the_database_is_named_not_audited(database: str) -> None:
    seed(database, violations=False)
    engine = sa.create_engine(driver_url(database), poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE order_items"))
    engine.dispose()
    report = reconcile(database, schema=SCHEMA)
    assert report.checked == ("negative_stock", "duplicate_keys")
    assert [(n.audit, n.cause) for n in report.not_audited] == [
        ("oversold", "missing_table"),
        ("paid_without_items", "missing_table"),
    ]
    assert all("order_items" in n.reason for n in report.not_audited)
    assert exit_status(report) == ExitCode.INCOMPLETE
    text = format_table(report)
    assert "every invariant holds" not in text
    assert "oversold: NOT AUDITED — not in the database:" in text


# --- the URLs the exporter takes, and a path that is not there ------------------------------


@pytest.mark.parametrize(
    ("kind", "scheme", "driver"),
    [
        ("postgresql", "postgresql://", "postgresql+asyncpg://"),
        ("mariadb", "mysql://", "mysql+aiomysql://"),
        ("mariadb", "mysql://", "mariadb+aiomysql://"),
    ],
)
def test_an_asyncio_driver_url_audits_through_its_sync_twin(
    kind: str, scheme: str, driver: str, request: pytest.FixtureRequest
) -> None:
    plain = request.getfixturevalue("pg_database" if kind == "postgresql" else "mysql_database")
    seed(
        request.getfixturevalue("pg_sqlalchemy_url") if kind == "postgresql" else plain,
        violations=True,
    )
    data = findings_of_cli(plain.replace(scheme, driver, 1))
    assert data["oversold"] == [
        {"sku": "EGG-01", "allocation": 2, "sold_units": 5, "paid_orders": 5, "oversold_units": 3}
    ]
    assert data["violations"] == 5


def test_a_sqlite_path_that_is_not_there_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "wrong" / "path.db"
    done = cli("--database", f"sqlite:///{missing}", "--allocation", "initial_stock")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1
    assert "unable to open database file" in done.stderr
    assert not missing.exists()
    assert not missing.parent.exists()
