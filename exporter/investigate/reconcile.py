"""``stocksentry reconcile``: the audit SQL of an oversell investigation, as one command.

Checks, read-only, the invariants a double-sell breaks with the statements the sidecar's
probes aggregate (:mod:`stocksentry.exporter.invariants`), each audit in a savepoint of
its own; one that cannot run or finish is named NOT AUDITED and the others still run.
The options and exit statuses are in README.md ("Investigating an incident").
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TextIO

from ..commandline import CommandError, ExitCode, Subcommands, duration_in, report_error, say
from ..durations import format_duration
from ..invariants import INVARIANTS, InvariantSql, Query
from .scope import ReconcileError, parse_since, session_moment, shown_sku

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from ..config import SchemaConfig


COMMAND = "reconcile"
#: The invariants checked, in the order they are reported.
FINDING_KINDS = INVARIANTS
#: The ``--statement-timeout`` range: above 0 (0 would mean no limit), at most a day.
STATEMENT_TIMEOUT_RANGE = (0.001, 86400.0)


@dataclass(frozen=True, slots=True)
class NotAudited:
    """An audit that did not run or did not finish: which, why, and what to do."""

    audit: str
    #: ``no_allocation`` (no allocation column for ``oversold``), ``missing_table`` (a
    #: mapped table or column the database does not have), ``not_permitted`` (one the
    #: database user may not read) or ``out_of_time``.
    cause: str
    reason: str

    def line(self) -> str:
        """The report's line: ``oversold: NOT AUDITED — no allocation: ...``."""
        return f"{self.audit}: NOT AUDITED — {self.reason}"


@dataclass(frozen=True, slots=True)
class Report:
    """What the audit found.

    Every list empty means every invariant holds only when :attr:`complete`: an audit of
    :attr:`not_audited` did not look.
    """

    database: str
    since: str | None
    sku: str | None
    #: The audits that ran to the end, in report order.
    checked: tuple[str, ...]
    notes: tuple[str, ...] = ()
    #: The audits that did not run or did not finish, each with why and what to do.
    not_audited: tuple[NotAudited, ...] = ()
    #: Audits left out because the scope cannot hold them (``name: why``); not a gap.
    out_of_scope: tuple[str, ...] = ()
    #: The order keys ``duplicate_keys`` compared, as ``kind (table.column)``, and those it
    #: did not (``kind: why``): which keys were audited is part of the answer.
    keys: tuple[str, ...] = ()
    keys_not_compared: tuple[str, ...] = ()
    negative_stock: list[dict[str, Any]] = field(default_factory=list)
    oversold: list[dict[str, Any]] = field(default_factory=list)
    duplicate_keys: list[dict[str, Any]] = field(default_factory=list)
    paid_without_items: list[dict[str, Any]] = field(default_factory=list)

    @property
    def violations(self) -> int:
        """How many findings in all."""
        return sum(len(getattr(self, kind)) for kind in FINDING_KINDS)

    @property
    def complete(self) -> bool:
        """Whether every audit in scope ran to the end."""
        return not self.not_audited

    @property
    def skipped(self) -> tuple[str, ...]:
        """The audits cancelled by the statement timeout (``name: reason``)."""
        return tuple(
            f"{n.audit}: {n.reason}" for n in self.not_audited if n.cause == "out_of_time"
        )

    @property
    def verdict(self) -> str:
        """``violations``, ``incomplete`` (nothing found, not everything audited) or
        ``clear``."""
        if self.violations:
            return "violations"
        return "clear" if self.complete else "incomplete"

    def to_dict(self) -> dict[str, Any]:
        """The ``--format json`` document."""
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        data["skipped"] = list(self.skipped)
        data.update(violations=self.violations, complete=self.complete, verdict=self.verdict)
        return data


def _rows(conn: Connection, query: Query) -> Sequence[Any]:
    from sqlalchemy import text

    return conn.execute(text(query.text("named")), query.params).all()


def _negative_stock(conn: Connection, sql: InvariantSql, sku: str | None) -> list[dict[str, Any]]:
    rows = _rows(conn, sql.negative_stock(skus=[sku] if sku is not None else None))
    return [{"sku": str(row[0]), "stock": int(row[1])} for row in rows]


def _oversold(conn: Connection, sql: InvariantSql, sku: str | None) -> list[dict[str, Any]]:
    query = sql.oversold(skus=[sku] if sku is not None else None, count_orders=True)
    found = []
    for row in _rows(conn, query):
        allocation, sold = int(row[1]), int(row[2])
        found.append(
            {
                "sku": str(row[0]),
                "allocation": allocation,
                "sold_units": sold,
                "paid_orders": int(row[4]),
                "oversold_units": sold - allocation,
            }
        )
    return found


