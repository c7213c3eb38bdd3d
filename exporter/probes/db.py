"""The database probes, one class each for every dialect (what differs is in its
:class:`~.dialects.Dialect`), each run in the pool's read-only transaction.

The invariant probes' statements come from :class:`~stocksentry.exporter.invariants.InvariantSql`,
as ``stocksentry reconcile``'s do: each figure aggregates the rows reconcile would list. The
incremental runs read the dialect's *horizon* first (no row created before it can still be
uncommitted): docs/exporter-config.md, "How ``oversold`` counts".

Example::

    pool = Pool(config.database)
    families = await NegativeStockProbe(config, pool, LabelGuard(100)).run()
    await pool.close()
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable
from typing import Any, Final

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.catalog import MetricSpec
from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value

from ..config import CustomProbe, ExporterConfig, ProbeSettings
from ..invariants import InvariantSql, Query
from .base import LOGGER, Probe, family
from .dialects import Session, number
from .families import (
    MAX_SKU_KEYS,
    OutboxStuck,
    OutboxStuckLog,
    negative_stock_families,
    pinned_labels,
    worst_sku_samples,
)
from .pool import Pool
from .soldtotals import MIN_CHUNK, RunLog, SoldTotals, chunk_size, incremental_run

#: New keys asked about one by one at most; beyond it one read of the window is cheaper.
MAX_NEW_KEYS: Final = 5000


class DuplicateKeys:
    """The duplicate keys of the window per key kind, kept between runs, each with the time
    it ends: when its second newest order leaves the window. A key only *becomes* a
    duplicate through a new order, so after one read of the window each run asks only
    about the keys of the orders created since the last horizon."""

    def __init__(self, *, window: float) -> None:
        self.window = dt.timedelta(seconds=window)
        #: Orders created at or after it are read again next run; ``None``: read the
        #: whole window first.
        self.boundary: dt.datetime | None = None
        self._ends: dict[tuple[str, str], dt.datetime] = {}

    def update(self, kind: str, rows: Iterable[tuple[Any, Any]]) -> None:
        """Rows ``(key, second_newest_created_at)`` of keys held by two orders or more."""
        for key, second_newest in rows:
            self._ends[(kind, str(key))] = second_newest + self.window

    def expire(self, now: dt.datetime) -> None:
        """Forget the keys whose second newest order has left the window by ``now``."""
        gone = [k for k, end in self._ends.items() if end < now]
        for k in gone:
            del self._ends[k]

    def keys_of(self, kind: str) -> list[str]:
        """The duplicate keys of one kind (``external_ref``, ``idempotency_key``), sorted."""
        return sorted(key for k, key in self._ends if k == kind)

    def count(self) -> int:
        """How many keys, over every kind, are duplicates now."""
        return len(self._ends)


class DbProbe(Probe):
    """A probe whose :meth:`query` runs in the pool's read-only transaction."""

    def __init__(self, name: str, settings: ProbeSettings, pool: Pool) -> None:
        super().__init__(name, interval=settings.interval, timeout=settings.timeout)
        self.pool = pool
        self.dialect = pool.dialect
        self.statement_timeout = settings.statement_timeout

    async def run(self) -> tuple[Metric, ...]:
        return await self.pool.read(self.query, statement_timeout=self.statement_timeout)

    async def query(self, session: Session) -> tuple[Metric, ...]:
        """Observe once through ``session`` (already in a read-only transaction)."""
        raise NotImplementedError

    async def fetch(self, session: Session, query: Query) -> list[tuple[Any, ...]]:
        """The rows of an invariant statement."""
        return await session.rows(*self.dialect.render(query))


class NegativeStockProbe(DbProbe):
    """``stock_inventory_negative_skus`` / ``_units``: SKUs below zero and by how much;
    ``stock_inventory_negative_sku_units{sku}``: the ``top_skus`` lowest by name, the rest
    under ``__other__``, promo SKUs at 0 when not below zero. Two reads of the range
    below zero of an index on ``products(stock)``: the totals, then the worst SKUs."""

    specs = (
        catalog.NEGATIVE_INVENTORY_SKUS,
        catalog.NEGATIVE_INVENTORY_UNITS,
        catalog.NEGATIVE_INVENTORY_SKU_UNITS,
    )

    def __init__(self, config: ExporterConfig, pool: Pool, guard: LabelGuard) -> None:
        settings = config.probes.negative_stock
        super().__init__("negative_stock", settings, pool)
        self._guard = guard
        self._pinned = pinned_labels(config.sku_guard.promo_skus, self._guard)
        self.top = settings.top_skus
        builder = InvariantSql(config.schema, self.dialect.name)
        self._totals = builder.negative_stock_totals()
        worst = builder.negative_stock(ordered=True)
        self._worst = Query((*worst.parts, f" LIMIT {int(self.top)}"), worst.columns)

    async def query(self, session: Session) -> tuple[Metric, ...]:
        skus, units = (await self.fetch(session, self._totals))[0]
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


