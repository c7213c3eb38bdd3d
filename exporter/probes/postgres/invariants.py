"""The invariant probes: negative stock, oversold units per SKU, duplicate orders per key.

Their statements come from :class:`stocksentry.exporter.invariants.InvariantSql`, the
builder ``stocksentry reconcile`` uses too: each figure is an aggregate over the rows
reconcile would list, so the dashboard and the audit agree by construction.
"""

from __future__ import annotations

import datetime as dt

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value

from ...config import ExporterConfig
from ...invariants import InvariantSql
from ..base import family
from .common import DbProbe, composed, number, one_row
from .pool import Conn, PgPool

__all__ = ["DuplicateOrdersProbe", "NegativeStockProbe", "OversoldProbe"]


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


class OversoldProbe(DbProbe):
    """``stock_oversold_units{sku}``: paid units beyond each SKU's allocation.

    Only SKUs that are oversold come back from the database; promo SKUs always have a
    series (0 when not oversold); other SKUs go through the SKU guard, and those folded
    into ``__other__`` are summed there. With ``scope: promo`` only the promo SKUs' items
    are read.
    """

    specs = (catalog.OVERSOLD_UNITS,)

    def __init__(self, config: ExporterConfig, pool: PgPool, guard: LabelGuard) -> None:
        settings = config.probes.oversold
        super().__init__("oversold", settings, pool)
        self._guard = guard
        self._pinned = tuple(
            dict.fromkeys(
                sanitize_label_value(s, guard.max_length) for s in config.sku_guard.promo_skus
            )
        )
        if config.schema.products.allocation is None:
            raise ValueError("the oversold probe needs schema.products.allocation")
        promo = config.sku_guard.promo_skus if settings.scope == "promo" else None
        # Worst first, so the worst SKUs are the ones that get their own series.
        query = InvariantSql(config.schema).oversold(skus=promo, worst_first=True)
        self._sql, self._params = composed(query)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        cursor = await conn.execute(self._sql, self._params)
        by_label: dict[str, float] = dict.fromkeys(self._pinned, 0.0)
        for sku, _allocation, _sold, units in await cursor.fetchall():
            label = self._guard(str(sku))
            by_label[label] = by_label.get(label, 0.0) + number(units)
        samples = [((label,), value) for label, value in sorted(by_label.items())]
        return (family(catalog.OVERSOLD_UNITS, samples),)


class DuplicateOrdersProbe(DbProbe):
    """``stock_duplicate_order_keys``: keys with more than one order in the recent window.

    External references and idempotency keys (whichever are mapped) are counted
    separately and added up. Only orders with ``created_at`` inside the window are read,
    through the ``orders(created_at)`` index.
    """

    specs = (catalog.DUPLICATE_ORDER_KEYS,)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        settings = config.probes.duplicate_orders
        super().__init__("duplicate_orders", settings, pool)
        builder = InvariantSql(config.schema)
        if not builder.key_columns():
            raise ValueError("the duplicate_orders probe needs external_ref or idempotency_key")
        window = dt.timedelta(seconds=settings.window)
        self._sql, self._params = composed(builder.duplicate_key_totals(since=window))

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        (keys,) = await one_row(conn, self._sql, self._params)
        return (family(catalog.DUPLICATE_ORDER_KEYS, [((), number(keys))]),)
