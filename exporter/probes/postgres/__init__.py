"""The PostgreSQL probes, their small connection pool, and the index check.

Every probe query runs in a read-only transaction opened with one round trip::

    BEGIN READ ONLY; SET LOCAL statement_timeout = 2000; SET LOCAL lock_timeout = 200

and ends with ``ROLLBACK`` (nothing to commit; a rollback is the cheapest end). The
sessions themselves are read-only by default too, so a statement outside that transaction
could not write either. Table and column names come from the validated ``schema`` config
and reach SQL only through :class:`psycopg.sql.Identifier`; status values only through
:class:`psycopg.sql.Literal`.

Example::

    pool = PgPool(config.database)
    probe = NegativeStockProbe(config, pool)
    families = await probe.run()      # stock_negative_inventory_skus / _units
    await pool.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, TypeVar

import psycopg
from prometheus_client.core import Metric
from psycopg import AsyncConnection, sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.catalog import MetricSpec
from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value

from ..config import (
    CustomProbe,
    DatabaseConfig,
    ExporterConfig,
    ProbeSettings,
)
from .base import (
    LOGGER,
    LONG_TRANSACTION_MAX,
    LONG_TRANSACTIONS,
    Backoff,
    Probe,
    ProbeUnavailableError,
    describe_error,
    family,
)

__all__ = [
    "Conn",
    "CustomSqlProbe",
    "DbProbe",
    "DeadlocksProbe",
    "DuplicateOrdersProbe",
    "ExpiredReservationsProbe",
    "IndexAdvice",
    "LockWaitersProbe",
    "LongTransactionsProbe",
    "NegativeStockProbe",
    "OutboxProbe",
    "OversoldProbe",
    "PgPool",
    "build_db_probes",
    "check_indexes",
    "connect",
    "ident",
    "quoted_name",
]

Conn = AsyncConnection[TupleRow]
_T = TypeVar("_T")
_ROLLBACK: Final = sql.SQL("ROLLBACK")
_UNLOCK_ALL: Final = sql.SQL("SELECT pg_advisory_unlock_all()")


def ident(name: str) -> sql.Identifier:
    """A validated, possibly schema-qualified name as a quoted SQL identifier.

    Example::

        ident("shop.products").as_string()   # '"shop"."products"'
    """
    return sql.Identifier(*name.split("."))


def quoted_name(name: str) -> str:
    """The quoted spelling of a validated name, for ``to_regclass()`` arguments.

    The config allows only letters, digits, ``_`` and ``$`` in names, so there is no quote
    inside to double.
    """
    return ".".join(f'"{part}"' for part in name.split("."))


def _ms(seconds: float) -> sql.Literal:
    # PostgreSQL takes these settings in whole milliseconds; 0 would mean "no limit".
    return sql.Literal(max(1, math.ceil(seconds * 1000)))


def _in_list(values: Sequence[str]) -> sql.Composable:
    # Literals rather than a text[] parameter: they compare with enum status columns too,
    # and keep a partial index whose predicate lists the same values usable.
    return sql.SQL(", ").join(sql.Literal(v) for v in values)


def _number(value: object) -> float:
    if value is None:
        return 0.0
    if isinstance(value, bool | int | float | Decimal):
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


# --- connections ---------------------------------------------------------------------------


async def connect(db: DatabaseConfig, *, params: Mapping[str, Any] | None = None) -> Conn:
    """Open one autocommit session whose transactions are read-only by default.

    ``statement_timeout`` and ``lock_timeout`` are set for the session as well, as a
    backstop for anything that runs outside a probe's own transaction. ``params``: more
    libpq connection parameters, for those the URL does not set itself.
    """
    url = db.url.reveal()
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        # Never pass the parser's message on: it quotes the part it did not understand.
        raise ProbeUnavailableError(
            f"the database URL from {db.url_source} cannot be parsed"
        ) from None
    options: dict[str, Any] = {}
    if "application_name" not in params:
        options["application_name"] = db.application_name
    if "connect_timeout" not in params:
        options["connect_timeout"] = max(2, math.ceil(db.connect_timeout))
    options.update({k: v for k, v in (params or {}).items() if k not in params})
    conn = await AsyncConnection.connect(url, autocommit=True, **options)
    try:
        await conn.execute(
            sql.SQL(
                "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY; "
                "SET statement_timeout = {}; SET lock_timeout = {}"
            ).format(_ms(db.statement_timeout), _ms(db.lock_timeout))
        )
    except BaseException:
        await conn.close()
        raise
    return conn


def _reusable(conn: Conn) -> bool:
    return (
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status == TransactionStatus.IDLE
    )


async def _unlock_all(conn: Conn) -> None:
    """Release the session's advisory locks; when that fails, close the session instead."""
    try:
        await conn.execute(_UNLOCK_ALL)
    except BaseException:
        # Whether the locks went is unknown: never hand this session out again.
        await _close_quietly(conn)
        raise


