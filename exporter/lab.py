"""The flash-sale lab behind ``stocksentry demo``.

Many buyers try to reserve one unit each of a small stock, all at once, under several
checkout strategies. Every reservation is recorded through the public instrumentation API
(:class:`~stocksentry.instrumentation.Sentry`), and at the end the lab counts the truth in
the database with SQL and compares it with the metric totals: the unsafe strategies
oversell or drive stock negative, and the metrics say so.

Each strategy gets its own product row (sku ``LAB-<STRATEGY>``) in the common
``products / orders / order_items`` layout. ``order_items.stock_after`` keeps the stock
value each reservation wrote, so the database alone tells how many writes went negative.

The strategies, unsafe first: ``unsafe`` (read, then write a value computed in Python),
``check_then_decrement`` (read, then an unguarded relative decrement), ``naive_lock`` (the
seeds' Redis ``SET NX PX`` lock with a TTL shorter than the work and a naive ``DEL``),
``atomic`` (one conditional ``UPDATE``), ``for_update`` (``SELECT ... FOR UPDATE``, or
``BEGIN IMMEDIATE`` on SQLite) and ``redlock`` (an owned Redis lock with a token,
jittered retries and a compare-and-delete release: the lab's own, or pottery's Redlock).
The two Redis strategies need ``redis_url``; without it they are reported as skipped.

Options cut across strategies: ``retries`` (a share of buyers submit the same intent
twice; with ``idempotency`` the second submit is answered from the stored result and
counted as a replay, without it the intent is reserved twice: duplicate orders per key),
and ``stale_cache`` (the availability decision is read from a cache refreshed late; a
cached "available" that the database contradicts is a stale hit). The lab engine is
instrumented with stocksentry's SQLAlchemy integration when it is installed, which counts
the unsafe read-modify-writes per strategy.

Example::

    from stocksentry.exporter.lab import LabConfig, run_lab

    for result in run_lab(LabConfig(buyers=200, stock=20, strategies=("unsafe", "atomic"))):
        print(result.strategy, result.sold, result.oversold, result.consistent)

    # Every strategy, the Redis locks included; a fifth of the buyers resubmit, unprotected.
    config = LabConfig(redis_url="redis://127.0.0.1:6379/0", retries=0.2, idempotency=False)
    print(format_report(config, run_lab(config)))

Adding a strategy is one function ``(shop, reservation, buyer) -> None`` registered in
:data:`STRATEGIES`; it must mark the reservation with ``success`` or ``conflict``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import importlib
import importlib.util
import math
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO, cast

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, start_http_server
from sqlalchemy.engine import URL, Connection, Engine
from stocksentry.instrumentation import Reservation, Sentry, catalog, classify_exception
from stocksentry.instrumentation.locks import (
    LOCK_ACQUIRE_RETRIES,
    LOCK_EXTEND_FAILURES,
    InstrumentedRedlock,
    LockNotAcquired,
    SetNxLock,
)

from .dburl import parse_url, shown

__all__ = [
    "REDIS_STRATEGIES",
    "STRATEGIES",
    "Buyer",
    "DbFigures",
    "LabConfig",
    "LabError",
    "Progress",
    "ProgressSink",
    "Shop",
    "StderrProgress",
    "StrategyResult",
    "caught_lines",
    "describe_database",
    "describe_redis",
    "format_html",
    "format_report",
    "format_table",
    "normalize_url",
    "run_lab",
    "serve_metrics",
    "sku_for",
]

#: SQLite's busy timeout: writers queue behind the one holding the lock instead of failing
#: with "database is locked" (a lock_timeout conflict would blur the strategies' results).
SQLITE_BUSY_TIMEOUT_S = 30.0
#: How often live progress is refreshed.
PROGRESS_INTERVAL_S = 0.1
#: How often the stock is sampled for the report's stock-over-time chart.
SAMPLE_INTERVAL_S = 0.02
#: Strategies that need Redis; without ``redis_url`` they are skipped, with this reason.
REDIS_STRATEGIES = frozenset({"naive_lock", "redlock"})
SKIPPED_WITHOUT_REDIS = "needs --redis URL (a Redis lock strategy)"
#: How long a buyer waits for a Redis lock before giving up as ``lock_not_acquired``.
LOCK_WAIT_S = 30.0
#: Pause between attempts at a Redis lock (with jitter): short, the work is milliseconds;
#: shorter pauses make 50 waiting threads spin so fast that they slow the holder down.
LOCK_RETRY_S = 0.01
#: The owned lock's TTL is at least this, and at least 20 times the work.
REDLOCK_MIN_TTL_S = 1.0
#: The ``cache`` label of the stale-cache metric, and the idempotent operation's name.
CACHE_NAME = "lab_stock"
IDEMPOTENT_OPERATION = "checkout"
#: The stock table the SQLAlchemy integration watches.
STOCK_TABLE = "products"

_SUCCESS = catalog.RESERVATION_SUCCESS.name
_CONFLICT = catalog.RESERVATION_CONFLICT.name
_NEGATIVE = catalog.INVENTORY_NEGATIVE.name
_DURATION_COUNT = f"{catalog.RESERVATION_DURATION.name}_count"
_REPLAY = catalog.IDEMPOTENCY_REPLAY.name
_STALE = catalog.CACHE_STALE_HIT.name
_UNSAFE_RMW = catalog.UNSAFE_READ_MODIFY_WRITE.name
_LOCK_WAIT = catalog.LOCK_ACQUIRE_DURATION.name
_LOCK_RATIO = catalog.LOCK_HOLD_RATIO.name
_LOCK_EXPIRED = catalog.LOCK_EXPIRED_WHILE_HELD.name
_LOCK_NOT_OWNED = catalog.LOCK_RELEASE_NOT_OWNED.name
# Pending catalog entries (defined in instrumentation/locks.py until they move).
_LOCK_EXTEND_FAILED = LOCK_EXTEND_FAILURES.name
_LOCK_RETRIES = LOCK_ACQUIRE_RETRIES.name


class LabError(Exception):
    """A set-up problem the CLI reports as one line (bad URL, unreachable database...)."""


# --- configuration and results -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabConfig:
    """What to run. ``database_url=None`` means a temporary SQLite file, removed at the end.

    ``work_ms`` is the app's work between reading the stock and writing it (pricing,
    fraud checks...): the window in which unsafe strategies lose updates.

    ``redis_url`` enables the Redis lock strategies (their keys start with
    ``redis_prefix`` and are deleted at the end). ``lock_ttl_ms`` is the naive lock's TTL,
    by default 80 % of the work (the seeds: a 5 s lock around 6 s of work); the owned
    lock's TTL is :data:`REDLOCK_MIN_TTL_S` or 20 times the work, whichever is longer.
    ``retries`` is the share of buyers (0 to 1) who submit the same intent a second time;
    ``idempotency`` answers those from the stored result. ``stale_cache`` makes the
    availability decision from a cache (a Redis key with ``redis_url``, else a dict)
    refreshed every ``cache_refresh_ms``. ``sql_detector`` instruments the engine with
    stocksentry's SQLAlchemy integration when it is installed. ``redlock_impl`` is the
    ``redlock`` strategy's lock: ``"lab"`` (SetNxLock with the owned release) or
    ``"pottery"`` (pottery's Redlock on the one Redis master; slower under 50 contending
    threads, as pottery starts a thread pool for every attempt).
    """

    database_url: str | None = None
    buyers: int = 500
    stock: int = 100
    concurrency: int = 50
    work_ms: float = 5.0
    strategies: tuple[str, ...] = ()
    quantity: int = 1
    log_file: str | None = None
    redis_url: str | None = None
    lock_ttl_ms: float | None = None
    retries: float = 0.0
    idempotency: bool = True
    stale_cache: bool = False
    cache_refresh_ms: float = 50.0
    redis_prefix: str = "stocksentry-lab:"
    sql_detector: bool = True
    redlock_impl: str = "lab"

    def __post_init__(self) -> None:
        if self.buyers < 1:
            raise ValueError(f"buyers must be >= 1, got {self.buyers}")
        if self.stock < 0:
            raise ValueError(f"stock must be >= 0, got {self.stock}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if not (self.work_ms >= 0 and math.isfinite(self.work_ms)):
            raise ValueError(f"work_ms must be a finite number >= 0, got {self.work_ms}")
        if self.quantity < 1:
            raise ValueError(f"quantity must be >= 1, got {self.quantity}")
        if self.lock_ttl_ms is not None and not (
            self.lock_ttl_ms > 0 and math.isfinite(self.lock_ttl_ms)
        ):
            raise ValueError(f"lock_ttl_ms must be a finite number > 0, got {self.lock_ttl_ms}")
        if not 0 <= self.retries <= 1:
            raise ValueError(f"retries must be a share between 0 and 1, got {self.retries}")
        if self.redlock_impl not in ("lab", "pottery"):
            raise ValueError(f"redlock_impl must be 'lab' or 'pottery', got {self.redlock_impl!r}")
        if not (self.cache_refresh_ms > 0 and math.isfinite(self.cache_refresh_ms)):
            raise ValueError(
                f"cache_refresh_ms must be a finite number > 0, got {self.cache_refresh_ms}"
            )
        unknown = [name for name in self.strategies if name not in STRATEGIES]
        if unknown:
            raise ValueError(
                f"unknown strategy {', '.join(unknown)} (known: {', '.join(STRATEGIES)})"
            )

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies to run, in order (all of :data:`STRATEGIES` when none given)."""
        return self.strategies or tuple(STRATEGIES)

    @property
    def naive_lock_ttl_s(self) -> float:
        """The naive lock's TTL: ``lock_ttl_ms``, or 80 % of the work (at least 1 ms)."""
        if self.lock_ttl_ms is not None:
            return self.lock_ttl_ms / 1000
        return max(0.001, 0.8 * self.work_ms / 1000)

    @property
    def redlock_ttl_s(self) -> float:
        """The owned lock's TTL: far above the work, so a holder never outlives it."""
        return max(REDLOCK_MIN_TTL_S, 20 * self.work_ms / 1000)

    def skip_reason(self, strategy: str) -> str | None:
        """Why ``strategy`` cannot run with this configuration (``None``: it can)."""
        if strategy in REDIS_STRATEGIES and self.redis_url is None:
            return SKIPPED_WITHOUT_REDIS
        return None