class OversoldProbe(DbProbe):
    """``stock_oversold_units{sku}``: paid units beyond each SKU's allocation, for the
    oversold SKUs (through the SKU guard) and every promo SKU (0 when not oversold).
    ``scope: promo`` reads the promo SKUs' whole history every run; ``scope: all`` runs
    incrementally (:func:`~.soldtotals.incremental_run`)."""

    specs = (catalog.OVERSOLD_UNITS,)

    def __init__(self, config: ExporterConfig, pool: Pool, guard: LabelGuard) -> None:
        settings = config.probes.oversold
        super().__init__("oversold", settings, pool)
        self._settings = settings
        self._guard = guard
        self._pinned = pinned_labels(config.sku_guard.promo_skus, guard)
        self._builder = InvariantSql(config.schema, self.dialect.name)
        self._products = config.schema.products.table
        self.incremental = settings.scope == "all"
        self.totals = SoldTotals(max_products=settings.max_tracked_products)
        self._chunk = MIN_CHUNK
        self._log = RunLog(self.name)
        self._promo = self._builder.oversold(skus=config.sku_guard.promo_skus, worst_first=True)

    def reset(self) -> None:
        """Forget the totals (a new leader starts from nothing and rebuilds them)."""
        self.totals = SoldTotals(max_products=self._settings.max_tracked_products)
        self._log.reset()

    async def query(self, session: Session) -> tuple[Metric, ...]:
        if not self.incremental:
            found = await self.fetch(session, self._promo)
            rows = [(sku, units) for sku, _a, _s, units in found]
        else:
            # One incremental run: the dialect's horizon, then incremental_run.
            s, d = self._settings, self.dialect
            horizon, _now = await d.horizon(
                session, settle_after=s.settle_after, margin=s.clock_margin
            )
            if self.totals.cursor is None:
                # Products per chunk, so that one pass takes recount_period.
                (estimate,) = await session.one(d.row_estimate_sql, d.table_params(self._products))
                self._chunk = chunk_size(float(estimate), s.recount_period, self.interval)
            passes = self.totals.passes
            await incremental_run(
                self.totals,
                functools.partial(self.fetch, session),
                self._builder,
                horizon=horizon,
                chunk=self._chunk,
                recount_batch=s.recount_batch,
            )
            self._log.after_run(self.totals, passes_before=passes, recount_batch=s.recount_batch)
            rows = [(o.sku, o.oversold_units) for o in self.totals.oversold()]
        # Every oversold SKU (rows come worst first) through the guard, the promo SKUs at 0.
        samples = worst_sku_samples(rows, top=len(rows), guard=self._guard, pinned=self._pinned)
        return (family(catalog.OVERSOLD_UNITS, samples),)