async def _close_quietly(conn: Conn) -> None:
    with contextlib.suppress(Exception):
        await conn.close()


class PgPool:
    """A few lazily opened sessions shared by the probes, with backoff on connect errors.

    At most ``database.max_connections`` sessions are open; a probe waits for a free one
    within its own timeout. A session left in a transaction, broken or cancelled mid-query
    is closed rather than reused. While the database is unreachable, connection attempts
    are spaced by :class:`Backoff` and probe runs fail at once with
    :class:`ProbeUnavailableError`.

    Example::

        pool = PgPool(config.database)
        stock = await pool.read(lambda conn: conn.execute("SELECT 1"))
        await pool.close()
    """

    def __init__(self, db: DatabaseConfig, *, backoff: Backoff | None = None) -> None:
        self.db = db
        self._slots = asyncio.Semaphore(db.max_connections)
        self._idle: list[Conn] = []
        self._backoff = backoff or Backoff()
        self._last_error = ""
        self._closed = False
        self._begin = sql.SQL(
            "BEGIN READ ONLY; SET LOCAL statement_timeout = {}; SET LOCAL lock_timeout = {}"
        ).format(_ms(db.statement_timeout), _ms(db.lock_timeout))

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        """A session of the pool for the duration of the block."""
        if self._closed:
            raise ProbeUnavailableError("the pool is closed")
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            try:
                yield conn
            finally:
                if _reusable(conn) and not self._closed:
                    self._idle.append(conn)
                else:
                    await _close_quietly(conn)

    async def read(
        self, query: Callable[[Conn], Awaitable[_T]], *, release_locks: bool = False
    ) -> _T:
        """Run ``query(conn)`` in a read-only transaction with the configured timeouts.

        ``release_locks``: afterwards, also release the session-level advisory locks the
        query may have taken (custom SQL can call ``pg_advisory_lock``); a ``ROLLBACK``
        does not, and the session goes back to the pool.
        """
        async with self.connection() as conn:
            await conn.execute(self._begin)
            try:
                result = await query(conn)
            except asyncio.CancelledError:
                # Cancelled mid-query (the probe's timeout): the session's state is unknown,
                # connection() closes it instead of rolling back.
                raise
            except BaseException:
                if conn.info.transaction_status in (
                    TransactionStatus.INTRANS,
                    TransactionStatus.INERROR,
                ):
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute(_ROLLBACK)
                if release_locks and _reusable(conn):
                    with contextlib.suppress(psycopg.Error):
                        await _unlock_all(conn)
                raise
            await conn.execute(_ROLLBACK)
            if release_locks:
                await _unlock_all(conn)
            return result

    async def _connect(self) -> Conn:
        wait = self._backoff.wait_time()
        if wait > 0:
            raise ProbeUnavailableError(
                f"database unreachable ({self._last_error}); next attempt in {wait:.1f}s"
            )
        try:
            conn = await connect(self.db)
        except (psycopg.Error, OSError, asyncio.CancelledError, ProbeUnavailableError) as exc:
            self._last_error = describe_error(exc)
            self._backoff.failed()
            raise
        self._backoff.succeeded()
        return conn

    async def close_idle(self) -> None:
        """Close the sessions nobody uses (a follower keeps none open)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await _close_quietly(conn)

    async def close(self) -> None:
        """Close every session; the pool cannot be used afterwards."""
        self._closed = True
        await self.close_idle()


# --- probes --------------------------------------------------------------------------------


class DbProbe(Probe):
    """A probe whose :meth:`query` runs in the pool's read-only transaction."""

    def __init__(self, name: str, settings: ProbeSettings, pool: PgPool) -> None:
        super().__init__(name, interval=settings.interval, timeout=settings.timeout)
        self.pool = pool

    async def run(self) -> tuple[Metric, ...]:
        return await self.pool.read(self.query)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        """Observe once through ``conn`` (already in a read-only transaction)."""
        raise NotImplementedError