@dataclass(frozen=True, slots=True)
class DbFigures:
    """What the database says after a strategy's run, counted by SQL.

    ``duplicate_keys`` are idempotency keys with more than one order; ``duplicate_orders``
    the orders beyond the first for each of them.
    """

    orders: int
    units: int
    negative_writes: int
    final_stock: int
    duplicate_keys: int = 0
    duplicate_orders: int = 0


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """One strategy's run: ground truth from SQL, metric totals from the registry.

    ``sold``, ``oversold``, ``final_stock`` and ``negative_writes`` are the database's
    figures; ``metrics`` holds the registry's totals for the strategy (by metric name; the
    ones without a ``sku`` label are the difference over the strategy's run); ``consistent``
    is true when every metric total equals its database figure (or, for replays, stale
    hits and lock acquires, the lab's own count) and the outcomes add up to the
    reservations made (``mismatches`` says which did not).

    ``reservations`` is the buyers plus the resubmits that reserved again; ``replays`` the
    resubmits answered from the idempotency record. ``locks`` holds the lock metrics of a
    lock strategy; ``unsafe_read_modify_write`` is ``None`` when the SQLAlchemy integration
    is not installed. ``samples`` is the stock over time, ``(seconds, stock)``. A strategy
    that could not run has ``skipped`` set to the reason and zero figures.
    """

    strategy: str
    sku: str
    stock_initial: int
    buyers: int
    sold: int
    orders: int
    oversold: int
    lost_updates: int
    final_stock: int
    conflicts: dict[str, int]
    errors: int
    negative_writes: int
    p50_ms: float
    p99_ms: float
    wall_s: float
    metrics: dict[str, int]
    db: DbFigures
    consistent: bool
    mismatches: tuple[str, ...] = ()
    first_error: str | None = None
    skipped: str | None = None
    reservations: int = 0
    resubmitted: int = 0
    replays: int = 0
    stale_cache_hits: int = 0
    unsafe_read_modify_write: int | None = None
    locks: dict[str, float] = field(default_factory=dict)
    samples: tuple[tuple[float, int], ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def skip(cls, config: LabConfig, strategy: str, reason: str) -> StrategyResult:
        """The result of a strategy that could not run."""
        return cls(
            strategy=strategy,
            sku=sku_for(strategy),
            stock_initial=config.stock,
            buyers=config.buyers,
            sold=0,
            orders=0,
            oversold=0,
            lost_updates=0,
            final_stock=config.stock,
            conflicts={},
            errors=0,
            negative_writes=0,
            p50_ms=0.0,
            p99_ms=0.0,
            wall_s=0.0,
            metrics={},
            db=DbFigures(0, 0, 0, config.stock),
            consistent=True,
            skipped=reason,
        )

    @property
    def duplicate_orders(self) -> int:
        """Orders beyond the first per idempotency key, counted by SQL."""
        return self.db.duplicate_orders

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (one item of ``--format json``).

        A skipped strategy gives only ``strategy``, ``sku`` and ``skipped`` (the reason);
        the others have ``"skipped": null`` and every figure.
        """
        if self.skipped is not None:
            return {"strategy": self.strategy, "sku": self.sku, "skipped": self.skipped}
        data = asdict(self)
        data["mismatches"] = list(self.mismatches)
        data["notes"] = list(self.notes)
        data["samples"] = [[t, stock] for t, stock in self.samples]
        data["duplicate_orders"] = self.duplicate_orders
        return data


@dataclass(frozen=True, slots=True)
class Progress:
    """A live snapshot of one strategy's run, counted on the Python side."""

    strategy: str
    done: int
    total: int
    sold: int
    conflicts: int
    errors: int
    elapsed_s: float


class ProgressSink(Protocol):
    """Receives live progress.

    ``start`` once the database is reached and prepared, then per strategy ``update``
    every :data:`PROGRESS_INTERVAL_S` and ``finish`` at its end.
    """

    def start(self, database: str) -> None: ...

    def update(self, progress: Progress) -> None: ...

    def finish(self, progress: Progress) -> None: ...


class StderrProgress:
    """Progress on a terminal: one line per strategy, rewritten in place on a TTY.

    Not on a TTY (a pipe, a CI log) only the final line of each strategy is written, so
    logs do not fill with carriage returns.
    """

    def __init__(
        self, stream: TextIO, *, tty: bool | None = None, header: tuple[str, ...] = ()
    ) -> None:
        self.stream = stream
        self.header = header
        if tty is None:
            try:
                tty = stream.isatty()
            except (AttributeError, ValueError):
                tty = False
        self.tty = tty

    @staticmethod
    def line(p: Progress) -> str:
        """The text of one progress line."""
        return (
            f"  {p.strategy:<22} {p.done:>{len(str(p.total))}}/{p.total} buyers"
            f"  sold {p.sold:<5} conflicts {p.conflicts:<5} errors {p.errors:<4}"
            f" {p.elapsed_s:6.2f} s"
        )

    def start(self, database: str) -> None:
        # Written only once the database answered, so a failed connection stays one line.
        for line in (*self.header, f"flash-sale lab on {database}:"):
            self.stream.write(line + "\n")
        self.stream.flush()

    def update(self, progress: Progress) -> None:
        if self.tty:
            # \x1b[K clears what a longer previous line left behind.
            self.stream.write("\r" + self.line(progress) + "\x1b[K")
            self.stream.flush()

    def finish(self, progress: Progress) -> None:
        prefix, suffix = ("\r", "\x1b[K\n") if self.tty else ("", "\n")
        self.stream.write(prefix + self.line(progress) + suffix)
        self.stream.flush()


# --- the shop: schema, engine, one product per strategy ------------------------------------

metadata = sa.MetaData()
products = sa.Table(
    "products",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(64), nullable=False, unique=True),
    sa.Column("available_stock", sa.Integer, nullable=False),
    sa.Column("initial_stock", sa.Integer, nullable=False),
)
orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("external_ref", sa.String(128), nullable=False, index=True),
    sa.Column("idempotency_key", sa.String(128)),
    sa.Column("request_id", sa.String(128)),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)
order_items = sa.Table(
    "order_items",
    metadata,
    sa.Column(
        "order_id",
        sa.Integer,
        sa.ForeignKey("orders.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("product_id", sa.Integer, sa.ForeignKey("products.id"), primary_key=True),
    sa.Column("quantity", sa.Integer, nullable=False),
    # The stock value the reservation wrote: negative values are negative writes.
    sa.Column("stock_after", sa.Integer, nullable=False),
    sa.Index("ix_order_items_product_id", "product_id"),
)
# The idempotency store: one row per intent, with the outcome a resubmit is answered with.
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("idempotency_key", sa.String(128), primary_key=True),
    sa.Column("sku", sa.String(64), nullable=False, index=True),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)


@dataclass(frozen=True, slots=True)
class Buyer:
    """One buyer's identifiers (unique per lab run)."""

    number: int
    request_id: str
    idempotency_key: str
    external_ref: str


@dataclass(frozen=True, slots=True)
class Shop:
    """What a strategy works with: the engine, its product row and the app's work time.

    The lock strategies also get the Redis client, their lock key and name, the TTLs and
    the :class:`~stocksentry.instrumentation.Sentry` their lock records into.
    """

    engine: Engine
    sku: str
    product_id: int
    qty: int
    work_s: float
    #: Whether ``UPDATE ... RETURNING`` is available; otherwise read back in the transaction.
    update_returning: bool
    sentry: Sentry | None = None
    redis: Any = None
    lock_key: str = ""
    lock_name: str = ""
    naive_lock_ttl_s: float = 0.004
    redlock_ttl_s: float = REDLOCK_MIN_TTL_S
    #: ``"pottery"`` (pottery's Redlock) or ``"lab"`` (SetNxLock with the owned release).
    redlock_impl: str = "lab"

    @property
    def is_sqlite(self) -> bool:
        """Whether the shop runs on SQLite (no ``FOR UPDATE``)."""
        return self.engine.dialect.name == "sqlite"

    @contextlib.contextmanager
    def begin_immediate(self) -> Iterator[Connection]:
        """A SQLite transaction that takes the database's write lock at ``BEGIN``.

        SQLite has no ``SELECT ... FOR UPDATE``; ``BEGIN IMMEDIATE`` is its equivalent for
        one writer: the next buyer's ``BEGIN IMMEDIATE`` waits (busy timeout) until this
        one commits. pysqlite's own implicit ``BEGIN`` is switched off for the connection
        while it runs, so the explicit one is the transaction.
        """
        with self.engine.connect() as conn:
            dbapi = cast(Any, conn.connection.dbapi_connection)
            previous = dbapi.isolation_level
            dbapi.isolation_level = None
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    conn.rollback()
                    raise
                conn.commit()
            finally:
                dbapi.isolation_level = previous

    def work(self) -> None:
        """The app's work between read and write; a real sleep, so buyers overlap in it."""
        if self.work_s > 0:
            time.sleep(self.work_s)

    def read_stock(self) -> int:
        """Read the stock in a short transaction of its own.

        It ends before any write: on SQLite in WAL mode a read transaction that later
        tries to write fails with "database is locked" instead of losing the update.
        """
        with self.engine.begin() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT available_stock FROM products WHERE sku = :sku"),
                    {"sku": self.sku},
                ).scalar_one()
            )

    def insert_order(self, conn: Connection, buyer: Buyer, stock_after: int) -> int:
        """Insert a paid order and its item; returns the order id."""
        order_id = _new_id(
            conn.execute(
                orders.insert().values(
                    external_ref=buyer.external_ref,
                    idempotency_key=buyer.idempotency_key,
                    request_id=buyer.request_id,
                    status="PAID",
                    created_at=datetime.now(UTC),
                )
            )
        )
        conn.execute(
            order_items.insert().values(
                order_id=order_id,
                product_id=self.product_id,
                quantity=self.qty,
                stock_after=stock_after,
            )
        )
        return order_id

    def decrement_unconditionally(self, conn: Connection) -> int:
        """``available_stock - :qty`` with no guard; returns the value written."""
        params = {"qty": self.qty, "sku": self.sku}
        sql = "UPDATE products SET available_stock = available_stock - :qty WHERE sku = :sku"
        if self.update_returning:
            return int(
                conn.execute(sa.text(sql + " RETURNING available_stock"), params).scalar_one()
            )
        conn.execute(sa.text(sql), params)
        return self._read_back(conn)

    def decrement_if_available(self, conn: Connection) -> int | None:
        """The atomic conditional update; the value written, or ``None`` if no row matched."""
        params = {"qty": self.qty, "sku": self.sku}
        sql = (
            "UPDATE products SET available_stock = available_stock - :qty"
            " WHERE sku = :sku AND available_stock >= :qty"
        )
        if self.update_returning:
            value = conn.execute(sa.text(sql + " RETURNING available_stock"), params).scalar()
            return None if value is None else int(value)
        if conn.execute(sa.text(sql), params).rowcount == 0:
            return None
        return self._read_back(conn)

    def _read_back(self, conn: Connection) -> int:
        # Same transaction as the update, so it sees our own write (and holds its lock).
        return int(
            conn.execute(
                sa.text("SELECT available_stock FROM products WHERE sku = :sku"),
                {"sku": self.sku},
            ).scalar_one()
        )


