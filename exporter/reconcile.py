"""``stocksentry reconcile``: the audit SQL of an oversell investigation, as one command.

Checks the invariants a double-sell breaks, read-only, on PostgreSQL or SQLite:

- ``negative_stock``: SKUs whose stock is below zero;
- ``oversold``: all paid units per SKU against the SKU's allocation for the sale (needs the
  ``schema.products.allocation`` column, or ``--allocation``; without it a lost update
  from 1 to 0 twice leaves the stock at 0 and only negative stock is visible);
- ``duplicate_keys``: more than one order for one external reference or idempotency key;
- ``paid_without_items``: paid orders with no order item, i.e. no stock movement.

Exit status 0 when every invariant holds, 1 when any is violated, 2 on bad input. The
schema comes from the exporter config (``--config``), defaulting to the common
``products / orders / order_items`` layout.

Example::

    stocksentry reconcile --database postgresql://postgres@127.0.0.1/shop \\
        --allocation initial_stock --sku EGG-01 --since 2h
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from .config import SchemaConfig

EXIT_OK = 0
EXIT_VIOLATED = 1
EXIT_BAD_INPUT = 2

FINDING_KINDS = ("negative_stock", "oversold", "duplicate_keys", "paid_without_items")


class ReconcileError(Exception):
    """Bad input or an unusable database; ``str()`` is the one line to print."""


@dataclass(frozen=True, slots=True)
class Report:
    """What the audit found; every list empty means every invariant holds."""

    database: str
    since: str | None
    sku: str | None
    checked: tuple[str, ...]
    notes: tuple[str, ...] = ()
    negative_stock: list[dict[str, Any]] = field(default_factory=list)
    oversold: list[dict[str, Any]] = field(default_factory=list)
    duplicate_keys: list[dict[str, Any]] = field(default_factory=list)
    paid_without_items: list[dict[str, Any]] = field(default_factory=list)

    @property
    def violations(self) -> int:
        """How many findings in all."""
        return sum(len(getattr(self, kind)) for kind in FINDING_KINDS)

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` document."""
        data = asdict(self)
        data["checked"] = list(self.checked)
        data["notes"] = list(self.notes)
        data["violations"] = self.violations
        return data