async def _one_row(
    conn: Conn, query: sql.SQL | sql.Composed, params: Any = None
) -> tuple[Any, ...]:
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    if row is None:  # aggregates always return a row; a view mapped as a table might not
        raise ValueError("the query returned no row")
    return tuple(row)


class NegativeStockProbe(DbProbe):
    """``stock_negative_inventory_skus`` / ``_units``: SKUs below zero and by how much.

    Reads the partial index ``products(available_stock) WHERE available_stock < 0``.
    """

    specs = (catalog.NEGATIVE_INVENTORY_SKUS, catalog.NEGATIVE_INVENTORY_UNITS)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("negative_stock", config.probes.negative_stock, pool)
        p = config.schema.products
        self._sql = sql.SQL(
            "SELECT count(*), coalesce(sum(-{stock}), 0) FROM {table} WHERE {stock} < 0"
        ).format(stock=sql.Identifier(p.stock), table=ident(p.table))

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        skus, units = await _one_row(conn, self._sql)
        return (
            family(catalog.NEGATIVE_INVENTORY_SKUS, [((), _number(skus))]),
            family(catalog.NEGATIVE_INVENTORY_UNITS, [((), _number(units))]),
        )


class OversoldProbe(DbProbe):
    """``stock_oversold_units{sku}``: paid units beyond each SKU's allocation.

    Only SKUs that are oversold come back from the database; promo SKUs always have a
    series (0 when not oversold); other SKUs go through the SKU guard, and those folded
    into ``__other__`` are summed there.
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
        s = config.schema
        if s.products.allocation is None:
            raise ValueError("the oversold probe needs schema.products.allocation")
        promo: sql.Composable = sql.SQL("")
        if settings.scope == "promo":
            promo = sql.SQL(
                " AND oi.{product_id} IN (SELECT {id} FROM {products} WHERE {sku} IN ({skus}))"
            ).format(
                product_id=sql.Identifier(s.order_items.product_id),
                id=sql.Identifier(s.products.id),
                products=ident(s.products.table),
                sku=sql.Identifier(s.products.sku),
                skus=_in_list(config.sku_guard.promo_skus),
            )
        self._sql = sql.SQL(
            "SELECT p.{sku}::text, s.sold - p.{allocation}"
            " FROM (SELECT oi.{product_id} AS product_id, sum(oi.{quantity}) AS sold"
            " FROM {items} AS oi JOIN {orders} AS o ON o.{order_pk} = oi.{order_id}"
            " WHERE o.{status} IN ({paid}){promo}"
            " GROUP BY oi.{product_id}) AS s"
            " JOIN {products} AS p ON p.{product_pk} = s.product_id"
            " WHERE s.sold > p.{allocation}"
            " ORDER BY 2 DESC, 1"
        ).format(
            sku=sql.Identifier(s.products.sku),
            allocation=sql.Identifier(s.products.allocation),
            product_id=sql.Identifier(s.order_items.product_id),
            quantity=sql.Identifier(s.order_items.quantity),
            items=ident(s.order_items.table),
            orders=ident(s.orders.table),
            order_pk=sql.Identifier(s.orders.id),
            order_id=sql.Identifier(s.order_items.order_id),
            status=sql.Identifier(s.orders.status),
            paid=_in_list(s.orders.paid_statuses),
            promo=promo,
            products=ident(s.products.table),
            product_pk=sql.Identifier(s.products.id),
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        cursor = await conn.execute(self._sql)
        by_label: dict[str, float] = dict.fromkeys(self._pinned, 0.0)
        # Largest first (ORDER BY), so the worst SKUs are the ones that get their own series.
        for sku, units in await cursor.fetchall():
            label = self._guard(str(sku))
            by_label[label] = by_label.get(label, 0.0) + _number(units)
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
        o = config.schema.orders
        self._window = dt.timedelta(seconds=settings.window)
        counts = [
            sql.SQL(
                "(SELECT count(*) FROM (SELECT 1 FROM {orders}"
                " WHERE {created_at} >= now() - %(window)s AND {key} IS NOT NULL"
                " GROUP BY {key} HAVING count(*) > 1) AS d)"
            ).format(
                orders=ident(o.table),
                created_at=sql.Identifier(o.created_at),
                key=sql.Identifier(column),
            )
            for column in (o.external_ref, o.idempotency_key)
            if column is not None
        ]
        if not counts:
            raise ValueError("the duplicate_orders probe needs external_ref or idempotency_key")
        self._sql = sql.SQL("SELECT ") + sql.SQL(" + ").join(counts)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        (keys,) = await _one_row(conn, self._sql, {"window": self._window})
        return (family(catalog.DUPLICATE_ORDER_KEYS, [((), _number(keys))]),)


_LOCK_WAITERS_SQL: Final = (
    "SELECT count(DISTINCT l.pid),"
    " coalesce(max(extract(epoch FROM clock_timestamp() - {since})), 0)"
    " FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
    " WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid()"
)


class LockWaitersProbe(DbProbe):
    """``stock_db_lock_waiters`` and ``stock_db_lock_wait_max_seconds`` in this database.

    The wait starts at ``pg_locks.waitstart`` (PostgreSQL 14+), else at the session's last
    state change (the start of the statement that waits), else its ``query_start``.
    Other roles' sessions show their times only to members of ``pg_monitor``.
    """

    specs = (catalog.DB_LOCK_WAITERS, catalog.DB_LOCK_WAIT_MAX)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("lock_waiters", config.probes.lock_waiters, pool)
        self._sql_14 = sql.SQL(
            _LOCK_WAITERS_SQL.format(since="coalesce(l.waitstart, a.state_change, a.query_start)")
        )
        self._sql_old = sql.SQL(
            _LOCK_WAITERS_SQL.format(since="coalesce(a.state_change, a.query_start)")
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        query = self._sql_14 if conn.info.server_version >= 140000 else self._sql_old
        waiters, longest = await _one_row(conn, query)
        return (
            family(catalog.DB_LOCK_WAITERS, [((), _number(waiters))]),
            family(catalog.DB_LOCK_WAIT_MAX, [((), max(0.0, _number(longest)))]),
        )


class DeadlocksProbe(DbProbe):
    """``stock_db_deadlocks_total{database}`` from ``pg_stat_database``."""

    specs = (catalog.DB_DEADLOCKS,)
    _SQL: Final = sql.SQL(
        "SELECT datname::text, deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("deadlocks", config.probes.deadlocks, pool)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        database, deadlocks = await _one_row(conn, self._SQL)
        return (family(catalog.DB_DEADLOCKS, [((str(database),), _number(deadlocks))]),)


class LongTransactionsProbe(DbProbe):
    """Transactions open longer than ``threshold`` that hold a lock on a stock table.

    Exports ``stock_db_long_transactions`` and ``stock_db_long_transaction_max_seconds``.
    The stock tables are the mapped products, orders, order_items, reservations and outbox tables.
    """

    specs = (LONG_TRANSACTIONS, LONG_TRANSACTION_MAX)
    _SQL: Final = sql.SQL(
        "SELECT count(*), coalesce(max(extract(epoch FROM clock_timestamp() - a.xact_start)), 0)"
        " FROM pg_stat_activity AS a"
        " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()"
        " AND a.xact_start < clock_timestamp() - %(threshold)s"
        " AND EXISTS (SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND l.granted"
        " AND l.relation = ANY (ARRAY(SELECT to_regclass(t)::oid"
        " FROM unnest(%(tables)s::text[]) AS t)))"
    )

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        settings = config.probes.long_transactions
        super().__init__("long_transactions", settings, pool)
        s = config.schema
        tables = [s.products.table, s.orders.table, s.order_items.table]
        if s.reservations is not None:
            tables.append(s.reservations.table)
        if s.outbox is not None:
            tables.append(s.outbox.table)
        self._params = {
            "threshold": dt.timedelta(seconds=settings.threshold),
            "tables": [quoted_name(t) for t in dict.fromkeys(tables)],
        }

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        count, oldest = await _one_row(conn, self._SQL, self._params)
        return (
            family(LONG_TRANSACTIONS, [((), _number(count))]),
            family(LONG_TRANSACTION_MAX, [((), max(0.0, _number(oldest)))]),
        )


class ExpiredReservationsProbe(DbProbe):
    """``stock_reservations_expired_unreleased``: past ``expires_at``, still holding stock."""

    specs = (catalog.RESERVATIONS_EXPIRED_UNRELEASED,)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("expired_reservations", config.probes.expired_reservations, pool)
        r = config.schema.reservations
        if r is None:
            raise ValueError("the expired_reservations probe needs schema.reservations")
        self._sql = sql.SQL(
            "SELECT count(*) FROM {table} WHERE {expires_at} < now() AND {held}"
        ).format(
            table=ident(r.table),
            expires_at=sql.Identifier(r.expires_at),
            held=_held_predicate(config),
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        (count,) = await _one_row(conn, self._sql)
        return (family(catalog.RESERVATIONS_EXPIRED_UNRELEASED, [((), _number(count))]),)


def _held_predicate(config: ExporterConfig) -> sql.Composable:
    r = config.schema.reservations
    assert r is not None  # noqa: S101 - callers checked
    if r.status is not None:
        return sql.SQL("{} IN ({})").format(sql.Identifier(r.status), _in_list(r.held_statuses))
    assert r.released_at is not None  # noqa: S101 - the config sets one of the two
    return sql.SQL("{} IS NULL").format(sql.Identifier(r.released_at))


class OutboxProbe(DbProbe):
    """``stock_outbox_pending_events`` and ``stock_outbox_lag_seconds`` (oldest pending age)."""

    specs = (catalog.OUTBOX_PENDING, catalog.OUTBOX_LAG)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("outbox", config.probes.outbox, pool)
        b = config.schema.outbox
        if b is None:
            raise ValueError("the outbox probe needs schema.outbox")
        self._sql = sql.SQL(
            "SELECT count(*),"
            " coalesce(extract(epoch FROM clock_timestamp() - min({created_at})), 0)"
            " FROM {table} WHERE {published_at} IS NULL"
        ).format(
            created_at=sql.Identifier(b.created_at),
            table=ident(b.table),
            published_at=sql.Identifier(b.published_at),
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        pending, lag = await _one_row(conn, self._sql)
        return (
            family(catalog.OUTBOX_PENDING, [((), _number(pending))]),
            family(catalog.OUTBOX_LAG, [((), max(0.0, _number(lag)))]),
        )


class CustomSqlProbe(DbProbe):
    """A ``probes.custom`` entry: its SQL's rows exported as one gauge.

    The SQL runs wrapped as ``SELECT * FROM (<sql>) AS q`` through the extended protocol,
    so it is one read-only query and nothing else. Each row gives one sample: the value
    from ``value_column`` (rows where it is null are skipped), labels from
    ``label_columns`` (a ``sku`` label goes through the SKU guard, others are sanitised);
    rows with the same labels are summed; past ``max_series`` label sets the rest are
    dropped with a warning.
    """

    def __init__(self, custom: CustomProbe, pool: PgPool, guard: LabelGuard) -> None:
        super().__init__(custom.name, ProbeSettings(True, custom.interval, custom.timeout), pool)
        self.custom = custom
        self.spec = MetricSpec(
            custom.metric, "gauge", custom.help, custom.label_columns, source="probe"
        )
        self.specs = (self.spec,)
        self._guard = guard
        self._warned = False
        self._sql = sql.SQL("SELECT * FROM ({}\n) AS stocksentry_custom").format(
            sql.SQL(custom.sql)
        )

    async def run(self) -> tuple[Metric, ...]:
        # The SQL may take session-level advisory locks, which outlive the transaction:
        # released after each run, so a pooled session never keeps one.
        return await self.pool.read(self.query, release_locks=True)

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        # prepare=True forces the extended protocol: one statement, no "; COMMIT; ...".
        cursor = await conn.execute(self._sql, prepare=True)
        columns = [c.name for c in cursor.description or ()]
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
        for row in await cursor.fetchall():
            if row[value_at] is None:
                continue
            value = _number(row[value_at])
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
            samples[labels] = samples.get(labels, 0.0) + value
        return (family(self.spec, sorted(samples.items())),)


def build_db_probes(config: ExporterConfig, pool: PgPool, guard: LabelGuard) -> list[DbProbe]:
    """The enabled database probes of ``config`` (cache drift is built by the runner)."""
    p = config.probes
    probes: list[DbProbe] = []
    if p.negative_stock.enabled:
        probes.append(NegativeStockProbe(config, pool))
    if p.oversold.enabled:
        probes.append(OversoldProbe(config, pool, guard))
    if p.duplicate_orders.enabled:
        probes.append(DuplicateOrdersProbe(config, pool))
    if p.lock_waiters.enabled:
        probes.append(LockWaitersProbe(config, pool))
    if p.deadlocks.enabled:
        probes.append(DeadlocksProbe(config, pool))
    if p.long_transactions.enabled:
        probes.append(LongTransactionsProbe(config, pool))
    if p.expired_reservations.enabled:
        probes.append(ExpiredReservationsProbe(config, pool))
    if p.outbox.enabled:
        probes.append(OutboxProbe(config, pool))
    probes.extend(CustomSqlProbe(custom, pool, guard) for custom in p.custom)
    return probes


# --- the indexes the probes expect ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexAdvice:
    """An index a probe expects but the database lacks, with the statement that adds it."""

    probe: str
    table: str
    column: str
    statement: str

    def __str__(self) -> str:
        return (
            f"probe {self.probe}: no index on {self.table} starts with column {self.column}, "
            f"so the probe reads the whole table; add one with: {self.statement}"
        )


@dataclass(frozen=True, slots=True)
class _Expected:
    probe: str
    table: str
    column: str
    where: sql.Composable | None


def expected_indexes(config: ExporterConfig) -> list[_Expected]:
    """The indexes the enabled probes read through, as (probe, table, leading column)."""
    s, p = config.schema, config.probes
    out: list[_Expected] = []
    stock = sql.Identifier(s.products.stock)
    if p.negative_stock.enabled:
        out.append(
            _Expected(
                "negative_stock",
                s.products.table,
                s.products.stock,
                sql.SQL("{} < 0").format(stock),
            )
        )
    if p.oversold.enabled:
        out.append(_Expected("oversold", s.order_items.table, s.order_items.product_id, None))
        if p.oversold.scope == "promo":
            out.append(_Expected("oversold", s.products.table, s.products.sku, None))
    if p.duplicate_orders.enabled:
        out.append(_Expected("duplicate_orders", s.orders.table, s.orders.created_at, None))
    if p.expired_reservations.enabled and s.reservations is not None:
        out.append(
            _Expected(
                "expired_reservations",
                s.reservations.table,
                s.reservations.expires_at,
                _held_predicate(config),
            )
        )
    if p.outbox.enabled and s.outbox is not None:
        out.append(
            _Expected(
                "outbox",
                s.outbox.table,
                s.outbox.created_at,
                sql.SQL("{} IS NULL").format(sql.Identifier(s.outbox.published_at)),
            )
        )
    if p.cache_drift.enabled:
        out.append(_Expected("cache_drift", s.products.table, s.products.sku, None))
    return out


_LEADING_COLUMNS: Final = sql.SQL(
    "SELECT to_regclass(%(table)s) IS NOT NULL,"
    " ARRAY(SELECT a.attname::text FROM pg_index AS i"
    " JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
    " WHERE i.indrelid = to_regclass(%(table)s) AND i.indisvalid)"
)


async def check_indexes(conn: Conn, config: ExporterConfig) -> list[IndexAdvice]:
    """The expected indexes missing from the database, each with its ``CREATE INDEX``.

    An index counts when its first column is the expected one (``pg_index`` /
    ``pg_attribute``, the catalogs behind ``pg_indexes``); a partial index's predicate is
    not compared. Tables that do not exist are skipped: their probe reports the error.

    Example::

        for advice in await check_indexes(conn, config):
            log.warning("%s", advice)
    """
    advice: list[IndexAdvice] = []
    leading: dict[str, set[str] | None] = {}
    for want in expected_indexes(config):
        if want.table not in leading:
            exists, columns = await _one_row(
                conn, _LEADING_COLUMNS, {"table": quoted_name(want.table)}
            )
            leading[want.table] = set(columns) if exists else None
        have = leading[want.table]
        if have is None or want.column in have:
            continue
        # Only one piece of advice per (table, column), even when two probes need it.
        if any(a.table == want.table and a.column == want.column for a in advice):
            continue
        short = want.table.rsplit(".", 1)[-1]
        name = f"{short}_{want.column}_{'partial_' if want.where else ''}idx"[:63]
        statement = sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ({})").format(
            sql.Identifier(name), ident(want.table), sql.Identifier(want.column)
        )
        if want.where is not None:
            statement = statement + sql.SQL(" WHERE ") + want.where
        advice.append(
            IndexAdvice(want.probe, want.table, want.column, statement.as_string(conn) + ";")
        )
    return advice
