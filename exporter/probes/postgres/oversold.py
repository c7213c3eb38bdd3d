"""The oversold probe on PostgreSQL: incremental for ``scope: all``, a full scan for promo.

``scope: all`` keeps per-product paid totals between runs
(:class:`~stocksentry.exporter.probes.soldtotals.SoldTotals`, which knows no SQL) and
reads only what changed since the last run, with the statements of
:class:`~stocksentry.exporter.invariants.InvariantSql` (the builder reconcile uses, so
the figures equal its full recount). Only two things here are PostgreSQL's own: the
*horizon* statement and the products' row estimate. A MariaDB probe would replace just
those (``information_schema.innodb_trx.trx_started`` for ``pg_stat_activity``).

One run, in one read-only ``READ COMMITTED`` transaction:

1. the horizon: ``least(clock - settle_after, start of the oldest open transaction of
   this database) - clock_margin``, read *first*, so every later statement's snapshot
   holds every transaction that had committed by then. A row not committed yet belongs
   to a transaction still open, so it was created after that transaction started (less
   the margin for the app's clock and for a ``created_at`` taken just before ``BEGIN``):
   at or after the horizon. So an order that commits late is never settled unseen, however
   old its ``created_at`` or id;
2. the orders created between the last and the new boundary: added to the settled totals;
3. the orders created since the boundary (``settle_after`` and a little): read again on
   every run, so their payments, refunds and cancellations show at once;
4. the settled totals of up to ``recount_batch`` products seen for the first time;
5. one chunk of the rolling recount (``recount_period`` per pass over all products).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client.core import Metric
from psycopg import sql
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard

from ...config import ExporterConfig
from ...invariants import InvariantSql, Query
from ..families import oversold_families, pinned_labels
from ..soldtotals import MIN_CHUNK, RunLog, SoldTotals, chunk_size
from .common import DbProbe, composed, number, one_row, quoted_name
from .pool import Conn, PgPool

__all__ = ["OversoldProbe", "horizon_statement"]


def horizon_statement(*, with_clock: bool = False) -> sql.Composed:
    """PostgreSQL's horizon: no row created before it can still be uncommitted.

    Parameters ``settle_after`` and ``margin`` (intervals). Every client transaction of
    this database but the probe's own counts, those that have written nothing yet too
    (they may still insert with an old ``now()``): an open transaction holds the horizon
    at its start. Autovacuum and other server processes insert no orders and do not.
    Seeing other roles' ``xact_start`` needs ``pg_monitor``. ``with_clock`` adds a second
    column, the database's clock.
    """
    return sql.SQL(
        "SELECT least(clock_timestamp() - %(settle_after)s,"
        " (SELECT min(a.xact_start) FROM pg_stat_activity AS a"
        " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
        " AND a.backend_type = 'client backend' AND a.xact_start IS NOT NULL))"
        " - %(margin)s{}"
    ).format(sql.SQL(", clock_timestamp()") if with_clock else sql.SQL(""))


class OversoldProbe(DbProbe):
    """``stock_oversold_units{sku}``: paid units beyond each SKU's allocation.

    Only oversold SKUs get a series, and every promo SKU (0 when not oversold); other
    SKUs go through the SKU guard, and those folded into ``__other__`` are summed there.
    ``scope: promo`` reads the promo SKUs' whole history on every run (a few SKUs);
    ``scope: all`` runs incrementally (see the module).
    """

    specs = (catalog.OVERSOLD_UNITS,)

    def __init__(self, config: ExporterConfig, pool: PgPool, guard: LabelGuard) -> None:
        settings = config.probes.oversold
        super().__init__("oversold", settings, pool)
        self._settings = settings
        self._guard = guard
        self._pinned = pinned_labels(config.sku_guard.promo_skus, guard)
        if config.schema.products.allocation is None:
            raise ValueError("the oversold probe needs schema.products.allocation")
        self._builder = InvariantSql(config.schema)
        self._products = quoted_name(config.schema.products.table)
        self.incremental = settings.scope == "all"
        self.totals = SoldTotals(max_products=settings.max_tracked_products)
        self._chunk = MIN_CHUNK
        self._log = RunLog(self.name)
        if not self.incremental:
            query = self._builder.oversold(skus=config.sku_guard.promo_skus, worst_first=True)
            self._sql, self._params = composed(query)

    def reset(self) -> None:
        """Forget the totals (a new leader starts from nothing and rebuilds them)."""
        self.totals = SoldTotals(max_products=self._settings.max_tracked_products)
        self._log.reset()

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        if not self.incremental:
            cursor = await conn.execute(self._sql, self._params)
            rows = [(sku, units) for sku, _a, _s, units in await cursor.fetchall()]
        else:
            await self.step(conn)
            rows = [(s.sku, s.oversold_units) for s in self.totals.oversold()]
        return oversold_families(rows, pinned=self._pinned, guard=self._guard, number=number)

    async def _rows(self, conn: Conn, query: Query) -> list[tuple[Any, ...]]:
        statement, params = composed(query)
        cursor = await conn.execute(statement, params)
        return [tuple(row) for row in await cursor.fetchall()]

    async def step(self, conn: Conn) -> None:
        """One incremental run: PostgreSQL's horizon, then
        :func:`~stocksentry.exporter.probes.soldtotals.incremental_run` (the statements of
        every dialect, and the bookkeeping)."""
        s = self._settings
        (horizon,) = await one_row(
            conn,
            horizon_statement(),
            {
                "settle_after": dt.timedelta(seconds=s.settle_after),
                "margin": dt.timedelta(seconds=s.clock_margin),
            },
        )
        totals = self.totals
        if totals.cursor is None:
            await self._size_chunk(conn)

        async def fetch(query: Query) -> list[tuple[Any, ...]]:
            return await self._rows(conn, query)

        await self._log.run(
            totals,
            fetch,
            self._builder,
            horizon=horizon,
            chunk=self._chunk,
            recount_batch=s.recount_batch,
        )

    async def _size_chunk(self, conn: Conn) -> None:
        """Products per chunk, so that one pass takes ``recount_period``."""
        (estimate,) = await one_row(
            conn,
            sql.SQL("SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = to_regclass(%s)"),
            (self._products,),
        )
        self._chunk = chunk_size(number(estimate), self._settings.recount_period, self.interval)
