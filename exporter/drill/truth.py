"""The database's truth about the drill SKU, read with the statements of the sidecar's
probes and ``stocksentry reconcile`` (:class:`~stocksentry.exporter.invariants.InvariantSql`)
through the same ``schema`` mapping, so all agree on what an oversell is. The one write is
the drill SKU's stock column (set before each scenario, restored at the end)."""

# ruff: noqa: S608 - identifiers only through InvariantSql.quote(), values as parameters.

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .. import dburl
from ..invariants import InvariantSql, Query

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

    from ..config import SchemaConfig

__all__ = ["Shop", "Snapshot", "Unverifiable"]

T = TypeVar("T")
#: How far ahead of now "every order so far" reaches: the shop's clock may run ahead.
_CLOCK_SLACK = timedelta(days=1)


class Unverifiable(Exception):
    """The database could not be read: the drill cannot judge (exit 3, never a pass).
    ``str()`` is one line without the URL's secrets."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The drill SKU at one moment: its stock and the paid units of all its orders."""

    stock: int
    paid_units: int


class Shop:
    """The shop's database as the drill reads and resets it (one short connection per
    call, so a database that goes away is seen at the next call)."""

    def __init__(self, url: str, schema: SchemaConfig, sku: str) -> None:
        import sqlalchemy as sa

        self.url = url
        self.shown = dburl.shown(url)
        self.sku = sku
        self.schema = schema
        try:
            # An unreachable server is a verdict of its own (exit 3), soon.
            remote = dburl.dialect_of(url) in ("postgresql", "mysql", "mariadb")
            parsed = dburl.parse_url(url)
            # A synchronous driver; a SQLite file stays writable (the stock reset writes).
            sqlite = parsed.get_backend_name() == "sqlite"
            self.engine: Engine = sa.create_engine(
                parsed if sqlite else dburl.sync_url(parsed),
                poolclass=sa.pool.NullPool,
                connect_args={"connect_timeout": 5} if remote else {},
            )
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ValueError, ImportError) as exc:
            raise ValueError(f"database: cannot use {self.shown}: {type(exc).__name__}") from None
        self.sql = InvariantSql(schema, self.engine.dialect.name)
        self.product_id: Any = None

    def close(self) -> None:
        """Release the engine."""
        self.engine.dispose()

    def _run(self, work: Callable[[Connection], T]) -> T:
        import sqlalchemy as sa

        try:
            with self.engine.begin() as conn:
                return work(conn)
        except (sa.exc.SQLAlchemyError, OSError) as exc:
            orig = getattr(exc, "orig", None)
            text = str(orig if orig is not None else exc).strip().splitlines()
            first = text[0] if text else type(exc).__name__
            raise Unverifiable(f"database {self.shown}: {dburl.scrub(first, self.url)}") from None

    def _rows(self, conn: Connection, query: Query) -> Sequence[Any]:
        import sqlalchemy as sa

        return conn.execute(sa.text(query.text("named")), query.params).all()

    def _column(self, conn: Connection, column: str) -> Any:
        """The drill SKU's ``column`` of the products table (``None``: no such row)."""
        import sqlalchemy as sa

        q, p = self.sql.quote, self.schema.products
        statement = f"SELECT {q(column)} FROM {q(p.table)} WHERE {q(p.sku)} = :sku"
        return conn.execute(sa.text(statement), {"sku": self.sku}).scalar_one_or_none()

    def find(self) -> Snapshot:
        """Find the drill SKU's row (a missing one is :class:`LookupError`) and read it."""
        self.product_id = self._run(lambda conn: self._column(conn, self.schema.products.id))
        if self.product_id is None:
            raise LookupError(f"no product {self.sku!r} in {self.shown}")
        return self.snapshot()

    def snapshot(self) -> Snapshot:
        """The stock and the paid units now."""

        def work(conn: Connection) -> Snapshot:
            stock = self._column(conn, self.schema.products.stock)
            if stock is None:
                raise Unverifiable(f"database {self.shown}: product {self.sku!r} is gone")
            query = self.sql.paid_units_of_products(
                [self.product_id], end=datetime.now(UTC) + _CLOCK_SLACK
            )
            rows = self._rows(conn, query)
            return Snapshot(int(stock), int(rows[0][1]) if rows else 0)

        return self._run(work)

    def set_stock(self, stock: int) -> None:
        """Write the drill SKU's stock column (the one row, by its SKU)."""
        import sqlalchemy as sa

        q, p = self.sql.quote, self.schema.products
        statement = f"UPDATE {q(p.table)} SET {q(p.stock)} = :stock WHERE {q(p.sku)} = :sku"
        values = {"stock": stock, "sku": self.sku}
        if self._run(lambda conn: conn.execute(sa.text(statement), values).rowcount) != 1:
            raise Unverifiable(f"database {self.shown}: product {self.sku!r} is gone")

    def orders_per_key(self, kind: str, prefix: str) -> dict[str, int]:
        """The drill's keys (values starting with ``prefix``) held by more than one order
        of the drill SKU, by the mapped column of ``kind`` (``external_ref`` or
        ``idempotency_key``, as :meth:`key_kind` names it), as the duplicate-orders invariant
        counts them."""
        column = dict(self.sql.key_columns())[kind]
        query = self.sql.duplicate_keys(column, skus=[self.sku], ordered=False)
        rows = self._run(lambda conn: self._rows(conn, query))
        return {str(k): int(n) for k, n in rows if str(k).startswith(prefix)}

    def key_kind(self, preferred: str) -> str | None:
        """``preferred`` when mapped, else the other key column, else ``None``."""
        kinds = [kind for kind, _ in self.sql.key_columns()]
        return preferred if preferred in kinds else next(iter(kinds), None)