def _new_id(result: sa.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise RuntimeError("the database returned no id for the inserted row")
    return int(key[0])


# --- strategies ----------------------------------------------------------------------------


class Strategy(Protocol):
    """A checkout strategy: reserve ``shop.qty`` for ``buyer`` and mark ``r``."""

    def __call__(self, shop: Shop, r: Reservation, buyer: Buyer, /) -> None: ...


def unsafe(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The seeds' read-then-write: check a value read earlier, write a value computed in Python.

    Two buyers that read the same stock both write ``stock - qty``: one update is lost and
    one unit is sold twice.
    """
    available = shop.read_stock()
    r.stock_check(available)
    shop.work()
    if available < shop.qty:
        r.conflict("out_of_stock")
        return
    computed = available - shop.qty
    with shop.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            {"computed": computed, "sku": shop.sku},
        )
        shop.insert_order(conn, buyer, computed)
    r.success(old_stock=available, new_stock=computed)


def _decrement_and_order(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    # The relative decrement and the order in one transaction, then the success mark with
    # the stock before and after as the database saw them.
    with shop.engine.begin() as conn:
        written = shop.decrement_unconditionally(conn)
        shop.insert_order(conn, buyer, written)
    r.success(old_stock=written + shop.qty, new_stock=written)


def check_then_decrement(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """Check a value read earlier, then decrement relatively without a guard.

    No update is lost, but every buyer who passed the check decrements: stock goes below
    zero and each such write counts in ``stock_inventory_negative_total``.
    """
    available = shop.read_stock()
    r.stock_check(available)
    shop.work()
    if available < shop.qty:
        r.conflict("out_of_stock")
        return
    _decrement_and_order(shop, r, buyer)


def atomic(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The fix: one conditional ``UPDATE ... WHERE available_stock >= :qty`` and the order.

    The database checks and writes in one statement under the row lock; a buyer whose
    update matched no row is refused as ``out_of_stock``. Sells exactly the stock.
    """
    # The same app work as the other strategies, so latencies compare like with like; it
    # happens before the transaction, as an app would price the cart before reserving.
    shop.work()
    with shop.engine.begin() as conn:
        written = shop.decrement_if_available(conn)
        if written is None:
            conn.rollback()
            r.conflict("out_of_stock")
            return
        shop.insert_order(conn, buyer, written)
    r.success(old_stock=written + shop.qty, new_stock=written)


def _write_computed(shop: Shop, buyer: Buyer, available: int) -> int:
    """Write ``available - qty`` as a value computed in Python, and the order."""
    computed = available - shop.qty
    with shop.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            {"computed": computed, "sku": shop.sku},
        )
        shop.insert_order(conn, buyer, computed)
    return computed


def naive_lock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The seeds' hotfix: ``SET lock token NX PX ttl``, the unsafe read-then-write, ``DEL``.

    The TTL is shorter than the work (``naive_lock_ttl_s``), as the seeds' 5 s lock around
    6 s of work: the lock expires under its holder, a second buyer gets it and reads the
    same stock, and the first one's ``DEL`` deletes the second one's lock. The lock is
    :class:`~stocksentry.instrumentation.locks.SetNxLock` with the naive release, so every
    expiry and every foreign ``DEL`` is counted.
    """
    lock = SetNxLock(
        shop.redis,
        shop.lock_key,
        name=shop.lock_name,
        ttl=shop.naive_lock_ttl_s,
        release="naive",
        blocking_timeout=LOCK_WAIT_S,
        retry_delay=LOCK_RETRY_S,
        sentry=shop.sentry,
    )
    try:
        with lock:
            available = shop.read_stock()
            r.stock_check(available)
            if available < shop.qty:
                r.conflict("out_of_stock")
                return
            shop.work()
            computed = _write_computed(shop, buyer, available)
            r.success(old_stock=available, new_stock=computed)
    except LockNotAcquired:
        r.conflict("lock_not_acquired")


def for_update(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """A transaction that locks the row first: ``SELECT ... FOR UPDATE``, check, write.

    The next buyer's ``SELECT ... FOR UPDATE`` waits for this transaction to end, so each
    one reads the stock the previous one wrote. On SQLite, which has no ``FOR UPDATE``,
    ``BEGIN IMMEDIATE`` takes the write lock before the read and the write is the relative
    decrement (the lock, not the statement, makes it safe). Sells exactly the stock.
    """
    if shop.is_sqlite:
        with shop.begin_immediate() as conn:
            available = _select_stock(conn, shop.sku, for_update=False)
            r.stock_check(available)
            if available < shop.qty:
                r.conflict("out_of_stock")
                return
            shop.work()
            written = shop.decrement_unconditionally(conn)
            shop.insert_order(conn, buyer, written)
        r.success(old_stock=available, new_stock=written)
        return
    with shop.engine.begin() as conn:
        available = _select_stock(conn, shop.sku, for_update=True)
        r.stock_check(available)
        if available < shop.qty:
            r.conflict("out_of_stock")
            return
        shop.work()
        computed = available - shop.qty
        conn.execute(
            sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
            {"computed": computed, "sku": shop.sku},
        )
        shop.insert_order(conn, buyer, computed)
    r.success(old_stock=available, new_stock=computed)


def _select_stock(conn: Connection, sku: str, *, for_update: bool) -> int:
    sql = "SELECT available_stock FROM products WHERE sku = :sku"
    if for_update:
        sql += " FOR UPDATE"
    return int(conn.execute(sa.text(sql), {"sku": sku}).scalar_one())


def redlock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The seeds' fix: an owned lock (token), retries with jitter, release only if owned.

    The lab's :class:`~stocksentry.instrumentation.locks.SetNxLock` with the
    compare-and-delete release (``redlock_impl="lab"``), or pottery's ``Redlock`` on the
    one Redis master (``"pottery"``); both instrumented. The TTL is far above the work,
    and the lock is extended (only while still ours) before the write, so a holder that
    lost it refuses instead of writing. Under the lock the write is the relative
    decrement: the lock makes the check hold, and the SQL detector, which cannot see a
    Redis lock, has nothing to flag.
    """
    try:
        if shop.redlock_impl == "pottery":
            _with_pottery_redlock(shop, r, buyer)
        else:
            _with_owned_lock(shop, r, buyer)
    except LockNotAcquired:
        r.conflict("lock_not_acquired")


def _locked_checkout(
    shop: Shop, r: Reservation, buyer: Buyer, still_ours: Callable[[], bool]
) -> None:
    available = shop.read_stock()
    r.stock_check(available)
    if available < shop.qty:
        r.conflict("out_of_stock")
        return
    shop.work()
    if not still_ours():
        r.conflict("lock_timeout")
        return
    _decrement_and_order(shop, r, buyer)


def _with_owned_lock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    lock = SetNxLock(
        shop.redis,
        shop.lock_key,
        name=shop.lock_name,
        ttl=shop.redlock_ttl_s,
        release="owned",
        blocking_timeout=LOCK_WAIT_S,
        retry_delay=LOCK_RETRY_S,
        sentry=shop.sentry,
    )
    with lock:
        _locked_checkout(shop, r, buyer, lock.extend)


def _with_pottery_redlock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    from pottery import ExtendUnlockedLock, QuorumNotAchieved, Redlock

    lock = InstrumentedRedlock(
        Redlock(
            key=shop.lock_key,
            masters={shop.redis},
            auto_release_time=shop.redlock_ttl_s,
            context_manager_timeout=LOCK_WAIT_S,
        ),
        name=shop.lock_name,
        # pottery waits up to 0.2 s between attempts; the lab's work is milliseconds.
        retry_delay=2 * LOCK_RETRY_S,
        sentry=shop.sentry,
    )

    def still_ours() -> bool:
        try:
            lock.extend()
        except ExtendUnlockedLock:
            return False
        return True

    try:
        with lock:
            _locked_checkout(shop, r, buyer, still_ours)
    except QuorumNotAchieved as exc:
        raise LockNotAcquired(shop.lock_name, LOCK_WAIT_S) from exc


#: Strategy name -> function, in the order the report shows them (unsafe ones first).
STRATEGIES: dict[str, Strategy] = {
    "unsafe": unsafe,
    "check_then_decrement": check_then_decrement,
    "naive_lock": naive_lock,
    "atomic": atomic,
    "for_update": for_update,
    "redlock": redlock,
}


def sku_for(strategy: str) -> str:
    """The product row a strategy sells: ``LAB-<STRATEGY>``."""
    return f"LAB-{strategy.upper()}"


# --- database set-up -----------------------------------------------------------------------


def normalize_url(url: str) -> URL:
    """Parse a SQLAlchemy URL; plain ``postgresql://`` (or ``postgres://``) gets psycopg 3.

    Raises :class:`LabError` for a URL SQLAlchemy cannot parse, without quoting it (it may
    hold a password in a form no mask recognises).
    """
    try:
        return parse_url(url)
    except ValueError as exc:
        raise LabError(f"cannot parse database URL: {exc}") from None


def _first_line(exc: BaseException) -> str:
    # Driver errors carry multi-line details (SQLAlchemy adds a "Background on this
    # error" link); the CLI promises one line.
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _create_engine(url: URL, concurrency: int) -> Engine:
    # One connection per worker thread: a buyer holds at most one at a time, and a pool
    # smaller than the workers would make them queue in the pool instead of the database.
    pool: dict[str, Any] = {
        "poolclass": sa.QueuePool,
        "pool_size": concurrency,
        "max_overflow": 4,
        "pool_timeout": 60,
    }
    try:
        if url.get_backend_name() == "sqlite":
            database = url.database or ""
            if database in ("", ":memory:") or database.startswith("file::memory:"):
                raise LabError(
                    "an in-memory SQLite database is private to each connection; "
                    "give a file (sqlite:///lab.db) or leave --database out"
                )
            engine = sa.create_engine(
                url,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
                **pool,
            )
            sa.event.listen(engine, "connect", _sqlite_on_connect)
            return engine
        connect_args: dict[str, Any] = {}
        if url.get_backend_name() == "postgresql":
            # Fail fast on an unreachable server instead of hanging the CLI.
            connect_args["connect_timeout"] = 10
        return sa.create_engine(url, connect_args=connect_args, **pool)
    except LabError:
        raise
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
        raise LabError(
            f"cannot use database URL {url.render_as_string(hide_password=True)}: "
            f"{_first_line(exc)}"
        ) from exc


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets the buyers read while one of them writes, as in a server database.
        cursor.execute("PRAGMA journal_mode=WAL")
        # Safe in WAL mode (no corruption, only the last commits at risk on power loss),
        # and it keeps each commit off the disk's fsync latency.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    finally:
        cursor.close()


def _update_returning(engine: Engine) -> bool:
    # SQLAlchemy knows per dialect and server version (SQLite from 3.35, PostgreSQL).
    return bool(engine.dialect.update_returning)


def _prepare_product(engine: Engine, sku: str, stock: int) -> int:
    """Create or reset the strategy's product row and delete its earlier orders."""
    with engine.begin() as conn:
        product_id = conn.execute(
            sa.select(products.c.id).where(products.c.sku == sku)
        ).scalar_one_or_none()
        if product_id is None:
            product_id = _new_id(
                conn.execute(
                    products.insert().values(sku=sku, available_stock=stock, initial_stock=stock)
                )
            )
        else:
            conn.execute(
                products.update()
                .where(products.c.id == product_id)
                .values(available_stock=stock, initial_stock=stock)
            )
            items = sa.select(order_items.c.order_id).where(order_items.c.product_id == product_id)
            # Orders first (PostgreSQL cascades to the items), then the items SQLite keeps
            # because it does not enforce foreign keys by default.
            conn.execute(orders.delete().where(orders.c.id.in_(items)))
            conn.execute(order_items.delete().where(order_items.c.product_id == product_id))
            conn.execute(idempotency_keys.delete().where(idempotency_keys.c.sku == sku))
    return int(product_id)


def _count_in_db(engine: Engine, product_id: int) -> DbFigures:
    """The ground truth: paid orders, units and negative writes by SQL, and the stock."""
    with engine.begin() as conn:
        row = conn.execute(
            sa.text(
                "SELECT COUNT(DISTINCT o.id), COALESCE(SUM(oi.quantity), 0),"
                " COALESCE(SUM(CASE WHEN oi.stock_after < 0 THEN 1 ELSE 0 END), 0)"
                " FROM order_items oi JOIN orders o ON o.id = oi.order_id"
                " WHERE oi.product_id = :pid AND o.status = 'PAID'"
            ),
            {"pid": product_id},
        ).one()
        final = conn.execute(
            sa.text("SELECT available_stock FROM products WHERE id = :pid"), {"pid": product_id}
        ).scalar_one()
        duplicates = conn.execute(
            sa.text(
                "SELECT COUNT(*), COALESCE(SUM(n - 1), 0) FROM ("
                " SELECT o.idempotency_key, COUNT(*) AS n"
                " FROM order_items oi JOIN orders o ON o.id = oi.order_id"
                " WHERE oi.product_id = :pid AND o.status = 'PAID'"
                " GROUP BY o.idempotency_key HAVING COUNT(*) > 1) d"
            ),
            {"pid": product_id},
        ).one()
    return DbFigures(
        orders=int(row[0]),
        units=int(row[1]),
        negative_writes=int(row[2]),
        final_stock=int(final),
        duplicate_keys=int(duplicates[0]),
        duplicate_orders=int(duplicates[1]),
    )


def _read_stock_by_id(engine: Engine, product_id: int) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT available_stock FROM products WHERE id = :pid"),
                {"pid": product_id},
            ).scalar_one()
        )


