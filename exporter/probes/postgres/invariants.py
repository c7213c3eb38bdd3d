"""The invariant probes: negative stock and duplicate orders per key (oversold: :mod:`.oversold`).

Their statements come from :class:`stocksentry.exporter.invariants.InvariantSql`, the
builder ``stocksentry reconcile`` uses too: each figure is an aggregate over the rows
reconcile would list, so the dashboard and the audit agree by construction.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard

from ...config import ExporterConfig
from ...invariants import InvariantSql, Query
from ..duplicates import DuplicateKeys
from ..families import (
    default_guard,
    duplicate_order_families,
    negative_stock_families,
    pinned_labels,
    refresh_duplicate_keys,
)
from .common import DbProbe, composed, number, one_row
from .oversold import horizon_statement
from .pool import Conn, PgPool

__all__ = ["DuplicateOrdersProbe", "NegativeStockProbe"]


class NegativeStockProbe(DbProbe):
    """``stock_negative_inventory_skus`` / ``_units``: SKUs below zero and by how much;
    ``stock_negative_inventory_sku_units{sku}``: the ``top_skus`` lowest by name.

    Reads the partial index ``products(available_stock) WHERE available_stock < 0``, twice:
    the totals, then the worst SKUs (at most ``top_skus`` rows). The units of the SKUs not
    named are summed under ``__other__``; promo SKUs are exported at 0 when not below zero.
    """

    specs = (
        catalog.NEGATIVE_INVENTORY_SKUS,
        catalog.NEGATIVE_INVENTORY_UNITS,
        catalog.NEGATIVE_INVENTORY_SKU_UNITS,
    )

    def __init__(
        self, config: ExporterConfig, pool: PgPool, guard: LabelGuard | None = None
    ) -> None:
        settings = config.probes.negative_stock
        super().__init__("negative_stock", settings, pool)
        self._guard = guard or default_guard(config)
        self._pinned = pinned_labels(config.sku_guard.promo_skus, self._guard)
        self.top = settings.top_skus
        builder = InvariantSql(config.schema)
        self._sql, self._params = composed(builder.negative_stock_totals())
        worst = builder.negative_stock(ordered=True)
        self._worst_sql, self._worst_params = composed(
            Query((*worst.parts, f" LIMIT {int(self.top)}"), worst.columns)
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        skus, units = await one_row(conn, self._sql, self._params)
        worst: list[tuple[Any, Any]] = []
        if number(skus):
            cursor = await conn.execute(self._worst_sql, self._worst_params)
            worst = [(sku, number(stock)) for sku, stock in await cursor.fetchall()]
        return negative_stock_families(
            number(skus),
            number(units),
            worst,
            top=self.top,
            guard=self._guard,
            pinned=self._pinned,
        )


class DuplicateOrdersProbe(DbProbe):
    """``stock_duplicate_order_keys``: keys with more than one order in the recent window;
    ``stock_duplicate_order_sku_keys{sku}``: per SKU among those keys' orders' items, the
    ``top_skus`` with the most keys by name, the rest under ``__other__``.

    External references and idempotency keys (whichever are mapped) are counted
    separately and added up. The first run reads the whole window (``orders(created_at)``);
    later runs read only the keys of the orders created since the last horizon and ask
    about those keys alone, through the index on each key column
    (:class:`~stocksentry.exporter.probes.duplicates.DuplicateKeys` keeps the rest).
    """

    specs = (catalog.DUPLICATE_ORDER_KEYS, catalog.DUPLICATE_ORDER_SKU_KEYS)

    def __init__(
        self, config: ExporterConfig, pool: PgPool, guard: LabelGuard | None = None
    ) -> None:
        settings = config.probes.duplicate_orders
        super().__init__("duplicate_orders", settings, pool)
        self._guard = guard or default_guard(config)
        self.top = settings.top_skus
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

        async def fetch(query: Query) -> list[tuple[Any, ...]]:
            return await self._rows(conn, query)

        keys = self.keys
        by_sku = await refresh_duplicate_keys(
            keys,
            self._builder,
            fetch,
            window=self._window,
            horizon=horizon,
            now=now,
            number=number,
        )
        return duplicate_order_families(
            keys.count(), by_sku.items(), top=self.top, guard=self._guard
        )
