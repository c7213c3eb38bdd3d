"""``cache_drift`` on MySQL/MariaDB: the promo SKUs' stock in Redis against the database's.

The probe is :class:`~stocksentry.exporter.probes.redis.CacheDriftProbe` (Redis first,
outside the transaction, then one indexed read of the promo SKUs, then the grace and
tolerance bookkeeping); only its database read is this dialect's. Imported only when a
``redis`` section is configured (the redis package comes with the exporter extra).
"""

from __future__ import annotations

from stocksentry.instrumentation.guard import LabelGuard

from ...config import ExporterConfig
from ...invariants import quote
from ..redis import CacheDriftProbe, RedisSource
from .common import ident
from .pool import MyPool, MySession

__all__ = ["MyCacheDriftProbe"]


class MyCacheDriftProbe(CacheDriftProbe):
    """``stock_cache_drift_skus{cache="redis"}`` and ``stock_cache_drift_sku_units{cache,
    sku}`` with the stock read from MySQL/MariaDB."""

    def __init__(
        self,
        config: ExporterConfig,
        pool: MyPool,
        source: RedisSource,
        *,
        guard: LabelGuard | None = None,
    ) -> None:
        # The base class reads the database only through pool.read(self._database_stock),
        # which MyPool offers with a MySQL session in place of a psycopg connection.
        super().__init__(config, pool, source, guard=guard)  # type: ignore[arg-type]
        p = config.schema.products
        marks = ", ".join(["%s"] * len(self.skus))
        sku, stock = quote(p.sku, "mysql"), quote(p.stock, "mysql")
        self._my_sql = f"SELECT {sku}, {stock} FROM {ident(p.table)} WHERE {sku} IN ({marks})"  # noqa: S608 - quoted identifiers, values as parameters

    async def _database_stock(self, session: MySession) -> dict[str, float]:  # type: ignore[override]  # a MySQL session, as MyPool.read gives
        if not self.skus:
            return {}
        rows = await session.rows(self._my_sql, list(self.skus))
        return {str(sku): float(value) for sku, value in rows if value is not None}
