"""The flash-sale lab behind ``stocksentry demo``.

Many buyers try to reserve one unit each of a small stock, all at once, under several
checkout strategies. Every reservation is recorded through the public instrumentation API
(:class:`~stocksentry.instrumentation.Sentry`), and at the end the lab counts the truth in
the database with SQL and compares it with the metric totals: the unsafe strategies
oversell or drive stock negative, and the metrics say so.

Each strategy gets its own product row (sku ``LAB-<STRATEGY>``) in the common
``products / orders / order_items`` layout. ``order_items.stock_after`` keeps the stock
value each reservation wrote, so the database alone tells how many writes went negative.

Example::

    from stocksentry.exporter.lab import LabConfig, run_lab

    for result in run_lab(LabConfig(buyers=200, stock=20, strategies=("unsafe", "atomic"))):
        print(result.strategy, result.sold, result.oversold, result.consistent)

Adding a strategy is one function ``(shop, reservation, buyer) -> None`` registered in
:data:`STRATEGIES`; it must mark the reservation with ``success`` or ``conflict``.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, start_http_server
from sqlalchemy.engine import URL, Connection, Engine
from stocksentry.instrumentation import Reservation, Sentry, catalog, classify_exception

__all__ = [
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
    "format_report",
    "format_table",
    "normalize_url",
    "run_lab",
    "serve_metrics",
]

#: SQLite's busy timeout: writers queue behind the one holding the lock instead of failing
#: with "database is locked" (a lock_timeout conflict would blur the strategies' results).
SQLITE_BUSY_TIMEOUT_S = 30.0
#: How often live progress is refreshed.
PROGRESS_INTERVAL_S = 0.1

_SUCCESS = catalog.RESERVATION_SUCCESS.name
_CONFLICT = catalog.RESERVATION_CONFLICT.name
_NEGATIVE = catalog.INVENTORY_NEGATIVE.name
_DURATION_COUNT = f"{catalog.RESERVATION_DURATION.name}_count"


class LabError(Exception):
    """A set-up problem the CLI reports as one line (bad URL, unreachable database...)."""


# --- configuration and results -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabConfig:
    """What to run. ``database_url=None`` means a temporary SQLite file, removed at the end.

    ``work_ms`` is the app's work between reading the stock and writing it (pricing,
    fraud checks...): the window in which unsafe strategies lose updates.
    """

    database_url: str | None = None
    buyers: int = 500
    stock: int = 100
    concurrency: int = 50
    work_ms: float = 5.0
    strategies: tuple[str, ...] = ()
    quantity: int = 1
    log_file: str | None = None

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
        unknown = [name for name in self.strategies if name not in STRATEGIES]
        if unknown:
            raise ValueError(
                f"unknown strategy {', '.join(unknown)} (known: {', '.join(STRATEGIES)})"
            )

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies to run, in order (all of :data:`STRATEGIES` when none given)."""
        return self.strategies or tuple(STRATEGIES)


@dataclass(frozen=True, slots=True)
class DbFigures:
    """What the database says after a strategy's run, counted by SQL."""

    orders: int
    units: int
    negative_writes: int
    final_stock: int


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """One strategy's run: ground truth from SQL, metric totals from the registry.

    ``sold``, ``oversold``, ``final_stock`` and ``negative_writes`` are the database's
    figures; ``metrics`` holds the registry's totals for the strategy's SKU; ``consistent``
    is true when every metric total equals its database figure and the outcomes add up to
    the buyers (``mismatches`` says which did not).
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the ``--format json`` object)."""
        data = asdict(self)
        data["mismatches"] = list(self.mismatches)
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


@dataclass(frozen=True, slots=True)
class Buyer:
    """One buyer's identifiers (unique per lab run)."""

    number: int
    request_id: str
    idempotency_key: str
    external_ref: str


@dataclass(frozen=True, slots=True)
class Shop:
    """What a strategy works with: the engine, its product row and the app's work time."""

    engine: Engine
    sku: str
    product_id: int
    qty: int
    work_s: float
    #: Whether ``UPDATE ... RETURNING`` is available; otherwise read back in the transaction.
    update_returning: bool

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
    with shop.engine.begin() as conn:
        written = shop.decrement_unconditionally(conn)
        shop.insert_order(conn, buyer, written)
    r.success(old_stock=written + shop.qty, new_stock=written)


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