# --- metrics -------------------------------------------------------------------------------


def _sample(registry: CollectorRegistry, name: str, labels: Mapping[str, str]) -> float:
    value = registry.get_sample_value(name, dict(labels))
    return 0.0 if value is None else value


def _durations(registry: CollectorRegistry) -> dict[str, float]:
    # The duration histogram has no sku label (bounded cardinality), so the lab takes the
    # difference before and after each strategy; strategies run one after the other.
    return {
        outcome: _sample(registry, _DURATION_COUNT, {"outcome": outcome})
        for outcome in catalog.OUTCOMES
    }


def _unlabelled_totals(registry: CollectorRegistry, lock: str) -> dict[str, float]:
    """Totals of the metrics without a ``sku`` label, read before and after a strategy.

    Strategies run one after the other, so the difference is the strategy's own.
    """
    totals = {
        _REPLAY: _sample(registry, _REPLAY, {"operation": IDEMPOTENT_OPERATION}),
        _STALE: _sample(registry, _STALE, {"cache": CACHE_NAME}),
        _UNSAFE_RMW: _sample(registry, _UNSAFE_RMW, {"table": STOCK_TABLE}),
        _LOCK_EXPIRED: _sample(registry, _LOCK_EXPIRED, {"lock": lock}),
        _LOCK_NOT_OWNED: _sample(registry, _LOCK_NOT_OWNED, {"lock": lock}),
        _LOCK_EXTEND_FAILED: _sample(registry, _LOCK_EXTEND_FAILED, {"lock": lock}),
        _LOCK_RETRIES: _sample(registry, _LOCK_RETRIES, {"lock": lock}),
        f"{_LOCK_RATIO}_count": _sample(registry, f"{_LOCK_RATIO}_count", {"lock": lock}),
        f"{_LOCK_RATIO}_sum": _sample(registry, f"{_LOCK_RATIO}_sum", {"lock": lock}),
    }
    for outcome in ("acquired", "timeout", "error"):
        labels = {"lock": lock, "outcome": outcome}
        totals[f"{_LOCK_WAIT}_count:{outcome}"] = _sample(registry, f"{_LOCK_WAIT}_count", labels)
        totals[f"{_LOCK_WAIT}_sum:{outcome}"] = _sample(registry, f"{_LOCK_WAIT}_sum", labels)
    return totals


@dataclass(slots=True)
class _Tally:
    """Outcomes counted on the Python side, for live progress and the lab's own checks.

    ``done`` counts buyers; ``reservations`` every reservation made (a resubmit without
    idempotency is a second one); ``locked`` the reservations that went to the strategy
    (not refused by the cache first), each of which asks a lock strategy's lock once.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: int = 0
    reservations: int = 0
    locked: int = 0
    sold: int = 0
    conflicts: int = 0
    errors: int = 0
    resubmitted: int = 0
    replays: int = 0
    stale_hits: int = 0
    first_error: str | None = None
    latencies: list[float] = field(default_factory=list)

    def add(
        self,
        outcome: str,
        seconds: float,
        exc: BaseException | None,
        *,
        reached_strategy: bool = True,
        stale: bool = False,
    ) -> None:
        with self.lock:
            self.reservations += 1
            self.locked += reached_strategy
            self.stale_hits += stale
            self.latencies.append(seconds)
            if outcome == "success":
                self.sold += 1
            elif outcome == "error":
                self.errors += 1
                self._note(exc)
            else:
                self.conflicts += 1

    def _note(self, exc: BaseException | None) -> None:
        if self.first_error is None and exc is not None:
            self.first_error = f"{type(exc).__name__}: {_first_line(exc)}"

    def note(self, exc: BaseException) -> None:
        """Remember a failure outside any reservation (the idempotency store)."""
        with self.lock:
            self._note(exc)

    def buyer_done(self) -> None:
        with self.lock:
            self.done += 1

    def resubmit(self) -> None:
        with self.lock:
            self.resubmitted += 1

    def replay(self) -> None:
        with self.lock:
            self.replays += 1


def resubmits(number: int, share: float) -> bool:
    """Whether buyer ``number`` (from 1) submits its intent twice; exactly
    ``floor(buyers * share)`` of the buyers do, spread evenly.

    Example::

        >>> [n for n in range(1, 11) if resubmits(n, 0.3)]
        [4, 7, 10]
    """
    return math.floor(number * share) > math.floor((number - 1) * share)


class _IdempotencyStore:
    """The idempotency records: intent key -> the outcome it was answered with."""

    def __init__(self, engine: Engine, sku: str) -> None:
        self.engine = engine
        self.sku = sku

    def seen(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            outcome = conn.execute(
                sa.select(idempotency_keys.c.outcome).where(
                    idempotency_keys.c.idempotency_key == key
                )
            ).scalar_one_or_none()
        return None if outcome is None else str(outcome)

    def save(self, key: str, outcome: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                idempotency_keys.insert().values(
                    idempotency_key=key,
                    sku=self.sku,
                    outcome=outcome,
                    created_at=datetime.now(UTC),
                )
            )


class _Every:
    """Calls ``tick()`` every ``interval`` seconds in a thread, for the ``with`` block."""

    def __init__(self, interval: float, tick: Callable[[], None], name: str) -> None:
        self._interval = interval
        self._tick = tick
        self._name = name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tick()
            except Exception as exc:  # a failed sample or refresh is skipped, not fatal
                self.error = exc

    def __enter__(self) -> _Every:
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class _StockCache:
    """The stock as a cache holds it, refreshed from the database late, on a timer.

    A Redis key when the lab has Redis, else a value in memory. Between refreshes the
    cache still says "available" after the last unit went: the decision it feeds is stale.
    """

    def __init__(self, read: Callable[[], int], redis: Any, key: str) -> None:
        self._read = read
        self._redis = redis
        self._key = key
        self._value: int | None = None

    def refresh(self) -> None:
        value = self._read()
        if self._redis is not None:
            self._redis.set(self._key, value)
        else:
            self._value = value

    def get(self) -> int | None:
        if self._redis is None:
            return self._value
        raw = self._redis.get(self._key)
        return None if raw is None else int(raw)


class _Sampler:
    """Samples the stock for the report's stock-over-time chart."""

    def __init__(self, read: Callable[[], int]) -> None:
        self._read = read
        #: ``perf_counter()`` at the start of the sale: sample times count from there.
        self.origin = time.perf_counter()
        self.samples: list[tuple[float, int]] = []

    def sample(self) -> None:
        stock = self._read()
        self.samples.append((round(time.perf_counter() - self.origin, 4), stock))


