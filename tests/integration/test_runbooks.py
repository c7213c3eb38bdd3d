"""Every stocksentry command of every runbook, run against a shop with a known violation.

A runbook's command that says "every invariant holds" while the alert it serves is firing
is worse than no command: the on-call closes the incident. So every command is extracted
from the runbooks (docs/runbooks/*.md) the way an operator would copy it, and the audits
among them (``stocksentry reconcile``, ``stocksentry timeline``) are executed in bash, as
written, against:

- a fresh PostgreSQL database where SKU EGG-01 is oversold by 400 units (500 paid of an
  allocation of 100) while its available stock is 0, not negative: the case that only an
  audit that knows the allocation column can see (a reconcile without ``--config`` or
  ``--allocation`` cannot run its oversold audit: it says so and exits 3, incomplete,
  which the first test shows);
- ``$STOCKSENTRY_CONFIG``, the exporter's config file the runbooks name: its database,
  its schema mapping and the allocation column;
- ``app.log`` in the working directory, with a lost update on EGG-01.

Each audit must report the violation: exit status 1 (3 would be an incomplete audit) and a
finding naming EGG-01, never "every invariant holds" nor "NOT AUDITED". Where the
commands are: fenced ``sh``/``bash`` blocks, one per line, ``#`` starts a comment; and
inline code spans in the prose that start with ``stocksentry``. Placeholders: ``<SKU>`` is EGG-01.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from dbs import PG_SHOP_TABLES

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((ROOT / "docs" / "runbooks").glob("*.md"))
#: The subcommands that audit the shop and so must never give a false all-clear.
AUDITS = ("reconcile", "timeline")
SKU = "EGG-01"

FENCE = re.compile(r"^[ \t]*```([a-z]*)[ \t]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`(stocksentry [^`]+)`")

# EGG-01: 5 paid orders of 100 units against an allocation of 100, stock at 0 (the
# checkout stopped at zero, a second path sold the rest). EGG-02 sells within its own.
SEED = """
INSERT INTO products (id, sku, available_stock, initial_stock) VALUES
    (1, 'EGG-01', 0, 100), (2, 'EGG-02', 7, 10);
INSERT INTO orders (id, status, external_ref)
    SELECT g, 'PAID', 'ref-' || g FROM generate_series(1, 6) AS g;
INSERT INTO order_items (order_id, product_id, quantity)
    SELECT g, 1, 100 FROM generate_series(1, 5) AS g;