#: Strategy name -> function, in the order the report shows them.
STRATEGIES: dict[str, Strategy] = {
    "unsafe": unsafe,
    "check_then_decrement": check_then_decrement,
    "atomic": atomic,
}


def sku_for(strategy: str) -> str:
    """The product row a strategy sells: ``LAB-<STRATEGY>``."""
    return f"LAB-{strategy.upper()}"


# --- database set-up -----------------------------------------------------------------------


def normalize_url(url: str) -> URL:
    """Parse a SQLAlchemy URL; plain ``postgresql://`` (or ``postgres://``) gets psycopg 3.

    Raises :class:`LabError` for a URL SQLAlchemy cannot parse.
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise LabError(f"cannot parse database URL {url!r}") from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


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
        "max_overflow": 2,
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
    return DbFigures(
        orders=int(row[0]), units=int(row[1]), negative_writes=int(row[2]), final_stock=int(final)
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


@dataclass(slots=True)
class _Tally:
    """Outcomes counted on the Python side, for live progress."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: int = 0
    sold: int = 0
    conflicts: int = 0
    errors: int = 0
    first_error: str | None = None
    latencies: list[float] = field(default_factory=list)

    def add(self, outcome: str, seconds: float, exc: BaseException | None) -> None:
        with self.lock:
            self.done += 1
            self.latencies.append(seconds)
            if outcome == "success":
                self.sold += 1
            elif outcome == "error":
                self.errors += 1
                if self.first_error is None and exc is not None:
                    self.first_error = f"{type(exc).__name__}: {_first_line(exc)}"
            else:
                self.conflicts += 1


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
    """Run every configured strategy in turn and return one result each.

    ``registry`` receives the lab's metrics (a fresh one when ``None``); serve it with
    :func:`serve_metrics` to scrape the run live. Raises :class:`LabError` when the
    database cannot be reached or prepared.
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
    try:
        engine = _create_engine(url, config.concurrency)
        _connect_and_prepare(engine, shown, config.concurrency)
        if progress is not None:
            progress.start(shown)
        with _json_logs_to(config.log_file) as log:
            sentry = Sentry(
                registry=registry,
                promo_skus=[sku_for(name) for name in names],
                log=log,
                trace=False,
            )
            run = uuid.uuid4().hex[:8]
            return [
                _run_strategy(engine, sentry, registry, config, name, run, progress)
                for name in names
            ]
    finally:
        if engine is not None:
            engine.dispose()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


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


def _run_strategy(
    engine: Engine,
    sentry: Sentry,
    registry: CollectorRegistry,
    config: LabConfig,
    name: str,
    run: str,
    progress: ProgressSink | None,
) -> StrategyResult:
    strategy = STRATEGIES[name]
    sku = sku_for(name)
    product_id = _prepare_product(engine, sku, config.stock)
    shop = Shop(
        engine=engine,
        sku=sku,
        product_id=product_id,
        qty=config.quantity,
        work_s=config.work_ms / 1000,
        update_returning=_update_returning(engine),
    )
    durations_before = _durations(registry)
    tally = _Tally()
    gate = threading.Event()
    arrived = threading.Semaphore(0)
    stop = threading.Event()

    def buy(number: int) -> None:
        arrived.release()
        # Everyone in the first wave waits here, so they really collide.
        gate.wait()
        if stop.is_set():
            return
        buyer = Buyer(
            number=number,
            request_id=f"req-{run}-{name}-{number}",
            idempotency_key=f"idem-{run}-{name}-{number}",
            external_ref=f"lab-{run}-{name}-{number}",
        )
        error: BaseException | None = None
        handle: Reservation | None = None
        start = time.perf_counter()
        try:
            with sentry.reservation(
                sku,
                strategy=name,
                qty=config.quantity,
                request_id=buyer.request_id,
                idempotency_key=buyer.idempotency_key,
            ) as handle:
                strategy(shop, handle, buyer)
        except Exception as exc:
            # The reservation has recorded it (as an error or, for a lock timeout, a
            # conflict); one failed buyer must not stop the sale.
            error = exc
        elapsed = time.perf_counter() - start
        outcome = handle.outcome if handle is not None else None
        if outcome is None:
            outcome = classify_exception(error) if error is not None else "success"
        tally.add(outcome, elapsed, error)

    def snapshot(elapsed: float) -> Progress:
        with tally.lock:
            return Progress(
                name, tally.done, config.buyers, tally.sold, tally.conflicts, tally.errors, elapsed
            )

    first_wave = min(config.concurrency, config.buyers)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="buyer") as pool:
        futures = [pool.submit(buy, n) for n in range(1, config.buyers + 1)]
        try:
            for _ in range(first_wave):
                arrived.acquire()
            started = time.perf_counter()
            gate.set()
            ticker = _Ticker(progress, lambda: snapshot(time.perf_counter() - started))
            with ticker:
                for future in futures:
                    future.result()
        except BaseException:
            # Ctrl-C: let the queued buyers return at once instead of running the sale out.
            stop.set()
            gate.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    wall = time.perf_counter() - started
    if progress is not None:
        progress.finish(snapshot(wall))
    return _result(registry, config, name, sku, product_id, engine, tally, wall, durations_before)


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
    registry: CollectorRegistry,
    config: LabConfig,
    name: str,
    sku: str,
    product_id: int,
    engine: Engine,
    tally: _Tally,
    wall: float,
    durations_before: dict[str, float],
) -> StrategyResult:
    db = _count_in_db(engine, product_id)
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
    metrics = {
        _SUCCESS: success,
        _CONFLICT: conflict_total,
        _NEGATIVE: negative,
        _DURATION_COUNT: sum(observed.values()),
    }

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
            success + conflict_total + errors == config.buyers,
            f"success {success} + conflicts {conflict_total} + errors {errors}"
            f" != {config.buyers} buyers",
        ),
        (
            metrics[_DURATION_COUNT] == config.buyers,
            f"{_DURATION_COUNT} rose by {metrics[_DURATION_COUNT]} for {config.buyers} buyers",
        ),
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
    )


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


def format_table(results: list[StrategyResult]) -> str:
    """The side-by-side report, one row per strategy."""
    headers = (
        "strategy",
        "stock",
        "buyers",
        "sold",
        "oversold",
        "final stock",
        "conflicts",
        "negative writes",
        "p50 ms",
        "p99 ms",
        "metrics = db",
    )
    left = {0, 6, 10}
    rows = [
        (
            r.strategy,
            str(r.stock_initial),
            str(r.buyers),
            str(r.sold),
            str(r.oversold),
            str(r.final_stock),
            _conflict_text(r.conflicts) + (f", error {r.errors}" if r.errors else ""),
            str(r.negative_writes),
            f"{r.p50_ms:.1f}",
            f"{r.p99_ms:.1f}",
            "yes" if r.consistent else "NO",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]

    def render(row: tuple[str, ...]) -> str:
        cells = (
            cell.ljust(widths[i]) if i in left else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([render(headers), rule, *(render(row) for row in rows)])


def caught_lines(result: StrategyResult) -> list[str]:
    """What the metrics said about a strategy that oversold or drove stock negative.

    Empty for a strategy that did neither.
    """
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
    if result.negative_writes or result.metrics[_NEGATIVE]:
        lines.append(
            f'{_NEGATIVE}{{sku="{sku}"}} = {result.metrics[_NEGATIVE]}:'
            f" writes left the stock below zero (final stock {result.final_stock})"
        )
    return lines


def describe_database(config: LabConfig) -> str:
    """Where the lab runs, for people: the URL without its password, or the SQLite default.

    Raises :class:`LabError` for a URL that cannot be parsed.
    """
    if config.database_url is None:
        return "embedded SQLite (temporary file)"
    return normalize_url(config.database_url).render_as_string(hide_password=True)


def format_report(config: LabConfig, results: list[StrategyResult]) -> str:
    """The whole text report: what ran, the table, and what the metrics caught."""
    lines = [
        f"flash-sale lab: {config.buyers} buyers, {config.stock} units of one SKU per strategy,"
        f" {config.concurrency} threads, {config.work_ms:g} ms of work between read and write",
        f"database: {describe_database(config)}",
        "",
        format_table(results),
        "",
        "what caught it:",
    ]
    width = max((len(r.strategy) for r in results), default=0)
    for result in results:
        refused = sum(result.conflicts.values())
        caught = caught_lines(result) or [
            f"nothing to catch: sold {result.sold} of {result.stock_initial}, {refused} refused"
            + (f" as {', '.join(result.conflicts)}" if result.conflicts else "")
        ]
        for i, line in enumerate(caught):
            lines.append(f"  {(result.strategy if i == 0 else ''):<{width}}  {line}")
    lines += [
        "",
        "sold, oversold, final stock and negative writes are counted by SQL in the database;",
        "metrics = db: every metric total of the strategy's SKU equals that count.",
    ]
    return "\n".join(lines)