class DuplicateOrdersProbe(DbProbe):
    """``stock_duplicate_order_keys``: keys (external references and idempotency keys,
    whichever are mapped, added up) with more than one order in the window;
    ``stock_duplicate_order_sku_keys{sku}``: the ``top_skus`` SKUs of those orders' items
    with the most keys, the rest under ``__other__``. The first run reads the window, later
    ones only the keys of orders created since the last horizon (:class:`DuplicateKeys`)."""

    specs = (catalog.DUPLICATE_ORDER_KEYS, catalog.DUPLICATE_ORDER_SKU_KEYS)

    def __init__(self, config: ExporterConfig, pool: Pool, guard: LabelGuard) -> None:
        settings = config.probes.duplicate_orders
        super().__init__("duplicate_orders", settings, pool)
        self._guard = guard
        self.top = settings.top_skus
        self._builder = InvariantSql(config.schema, self.dialect.name)
        if not self._builder.key_columns():
            # Without a key column every run would export 0: an all-clear, not a probe.
            raise ValueError("the duplicate_orders probe needs external_ref or idempotency_key")
        self._window = settings.window
        self._margin = settings.clock_margin
        self.keys = DuplicateKeys(window=settings.window)

    def reset(self) -> None:
        """Forget the keys (a new leader reads the window again)."""
        self.keys = DuplicateKeys(window=self._window)

    async def query(self, session: Session) -> tuple[Metric, ...]:
        horizon, now = await self.dialect.horizon(session, settle_after=0.0, margin=self._margin)
        keys, builder = self.keys, self._builder
        window = dt.timedelta(seconds=self._window)
        found: list[tuple[str, list[tuple[Any, ...]]]] = []
        for kind, column in builder.key_columns():
            if keys.boundary is None:
                rows = await self.fetch(
                    session, builder.duplicate_key_expiry(column, window=window)
                )
            else:
                new = await self.fetch(session, builder.keys_created(column, start=keys.boundary))
                # A horizon held back long (an open transaction): beyond MAX_NEW_KEYS one
                # read of the window costs less than asking about each key.
                asked = [k for (k,) in new] if len(new) <= MAX_NEW_KEYS else None
                expiry = builder.duplicate_key_expiry(column, window=window, keys=asked)
                rows = await self.fetch(session, expiry) if new else []
            found.append((kind, rows))
        # The keys change only once every statement has answered: a failed run repeats.
        for kind, rows in found:
            keys.update(kind, rows)
        if keys.boundary is None or horizon > keys.boundary:
            keys.boundary = horizon
        keys.expire(now)
        by_sku: dict[str, float] = {}
        for kind, column in builder.key_columns():
            if held := keys.keys_of(kind)[:MAX_SKU_KEYS]:
                query = builder.duplicate_key_skus(column, held, since=now - window)
                for sku, count in await self.fetch(session, query):
                    by_sku[str(sku)] = by_sku.get(str(sku), 0.0) + number(count)
        samples = worst_sku_samples(by_sku.items(), top=self.top, guard=self._guard)
        return (
            family(catalog.DUPLICATE_ORDER_KEYS, [((), float(keys.count()))]),
            family(catalog.DUPLICATE_ORDER_SKU_KEYS, samples),
        )


class LockWaitersProbe(DbProbe):
    """``stock_db_lock_waiters`` and ``stock_db_lock_wait_max_seconds`` in this database."""

    specs = (catalog.DB_LOCK_WAITERS, catalog.DB_LOCK_WAIT_MAX)

    def __init__(self, config: ExporterConfig, pool: Pool) -> None:
        super().__init__("lock_waiters", config.probes.lock_waiters, pool)

    async def query(self, session: Session) -> tuple[Metric, ...]:
        waiters, longest = await session.one(self.dialect.lock_waiters_sql(session.flavor))
        return (
            family(catalog.DB_LOCK_WAITERS, [((), number(waiters))]),
            family(catalog.DB_LOCK_WAIT_MAX, [((), max(0.0, number(longest)))]),
        )


class DeadlocksProbe(DbProbe):
    """``stock_db_server_deadlock_total{database}``: ``pg_stat_database``'s count, or InnoDB's
    server-wide ``Innodb_deadlocks`` labelled with the URL's database."""

    specs = (catalog.DB_DEADLOCKS,)

    def __init__(self, config: ExporterConfig, pool: Pool) -> None:
        super().__init__("deadlocks", config.probes.deadlocks, pool)

    async def query(self, session: Session) -> tuple[Metric, ...]:
        database, deadlocks = await self.dialect.deadlocks(session)
        return (family(catalog.DB_DEADLOCKS, [((database,), number(deadlocks))]),)


class LongTransactionsProbe(DbProbe):
    """``stock_db_long_transactions`` and ``stock_db_long_transaction_max_seconds``:
    transactions open beyond ``threshold`` holding a lock on a mapped stock table (on
    MySQL, whose locked tables are not visible, any InnoDB transaction of the database)."""

    specs = (catalog.DB_LONG_TRANSACTIONS, catalog.DB_LONG_TRANSACTION_MAX)

    def __init__(self, config: ExporterConfig, pool: Pool) -> None:
        settings = config.probes.long_transactions
        super().__init__("long_transactions", settings, pool)
        self.threshold = settings.threshold
        s = config.schema
        tables = [s.products.table, s.orders.table, s.order_items.table]
        tables += [t.table for t in (s.reservations, s.outbox) if t is not None]
        # The quoted names, comma-separated (the config allows no comma in a name).
        self._tables = ",".join(map(self.dialect.quote, dict.fromkeys(tables)))

    async def query(self, session: Session) -> tuple[Metric, ...]:
        params = {"threshold": self.dialect.interval(self.threshold), "tables": self._tables}
        count, oldest = await session.one(self.dialect.long_transactions_sql, params)
        return (
            family(catalog.DB_LONG_TRANSACTIONS, [((), number(count))]),
            family(catalog.DB_LONG_TRANSACTION_MAX, [((), max(0.0, number(oldest)))]),
        )