INSERT INTO order_items (order_id, product_id, quantity) VALUES (6, 2, 3);
"""
# Two requests both read available=1 and both wrote 1 -> 0: a lost update on EGG-01.
APP_LOG = """\
[10:00:00.101] request_id=R1 sku=EGG-01 stock_check available=1
[10:00:00.103] request_id=R2 sku=EGG-01 stock_check available=1
[10:00:00.120] request_id=R1 sku=EGG-01 stock_update from=1 to=0 success=true
[10:00:00.121] request_id=R2 sku=EGG-01 stock_update from=1 to=0 success=true
"""


@dataclass(frozen=True)
class Command:
    """One command as a runbook gives it."""

    runbook: str
    text: str

    @property
    def subcommand(self) -> str:
        return self.text.split()[1]

    def __str__(self) -> str:
        return f"{self.runbook}: {self.text}"


def _strip_comment(line: str) -> str:
    # A `#` after whitespace starts a comment in the runbooks' shell lines; none of their
    # commands has a `#` inside a quoted argument.
    return re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()


def extract(path: Path) -> list[Command]:
    """The stocksentry commands of one runbook: shell blocks first, then the prose."""
    text = path.read_text(encoding="utf-8")
    found: list[Command] = []
    for language, body in FENCE.findall(text):
        if language not in ("sh", "bash"):
            continue
        for line in body.splitlines():
            command = _strip_comment(line)
            if command.startswith("stocksentry "):
                found.append(Command(path.stem, command))
    prose = FENCE.sub("", text)
    for span in INLINE.findall(prose):
        found.append(Command(path.stem, " ".join(span.split())))
    return found


ALL_COMMANDS = [command for path in RUNBOOKS for command in extract(path)]
AUDIT_COMMANDS = [c for c in ALL_COMMANDS if c.subcommand in AUDITS]


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The seeded database, the exporter config and app.log: the environment to run in."""
    from services import PG_SERVER

    name = f"stocksentry_runbooks_{os.getpid()}"
    base = PG_SERVER.rpartition("/")[0]
    url = f"{base}/{name}"
    with psycopg.connect(PG_SERVER, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(PG_SHOP_TABLES)
            conn.execute(SEED)
        work = tmp_path_factory.mktemp("runbooks")
        config = work / "stocksentry.yaml"
        config.write_text(
            yaml.safe_dump(
                {"database": {"url": url}, "schema": {"products": {"allocation": "initial_stock"}}}
            ),
            encoding="utf-8",
        )
        (work / "app.log").write_text(APP_LOG, encoding="utf-8")
        bindir = str(Path(sys.executable).parent)
        yield {
            "cwd": str(work),
            "url": url,
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "STOCKSENTRY_CONFIG": str(config),
        }
    finally:
        with psycopg.connect(PG_SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(command: str, shop: dict[str, str]) -> subprocess.CompletedProcess[str]:
    bash = shutil.which("bash")
    assert bash is not None
    env = {
        "PATH": shop["PATH"],
        "HOME": shop["cwd"],
        "STOCKSENTRY_CONFIG": shop["STOCKSENTRY_CONFIG"],
    }
    return subprocess.run(
        [bash, "-c", command.replace("<SKU>", SKU)],
        cwd=shop["cwd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_audit_that_does_not_know_the_allocation_says_it_is_incomplete(shop):
    """Without the config's allocation column, reconcile cannot see the oversell here
    (the shop that gave the old runbook lines their false all-clear): it names the
    oversold audit NOT AUDITED and exits 3, never "every invariant holds" with 0."""
    done = run(f'stocksentry reconcile --database "{shop["url"]}" --sku {SKU}', shop)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "every invariant holds" not in done.stdout
    assert "oversold: NOT AUDITED — no allocation" in done.stdout
    with_config = run(f'stocksentry reconcile --config "$STOCKSENTRY_CONFIG" --sku {SKU}', shop)
    assert with_config.returncode == 1, with_config.stdout + with_config.stderr
    assert "OVERSOLD (1)" in with_config.stdout


def test_the_runbooks_hold_the_audits_an_operator_runs():
    """The extraction finds the commands: every runbook of an alert about stock that
    names a reconcile, and every reconcile line gives the allocation (through the config
    or --allocation)."""
    with_reconcile = {c.runbook for c in AUDIT_COMMANDS if c.subcommand == "reconcile"}
    assert {
        "StockOversold",
        "StockNegativeInventory",
        "StockNegativeWrite",
        "StockRefundDueToOversell",
        "StockRefundsAboveBaseline",
        "StockDuplicateOrders",
        "StocksentryExporterDown",
        "StocksentryProbeDown",
    } <= with_reconcile
    assert len(AUDIT_COMMANDS) >= 25, [str(c) for c in AUDIT_COMMANDS]
    for command in AUDIT_COMMANDS:
        if command.subcommand == "reconcile":
            assert "--config" in command.text or "--allocation" in command.text, str(command)


@pytest.mark.parametrize("command", AUDIT_COMMANDS, ids=str)
def test_every_runbook_audit_reports_the_known_violation(command: Command, shop):
    done = run(command.text, shop)
    shown = f"$ {command.text}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
    assert "every invariant holds" not in done.stdout, shown
    assert "NOT AUDITED" not in done.stdout, shown
    assert done.returncode == 1, shown
    if command.subcommand == "reconcile":
        assert re.search(r"^OVERSOLD \(1\)$", done.stdout, re.MULTILINE), shown
        assert re.search(rf"^\s+{SKU}\s+100\s+500\s+5\s+400$", done.stdout, re.MULTILINE), shown
    else:
        assert f"LOST UPDATE sku={SKU}" in done.stdout, shown


@pytest.mark.parametrize(
    "subcommand",
    sorted({c.subcommand for c in ALL_COMMANDS} - set(AUDITS)),
)
def test_the_other_runbook_commands_exist(subcommand: str, shop):
    """Commands that are not audits (check-config ...) are at least real subcommands."""
    done = run(f"stocksentry {subcommand} --help", shop)
    assert done.returncode == 0, done.stdout + done.stderr