def _duplicates(
    conn: Connection, sql: InvariantSql, sku: str | None, since: datetime | None
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for kind, column in sql.key_columns():
        query = sql.duplicate_keys(column, since=since, skus=[sku] if sku is not None else None)
        found.extend(
            {"kind": kind, "key": str(row[0]), "orders": int(row[1])} for row in _rows(conn, query)
        )
    return found


def _paid_without_items(
    conn: Connection, sql: InvariantSql, since: datetime | None, limit: int
) -> list[dict[str, Any]]:
    rows = _rows(conn, sql.paid_without_items(since=since, limit=limit))
    return [{"order_id": str(row[0]), "status": str(row[1])} for row in rows]


@contextmanager
def read_only(engine: Engine, statement_timeout: float) -> Iterator[Connection]:
    """A connection in a read-only transaction with a statement timeout."""
    from sqlalchemy import text

    with engine.connect() as conn:
        if engine.dialect.name in _MYSQL:
            # Whole seconds, at least 1, for the lock waits (a consistent read takes no
            # row lock, but a table another session holds with LOCK TABLES ... WRITE or a
            # DDL blocks it).
            seconds = max(1, math.ceil(statement_timeout))
            if getattr(conn.dialect, "is_mariadb", False):
                # MariaDB: seconds, fractions allowed; every statement kind.
                conn.execute(text(f"SET SESSION max_statement_time = {statement_timeout:.3f}"))
            else:
                # MySQL 8: milliseconds, read-only SELECTs only (which is all the audit runs).
                millis = max(1, math.ceil(statement_timeout * 1000))
                conn.execute(text(f"SET SESSION max_execution_time = {millis}"))
            conn.execute(text(f"SET SESSION innodb_lock_wait_timeout = {seconds}"))
            conn.execute(text(f"SET SESSION lock_wait_timeout = {seconds}"))
            # SET statements open no transaction: the SQLAlchemy one began before them is
            # rolled back, and READ ONLY applies to the next, the audit's own.
            conn.rollback()
            conn.execute(text("SET TRANSACTION READ ONLY"))
        elif engine.dialect.name == "postgresql":
            # Whole milliseconds, at least 1: 0 would mean no limit at all.
            millis = max(1, math.ceil(statement_timeout * 1000))
            conn.execute(text("SET TRANSACTION READ ONLY"))
            conn.execute(text(f"SET LOCAL statement_timeout = {millis}"))
        elif engine.dialect.name == "sqlite":
            conn.execute(text("PRAGMA query_only = ON"))
        try:
            yield conn
        finally:
            conn.rollback()


_MYSQL = ("mysql", "mariadb")


#: What to do when an audit runs out of time, by audit.
_NARROWER: Final = {
    "negative_stock": "give it more time with --statement-timeout",
    "oversold": (
        "it sums every paid order item of the whole sale; audit one SKU with --sku "
        "(through order_items(product_id)) or give it more time with --statement-timeout"
    ),
    "duplicate_keys": "narrow it with --since or --sku, or give it more time",
    "paid_without_items": "narrow it with --since, or give it more time",
}


def _why_not_audited(exc: Exception) -> str | None:
    """``out_of_time`` for the statement timeout's cancellation, ``missing_table`` for an
    undefined table or column, ``not_permitted`` for one the user may not read, else
    ``None`` (SQLSTATEs; MySQL / MariaDB error numbers)."""
    orig = getattr(exc, "orig", None)
    driver = type(orig).__module__.partition(".")[0]
    if driver == "pymysql":
        args: tuple[Any, ...] = getattr(orig, "args", ())
        code = args[0] if args else None
        # Statement time (MariaDB 1969, MySQL 3024), a lock wait past its timeout (1205);
        # no such table (1146) or column (1054); SELECT denied on a table (1142) or a
        # column (1143).
        out_of_time, missing = code in (1969, 3024, 1205), code in (1146, 1054)
        denied = code in (1142, 1143)
    elif driver == "sqlite3":
        out_of_time, missing = False, str(orig).startswith(("no such table", "no such column"))
        denied = False
    else:
        sqlstate = getattr(orig, "sqlstate", None)
        out_of_time, missing = sqlstate == "57014", sqlstate in ("42P01", "42703")
        denied = sqlstate == "42501"  # insufficient_privilege
    if out_of_time:
        return "out_of_time"
    return "missing_table" if missing else "not_permitted" if denied else None


def _first_line(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    first = str(orig if orig is not None else exc).strip().splitlines()
    return first[0] if first else type(exc).__name__


#: Why ``oversold`` cannot run without an allocation, and what to pass.
NO_ALLOCATION: Final = (
    "no allocation: pass --allocation COLUMN or --config (schema.products.allocation);"
    " without it an oversell that stopped the stock at 0 shows nowhere"
)


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

    from .. import dburl
    from ..config import SchemaConfig

    schema = schema or SchemaConfig()
    shown = dburl.shown(url)
    try:
        engine = sa.create_engine(dburl.sync_url(dburl.parse_url(url)), poolclass=sa.pool.NullPool)
    except (ArgumentError, NoSuchModuleError, ValueError, ImportError) as exc:
        # The exception text can quote the URL: say what is wrong without echoing it.
        if isinstance(exc, ImportError):
            why = f"its driver is not installed ({exc.name or type(exc).__name__})"
        elif isinstance(exc, NoSuchModuleError):
            why = "unknown database dialect"
        else:
            why = str(exc) if isinstance(exc, ValueError) else "not a usable database URL"
        raise ReconcileError(f"--database: cannot use {shown}: {why}") from None
    sql = InvariantSql(schema, engine.dialect.name)
    not_audited: list[NotAudited] = []
    if schema.products.allocation is None:
        not_audited.append(NotAudited("oversold", "no_allocation", NO_ALLOCATION))
    out_of_scope: list[str] = []
    if sku is not None:
        # An order without items names no SKU: it belongs to no one SKU's audit.
        out_of_scope.append(
            "paid_without_items: an order without items names no SKU; run without --sku"
        )

    def audit(name: str, run: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """One audit in a savepoint of its own: a timeout or a missing table stops it
        (named NOT AUDITED), the others still run."""
        try:
            with conn.begin_nested():
                return run()
        except DBAPIError as exc:
            cause = _why_not_audited(exc)
            if cause == "out_of_time":
                reason = (
                    f"cancelled by the {format_duration(statement_timeout)} statement"
                    f" timeout; {_NARROWER[name]}"
                )
            elif cause == "missing_table":
                reason = (
                    f"not in the database: {dburl.scrub(_first_line(exc), url)}; map the"
                    " shop's tables and columns in the config's schema section (--config)"
                )
            elif cause == "not_permitted":
                # One table out of reach is that audit's gap, not the whole run's.
                reason = (
                    f"not readable by this database user: {dburl.scrub(_first_line(exc), url)};"
                    " grant it SELECT on the shop's tables (docs/exporter-config.md, the"
                    " exporter's user)"
                )
            else:
                raise
            not_audited.append(NotAudited(name, cause, reason))
        return []

    try:
        with read_only(engine, statement_timeout) as conn:
            if since is not None and engine.dialect.name in _MYSQL:
                # A DATETIME holds the wall clock of the session's time zone.
                moment: datetime | None = session_moment(conn, since)
            else:
                moment = since
            negative = audit("negative_stock", lambda: _negative_stock(conn, sql, sku))
            # The allocation is for the whole sale: all paid units count against it,
            # so --since does not narrow the oversold check.
            oversold = (
                audit("oversold", lambda: _oversold(conn, sql, sku))
                if schema.products.allocation is not None
                else []
            )
            duplicates = audit("duplicate_keys", lambda: _duplicates(conn, sql, sku, moment))
            without_items = (
                audit("paid_without_items", lambda: _paid_without_items(conn, sql, moment, limit))
                if sku is None
                else []
            )
    except DBAPIError as exc:
        raise ReconcileError(f"database {shown}: {dburl.scrub(_first_line(exc), url)}") from None
    finally:
        engine.dispose()
    missed = {n.audit for n in not_audited}
    scoped = {line.partition(":")[0] for line in out_of_scope}
    checked = tuple(k for k in FINDING_KINDS if k not in missed and k not in scoped)
    missing = [n for n in not_audited if n.cause in ("missing_table", "not_permitted")]
    if not checked and missing:
        # No audit could read anything: the wrong database or mapping, not a partial audit.
        raise ReconcileError(f"database {shown}: {missing[0].reason}")
    notes = ("oversold counts every paid order, not only those since --since",)
    mapped = {
        "external_ref": schema.orders.external_ref,
        "idempotency_key": schema.orders.idempotency_key,
    }
    return Report(
        database=shown,
        since=since.isoformat() if since else None,
        sku=sku,
        checked=checked,
        notes=notes if since is not None and "oversold" in checked else (),
        not_audited=tuple(sorted(not_audited, key=lambda n: FINDING_KINDS.index(n.audit))),
        out_of_scope=tuple(out_of_scope),
        keys=tuple(
            f"{kind} ({schema.orders.table}.{column})" for kind, column in sql.key_columns()
        ),
        keys_not_compared=tuple(
            f"{kind}: not mapped (schema.orders.{kind} in --config)"
            for kind, column in mapped.items()
            if column is None
        ),
        negative_stock=negative,
        oversold=oversold,
        duplicate_keys=duplicates,
        paid_without_items=without_items,
    )


def format_table(report: Report) -> str:
    """The report as a person reads it first: a verdict, then one block per finding kind."""
    lines = [f"stocksentry reconcile: {report.database}"]
    scope = [f"sku={shown_sku(report.sku)}" if report.sku else "all SKUs"]
    if report.since:
        scope.append(f"orders since {report.since}")
    lines.append("scope: " + ", ".join(scope))
    missed = len(report.not_audited)
    if report.violations and missed:
        lines.append(
            f"verdict: {report.violations} violation(s), and {missed} audit(s) NOT AUDITED"
            " (below): there may be more"
        )
    elif report.violations:
        lines.append(f"verdict: {report.violations} violation(s)")
    elif missed:
        lines.append(
            f"verdict: INCOMPLETE — no violation in the audits that ran, but {missed}"
            " NOT AUDITED (below): this is not an all-clear"
        )
    else:
        lines.append("verdict: every invariant holds")
    # One line per audit, in report order: what ran (and found what), what did not and why.
    not_audited = {n.audit: n for n in report.not_audited}
    scoped = dict(line.split(": ", 1) for line in report.out_of_scope)
    for kind in FINDING_KINDS:
        if kind in not_audited:
            lines.append(not_audited[kind].line())
        elif kind in scoped:
            lines.append(f"{kind}: not in scope — {scoped[kind]}")
        else:
            found = len(getattr(report, kind))
            lines.append(f"{kind}: audited, {found if found else 'nothing'} found")
            if kind == "duplicate_keys":
                lines[-1] += f" — keys compared: {', '.join(report.keys) or 'none'}"
                lines.extend(f"  not compared: {why}" for why in report.keys_not_compared)
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


def add_reconcile_parser(commands: Subcommands) -> None:
    """Add the ``reconcile`` subcommand to the ``stocksentry`` parser."""
    parser = commands.add_parser(
        "reconcile",
        help="audit the database: negative stock, oversold SKUs, duplicate orders per key",
        description=(
            "Run the oversell audit read-only (safe during a sale). Every audit that could "
            "not run or finish (oversold without an allocation, a table or column not in the "
            "database, out of time) is named NOT AUDITED with why; the others still run. "
            "Exit status: 0 every audit ran and every invariant holds; 1 an invariant is "
            "violated; 3 incomplete: nothing found, but an audit did not run (not an "
            "all-clear); 2 bad input, or no audit could run at all; 130 interrupted."
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
        "--since",
        metavar="TIME",
        help="only orders since TIME: an ISO-8601 time, or a duration ago (2h, 1m30s, 1d)",
    )
    parser.add_argument(
        "--allocation",
        metavar="COLUMN",
        help="products column holding each SKU's inventory for the sale (overrides config);"
        " without it, or a config that maps it, the oversold audit is NOT AUDITED: no all-clear",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument(
        "--statement-timeout",
        type=duration_in(*STATEMENT_TIMEOUT_RANGE),
        default=10.0,
        metavar="DURATION",
        help="limit of each audit's statements, above 0 and at most 1d: 10s, 500ms, or "
        "seconds (10s); an audit that runs out of it is named NOT AUDITED, the others run",
    )
    parser.set_defaults(handler=run_reconcile, parser=parser)


def run_reconcile(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    """Run ``stocksentry reconcile``; returns the exit status (:class:`ExitCode`)."""
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
    except CommandError as exc:
        return report_error(COMMAND, str(exc))
    except KeyboardInterrupt:
        say(sys.stderr, f"stocksentry {COMMAND}: interrupted")
        return ExitCode.INTERRUPTED
    if args.format == "json":
        out.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
        # A document piped into a tool is not read by a person: say the gap on stderr too.
        for missed in report.not_audited:
            say(sys.stderr, f"stocksentry {COMMAND}: {missed.line()}")
    else:
        out.write(format_table(report))
    return exit_status(report)


def exit_status(report: Report) -> ExitCode:
    """The exit status of a report: a violation wins; an audit that did not run or finish
    proves nothing, so no finding then is :attr:`ExitCode.INCOMPLETE`, never ``OK``."""
    if report.violations:
        return ExitCode.FINDINGS
    return ExitCode.OK if report.complete else ExitCode.INCOMPLETE


def _schema_and_url(args: argparse.Namespace) -> tuple[SchemaConfig, str]:
    from ..config import ConfigError, SchemaConfig, load_config

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
