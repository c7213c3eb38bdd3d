"""The indexes the probes expect, and the statement that adds each one the database lacks."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ExporterConfig
from ..invariants import InvariantSql
from .dialects import Dialect, Session
from .pool import Pool


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
    #: The columns, the first of which must lead.
    columns: tuple[str, ...]
    #: A partial index's predicate (the probe's own, or the planner cannot use it).
    where: str | None = None


def _expected_indexes(config: ExporterConfig, dialect: Dialect) -> list[_Expected]:
    """The indexes the enabled probes read through. Without partial indexes (MySQL) the
    predicate's column leads instead: the held reservations, the unpublished events."""
    s, p = config.schema, config.probes
    builder = InvariantSql(s, dialect.name)
    partial = dialect.partial_indexes
    out: list[_Expected] = []

    def want(probe: str, table: str, column: str, where: str = "", on: str = "") -> None:
        if partial:
            out.append(_Expected(probe, table, (column,), where or None))
        else:
            out.append(_Expected(probe, table, (on, column) if on else (column,)))

    if p.negative_stock.enabled:
        want("negative_stock", s.products.table, s.products.stock, builder.negative_predicate())
    if p.oversold.enabled:
        want("oversold", s.order_items.table, s.order_items.product_id)
        if p.oversold.scope == "promo":
            want("oversold", s.products.table, s.products.sku)
        else:
            # The incremental runs: recent orders by creation time, then their items.
            want("oversold", s.orders.table, s.orders.created_at)
            want("oversold", s.order_items.table, s.order_items.order_id)
    if p.duplicate_orders.enabled:
        want("duplicate_orders", s.orders.table, s.orders.created_at)
        for _kind, column in builder.key_columns():
            want("duplicate_orders", s.orders.table, column)
    if p.expired_reservations.enabled and (r := s.reservations) is not None:
        held = dialect.render(builder.held_predicate())[0] if partial else ""
        on = r.status if r.status is not None else r.released_at
        want("expired_reservations", r.table, r.expires_at, held, on or "")
    if p.outbox.enabled and (b := s.outbox) is not None:
        published = builder.quote(b.published_at)
        want("outbox", b.table, b.created_at, f"{published} IS NULL", b.published_at)
    if p.cache_drift.enabled:
        want("cache_drift", s.products.table, s.products.sku)
    return out


async def check_indexes(pool: Pool, config: ExporterConfig) -> list[IndexAdvice]:
    """The expected indexes missing from the database (an index counts when its first
    column is the expected one), each with the statement that adds it; tables that do not
    exist are skipped (their probe reports it).

    Example::

        for advice in await check_indexes(pool, config):
            log.warning("%s", advice)
    """
    dialect = pool.dialect

    async def check(session: Session) -> list[IndexAdvice]:
        advice: list[IndexAdvice] = []
        leading: dict[str, set[str] | None] = {}
        for want in _expected_indexes(config, dialect):
            if want.table not in leading:
                leading[want.table] = await dialect.leading_columns(session, want.table)
            have, column = leading[want.table], want.columns[0]
            if have is None or dialect.fold(column) in have:
                continue
            # Only one piece of advice per (table, column), even when two probes need it.
            if any(a.table == want.table and a.column == column for a in advice):
                continue
            statement = dialect.add_index(want.table, want.columns, want.where)
            advice.append(IndexAdvice(want.probe, want.table, column, statement))
        return advice

    return await pool.read(check)
