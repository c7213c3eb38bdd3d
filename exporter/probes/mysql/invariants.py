"""Negative stock and duplicate orders per key on MySQL and MariaDB.

Their statements come from :class:`stocksentry.exporter.invariants.InvariantSql` (``mysql``
dialect), the builder ``stocksentry reconcile`` uses; the duplicate bookkeeping is
:class:`~stocksentry.exporter.probes.duplicates.DuplicateKeys` and the families (totals and
the per-SKU worst N) come from :mod:`..families`, both shared with PostgreSQL, so the two
dialects export the same series for the same rows.
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
from .common import MyDbProbe, number, statement
from .oversold import read_horizon
from .pool import MyPool, MySession

__all__ = ["DuplicateOrdersProbe", "NegativeStockProbe"]


class NegativeStockProbe(MyDbProbe):
    """``stock_negative_inventory_skus`` / ``_units``: SKUs below zero and by how much;
    ``stock_negative_inventory_sku_units{sku}``: the ``top_skus`` lowest by name.

    MySQL has no partial index: both statements read the range ``< 0`` of an index on
    ``products(stock)``, the totals first, then (only when there are SKUs below zero) the
    worst ``top_skus`` rows, sorted in memory (they are the few rows below zero). The
    units of the SKUs not named go under ``__other__``; promo SKUs are at 0 when not below
    zero.
    """

    specs = (
        catalog.NEGATIVE_INVENTORY_SKUS,
        catalog.NEGATIVE_INVENTORY_UNITS,
        catalog.NEGATIVE_INVENTORY_SKU_UNITS,
    )

    def __init__(
        self, config: ExporterConfig, pool: MyPool, guard: LabelGuard | None = None
    ) -> None:
        settings = config.probes.negative_stock
        super().__init__("negative_stock", settings, pool)
        self._guard = guard or default_guard(config)
        self._pinned = pinned_labels(config.sku_guard.promo_skus, self._guard)
        self.top = settings.top_skus
        builder = InvariantSql(config.schema, dialect="mysql")
        self._sql, self._params = statement(builder.negative_stock_totals())
        worst = builder.negative_stock(ordered=True)
        self._worst = Query((*worst.parts, f" LIMIT {int(self.top)}"), worst.columns)

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        skus, units = await session.one(self._sql, self._params)
        worst: list[tuple[Any, Any]] = []
        if number(skus):
            worst = [(sku, number(stock)) for sku, stock in await self.fetch(session, self._worst)]
        return negative_stock_families(
            number(skus),
            number(units),
            worst,
            top=self.top,
            guard=self._guard,
            pinned=self._pinned,
        )


class DuplicateOrdersProbe(MyDbProbe):
    """``stock_duplicate_order_keys``: keys with more than one order in the recent window;
    ``stock_duplicate_order_sku_keys{sku}``: per SKU among those keys' orders' items, the
    ``top_skus`` with the most keys by name, the rest under ``__other__``.

    As on PostgreSQL: the first run reads the window, later runs ask only about the keys
    of the orders created since the last horizon (this dialect's, :mod:`.oversold`); the
    SKUs of the keys held come from one more statement per key kind
    (:func:`~stocksentry.exporter.probes.families.duplicate_key_skus`: the key column's
    index, then each order's items and product by their keys).
    """

    specs = (catalog.DUPLICATE_ORDER_KEYS, catalog.DUPLICATE_ORDER_SKU_KEYS)

    def __init__(
        self, config: ExporterConfig, pool: MyPool, guard: LabelGuard | None = None
    ) -> None:
        settings = config.probes.duplicate_orders
        super().__init__("duplicate_orders", settings, pool)
        self._guard = guard or default_guard(config)
        self.top = settings.top_skus
        self._builder = InvariantSql(config.schema, dialect="mysql")
        if not self._builder.key_columns():
            raise ValueError("the duplicate_orders probe needs external_ref or idempotency_key")
        self._window = dt.timedelta(seconds=settings.window)
        self._margin = settings.clock_margin
        self.keys = DuplicateKeys(window=settings.window)

    def reset(self) -> None:
        """Forget the keys (a new leader reads the window again)."""
        self.keys = DuplicateKeys(window=self._window.total_seconds())

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        horizon, now = await read_horizon(session, settle_after=0.0, margin=self._margin)

        async def fetch(query: Query) -> list[tuple[Any, ...]]:
            return await self.fetch(session, query)

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
