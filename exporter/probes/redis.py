"""The Redis side: the stock cache compared with the database (``stock_cache_drift_skus``,
and per SKU ``stock_cache_drift_sku_units``).

For every promo SKU: the cached stock (one ``MGET``) against the database's (one indexed
query), drifting once they differ beyond ``redis.tolerance`` for ``redis.grace``: see
docs/exporter-config.md (``probes.cache_drift``).

Example::

    source = RedisSource(config.redis, timeout=2.0)
    probe = CacheDriftProbe(config, pool, source, guard=LabelGuard(100))
    await probe.run()     # stock_cache_drift_skus{cache="redis"}, _sku_units{cache, sku}
    await source.close()
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Final

import redis.asyncio as aioredis
from prometheus_client.core import Metric
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard

from ..config import ExporterConfig, RedisConfig
from .base import Backoff, family
from .db import DbProbe
from .dialects import Session
from .families import pinned_labels, worst_sku_samples
from .pool import Pool

#: The ``cache`` label value of ``stock_cache_drift_skus``.
CACHE_LABEL: Final = "redis"


class RedisSource:
    """A lazily created Redis client with backoff while Redis is unreachable (redis-py's
    own retries are off: a probe run never waits longer than its timeout)."""

    def __init__(self, config: RedisConfig, *, timeout: float) -> None:
        self.config = config
        self.timeout = timeout
        self._client: aioredis.Redis | None = None
        self._backoff = Backoff()

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``MGET keys``: the raw values, ``None`` where a key is missing."""
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self.config.url.reveal(),
                socket_timeout=self.timeout,
                socket_connect_timeout=self.timeout,
                retry=Retry(NoBackoff(), 0),
            )
        with self._backoff.attempt("redis", (RedisConnectionError, RedisTimeoutError, OSError)):
            values = await self._client.mget(list(keys))
        # Without decode_responses the values are bytes; str only if someone turned it on.
        return [v.encode() if isinstance(v, str) else v for v in values]

    async def close(self) -> None:
        """Close the client's connections (a later call opens new ones)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class CacheDriftProbe(DbProbe):
    """``stock_cache_drift_skus{cache="redis"}`` and ``stock_cache_drift_sku_units{cache,
    sku}`` for the promo SKUs (see the module); it reads the database: leader only."""

    specs = (catalog.CACHE_DRIFT_SKUS, catalog.CACHE_DRIFT_SKU_UNITS)

    def __init__(
        self,
        config: ExporterConfig,
        pool: Pool,
        source: RedisSource,
        *,
        guard: LabelGuard,
    ) -> None:
        settings = config.probes.cache_drift
        super().__init__("cache_drift", settings, pool)
        assert config.redis is not None  # noqa: S101 - the runner builds it only with one
        self.source = source
        self.skus = config.sku_guard.promo_skus
        self.top = settings.top_skus
        self._guard = guard
        # Every compared SKU is a promo SKU: each keeps its series, at 0 while in step.
        self._pinned = pinned_labels(self.skus, self._guard)
        self.tolerance = config.redis.tolerance
        self.grace = config.redis.grace
        self._keys = [config.redis.key(sku) for sku in self.skus]
        # When each SKU was first seen drifting in the current uninterrupted stretch, and
        # the cached value of the previous run (a changed value restarts the stretch).
        self._since: dict[str, float] = {}
        self._previous: dict[str, float] = {}
        p, q = config.schema.products, self.dialect.quote
        marks = ", ".join(["%s"] * len(self.skus))
        # Quoted identifiers, values as parameters.
        self._sql = (
            f"SELECT {q(p.sku)}, {q(p.stock)} FROM {q(p.table)}"  # noqa: S608
            f" WHERE {q(p.sku)} IN ({marks})"
        )

    async def run(self) -> tuple[Metric, ...]:
        # Redis first, outside the transaction: the database transaction stays as short as
        # one indexed query.
        cached = await self.source.get_many(self._keys)
        stock = await self.pool.read(self.database_stock, statement_timeout=self.statement_timeout)
        now = time.monotonic()
        drifting = 0
        units: list[tuple[str, float]] = []
        for sku, raw in zip(self.skus, cached, strict=True):
            in_db = stock.get(sku)
            previous = self._previous.pop(sku, None)
            if raw is None or in_db is None:
                self._since.pop(sku, None)
                continue
            try:
                value = float(raw.decode("utf-8").strip())
            except (UnicodeDecodeError, ValueError):
                value = math.nan  # not a number: it drifts
            self._previous[sku] = value
            differs = math.isnan(value) or abs(value - in_db) > self.tolerance
            if not differs:
                self._since.pop(sku, None)
                continue
            # A changed cached value restarts the stretch (NaN equals NaN here: a value that
            # stays unreadable is not a refresh).
            both_nan = previous is not None and math.isnan(previous) and math.isnan(value)
            if previous != value and not both_nan:
                self._since[sku] = now
            since = self._since.setdefault(sku, now)
            if now - since >= self.grace:
                drifting += 1
                units.append((sku, math.inf if math.isnan(value) else abs(value - in_db)))
        per_sku = worst_sku_samples(units, top=self.top, guard=self._guard, pinned=self._pinned)
        return (
            family(catalog.CACHE_DRIFT_SKUS, [((CACHE_LABEL,), float(drifting))]),
            family(
                catalog.CACHE_DRIFT_SKU_UNITS,
                [((CACHE_LABEL, sku), value) for (sku,), value in per_sku],
            ),
        )

    async def database_stock(self, session: Session) -> dict[str, float]:
        """The promo SKUs' stock in the database (one indexed read)."""
        rows = await session.rows(self._sql, list(self.skus))
        return {str(sku): float(stock) for sku, stock in rows if stock is not None}
