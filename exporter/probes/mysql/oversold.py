"""The oversold probe on MySQL and MariaDB: the PostgreSQL probe's incremental design.

Only the dialect's own parts are here: the *horizon*, the ``fetch`` of
:func:`~stocksentry.exporter.probes.soldtotals.incremental_run`, and the products' row
estimate; the statements come from :class:`~stocksentry.exporter.invariants.InvariantSql`
(``mysql`` dialect) and the bookkeeping from
:class:`~stocksentry.exporter.probes.soldtotals.SoldTotals`, as on PostgreSQL.

The horizon (see :mod:`stocksentry.exporter.probes.postgres.oversold` for why it catches
every late commit)::

    least(now(6) - settle_after,
          coalesce(min(trx_started) of information_schema.innodb_trx but the probe's own,
                   now(6))) - clock_margin

- ``coalesce``: MySQL's ``least()`` is ``NULL`` when an argument is (PostgreSQL's skips it);
- ``innodb_trx`` lists every InnoDB transaction of the server that has read or written
  (every database's: a transaction elsewhere holds the horizon back too, which costs a
  longer recent part, never a missed order); a transaction that has run no statement yet
  is not listed, but its first ``INSERT`` stamps ``NOW()`` of that statement, which is
  after its ``trx_started``; a ``created_at`` the app takes before ``BEGIN`` is what
  ``clock_margin`` is for;
- ``trx_started`` has whole seconds: rounded down, so the horizon is at most a second
  earlier than needed (safe);
- reading ``innodb_trx`` needs the ``PROCESS`` privilege.

Each later statement of the run is a new READ COMMITTED snapshot (see :mod:`.pool`), so it
sees every transaction that had committed when the horizon was read.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard

from ...config import ExporterConfig
from ...invariants import InvariantSql, Query
from ..families import oversold_families, pinned_labels
from ..soldtotals import MIN_CHUNK, RunLog, SoldTotals, chunk_size
from .common import MyDbProbe, interval_us, number, table_parts
from .pool import MyPool, MySession

__all__ = ["HORIZON_SQL", "OversoldProbe", "read_horizon"]


HORIZON_SQL: Final = (
    "SELECT least(now(6) - INTERVAL %(settle_after)s MICROSECOND,"
    " coalesce((SELECT min(t.trx_started) FROM information_schema.innodb_trx AS t"
    " WHERE t.trx_mysql_thread_id <> connection_id()), now(6)))"
    " - INTERVAL %(margin)s MICROSECOND, now(6)"
)

_ROW_ESTIMATE: Final = (
    "SELECT coalesce(max(table_rows), 0) FROM information_schema.tables"
    " WHERE table_schema = coalesce(%(schema)s, database()) AND table_name = %(table)s"
)


async def read_horizon(
    session: MySession, *, settle_after: float, margin: float
) -> tuple[datetime, datetime]:
    """``(horizon, the database's clock)``: no row created before the horizon can still
    be uncommitted (see the module)."""
    horizon, now = await session.one(
        HORIZON_SQL, {"settle_after": interval_us(settle_after), "margin": interval_us(margin)}
    )
    if not isinstance(horizon, datetime) or not isinstance(now, datetime):
        raise TypeError("the horizon is not a point in time")
    return horizon, now


class OversoldProbe(MyDbProbe):
    """``stock_oversold_units{sku}``: paid units beyond each SKU's allocation.

    The same figures as the PostgreSQL probe: oversold SKUs and every promo SKU (0 when
    not oversold), the others through the SKU guard. ``scope: promo`` reads the promo
    SKUs' whole history every run; ``scope: all`` runs incrementally.
    """

    specs = (catalog.OVERSOLD_UNITS,)

    def __init__(self, config: ExporterConfig, pool: MyPool, guard: LabelGuard) -> None:
        settings = config.probes.oversold
        super().__init__("oversold", settings, pool)
        self._settings = settings
        self._guard = guard
        self._pinned = pinned_labels(config.sku_guard.promo_skus, guard)
        if config.schema.products.allocation is None:
            raise ValueError("the oversold probe needs schema.products.allocation")
        self._builder = InvariantSql(config.schema, dialect="mysql")
        self._products = table_parts(config.schema.products.table)
        self.incremental = settings.scope == "all"
        self.totals = SoldTotals(max_products=settings.max_tracked_products)
        self._chunk = MIN_CHUNK
        self._log = RunLog(self.name)
        self._promo = self._builder.oversold(skus=config.sku_guard.promo_skus, worst_first=True)

    def reset(self) -> None:
        """Forget the totals (a new leader starts from nothing and rebuilds them)."""
        self.totals = SoldTotals(max_products=self._settings.max_tracked_products)
        self._log.reset()

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        if not self.incremental:
            found = await self.fetch(session, self._promo)
            rows = [(sku, units) for sku, _a, _s, units in found]
        else:
            await self.step(session)
            rows = [(s.sku, s.oversold_units) for s in self.totals.oversold()]
        return oversold_families(rows, pinned=self._pinned, guard=self._guard, number=number)

    async def step(self, session: MySession) -> None:
        """One incremental run: this dialect's horizon, then
        :func:`~stocksentry.exporter.probes.soldtotals.incremental_run`."""
        s = self._settings
        horizon, _now = await read_horizon(
            session, settle_after=s.settle_after, margin=s.clock_margin
        )
        totals = self.totals
        if totals.cursor is None:
            await self._size_chunk(session)

        async def fetch(query: Query) -> list[tuple[Any, ...]]:
            return await self.fetch(session, query)

        await self._log.run(
            totals,
            fetch,
            self._builder,
            horizon=horizon,
            chunk=self._chunk,
            recount_batch=s.recount_batch,
        )

    async def _size_chunk(self, session: MySession) -> None:
        """Products per chunk, so that one pass takes ``recount_period`` (from InnoDB's
        row estimate in ``information_schema.tables``)."""
        schema, table = self._products
        (estimate,) = await session.one(_ROW_ESTIMATE, {"schema": schema, "table": table})
        self._chunk = chunk_size(number(estimate), self._settings.recount_period, self.interval)