def _percentile_ms(values: list[float], q: float) -> float:
    """Nearest-rank percentile, in milliseconds, rounded to 0.1 ms."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return round(ordered[rank - 1] * 1000, 1)


# --- running -------------------------------------------------------------------------------


@contextlib.contextmanager
def _json_logs_to(path: str | None) -> Iterator[bool]:
    """Send the instrumentation's JSON log lines to ``path`` for the block; yields ``log``.

    structlog's configuration is process-wide: the previous one is put back afterwards.
    """
    if path is None:
        yield False
        return
    import structlog
    from stocksentry.instrumentation.logs import configure_logging

    try:
        stream = Path(path).open("w", encoding="utf-8")  # noqa: SIM115 - closed in finally
    except OSError as exc:
        raise LabError(f"cannot write log file {path}: {exc.strerror or exc}") from exc
    previous = structlog.get_config()
    try:
        # No stdlib bridge: the lab leaves the process's logging handlers alone.
        configure_logging("INFO", stream=stream, bridge_stdlib=False)
        yield True
    finally:
        structlog.configure(**previous)
        stream.close()


def run_lab(
    config: LabConfig,
    *,
    registry: CollectorRegistry | None = None,
    progress: ProgressSink | None = None,
) -> list[StrategyResult]:
    """Run every configured strategy in turn and return one result each, in order.

    A strategy that cannot run (a Redis strategy without ``redis_url``) is returned as
    skipped, with the reason. ``registry`` receives the lab's metrics (a fresh one when
    ``None``); serve it with :func:`serve_metrics` to scrape the run live. Raises
    :class:`LabError` when the database or Redis cannot be reached or prepared.
    """
    registry = registry if registry is not None else CollectorRegistry()
    names = config.strategy_names
    temp_dir: str | None = None
    if config.database_url is None:
        temp_dir = tempfile.mkdtemp(prefix="stocksentry-lab-")
        url = sa.make_url(f"sqlite:///{Path(temp_dir) / 'lab.db'}")
    else:
        url = normalize_url(config.database_url)
    shown = describe_database(config)
    engine: Engine | None = None
    side: Engine | None = None
    redis_client: Any = None
    undo_sql: Callable[[], None] | None = None
    run = uuid.uuid4().hex[:8]
    try:
        engine = _create_engine(url, config.concurrency)
        _connect_and_prepare(engine, shown, config.concurrency)
        # The lab's own reads (reset, samples, cache refresh, counts) go through a second,
        # uninstrumented engine: the SQL detector sees the strategies' statements only.
        side = _create_engine(url, 3)
        if (
            config.redlock_impl == "pottery"
            and "redlock" in names
            and config.redis_url is not None
            and importlib.util.find_spec("pottery") is None
        ):
            raise LabError("the pottery Redlock needs pottery: pip install pottery")
        if config.redis_url is not None and any(
            config.skip_reason(name) is None and (name in REDIS_STRATEGIES or config.stale_cache)
            for name in names
        ):
            redis_client = _connect_redis(config)
        if progress is not None:
            progress.start(shown)
        with _json_logs_to(config.log_file) as log:
            sentry = Sentry(
                registry=registry,
                promo_skus=[sku_for(name) for name in names],
                log=log,
                trace=False,
            )
            if config.sql_detector:
                undo_sql = instrument_lab_engine(engine, sentry)
            lab = _Lab(
                engine=engine,
                side=side,
                sentry=sentry,
                registry=registry,
                config=config,
                run=run,
                progress=progress,
                redis=redis_client,
                detector=undo_sql is not None,
            )
            results = []
            for name in names:
                reason = config.skip_reason(name)
                if reason is not None:
                    results.append(StrategyResult.skip(config, name, reason))
                else:
                    results.append(_run_strategy(lab, name))
            return results
    finally:
        if undo_sql is not None:
            with contextlib.suppress(Exception):
                undo_sql()
        if redis_client is not None:
            _delete_redis_keys(redis_client, config.redis_prefix + run)
            redis_client.close()
        for each in (engine, side):
            if each is not None:
                each.dispose()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def instrument_lab_engine(engine: Engine, sentry: Sentry) -> Callable[[], None] | None:
    """Watch the lab's engine with stocksentry's SQLAlchemy integration, spans off.

    The hook that puts ``stock_unsafe_read_modify_write_total{table="products"}`` (and the
    lock-wait, deadlock and conflict metrics) into the lab. Returns the function that
    removes the listeners again, or ``None`` when the integration is not installed or
    refused the engine: the lab then runs without the detector.
    """
    try:
        module = importlib.import_module("stocksentry.instrumentation.sqlalchemy")
        stock_table = module.StockTable(stock_column="available_stock", key_columns=("id", "sku"))
        module.instrument_sqlalchemy(
            engine, sentry=sentry, stock_tables={STOCK_TABLE: stock_table}, spans="off"
        )
    except Exception:
        return None
    uninstrument: Callable[[Engine], None] = module.uninstrument_sqlalchemy
    return lambda: uninstrument(engine)


def describe_redis(config: LabConfig) -> str | None:
    """The Redis URL without its password, for people (``None`` without Redis)."""
    if config.redis_url is None:
        return None
    return re.sub(r"(//[^:@/]*):[^@/]*@", r"\1:***@", config.redis_url)


def _connect_redis(config: LabConfig) -> Any:
    shown = describe_redis(config)
    try:
        import redis
    except ImportError as exc:
        raise LabError(
            f"--redis needs the redis package ({exc.name or exc}):"
            " pip install 'stocksentry[redis]'"
        ) from exc
    try:
        client = redis.Redis.from_url(
            cast(str, config.redis_url), socket_connect_timeout=5, socket_timeout=30
        )
        client.ping()
    except (redis.RedisError, ValueError, OSError) as exc:
        raise LabError(f"cannot connect to Redis {shown}: {_first_line(exc)}") from exc
    return client


def _delete_redis_keys(client: Any, prefix: str) -> None:
    # The lab's keys: locks, pottery's ("redlock:" in front) and the stock cache.
    with contextlib.suppress(Exception):
        for pattern in (prefix + "*", "redlock:" + prefix + "*"):
            keys = list(client.scan_iter(match=pattern))
            if keys:
                client.delete(*keys)


@dataclass(slots=True)
class _Lab:
    """What every strategy's run shares."""

    engine: Engine
    side: Engine
    sentry: Sentry
    registry: CollectorRegistry
    config: LabConfig
    run: str
    progress: ProgressSink | None
    redis: Any
    detector: bool


def _connect_and_prepare(engine: Engine, shown: str, concurrency: int) -> None:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.SQLAlchemyError as exc:
        raise LabError(f"cannot connect to {shown}: {_first_line(exc)}") from exc
    # Open the workers' connections now, so the first wave of buyers does not spend its
    # time connecting while the others already race.
    held: list[Connection] = []
    try:
        for _ in range(concurrency):
            held.append(engine.connect())
    except sa.exc.SQLAlchemyError as exc:
        raise LabError(
            f"cannot open {concurrency} connections to {shown} (lower --concurrency?):"
            f" {_first_line(exc)}"
        ) from exc
    finally:
        for conn in held:
            conn.close()
    # After the connections: a run that cannot get them leaves no tables behind.
    try:
        metadata.create_all(engine)
    except sa.exc.SQLAlchemyError as exc:
        raise LabError(f"cannot create the lab tables in {shown}: {_first_line(exc)}") from exc