class ExpiredReservationsProbe(DbProbe):
    """``stock_reservations_expired_unreleased``: past ``expires_at``, still holding stock."""

    specs = (catalog.RESERVATIONS_EXPIRED_UNRELEASED,)

    def __init__(self, config: ExporterConfig, pool: Pool) -> None:
        super().__init__("expired_reservations", config.probes.expired_reservations, pool)
        r = config.schema.reservations
        assert r is not None  # noqa: S101 - the config switches the probe off without it
        q = self.dialect.quote
        self._sql = Query(
            (
                f"SELECT count(*) FROM {q(r.table)}"  # noqa: S608 - quoted identifiers
                f" WHERE {q(r.expires_at)} < {self.dialect.now} AND ",
                *InvariantSql(config.schema, self.dialect.name).held_predicate().parts,
            ),
            ("count",),
        )

    async def query(self, session: Session) -> tuple[Metric, ...]:
        ((count,),) = await self.fetch(session, self._sql)
        return (family(catalog.RESERVATIONS_EXPIRED_UNRELEASED, [((), number(count))]),)


class OutboxProbe(DbProbe):
    """``stock_outbox_pending_events``, ``stock_outbox_lag_seconds`` (oldest pending age),
    ``stock_outbox_stuck_events`` (pending beyond ``max_publish_latency``) and that latency
    (the alert's threshold), from one statement on the pending rows; stuck events are
    logged (:class:`~.families.OutboxStuckLog`)."""

    specs = (
        catalog.OUTBOX_PENDING,
        catalog.OUTBOX_LAG,
        catalog.OUTBOX_STUCK,
        catalog.OUTBOX_MAX_PUBLISH_LATENCY,
    )

    def __init__(self, config: ExporterConfig, pool: Pool) -> None:
        settings = config.probes.outbox
        super().__init__("outbox", settings, pool)
        b = config.schema.outbox
        assert b is not None  # noqa: S101 - the config switches the probe off without it
        self.max_publish_latency = settings.max_publish_latency
        self.stuck_log = OutboxStuckLog(max_publish_latency=settings.max_publish_latency)
        d, q = self.dialect, self.dialect.quote
        self._params = {"latency": d.interval(settings.max_publish_latency)}
        table, created, published = q(b.table), q(b.created_at), q(b.published_at)
        # The oldest pending event's id, through the index on created_at.
        oldest_id = (
            f", (SELECT {q(b.id)} FROM {table} WHERE {published} IS NULL"  # noqa: S608
            f" ORDER BY {created}, {q(b.id)} LIMIT 1)"
            if b.id is not None
            else ", NULL"
        )
        self._sql = (
            f"SELECT count(*), coalesce({d.seconds_since.format(f'min({created})')}, 0),"  # noqa: S608
            f" count(CASE WHEN {created} < {d.ago.format('latency')} THEN 1 END){oldest_id}"
            f" FROM {table} WHERE {published} IS NULL"
        )

    async def query(self, session: Session) -> tuple[Metric, ...]:
        pending, lag, stuck_count, oldest_id = await session.one(self._sql, self._params)
        stuck = OutboxStuck(
            count=int(number(stuck_count)),
            oldest_id=oldest_id if number(stuck_count) else None,
            oldest_age=max(0.0, number(lag)),
        )
        self.stuck_log.observe(stuck)
        return (
            family(catalog.OUTBOX_PENDING, [((), number(pending))]),
            family(catalog.OUTBOX_LAG, [((), max(0.0, number(lag)))]),
            family(catalog.OUTBOX_STUCK, [((), float(stuck.count))]),
            family(catalog.OUTBOX_MAX_PUBLISH_LATENCY, [((), self.max_publish_latency)]),
        )