# --- input ---------------------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """A point in time from an ISO-8601 timestamp or a duration ago (``90m``, ``2h``, ``1d``).

    Naive timestamps are taken as UTC.

    Example::

        parse_since("2026-11-29T10:00:00Z")
        parse_since("2h")  # two hours ago
    """
    match = _DURATION.match(text.strip())
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        except OverflowError:
            raise ReconcileError(f"--since: {text!r} reaches before year 1") from None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ReconcileError(
            f"--since: expected an ISO-8601 time or a duration like 2h, got {text!r}"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


# --- SQL -----------------------------------------------------------------------------------


class _Sql:
    """Quoted identifiers of the mapped schema for one dialect."""

    def __init__(self, engine: Engine, schema: SchemaConfig) -> None:
        quote = engine.dialect.identifier_preparer.quote
        self._quote = quote
        self.schema = schema

    def name(self, identifier: str) -> str:
        # Config identifiers are validated as plain (optionally schema-qualified) names.
        return ".".join(self._quote(part) for part in identifier.split("."))


def _paid_filter(schema: SchemaConfig, q: _Sql, params: dict[str, Any]) -> str:
    orders = schema.orders
    names = []
    for i, status in enumerate(orders.paid_statuses):
        params[f"paid{i}"] = status
        names.append(f":paid{i}")
    return f"o.{q.name(orders.status)} IN ({', '.join(names)})"


def _negative_stock(conn: Connection, q: _Sql, sku: str | None) -> list[dict[str, Any]]:
    from sqlalchemy import text

    p = q.schema.products
    where = f"{q.name(p.stock)} < 0"
    params: dict[str, Any] = {}
    if sku is not None:
        where += f" AND {q.name(p.sku)} = :sku"
        params["sku"] = sku
    rows = conn.execute(
        text(
            f"SELECT {q.name(p.sku)}, {q.name(p.stock)} FROM {q.name(p.table)}"  # noqa: S608 - quoted identifiers, bound values
            f" WHERE {where} ORDER BY {q.name(p.stock)}, {q.name(p.sku)}"
        ),
        params,
    )
    return [{"sku": str(row[0]), "stock": int(row[1])} for row in rows]


def _oversold(
    conn: Connection, q: _Sql, sku: str | None, since: datetime | None
) -> list[dict[str, Any]]:
    # ``since`` is accepted for a schema whose allocation column is per window; the
    # audit passes None (see reconcile()).
    from sqlalchemy import text

    s = q.schema
    p, o, oi = s.products, s.orders, s.order_items
    assert p.allocation is not None  # noqa: S101 - the caller checked
    params: dict[str, Any] = {}
    conditions = [_paid_filter(s, q, params)]
    if sku is not None:
        conditions.append(f"p.{q.name(p.sku)} = :sku")
        params["sku"] = sku
    if since is not None:
        conditions.append(f"o.{q.name(o.created_at)} >= :since")
        params["since"] = since
    sql = (
        f"SELECT p.{q.name(p.sku)}, p.{q.name(p.allocation)},"  # noqa: S608 - quoted identifiers, bound values
        f" SUM(oi.{q.name(oi.quantity)}), COUNT(DISTINCT o.{q.name(o.id)})"
        f" FROM {q.name(p.table)} p"
        f" JOIN {q.name(oi.table)} oi ON oi.{q.name(oi.product_id)} = p.{q.name(p.id)}"
        f" JOIN {q.name(o.table)} o ON o.{q.name(o.id)} = oi.{q.name(oi.order_id)}"
        f" WHERE {' AND '.join(conditions)}"
        f" GROUP BY p.{q.name(p.sku)}, p.{q.name(p.allocation)}"
        f" HAVING SUM(oi.{q.name(oi.quantity)}) > p.{q.name(p.allocation)}"
        f" ORDER BY p.{q.name(p.sku)}"
    )
    found = []
    for row in conn.execute(text(sql), params):
        allocation, sold = int(row[1]), int(row[2])
        found.append(
            {
                "sku": str(row[0]),
                "allocation": allocation,
                "sold_units": sold,
                "paid_orders": int(row[3]),
                "oversold_units": sold - allocation,
            }
        )
    return found


def _duplicates(
    conn: Connection, q: _Sql, sku: str | None, since: datetime | None
) -> list[dict[str, Any]]:
    from sqlalchemy import text

    s = q.schema
    o, oi, p = s.orders, s.order_items, s.products
    found: list[dict[str, Any]] = []
    for kind, column in (("external_ref", o.external_ref), ("idempotency_key", o.idempotency_key)):
        if column is None:
            continue
        params: dict[str, Any] = {}
        conditions = [f"o.{q.name(column)} IS NOT NULL"]
        joins = ""
        if since is not None:
            conditions.append(f"o.{q.name(o.created_at)} >= :since")
            params["since"] = since
        if sku is not None:
            joins = (
                f" JOIN {q.name(oi.table)} oi ON oi.{q.name(oi.order_id)} = o.{q.name(o.id)}"
                f" JOIN {q.name(p.table)} p ON p.{q.name(p.id)} = oi.{q.name(oi.product_id)}"
            )
            conditions.append(f"p.{q.name(p.sku)} = :sku")
            params["sku"] = sku
        sql = (
            f"SELECT o.{q.name(column)}, COUNT(DISTINCT o.{q.name(o.id)})"  # noqa: S608 - quoted identifiers, bound values
            f" FROM {q.name(o.table)} o{joins}"
            f" WHERE {' AND '.join(conditions)}"
            f" GROUP BY o.{q.name(column)} HAVING COUNT(DISTINCT o.{q.name(o.id)}) > 1"
            f" ORDER BY 2 DESC, 1"
        )
        found.extend(
            {"kind": kind, "key": str(row[0]), "orders": int(row[1])}
            for row in conn.execute(text(sql), params)
        )
    return found


def _paid_without_items(
    conn: Connection, q: _Sql, since: datetime | None, limit: int
) -> list[dict[str, Any]]:
    from sqlalchemy import text

    s = q.schema
    o, oi = s.orders, s.order_items
    params: dict[str, Any] = {"limit": limit}
    conditions = [_paid_filter(s, q, params)]
    if since is not None:
        conditions.append(f"o.{q.name(o.created_at)} >= :since")
        params["since"] = since
    sql = (
        f"SELECT o.{q.name(o.id)}, o.{q.name(o.status)} FROM {q.name(o.table)} o"  # noqa: S608 - quoted identifiers, bound values
        f" WHERE {' AND '.join(conditions)} AND NOT EXISTS ("
        f"SELECT 1 FROM {q.name(oi.table)} oi WHERE oi.{q.name(oi.order_id)} = o.{q.name(o.id)})"
        f" ORDER BY o.{q.name(o.id)} LIMIT :limit"
    )
    return [
        {"order_id": str(row[0]), "status": str(row[1])} for row in conn.execute(text(sql), params)
    ]


@contextmanager
def _read_only(engine: Engine, statement_timeout: float) -> Iterator[Connection]:
    """A connection in a read-only transaction with a statement timeout."""
    from sqlalchemy import text

    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SET TRANSACTION READ ONLY"))
            conn.execute(text(f"SET LOCAL statement_timeout = {int(statement_timeout * 1000)}"))
        elif engine.dialect.name == "sqlite":
            conn.execute(text("PRAGMA query_only = ON"))
        try:
            yield conn
        finally:
            conn.rollback()


def reconcile(
    url: str,
    *,
    schema: SchemaConfig | None = None,
    sku: str | None = None,
    since: datetime | None = None,
    statement_timeout: float = 10.0,
    limit: int = 1000,
) -> Report:
    """Run the audit against the database at ``url`` and return what it found.

    Raises :class:`ReconcileError` (one line, no password) when the database cannot be
    reached or the mapped tables and columns are not there.
    """
    import sqlalchemy as sa
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    from . import dburl
    from .config import SchemaConfig

    schema = schema or SchemaConfig()
    shown = dburl.shown(url)
    try:
        engine = sa.create_engine(dburl.parse_url(url), poolclass=sa.pool.NullPool)
    except (ArgumentError, NoSuchModuleError, ValueError, ImportError) as exc:
        # The exception text can quote the URL: say what is wrong without echoing it.
        if isinstance(exc, ImportError):
            why = f"its driver is not installed ({exc.name or type(exc).__name__})"
        elif isinstance(exc, NoSuchModuleError):
            why = "unknown database dialect"
        else:
            why = str(exc) if isinstance(exc, ValueError) else "not a usable database URL"
        raise ReconcileError(f"--database: cannot use {shown}: {why}") from None
    q = _Sql(engine, schema)
    checked = ["negative_stock", "duplicate_keys", "paid_without_items"]
    notes: list[str] = []
    if schema.products.allocation is not None:
        checked.insert(1, "oversold")
    else:
        notes.append(
            "oversold not checked: no allocation column mapped (schema.products.allocation "
            "or --allocation); only negative stock shows an oversell then"
        )
    try:
        with _read_only(engine, statement_timeout) as conn:
            report = Report(
                database=shown,
                since=since.isoformat() if since else None,
                sku=sku,
                checked=tuple(checked),
                notes=tuple(notes),
                negative_stock=_negative_stock(conn, q, sku),
                # The allocation is for the whole sale: all paid units count against it,
                # so --since does not narrow the oversold check.
                oversold=_oversold(conn, q, sku, None) if "oversold" in checked else [],
                duplicate_keys=_duplicates(conn, q, sku, since),
                paid_without_items=(
                    _paid_without_items(conn, q, since, limit) if sku is None else []
                ),
            )
    except DBAPIError as exc:
        first = str(exc.orig if exc.orig is not None else exc).strip().splitlines()
        detail = first[0] if first else type(exc).__name__
        password = dburl.password(url)
        if password:
            detail = detail.replace(password, "***")
        raise ReconcileError(f"database {shown}: {detail}") from None
    finally:
        engine.dispose()
    if sku is not None:
        report = replace(
            report,
            notes=(*report.notes, "paid_without_items is not filtered by SKU: run without --sku"),
        )
    if since is not None and "oversold" in checked:
        report = replace(
            report,
            notes=(
                *report.notes,
                "oversold counts every paid order, not only those since --since",
            ),
        )
    return report


# --- output --------------------------------------------------------------------------------


def format_table(report: Report) -> str:
    """The report as a person reads it first: a verdict, then one block per finding kind."""
    lines = [f"stocksentry reconcile: {report.database}"]
    scope = [f"sku={report.sku}" if report.sku else "all SKUs"]
    if report.since:
        scope.append(f"orders since {report.since}")
    lines.append("scope: " + ", ".join(scope))
    lines.append(
        "verdict: every invariant holds"
        if report.violations == 0
        else f"verdict: {report.violations} violation(s)"
    )
    lines.extend(f"note: {note}" for note in report.notes)
    blocks: list[tuple[str, list[str], Sequence[dict[str, Any]]]] = [
        ("NEGATIVE STOCK", ["sku", "stock"], report.negative_stock),
        (
            "OVERSOLD",
            ["sku", "allocation", "sold_units", "paid_orders", "oversold_units"],
            report.oversold,
        ),
        ("DUPLICATE ORDERS PER KEY", ["kind", "key", "orders"], report.duplicate_keys),
        ("PAID WITHOUT STOCK MOVEMENT", ["order_id", "status"], report.paid_without_items),
    ]
    for title, columns, rows in blocks:
        if not rows:
            continue
        lines.append("")
        lines.append(f"{title} ({len(rows)})")
        widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
        for cells in [columns, *([str(row[c]) for c in columns] for row in rows)]:
            padded = (cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
            lines.append(("  " + "  ".join(padded)).rstrip())
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------------


def add_reconcile_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``reconcile`` subcommand to the ``stocksentry`` parser."""
    parser = commands.add_parser(
        "reconcile",
        help="audit the database: negative stock, oversold SKUs, duplicate orders per key",
        description=(
            "Run the oversell audit read-only (safe during a sale): exit 0 when every "
            "invariant holds, 1 when any is violated, 2 on bad input."
        ),
    )
    parser.add_argument(
        "--database",
        metavar="URL",
        help="the shop's database (SQLAlchemy URL; default: the config's database)",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="exporter config whose schema mapping to use"
    )
    parser.add_argument("--sku", help="only this SKU")
    parser.add_argument(
        "--since", metavar="TIME", help="only orders since TIME (ISO-8601, or a duration: 2h)"
    )
    parser.add_argument(
        "--allocation",
        metavar="COLUMN",
        help="products column holding each SKU's inventory for the sale (overrides config)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--statement-timeout",
        type=_timeout,
        default=10.0,
        metavar="SECONDS",
        help="per-statement limit, > 0 (10)",
    )
    parser.set_defaults(handler=run_reconcile, parser=parser)


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    # `not value > 0` also refuses NaN; 0 would mean no timeout at all in PostgreSQL.
    if not value > 0 or value > 86400:
        raise argparse.ArgumentTypeError(f"must be > 0 and at most 86400 seconds, got {text}")
    return value


def run_reconcile(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run ``stocksentry reconcile``; returns the exit status."""
    out = out if out is not None else sys.stdout
    try:
        schema, url = _schema_and_url(args)
        since = parse_since(args.since) if args.since else None
        report = reconcile(
            url,
            schema=schema,
            sku=args.sku,
            since=since,
            statement_timeout=args.statement_timeout,
        )
    except ReconcileError as exc:
        print(f"stocksentry reconcile: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.format == "json":
        out.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        out.write(format_table(report))
    return EXIT_OK if report.violations == 0 else EXIT_VIOLATED


def _schema_and_url(args: argparse.Namespace) -> tuple[SchemaConfig, str]:
    from .config import ConfigError, SchemaConfig, load_config

    schema = SchemaConfig()
    url: str | None = args.database
    if args.config:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            raise ReconcileError(str(exc)) from None
        schema = config.schema
        if url is None and config.database is not None:
            url = config.database.url.reveal()
    if url is None:
        raise ReconcileError("--database is required (or a --config with a database section)")
    if args.allocation:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args.allocation):
            raise ReconcileError(f"--allocation: not a column name: {args.allocation!r}")
        schema = replace(schema, products=replace(schema.products, allocation=args.allocation))
    return schema, url
