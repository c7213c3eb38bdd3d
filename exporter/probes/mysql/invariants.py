"""Negative stock and duplicate orders per key on MySQL and MariaDB.

Their statements come from :class:`stocksentry.exporter.invariants.InvariantSql` (``mysql``
dialect), the builder ``stocksentry reconcile`` uses; the duplicate bookkeeping is
:class:`~stocksentry.exporter.probes.duplicates.DuplicateKeys`, shared with PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ...invariants import InvariantSql
from ..base import family
from ..duplicates import DuplicateKeys
from .common import MyDbProbe, number, statement
from .oversold import read_horizon
from .pool import MyPool, MySession

__all__ = ["MAX_NEW_KEYS", "DuplicateOrdersProbe", "NegativeStockProbe"]

#: Beyond this many keys of new orders in one run, duplicate_orders reads the window again.
MAX_NEW_KEYS: Final = 5000


class NegativeStockProbe(MyDbProbe):
    """``stock_negative_inventory_skus`` / ``_units``: SKUs below zero and by how much.

    MySQL has no partial index: it reads a range of an index on ``products(stock)``.
    """

    specs = (catalog.NEGATIVE_INVENTORY_SKUS, catalog.NEGATIVE_INVENTORY_UNITS)

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        super().__init__("negative_stock", config.probes.negative_stock, pool)
        self._sql, self._params = statement(
            InvariantSql(config.schema, dialect="mysql").negative_stock_totals()
        )

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        skus, units = await session.one(self._sql, self._params)
        return (
            family(catalog.NEGATIVE_INVENTORY_SKUS, [((), number(skus))]),
            family(catalog.NEGATIVE_INVENTORY_UNITS, [((), number(units))]),
        )


class DuplicateOrdersProbe(MyDbProbe):
    """``stock_duplicate_order_keys``: keys with more than one order in the recent window.

    As on PostgreSQL: the first run reads the window, later runs ask only about the keys
    of the orders created since the last horizon (this dialect's, :mod:`.oversold`).
    """

    specs = (catalog.DUPLICATE_ORDER_KEYS,)

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        settings = config.probes.duplicate_orders
        super().__init__("duplicate_orders", settings, pool)
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
        keys = self.keys
        found: list[tuple[str, list[tuple[Any, ...]]]] = []
        for kind, column in self._builder.key_columns():
            if keys.boundary is None:
                rows = await self.fetch(
                    session, self._builder.duplicate_key_expiry(column, window=self._window)
                )
            else:
                new = await self.fetch(
                    session, self._builder.keys_created(column, start=keys.boundary)
                )
                if len(new) > MAX_NEW_KEYS:
                    query = self._builder.duplicate_key_expiry(column, window=self._window)
                else:
                    query = self._builder.duplicate_key_expiry(
                        column, window=self._window, keys=[k for (k,) in new]
                    )
                rows = await self.fetch(session, query) if new else []
            found.append((kind, rows))
        for kind, rows in found:
            keys.update(kind, rows)
        if keys.boundary is None or horizon > keys.boundary:
            keys.boundary = horizon
        keys.expire(now)
        return (family(catalog.DUPLICATE_ORDER_KEYS, [((), float(keys.count()))]),)