def _run_strategy(lab: _Lab, name: str) -> StrategyResult:
    engine, sentry, registry, config = lab.engine, lab.sentry, lab.registry, lab.config
    progress = lab.progress
    strategy = STRATEGIES[name]
    sku = sku_for(name)
    product_id = _prepare_product(lab.side, sku, config.stock)
    keys = f"{config.redis_prefix}{lab.run}:{name}"
    shop = Shop(
        engine=engine,
        sku=sku,
        product_id=product_id,
        qty=config.quantity,
        work_s=config.work_ms / 1000,
        update_returning=_update_returning(engine),
        sentry=sentry,
        redis=lab.redis,
        lock_key=f"{keys}:lock",
        lock_name=name,
        naive_lock_ttl_s=config.naive_lock_ttl_s,
        redlock_ttl_s=config.redlock_ttl_s,
        redlock_impl=config.redlock_impl,
    )
    store = _IdempotencyStore(engine, sku) if config.retries > 0 and config.idempotency else None
    cache = None
    if config.stale_cache:
        cache = _StockCache(
            lambda: _read_stock_by_id(lab.side, product_id), lab.redis, f"{keys}:cache"
        )
        cache.refresh()
    before = _unlabelled_totals(registry, name)
    durations_before = _durations(registry)
    tally = _Tally()
    gate = threading.Event()
    arrived = threading.Semaphore(0)
    stop = threading.Event()

    def reserve(buyer: Buyer) -> str:
        error: BaseException | None = None
        handle: Reservation | None = None
        reached = True
        stale = False
        start = time.perf_counter()
        try:
            with sentry.reservation(
                sku,
                strategy=name,
                qty=config.quantity,
                request_id=buyer.request_id,
                idempotency_key=buyer.idempotency_key,
            ) as handle:
                cached = cache.get() if cache is not None else None
                if cached is not None and cached < config.quantity:
                    # The cache says sold out: refused without asking the database.
                    reached = False
                    handle.conflict("out_of_stock")
                else:
                    strategy(shop, handle, buyer)
                    if cached is not None and handle.outcome == "out_of_stock":
                        # The cache said available, the database said no.
                        stale = True
                        sentry.record_stale_cache_hit(CACHE_NAME, sku=sku, cached=cached)
        except Exception as exc:
            # The reservation has recorded it (as an error or, for a lock timeout, a
            # conflict); one failed buyer must not stop the sale.
            error = exc
        elapsed = time.perf_counter() - start
        outcome = handle.outcome if handle is not None else None
        if outcome is None:
            outcome = classify_exception(error) if error is not None else "success"
        tally.add(outcome, elapsed, error, reached_strategy=reached, stale=stale)
        return outcome

    def submit(buyer: Buyer) -> None:
        if store is not None:
            try:
                if store.seen(buyer.idempotency_key) is not None:
                    sentry.record_idempotency_replay(
                        IDEMPOTENT_OPERATION, key=buyer.idempotency_key
                    )
                    tally.replay()
                    return
            except sa.exc.SQLAlchemyError as exc:
                tally.note(exc)
        outcome = reserve(buyer)
        if store is not None and outcome != "error":
            try:
                store.save(buyer.idempotency_key, outcome)
            except sa.exc.SQLAlchemyError as exc:
                tally.note(exc)

    def buy(number: int) -> None:
        arrived.release()
        # Everyone in the first wave waits here, so they really collide.
        gate.wait()
        if stop.is_set():
            return
        buyer = Buyer(
            number=number,
            request_id=f"req-{lab.run}-{name}-{number}",
            idempotency_key=f"idem-{lab.run}-{name}-{number}",
            external_ref=f"lab-{lab.run}-{name}-{number}",
        )
        try:
            submit(buyer)
            if resubmits(number, config.retries):
                # The same intent again (a mobile retry, a proxy retry): new request id,
                # same idempotency key and external reference.
                tally.resubmit()
                submit(dataclasses.replace(buyer, request_id=buyer.request_id + "-retry"))
        finally:
            tally.buyer_done()

    def snapshot(elapsed: float) -> Progress:
        with tally.lock:
            return Progress(
                name, tally.done, config.buyers, tally.sold, tally.conflicts, tally.errors, elapsed
            )

    first_wave = min(config.concurrency, config.buyers)
    started = time.perf_counter()
    sampler = _Sampler(lambda: _read_stock_by_id(lab.side, product_id))
    with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="buyer") as pool:
        futures = [pool.submit(buy, n) for n in range(1, config.buyers + 1)]
        try:
            for _ in range(first_wave):
                arrived.acquire()
            started = sampler.origin = time.perf_counter()
            sampler.samples.append((0.0, config.stock))
            gate.set()
            ticker = _Ticker(progress, lambda: snapshot(time.perf_counter() - started))
            refresher = (
                _Every(config.cache_refresh_ms / 1000, cache.refresh, "lab-cache")
                if cache is not None
                else contextlib.nullcontext()
            )
            with ticker, refresher, _Every(SAMPLE_INTERVAL_S, sampler.sample, "lab-sampler"):
                for future in futures:
                    future.result()
        except BaseException:
            # Ctrl-C: let the queued buyers return at once instead of running the sale out.
            stop.set()
            gate.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    wall = time.perf_counter() - started
    with contextlib.suppress(sa.exc.SQLAlchemyError):
        sampler.sample()
    if progress is not None:
        progress.finish(snapshot(wall))
    if lab.redis is not None:
        _delete_redis_keys(lab.redis, keys)
    return _result(
        lab, name, sku, product_id, tally, wall, durations_before, before, sampler.samples
    )


