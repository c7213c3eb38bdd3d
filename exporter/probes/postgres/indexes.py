"""The indexes the probes expect, and the advice to add those the database lacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from psycopg import sql

from ...config import ExporterConfig
from ...invariants import InvariantSql
from .backlog import held_predicate
from .common import ident, one_row, quoted_name
from .pool import Conn

__all__ = ["IndexAdvice", "check_indexes", "expected_indexes"]


@dataclass(frozen=True, slots=True)
class IndexAdvice:
    """An index a probe expects but the database lacks, with the statement that adds it."""

    probe: str
    table: str
    column: str
    statement: str

    def __str__(self) -> str:
        return (
            f"probe {self.probe}: no index on {self.table} starts with column {self.column}, "
            f"so the probe reads the whole table; add one with: {self.statement}"
        )


@dataclass(frozen=True, slots=True)
class _Expected:
    probe: str
    table: str
    column: str
    where: sql.Composable | None


def expected_indexes(config: ExporterConfig) -> list[_Expected]:
    """The indexes the enabled probes read through, as (probe, table, leading column)."""
    s, p = config.schema, config.probes
    out: list[_Expected] = []
    if p.negative_stock.enabled:
        # The partial index's predicate is the probe's own, or the planner cannot use it.
        below_zero = sql.SQL(InvariantSql(s).negative_predicate())
        out.append(_Expected("negative_stock", s.products.table, s.products.stock, below_zero))
    if p.oversold.enabled:
        out.append(_Expected("oversold", s.order_items.table, s.order_items.product_id, None))
        if p.oversold.scope == "promo":
            out.append(_Expected("oversold", s.products.table, s.products.sku, None))
        else:
            # The incremental runs: recent orders by creation time, then their items.
            out.append(_Expected("oversold", s.orders.table, s.orders.created_at, None))
            out.append(_Expected("oversold", s.order_items.table, s.order_items.order_id, None))
    if p.duplicate_orders.enabled:
        out.append(_Expected("duplicate_orders", s.orders.table, s.orders.created_at, None))
        for _kind, column in InvariantSql(s).key_columns():
            out.append(_Expected("duplicate_orders", s.orders.table, column, None))
    if p.expired_reservations.enabled and s.reservations is not None:
        out.append(
            _Expected(
                "expired_reservations",
                s.reservations.table,
                s.reservations.expires_at,
                held_predicate(config),
            )
        )
    if p.outbox.enabled and s.outbox is not None:
        out.append(
            _Expected(
                "outbox",
                s.outbox.table,
                s.outbox.created_at,
                sql.SQL("{} IS NULL").format(sql.Identifier(s.outbox.published_at)),
            )
        )
    if p.cache_drift.enabled:
        out.append(_Expected("cache_drift", s.products.table, s.products.sku, None))
    return out


_LEADING_COLUMNS: Final = sql.SQL(
    "SELECT to_regclass(%(table)s) IS NOT NULL,"
    " ARRAY(SELECT a.attname::text FROM pg_index AS i"
    " JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
    " WHERE i.indrelid = to_regclass(%(table)s) AND i.indisvalid)"
)


async def check_indexes(conn: Conn, config: ExporterConfig) -> list[IndexAdvice]:
    """The expected indexes missing from the database, each with its ``CREATE INDEX``.

    An index counts when its first column is the expected one (``pg_index`` /
    ``pg_attribute``, the catalogs behind ``pg_indexes``); a partial index's predicate is
    not compared. Tables that do not exist are skipped: their probe reports the error.

    Example::

        for advice in await check_indexes(conn, config):
            log.warning("%s", advice)
    """
    advice: list[IndexAdvice] = []
    leading: dict[str, set[str] | None] = {}
    for want in expected_indexes(config):
        if want.table not in leading:
            exists, columns = await one_row(
                conn, _LEADING_COLUMNS, {"table": quoted_name(want.table)}
            )
            leading[want.table] = set(columns) if exists else None
        have = leading[want.table]
        if have is None or want.column in have:
            continue
        # Only one piece of advice per (table, column), even when two probes need it.
        if any(a.table == want.table and a.column == want.column for a in advice):
            continue
        short = want.table.rsplit(".", 1)[-1]
        name = f"{short}_{want.column}_{'partial_' if want.where else ''}idx"[:63]
        statement = sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(name), ident(want.table), sql.Identifier(want.column)
        )
        if want.where is not None:
            statement = statement + sql.SQL(" WHERE ") + want.where
        advice.append(
            IndexAdvice(want.probe, want.table, want.column, statement.as_string(conn) + ";")
        )
    return advice
