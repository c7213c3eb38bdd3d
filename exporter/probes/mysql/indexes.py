"""The indexes the MySQL/MariaDB probes expect, and the advice to add those missing.

MySQL has no partial index, so where PostgreSQL's probes read a partial one
(``stock < 0``, unreleased reservations, unpublished outbox rows) these read a plain
index: the range ``stock < 0`` of ``products(stock)``; ``reservations(released_at,
expires_at)`` (or ``(status, expires_at)``) and ``outbox(published_at, created_at)``,
whose leading ``IS NULL`` / status part skips the released and published rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...config import ExporterConfig
from ...invariants import InvariantSql, quote
from ..postgres.indexes import IndexAdvice
from .common import ident, table_parts
from .pool import MySession

__all__ = ["check_indexes", "expected_indexes"]


@dataclass(frozen=True, slots=True)
class _Expected:
    probe: str
    table: str
    columns: tuple[str, ...]


def expected_indexes(config: ExporterConfig) -> list[_Expected]:
    """The indexes the enabled probes read through: (probe, table, columns), the first
    column being the one that must lead."""
    s, p = config.schema, config.probes
    out: list[_Expected] = []
    if p.negative_stock.enabled:
        out.append(_Expected("negative_stock", s.products.table, (s.products.stock,)))
    if p.oversold.enabled:
        out.append(_Expected("oversold", s.order_items.table, (s.order_items.product_id,)))
        if p.oversold.scope == "promo":
            out.append(_Expected("oversold", s.products.table, (s.products.sku,)))
        else:
            out.append(_Expected("oversold", s.orders.table, (s.orders.created_at,)))
            out.append(_Expected("oversold", s.order_items.table, (s.order_items.order_id,)))
    if p.duplicate_orders.enabled:
        out.append(_Expected("duplicate_orders", s.orders.table, (s.orders.created_at,)))
        for _kind, column in InvariantSql(s, dialect="mysql").key_columns():
            out.append(_Expected("duplicate_orders", s.orders.table, (column,)))
    if p.expired_reservations.enabled and s.reservations is not None:
        r = s.reservations
        # The held ones first (what a partial index keeps on PostgreSQL), then expiry: a
        # shop's reservations are nearly all expired and released.
        held = r.status if r.status is not None else r.released_at
        assert held is not None  # noqa: S101 - the config maps one of the two
        out.append(_Expected("expired_reservations", r.table, (held, r.expires_at)))
    if p.outbox.enabled and s.outbox is not None:
        out.append(
            _Expected("outbox", s.outbox.table, (s.outbox.published_at, s.outbox.created_at))
        )
    if p.cache_drift.enabled:
        out.append(_Expected("cache_drift", s.products.table, (s.products.sku,)))
    return out


_EXISTS = (
    "SELECT count(*) FROM information_schema.tables"
    " WHERE table_schema = coalesce(%(schema)s, database()) AND table_name = %(table)s"
)
_LEADING = (
    "SELECT DISTINCT column_name FROM information_schema.statistics"
    " WHERE table_schema = coalesce(%(schema)s, database()) AND table_name = %(table)s"
    " AND seq_in_index = 1"
)


async def check_indexes(session: MySession, config: ExporterConfig) -> list[IndexAdvice]:
    """The expected indexes missing from the database, each with the ``ALTER TABLE`` that
    adds it online (``ALGORITHM=INPLACE, LOCK=NONE``: reads and writes go on meanwhile).

    An index counts when its first column is the expected one
    (``information_schema.statistics``). Tables that do not exist are skipped.
    """
    advice: list[IndexAdvice] = []
    leading: dict[str, set[str] | None] = {}
    for want in expected_indexes(config):
        if want.table not in leading:
            schema, table = table_parts(want.table)
            params = {"schema": schema, "table": table}
            (exists,) = await session.one(_EXISTS, params)
            found = await session.rows(_LEADING, params) if exists else []
            # Column names compare without case in MySQL.
            leading[want.table] = {str(c).lower() for (c,) in found} if exists else None
        have = leading[want.table]
        column = want.columns[0]
        if have is None or column.lower() in have:
            continue
        if any(a.table == want.table and a.column == column for a in advice):
            continue
        short = table_parts(want.table)[1]
        name = f"{short}_{'_'.join(want.columns)}_idx"[:64]
        columns = ", ".join(quote(c, "mysql") for c in want.columns)
        statement = (
            f"ALTER TABLE {ident(want.table)} ADD INDEX {quote(name, 'mysql')} ({columns}),"
            " ALGORITHM=INPLACE, LOCK=NONE;"
        )
        advice.append(IndexAdvice(want.probe, want.table, column, statement))
    return advice