class _Ticker:
    """Calls ``sink.update(snapshot())`` every :data:`PROGRESS_INTERVAL_S` in a thread."""

    def __init__(self, sink: ProgressSink | None, snapshot: Callable[[], Progress]) -> None:
        self._sink = sink
        self._snapshot = snapshot
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self, sink: ProgressSink) -> None:
        while not self._stop.wait(PROGRESS_INTERVAL_S):
            sink.update(self._snapshot())

    def __enter__(self) -> _Ticker:
        if self._sink is not None:
            self._thread = threading.Thread(
                target=self._loop, args=(self._sink,), name="lab-progress", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _result(
    lab: _Lab,
    name: str,
    sku: str,
    product_id: int,
    tally: _Tally,
    wall: float,
    durations_before: dict[str, float],
    before: dict[str, float],
    samples: list[tuple[float, int]],
) -> StrategyResult:
    registry, config = lab.registry, lab.config
    db = _count_in_db(lab.side, product_id)
    success = int(_sample(registry, _SUCCESS, {"sku": sku, "strategy": name}))
    conflicts = {
        reason: int(_sample(registry, _CONFLICT, {"sku": sku, "reason": reason}))
        for reason in catalog.CONFLICT_REASONS
    }
    conflict_total = sum(conflicts.values())
    negative = int(_sample(registry, _NEGATIVE, {"sku": sku}))
    durations_after = _durations(registry)
    observed = {k: int(durations_after[k] - durations_before[k]) for k in durations_after}
    errors = observed["error"]
    after = _unlabelled_totals(registry, name)
    delta = {key: after[key] - before[key] for key in after}
    replays = int(delta[_REPLAY])
    stale = int(delta[_STALE])
    unsafe_rmw = int(delta[_UNSAFE_RMW]) if lab.detector else None
    metrics = {
        _SUCCESS: success,
        _CONFLICT: conflict_total,
        _NEGATIVE: negative,
        _DURATION_COUNT: sum(observed.values()),
        _REPLAY: replays,
        _STALE: stale,
    }
    if unsafe_rmw is not None:
        metrics[_UNSAFE_RMW] = unsafe_rmw
    locks: dict[str, float] = {}
    lock_checks: tuple[tuple[bool, str], ...] = ()
    if name in REDIS_STRATEGIES:
        locks = _lock_figures(delta)
        metrics.update(
            {
                _LOCK_EXPIRED: int(locks["expired_while_held"]),
                _LOCK_NOT_OWNED: int(locks["release_not_owned"]),
                _LOCK_EXTEND_FAILED: int(locks["extend_failures"]),
                _LOCK_RETRIES: int(locks["acquire_retries"]),
                f"{_LOCK_WAIT}_count": int(
                    locks["acquired"] + locks["acquire_timeouts"] + locks["acquire_errors"]
                ),
            }
        )
        asked = metrics[f"{_LOCK_WAIT}_count"]
        lock_checks = (
            (
                asked == tally.locked,
                f"{_LOCK_WAIT}_count rose by {asked} for {tally.locked} reservations that"
                " asked for the lock",
            ),
        )

    checks = (
        (
            success == db.orders,
            f"{_SUCCESS} = {success} but the database holds {db.orders} orders",
        ),
        (
            negative == db.negative_writes,
            f"{_NEGATIVE} = {negative} but the database holds {db.negative_writes}"
            " negative stock writes",
        ),
        (
            success + conflict_total + errors == tally.reservations,
            f"success {success} + conflicts {conflict_total} + errors {errors}"
            f" != {tally.reservations} reservations",
        ),
        (
            metrics[_DURATION_COUNT] == tally.reservations,
            f"{_DURATION_COUNT} rose by {metrics[_DURATION_COUNT]} for"
            f" {tally.reservations} reservations",
        ),
        (
            replays == tally.replays,
            f"{_REPLAY} rose by {replays} for {tally.replays} resubmits answered from the"
            " idempotency record",
        ),
        (
            stale == tally.stale_hits,
            f"{_STALE} rose by {stale} for {tally.stale_hits} decisions the database contradicted",
        ),
        *lock_checks,
    )
    mismatches = tuple(message for ok, message in checks if not ok)
    return StrategyResult(
        strategy=name,
        sku=sku,
        stock_initial=config.stock,
        buyers=config.buyers,
        sold=db.units,
        orders=db.orders,
        oversold=max(0, db.units - config.stock),
        # Units sold that the stock column never saw go: each one is an overwritten update.
        lost_updates=max(0, db.units - (config.stock - db.final_stock)),
        final_stock=db.final_stock,
        conflicts={reason: n for reason, n in conflicts.items() if n},
        errors=errors,
        negative_writes=db.negative_writes,
        p50_ms=_percentile_ms(tally.latencies, 0.50),
        p99_ms=_percentile_ms(tally.latencies, 0.99),
        wall_s=round(wall, 3),
        metrics=metrics,
        db=db,
        consistent=not mismatches,
        mismatches=mismatches,
        first_error=tally.first_error,
        reservations=tally.reservations,
        resubmitted=tally.resubmitted,
        replays=replays,
        stale_cache_hits=stale,
        unsafe_read_modify_write=unsafe_rmw,
        locks=locks,
        samples=tuple(samples),
        notes=_notes(lab, name),
    )


def _lock_figures(delta: Mapping[str, float]) -> dict[str, float]:
    acquired = delta[f"{_LOCK_WAIT}_count:acquired"]
    ratios = delta[f"{_LOCK_RATIO}_count"]
    waited = sum(delta[f"{_LOCK_WAIT}_sum:{o}"] for o in ("acquired", "timeout", "error"))
    asked = sum(delta[f"{_LOCK_WAIT}_count:{o}"] for o in ("acquired", "timeout", "error"))
    return {
        "acquired": int(acquired),
        "acquire_timeouts": int(delta[f"{_LOCK_WAIT}_count:timeout"]),
        "acquire_errors": int(delta[f"{_LOCK_WAIT}_count:error"]),
        "acquire_retries": int(delta[_LOCK_RETRIES]),
        "acquire_wait_ms_mean": round(1000 * waited / asked, 3) if asked else 0.0,
        "expired_while_held": int(delta[_LOCK_EXPIRED]),
        "release_not_owned": int(delta[_LOCK_NOT_OWNED]),
        "extend_failures": int(delta[_LOCK_EXTEND_FAILED]),
        "hold_ratio_mean": round(delta[f"{_LOCK_RATIO}_sum"] / ratios, 3) if ratios else 0.0,
    }


def _notes(lab: _Lab, name: str) -> tuple[str, ...]:
    config = lab.config
    if name == "for_update" and lab.engine.dialect.name == "sqlite":
        return ("SQLite has no SELECT ... FOR UPDATE: BEGIN IMMEDIATE takes the write lock first",)
    if name == "naive_lock":
        return (
            f"SET NX PX {config.naive_lock_ttl_s * 1000:g} ms around {config.work_ms:g} ms of"
            " work, DEL without checking the token",
        )
    if name == "redlock":
        ttl = f"TTL {config.redlock_ttl_s:g} s, extended only while owned before the write"
        if config.redlock_impl == "pottery":
            return (f"pottery Redlock on one Redis master, retries with jitter, {ttl}",)
        return (
            "the lab's owned lock (SetNxLock): token, jittered retries,"
            f" compare-and-delete release, {ttl}",
        )
    return ()


# --- serving and reporting -----------------------------------------------------------------


@contextlib.contextmanager
def serve_metrics(registry: CollectorRegistry, port: int) -> Iterator[int]:
    """Serve ``registry`` at ``http://127.0.0.1:<port>/metrics`` for the block.

    Yields the bound port (useful with ``port=0``). Raises :class:`LabError` when the
    port cannot be bound.
    """
    try:
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError as exc:
        raise LabError(
            f"cannot serve /metrics on 127.0.0.1:{port}: {exc.strerror or exc}"
        ) from exc
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _conflict_text(conflicts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in conflicts.items()) or "-"


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    cell: Callable[[StrategyResult], str]
    left: bool = False


def _columns(results: Sequence[StrategyResult]) -> list[_Column]:
    """The table's columns: the fixed ones, and those the run has something to say in."""
    ran = [r for r in results if r.skipped is None]

    def lock_cell(key: str) -> Callable[[StrategyResult], str]:
        return lambda r: str(int(r.locks[key])) if r.locks else "-"

    columns = [
        _Column("strategy", lambda r: r.strategy, left=True),
        _Column("stock", lambda r: str(r.stock_initial)),
        _Column("buyers", lambda r: str(r.buyers)),
        _Column("sold", lambda r: str(r.sold)),
        _Column("oversold", lambda r: str(r.oversold)),
        _Column("final stock", lambda r: str(r.final_stock)),
        _Column(
            "conflicts",
            lambda r: _conflict_text(r.conflicts) + (f", error {r.errors}" if r.errors else ""),
            left=True,
        ),
        _Column("negative writes", lambda r: str(r.negative_writes)),
    ]
    if any(r.locks for r in ran):
        columns += [
            _Column("lock expired", lock_cell("expired_while_held")),
            _Column("not owned", lock_cell("release_not_owned")),
        ]
    if any(r.resubmitted for r in ran):
        columns += [
            _Column("replays", lambda r: str(r.replays)),
            _Column("dup orders", lambda r: str(r.duplicate_orders)),
        ]
    if any(_STALE in r.metrics and r.stale_cache_hits for r in ran):
        columns.append(_Column("stale hits", lambda r: str(r.stale_cache_hits)))
    if any(r.unsafe_read_modify_write is not None for r in ran):
        columns.append(
            _Column(
                "unsafe rmw",
                lambda r: (
                    "-" if r.unsafe_read_modify_write is None else str(r.unsafe_read_modify_write)
                ),
            )
        )
    columns += [
        _Column("p50 ms", lambda r: f"{r.p50_ms:.1f}"),
        _Column("p99 ms", lambda r: f"{r.p99_ms:.1f}"),
        _Column("metrics = db", lambda r: "yes" if r.consistent else "NO", left=True),
    ]
    return columns


def format_table(results: list[StrategyResult]) -> str:
    """The side-by-side report, one row per strategy; a skipped one says why.

    Columns for lock metrics, replays and duplicate orders, stale cache hits and unsafe
    read-modify-writes appear when the run has them.
    """
    columns = _columns(results)
    headers = tuple(c.header for c in columns)
    rows = [tuple(c.cell(r) for c in columns) for r in results if r.skipped is None]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    widths[0] = max([widths[0], *(len(r.strategy) for r in results)])

    def render(row: tuple[str, ...]) -> str:
        cells = (
            cell.ljust(widths[i]) if columns[i].left else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    lines = [render(headers), rule]
    rendered = iter(rows)
    for result in results:
        if result.skipped is not None:
            lines.append(f"{result.strategy.ljust(widths[0])}  skipped: {result.skipped}")
        else:
            lines.append(render(next(rendered)))
    return "\n".join(lines)


def caught_lines(result: StrategyResult) -> list[str]:
    """What the metrics said about a strategy that went wrong, one line per signal.

    Oversold and negative stock (counted against the database), a lock that expired
    under its holder or was released by a holder that no longer owned it, duplicate
    orders per idempotency key, stale cache decisions, unsafe read-modify-writes seen in
    the SQL. Empty for a strategy that did none of these (and for a skipped one).
    """
    if result.skipped is not None:
        return []
    sku = result.sku
    lines = []
    if result.oversold:
        line = (
            f'{_SUCCESS}{{sku="{sku}"}} = {result.metrics[_SUCCESS]} > stock'
            f" {result.stock_initial}: oversold {result.oversold}"
        )
        if result.lost_updates:
            line += f" ({result.lost_updates} lost updates)"
        lines.append(line)
    if result.negative_writes or result.metrics.get(_NEGATIVE):
        lines.append(
            f'{_NEGATIVE}{{sku="{sku}"}} = {result.metrics[_NEGATIVE]}:'
            f" writes left the stock below zero (final stock {result.final_stock})"
        )
    locks = result.locks
    if locks and (locks["expired_while_held"] or locks["release_not_owned"]):
        lock = f'{{lock="{result.strategy}"}}'
        lines.append(
            f"{_LOCK_EXPIRED}{lock} = {int(locks['expired_while_held'])},"
            f" {_LOCK_NOT_OWNED}{lock} = {int(locks['release_not_owned'])}:"
            " the lock's TTL ran out under the work, and holders released locks they no"
            " longer owned"
        )
    if result.db.duplicate_orders:
        lines.append(
            f"duplicate orders per idempotency key (SQL, the exporter's"
            f" {catalog.DUPLICATE_ORDER_KEYS.name}) = {result.db.duplicate_keys} keys,"
            f" {result.db.duplicate_orders} extra orders;"
            f' {_REPLAY}{{operation="{IDEMPOTENT_OPERATION}"}} = {result.replays}'
        )
    if result.stale_cache_hits:
        lines.append(
            f'{_STALE}{{cache="{CACHE_NAME}"}} = {result.stale_cache_hits}: the cache said'
            " available, the database said sold out"
        )
    if result.unsafe_read_modify_write:
        lines.append(
            f'{_UNSAFE_RMW}{{table="{STOCK_TABLE}"}} = {result.unsafe_read_modify_write}:'
            " stock read without a lock, written back as a value computed in the app"
        )
    return lines


def info_lines(result: StrategyResult) -> list[str]:
    """What went right and is worth seeing: replays, lock waits, and the strategy's notes."""
    if result.skipped is not None:
        return [f"skipped: {result.skipped}"]
    lines = []
    if result.replays:
        lines.append(
            f'{_REPLAY}{{operation="{IDEMPOTENT_OPERATION}"}} = {result.replays}: resubmits'
            " answered from the stored result, no second reservation"
        )
    locks = result.locks
    if locks:
        lines.append(
            f"lock: {int(locks['acquired'])} acquired, mean wait"
            f" {locks['acquire_wait_ms_mean']:g} ms, {int(locks['acquire_retries'])} retries,"
            f" mean hold/TTL {locks['hold_ratio_mean']:g}"
            + (
                f", {int(locks['extend_failures'])} extension failures"
                if locks["extend_failures"]
                else ""
            )
        )
    lines += [f"note: {note}" for note in result.notes]
    return lines


def describe_database(config: LabConfig) -> str:
    """Where the lab runs, for people: the URL without its password, or the SQLite default."""
    if config.database_url is None:
        return "embedded SQLite (temporary file)"
    return shown(config.database_url)


def _setup_lines(config: LabConfig) -> list[str]:
    lines = [
        f"flash-sale lab: {config.buyers} buyers, {config.stock} units of one SKU per strategy,"
        f" {config.concurrency} threads, {config.work_ms:g} ms of work between read and write",
        f"database: {describe_database(config)}",
        f"redis: {describe_redis(config) or 'none (the lock strategies are skipped)'}",
    ]
    if config.retries:
        lines.append(
            f"retries: {config.retries:.0%} of the buyers submit the same intent twice,"
            f" idempotency {'on' if config.idempotency else 'OFF'}"
        )
    if config.stale_cache:
        backend = "a Redis key" if config.redis_url else "an in-process value"
        lines.append(
            f"stale cache: the decision reads {backend} refreshed every"
            f" {config.cache_refresh_ms:g} ms"
        )
    return lines


def format_report(config: LabConfig, results: list[StrategyResult]) -> str:
    """The whole text report: what ran, the table, and what the metrics caught."""
    lines = [*_setup_lines(config), "", format_table(results), "", "what caught it:"]
    width = max((len(r.strategy) for r in results), default=0)
    for result in results:
        if result.skipped is None:
            refused = sum(result.conflicts.values())
            caught = caught_lines(result) or [
                f"nothing to catch: sold {result.sold} of {result.stock_initial},"
                f" {refused} refused"
                + (f" as {', '.join(result.conflicts)}" if result.conflicts else "")
            ]
        else:
            caught = []
        for i, line in enumerate([*caught, *info_lines(result)]):
            lines.append(f"  {(result.strategy if i == 0 else ''):<{width}}  {line}")
    lines += [
        "",
        "sold, oversold, final stock, negative writes and duplicate orders are counted by SQL",
        "in the database; metrics = db: every metric total of the strategy equals that count.",
    ]
    return "\n".join(lines)


# --- the HTML report -----------------------------------------------------------------------

_PALETTE = ("#d62728", "#ff7f0e", "#9467bd", "#2ca02c", "#1f77b4", "#17becf", "#8c564b")
_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child, td.left { text-align: left; }
tr.bad td { background: #fdecea; } tr.skipped td { color: #888; font-style: italic; }
code { font-size: 0.92em; background: #f4f4f4; padding: 1px 3px; }
ul.caught li { margin: 0.2em 0; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _thin(samples: Sequence[tuple[float, int]], limit: int = 400) -> Sequence[tuple[float, int]]:
    if len(samples) <= limit:
        return samples
    step = len(samples) / limit
    kept = [samples[int(i * step)] for i in range(limit)]
    return [*kept, samples[-1]]


def _svg_stock(results: Sequence[StrategyResult], colors: Mapping[str, str]) -> str:
    """Stock over time, one line per strategy, with the zero line."""
    points = [p for r in results for p in r.samples]
    if not points:
        return "<p>No samples.</p>"
    legend = {r.strategy: f"{r.strategy} (final {r.final_stock})" for r in results}
    right = 40 + 7 * max(len(text) for text in legend.values())
    height, left, top, bottom = 320, 56, 22, 40
    width = 560 + right
    plot_w, plot_h = width - left - right, height - top - bottom
    t_max = max(t for t, _ in points) or 1.0
    y_low = float(min(0, *(v for _, v in points)))
    y_high = float(max(1, *(v for _, v in points), *(r.stock_initial for r in results)))
    y_ticks = _nice_ticks(y_low, y_high)
    y_low, y_high = min(y_low, y_ticks[0]), max(y_high, y_ticks[-1])
    x_ticks = [t for t in _nice_ticks(0, t_max) if t <= t_max * 1.0001]

    def x(t: float) -> float:
        return left + plot_w * t / t_max

    def y(v: float) -> float:
        return top + plot_h * (y_high - v) / (y_high - y_low)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="stock over time">'
    ]
    for v in y_ticks:
        # The zero line is the one that matters: dark and dashed; the others light.
        style = 'stroke="#444" stroke-dasharray="4 3"' if v == 0 else 'stroke="#e5e5e5"'
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" {style}/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}</text>'
        )
    for t in x_ticks:
        out.append(
            f'<text x="{x(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{t:g}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle">'
        f'seconds since the sale opened</text><text x="{left - 6}" y="12" text-anchor="end">'
        "stock</text>"
    )
    for i, result in enumerate(results):
        color = colors[result.strategy]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in _thin(result.samples))
        out.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}">'
            f"<title>{_esc(result.strategy)}</title></polyline>"
        )
        ly = top + 14 + 18 * i
        out.append(
            f'<rect x="{width - right + 14}" y="{ly - 9}" width="12" height="12"'
            f' fill="{color}"/><text x="{width - right + 32}" y="{ly + 1}">'
            f"{_esc(legend[result.strategy])}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _svg_outcomes(results: Sequence[StrategyResult], colors: Mapping[str, str]) -> str:
    """Stacked bars per strategy: sold within stock, oversold, refused, errors, replays."""
    segments: tuple[tuple[str, str, Callable[[StrategyResult], int]], ...] = (
        ("sold within stock", "#2ca02c", lambda r: min(r.sold, r.stock_initial)),
        ("oversold", "#d62728", lambda r: r.oversold),
        ("refused", "#bbbbbb", lambda r: sum(r.conflicts.values())),
        ("errors", "#333333", lambda r: r.errors),
        ("replayed", "#1f77b4", lambda r: r.replays),
    )
    label_w, bar_h, gap, top = 170, 22, 10, 34
    width = 760
    plot_w = width - label_w - 60
    height = top + len(results) * (bar_h + gap) + 10
    total = max((sum(f(r) for _, _, f in segments) for r in results), default=1) or 1
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="outcomes per strategy">'
    ]
    lx = label_w
    for name, color, _ in segments:
        out.append(
            f'<rect x="{lx}" y="6" width="12" height="12" fill="{color}"/>'
            f'<text x="{lx + 16}" y="16">{name}</text>'
        )
        lx += 24 + 7 * len(name)
    for i, result in enumerate(results):
        y0 = top + i * (bar_h + gap)
        out.append(
            f'<rect x="0" y="{y0 + 4}" width="6" height="{bar_h - 8}"'
            f' fill="{colors[result.strategy]}"/>'
            f'<text x="12" y="{y0 + bar_h / 2 + 4:.0f}">{_esc(result.strategy)}</text>'
        )
        x0 = float(label_w)
        for name, color, f in segments:
            n = f(result)
            if not n:
                continue
            w = plot_w * n / total
            out.append(
                f'<rect x="{x0:.1f}" y="{y0}" width="{w:.1f}" height="{bar_h}" fill="{color}">'
                f"<title>{name}: {n}</title></rect>"
            )
            if w > 28:
                out.append(
                    f'<text x="{x0 + w / 2:.1f}" y="{y0 + bar_h / 2 + 4:.0f}"'
                    f' text-anchor="middle" style="fill:#fff">{n}</text>'
                )
            x0 += w
    out.append("</svg>")
    return "".join(out)


