"""The invariant probes: negative stock and duplicate orders per key (oversold: :mod:`.oversold`).

Their statements come from :class:`stocksentry.exporter.invariants.InvariantSql`, the
builder ``stocksentry reconcile`` uses too: each figure is an aggregate over the rows
reconcile would list, so the dashboard and the audit agree by construction.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ...invariants import InvariantSql, Query
from ..base import family
from ..duplicates import DuplicateKeys
from .common import DbProbe, composed, number, one_row
from .oversold import horizon_statement
from .pool import Conn, PgPool

__all__ = ["MAX_NEW_KEYS", "DuplicateOrdersProbe", "NegativeStockProbe"]

#: Beyond this many keys of new orders in one run, duplicate_orders reads the window again.
MAX_NEW_KEYS: Final = 5000


class NegativeStockProbe(DbProbe):
    """``stock_negative_inventory_skus`` / ``_units``: SKUs below zero and by how much.

    Reads the partial index ``products(available_stock) WHERE available_stock < 0``.
    """

    specs = (catalog.NEGATIVE_INVENTORY_SKUS, catalog.NEGATIVE_INVENTORY_UNITS)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("negative_stock", config.probes.negative_stock, pool)
        self._sql, self._params = composed(InvariantSql(config.schema).negative_stock_totals())

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        skus, units = await one_row(conn, self._sql, self._params)
        return (
            family(catalog.NEGATIVE_INVENTORY_SKUS, [((), number(skus))]),
            family(catalog.NEGATIVE_INVENTORY_UNITS, [((), number(units))]),
        )


class DuplicateOrdersProbe(DbProbe):
    """``stock_duplicate_order_keys``: keys with more than one order in the recent window.

    External references and idempotency keys (whichever are mapped) are counted
    separately and added up. The first run reads the whole window (``orders(created_at)``);
    later runs read only the keys of the orders created since the last horizon and ask
    about those keys alone, through the index on each key column
    (:class:`~stocksentry.exporter.probes.duplicates.DuplicateKeys` keeps the rest).
    """

    specs = (catalog.DUPLICATE_ORDER_KEYS,)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        settings = config.probes.duplicate_orders
        super().__init__("duplicate_orders", settings, pool)
        self._builder = InvariantSql(config.schema)
        if not self._builder.key_columns():
            raise ValueError("the duplicate_orders probe needs external_ref or idempotency_key")
        self._window = dt.timedelta(seconds=settings.window)
        self._margin = dt.timedelta(seconds=settings.clock_margin)
        self.keys = DuplicateKeys(window=settings.window)

    def reset(self) -> None:
        """Forget the keys (a new leader reads the window again)."""
        self.keys = DuplicateKeys(window=self._window.total_seconds())

    async def _rows(self, conn: Conn, query: Query) -> list[tuple[Any, ...]]:
        statement, params = composed(query)
        cursor = await conn.execute(statement, params)
        return [tuple(row) for row in await cursor.fetchall()]

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        horizon, now = await one_row(
            conn,
            horizon_statement(with_clock=True),
            {"settle_after": dt.timedelta(0), "margin": self._margin},
        )
        keys = self.keys
        found: list[tuple[str, list[tuple[Any, ...]]]] = []
        for kind, column in self._builder.key_columns():
            if keys.boundary is None:
                rows = await self._rows(
                    conn, self._builder.duplicate_key_expiry(column, window=self._window)
                )
            else:
                new = await self._rows(
                    conn, self._builder.keys_created(column, start=keys.boundary)
                )
                if len(new) > MAX_NEW_KEYS:
                    # A horizon held back long (an open transaction): one read of the window
                    # costs less than asking about that many keys one by one.
                    query = self._builder.duplicate_key_expiry(column, window=self._window)
                else:
                    query = self._builder.duplicate_key_expiry(
                        column, window=self._window, keys=[k for (k,) in new]
                    )
                rows = await self._rows(conn, query) if new else []
            found.append((kind, rows))
        for kind, rows in found:
            keys.update(kind, rows)
        if keys.boundary is None or horizon > keys.boundary:
            keys.boundary = horizon
        keys.expire(now)
        return (family(catalog.DUPLICATE_ORDER_KEYS, [((), float(keys.count()))]),)
