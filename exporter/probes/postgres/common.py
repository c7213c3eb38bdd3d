"""What the PostgreSQL probes share: the probe base class, names, values and statements.

Table and column names come from the validated ``schema`` config and reach SQL only
through :func:`ident` (here) or :func:`stocksentry.exporter.invariants.quote` (the
invariant statements, turned into psycopg statements by :func:`composed`); status values
only as :class:`psycopg.sql.Literal`.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from prometheus_client.core import Metric
from psycopg import sql

from ...config import ProbeSettings
from ...invariants import Query
from ..base import Probe
from .pool import Conn, PgPool

__all__ = ["DbProbe", "composed", "ident", "in_list", "number", "one_row", "quoted_name"]


def ident(name: str) -> sql.Identifier:
    """A validated, possibly schema-qualified name as a quoted SQL identifier.

    Example::

        ident("shop.products").as_string()   # '"shop"."products"'
    """
    return sql.Identifier(*name.split("."))


def quoted_name(name: str) -> str:
    """The quoted spelling of a validated name, for ``to_regclass()`` arguments.

    The config allows only letters, digits, ``_`` and ``$`` in names, so there is no quote
    inside to double.
    """
    return ".".join(f'"{part}"' for part in name.split("."))


def in_list(values: Sequence[str]) -> sql.Composable:
    """``'a', 'b'``: literals rather than a ``text[]`` parameter.

    They compare with enum status columns too, and keep a partial index whose predicate
    lists the same values usable.
    """
    return sql.SQL(", ").join(sql.Literal(v) for v in values)


def composed(query: Query) -> tuple[sql.Composed, dict[str, object] | None]:
    """An invariant :class:`~stocksentry.exporter.invariants.Query` as a psycopg statement.

    Constants (paid statuses, promo SKUs: values of the config) are inlined as literals,
    for the reason :func:`in_list` gives; every other value stays a parameter.

    Example::

        statement, params = composed(InvariantSql(schema).negative_stock_totals())
        await conn.execute(statement, params)
    """
    pieces: list[sql.Composable] = []
    params: dict[str, object] = {}
    # No parameters at all: None, so the statement is sent as it was before it had any.
    for part in query.parts:
        if isinstance(part, str):
            pieces.append(sql.SQL(part))
        elif part.constant:
            pieces.append(sql.Literal(part.value))
        else:
            pieces.append(sql.Placeholder(part.name))
            params[part.name] = part.value
    return sql.Composed(pieces), params or None


def number(value: object) -> float:
    """A numeric column's value as a float; ``NULL`` (an empty aggregate) is 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool | int | float | Decimal):
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


async def one_row(
    conn: Conn, query: sql.SQL | sql.Composed, params: Any = None
) -> tuple[Any, ...]:
    """The single row of an aggregate ``query``."""
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    if row is None:  # aggregates always return a row; a view mapped as a table might not
        raise ValueError("the query returned no row")
    return tuple(row)


class DbProbe(Probe):
    """A probe whose :meth:`query` runs in the pool's read-only transaction."""

    def __init__(self, name: str, settings: ProbeSettings, pool: PgPool) -> None:
        super().__init__(name, interval=settings.interval, timeout=settings.timeout)
        self.pool = pool
        self.statement_timeout = settings.statement_timeout

    async def run(self) -> tuple[Metric, ...]:
        return await self.pool.read(self.query, statement_timeout=self.statement_timeout)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        """Observe once through ``conn`` (already in a read-only transaction)."""
        raise NotImplementedError