def _svg_latency(results: Sequence[StrategyResult], colors: Mapping[str, str]) -> str:
    """p50 and p99 reservation latency per strategy, in milliseconds."""
    label_w, bar_h, gap, top = 170, 12, 12, 26
    width = 760
    plot_w = width - label_w - 90
    height = top + len(results) * (2 * bar_h + gap) + 10
    longest = max((r.p99_ms for r in results), default=1.0) or 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' viewBox="0 0 {width} {height}" role="img" aria-label="latency p50 and p99">'
        f'<rect x="{label_w}" y="6" width="12" height="12" fill="#9ecae1"/>'
        f'<text x="{label_w + 16}" y="16">p50</text>'
        f'<rect x="{label_w + 60}" y="6" width="12" height="12" fill="#3182bd"/>'
        f'<text x="{label_w + 76}" y="16">p99 (ms, reservation)</text>'
    ]
    for i, result in enumerate(results):
        y0 = top + i * (2 * bar_h + gap)
        out.append(
            f'<rect x="0" y="{y0 + 2}" width="6" height="{2 * bar_h - 4}"'
            f' fill="{colors[result.strategy]}"/>'
            f'<text x="12" y="{y0 + bar_h + 4}">{_esc(result.strategy)}</text>'
        )
        bars = ((result.p50_ms, "#9ecae1"), (result.p99_ms, "#3182bd"))
        for j, (value, color) in enumerate(bars):
            w = max(1.0, plot_w * value / longest)
            yy = y0 + j * bar_h
            out.append(
                f'<rect x="{label_w}" y="{yy}" width="{w:.1f}" height="{bar_h - 1}"'
                f' fill="{color}"/><text x="{label_w + w + 4:.1f}" y="{yy + bar_h - 2}">'
                f"{value:.1f}</text>"
            )
    out.append("</svg>")
    return "".join(out)


def _html_table(results: Sequence[StrategyResult]) -> str:
    columns = _columns(results)
    head = "".join(f"<th>{_esc(c.header)}</th>" for c in columns)
    rows = []
    for r in results:
        if r.skipped is not None:
            span = len(columns) - 1
            rows.append(
                f'<tr class="skipped"><td>{_esc(r.strategy)}</td>'
                f'<td class="left" colspan="{span}">skipped: {_esc(r.skipped)}</td></tr>'
            )
            continue
        bad = r.oversold or r.negative_writes or not r.consistent or r.duplicate_orders
        cells = "".join(
            f"<td{' class=left' if c.left else ''}>{_esc(c.cell(r))}</td>" for c in columns
        )
        rows.append(f"<tr{' class=bad' if bad else ''}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def format_html(config: LabConfig, results: list[StrategyResult]) -> str:
    """The report as one self-contained HTML page: no script, no external asset.

    The table, then inline SVG charts (stock over time per strategy, outcomes per
    strategy, reservation latency p50 and p99) and what the metrics caught.
    """
    ran = [r for r in results if r.skipped is None]
    colors = {r.strategy: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(results)}
    caught = []
    for r in results:
        lines = caught_lines(r) or (
            [f"nothing to catch: sold {r.sold} of {r.stock_initial}"] if r.skipped is None else []
        )
        items = "".join(f"<li><code>{_esc(line)}</code></li>" for line in lines)
        items += "".join(f"<li>{_esc(line)}</li>" for line in info_lines(r))
        caught.append(f"<h3>{_esc(r.strategy)}</h3><ul class=caught>{items}</ul>")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    setup = "".join(f"<li>{_esc(line)}</li>" for line in _setup_lines(config))
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<title>stocksentry flash-sale lab</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>stocksentry flash-sale lab</h1><p>{_esc(stamp)}</p><ul>{setup}</ul>"
        f"{_html_table(results)}"
        "<p>sold, oversold, final stock, negative writes and duplicate orders are counted by"
        " SQL in the database; metrics = db: every metric total equals that count.</p>"
        "<h2>Stock over time</h2>"
        f"{_svg_stock(ran, colors)}"
        "<h2>Outcomes per strategy</h2>"
        f"{_svg_outcomes(ran, colors)}"
        "<h2>Reservation latency</h2>"
        f"{_svg_latency(ran, colors)}"
        "<h2>What caught it</h2>"
        f"{''.join(caught)}"
        "</body></html>\n"
    )