#: What a custom probe's SQL is wrapped in (one statement, a derived table).
_CUSTOM_HEAD: Final = "SELECT * FROM ("
_CUSTOM_TAIL: Final = "\n) AS stocksentry_custom"


class CustomSqlProbe(DbProbe):
    """A ``probes.custom`` entry: its SQL's rows exported as one gauge.

    The SQL runs as one statement (the config refuses a ``;`` that could end it) wrapped
    in ``SELECT * FROM (<sql>) AS stocksentry_custom``, in a read-only transaction, without
    parameters (a ``%`` stays as written); the session-level locks it takes are released.
    Each row with a ``value_column`` gives a sample labelled by ``label_columns`` (``sku``
    through the SKU guard); equal labels are summed; beyond ``max_series`` label sets the
    rest are dropped with one warning.
    """

    def __init__(self, custom: CustomProbe, pool: Pool, guard: LabelGuard) -> None:
        settings = ProbeSettings(True, custom.interval, custom.timeout, custom.statement_timeout)
        super().__init__(custom.name, settings, pool)
        self.custom = custom
        self.spec = MetricSpec(
            custom.metric, "gauge", custom.help, custom.label_columns, source="probe"
        )
        self.specs = (self.spec,)
        self._guard = guard
        self._warned = False
        # The operator's own SQL, by design; it runs read-only (see above).
        self._sql = f"{_CUSTOM_HEAD}{custom.sql}{_CUSTOM_TAIL}"

    async def run(self) -> tuple[Metric, ...]:
        return await self.pool.read(
            self.query, release_locks=True, statement_timeout=self.statement_timeout
        )

    async def query(self, session: Session) -> tuple[Metric, ...]:
        try:
            columns, rows = await session.table(self._sql)
        except Exception as exc:
            # The server quotes the statement it ran (MariaDB's ``near '…'`` runs to its end);
            # the operator wrote only the inside.
            exc.args = tuple(
                a.replace(_CUSTOM_TAIL, "").replace(_CUSTOM_HEAD, "", 1)
                if isinstance(a, str)
                else a
                for a in exc.args
            )
            raise
        wanted = (self.custom.value_column, *self.custom.label_columns)
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise ValueError(
                f"the SQL returned no column {', '.join(missing)} (columns: {', '.join(columns)})"
            )
        value_at = columns.index(self.custom.value_column)
        label_at = [columns.index(c) for c in self.custom.label_columns]
        is_sku = [c == "sku" for c in self.custom.label_columns]
        samples: dict[tuple[str, ...], float] = {}
        for row in rows:
            if row[value_at] is None:
                continue
            labels = tuple(
                self._guard("" if row[i] is None else str(row[i]))
                if sku
                else sanitize_label_value("" if row[i] is None else row[i])
                for i, sku in zip(label_at, is_sku, strict=True)
            )
            if labels not in samples and len(samples) >= self.custom.max_series:
                if not self._warned:
                    LOGGER.warning(
                        "custom probe %s returned more than %d label sets; the rest are dropped",
                        self.name,
                        self.custom.max_series,
                        extra={"probe": self.name},
                    )
                    self._warned = True
                continue
            samples[labels] = samples.get(labels, 0.0) + number(row[value_at])
        return (family(self.spec, sorted(samples.items())),)


def build_db_probes(config: ExporterConfig, pool: Pool, guard: LabelGuard) -> list[DbProbe]:
    """The enabled database probes of ``config`` on ``pool`` (cache drift is built by the
    runner). The SKU-labelled ones share ``guard``."""
    p = config.probes
    probes: list[DbProbe] = []
    if p.negative_stock.enabled:
        probes.append(NegativeStockProbe(config, pool, guard))
    if p.oversold.enabled:
        probes.append(OversoldProbe(config, pool, guard))
    if p.duplicate_orders.enabled:
        probes.append(DuplicateOrdersProbe(config, pool, guard))
    plain = (
        (p.lock_waiters.enabled, LockWaitersProbe),
        (p.deadlocks.enabled, DeadlocksProbe),
        (p.long_transactions.enabled, LongTransactionsProbe),
        (p.expired_reservations.enabled, ExpiredReservationsProbe),
        (p.outbox.enabled, OutboxProbe),
    )
    probes += [make(config, pool) for enabled, make in plain if enabled]
    probes += [CustomSqlProbe(custom, pool, guard) for custom in p.custom]
    return probes
