"""The shop the lab sells from: its schema, its engine, one product row per strategy."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from ..dburl import parse_url
from .config import LabConfig, LabError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from stocksentry.instrumentation import Sentry

    from .progress import ProgressSink


#: SQLite's busy timeout: writers queue behind the one holding the lock instead of failing
#: with "database is locked" (a lock_timeout conflict would blur the strategies' results).
SQLITE_BUSY_TIMEOUT_S = 30.0


# MySQL / MariaDB: InnoDB whatever the server's default engine (MyISAM has neither row
# locks nor transactions); other dialects ignore the option.
_INNODB: dict[str, Any] = {"mysql_engine": "InnoDB"}

metadata = sa.MetaData()
products = sa.Table(
    "products",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(64), nullable=False, unique=True),
    sa.Column("available_stock", sa.Integer, nullable=False),
    sa.Column("initial_stock", sa.Integer, nullable=False),
    **_INNODB,
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
    **_INNODB,
)
order_items = sa.Table(
    "order_items",
    metadata,
    sa.Column(
        "order_id", sa.Integer, sa.ForeignKey("orders.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("product_id", sa.Integer, sa.ForeignKey("products.id"), primary_key=True),
    sa.Column("quantity", sa.Integer, nullable=False),
    # The stock value the reservation wrote: negative values are negative writes.
    sa.Column("stock_after", sa.Integer, nullable=False),
    sa.Index("ix_order_items_product_id", "product_id"),
    **_INNODB,
)
# The idempotency store: one row per intent, with the outcome a resubmit is answered with.
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("idempotency_key", sa.String(128), primary_key=True),
    sa.Column("sku", sa.String(64), nullable=False, index=True),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    **_INNODB,
)


# The transactional outbox: one event per paid order, written in the order's transaction;
# a publisher sets published_at when it has sent the event on.
outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("sku", sa.String(64), nullable=False, index=True),
    sa.Column("order_id", sa.Integer, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("published_at", sa.DateTime(timezone=True)),
    **_INNODB,
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
    """What a strategy works with: the engine, its product row, the settings, and for the
    lock strategies Redis and their lock's key and name."""

    engine: Engine
    sku: str
    product_id: int
    config: LabConfig
    #: Whether ``UPDATE ... RETURNING`` is available; otherwise read back in the transaction.
    update_returning: bool
    sentry: Sentry
    redis: Any
    lock_key: str
    lock_name: str
    #: The ``deadlock`` scenario's second product row (its sku and id).
    second_sku: str = ""
    second_product_id: int = 0

    @contextlib.contextmanager
    def begin_immediate(self) -> Iterator[Connection]:
        """A SQLite transaction that takes the write lock at ``BEGIN``. pysqlite's own
        implicit ``BEGIN`` is switched off meanwhile, so the explicit one is the
        transaction."""
        with self.engine.connect() as conn:
            dbapi = cast(Any, conn.connection.dbapi_connection)
            previous, dbapi.isolation_level = dbapi.isolation_level, None
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            finally:
                dbapi.isolation_level = previous

    def work(self) -> None:
        """The app's work between read and write; a real sleep, so buyers overlap in it."""
        if self.config.work_ms > 0:
            time.sleep(self.config.work_ms / 1000)

    def read_stock(self) -> int:
        """Read the stock in a short transaction of its own: on SQLite in WAL mode a read
        transaction that later writes fails with "database is locked"."""
        with self.engine.begin() as conn:
            return select_stock(conn, self.sku)

    def insert_order(self, conn: Connection, buyer: Buyer, stock_after: int) -> int:
        ids = {
            name: getattr(buyer, name)
            for name in ("external_ref", "idempotency_key", "request_id")
        }
        order = orders.insert().values(**ids, status="PAID", created_at=datetime.now(UTC))
        order_id = _new_id(conn.execute(order))
        self.insert_item(conn, order_id, self.product_id, stock_after)
        return order_id

    def insert_outbox_event(self, conn: Connection, order_id: int) -> None:
        conn.execute(
            outbox.insert().values(
                sku=self.sku, order_id=order_id, created_at=datetime.now(UTC), published_at=None
            )
        )

    def insert_item(
        self, conn: Connection, order_id: int, product_id: int, stock_after: int
    ) -> None:
        conn.execute(
            order_items.insert().values(
                order_id=order_id,
                product_id=product_id,
                quantity=self.config.quantity,
                stock_after=stock_after,
            )
        )

    def decrement(self, conn: Connection, sku: str | None = None) -> int:
        """``available_stock - :qty`` of ``sku`` (default: the shop's SKU) with no guard;
        returns the value written."""
        written = self._decrement(conn, sku or self.sku, guarded=False)
        if written is None:
            raise RuntimeError(f"no product row {sku or self.sku}")
        return written

    def decrement_if_available(self, conn: Connection) -> int | None:
        """The atomic conditional update; the value written, or ``None`` if no row matched."""
        return self._decrement(conn, self.sku, guarded=True)

    def _decrement(self, conn: Connection, sku: str, *, guarded: bool) -> int | None:
        params = {"qty": self.config.quantity, "sku": sku}
        sql = "UPDATE products SET available_stock = available_stock - :qty WHERE sku = :sku"
        if guarded:
            sql += " AND available_stock >= :qty"
        if self.update_returning:
            value = conn.execute(sa.text(sql + " RETURNING available_stock"), params).scalar()
            return None if value is None else int(value)
        if conn.execute(sa.text(sql), params).rowcount == 0:
            return None
        # Same transaction as the update, so it sees our own write (and holds its lock);
        # on InnoDB at REPEATABLE READ too: a transaction's snapshot shows its own changes.
        return select_stock(conn, sku)


def select_stock(conn: Connection, sku: str, *, for_update: bool = False) -> int:
    """The stock of ``sku``, read in ``conn``'s transaction (``FOR UPDATE``: row-locked)."""
    sql = "SELECT available_stock FROM products WHERE sku = :sku"
    if for_update:
        sql += " FOR UPDATE"
    return int(conn.execute(sa.text(sql), {"sku": sku}).scalar_one())


def _new_id(result: sa.CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise RuntimeError("the database returned no id for the inserted row")
    return int(key[0])


def normalize_url(url: str) -> URL:
    """Parse a SQLAlchemy URL; plain ``mysql://`` / ``mariadb://`` get PyMySQL. The error
    does not quote the URL (it may hold a password in a form no mask recognises)."""
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        raise LabError(f"cannot parse database URL: {exc}") from None
    if parsed.drivername in ("mysql", "mariadb"):
        parsed = parsed.set(drivername=f"{parsed.drivername}+pymysql")
    return parsed


def first_line(exc: BaseException) -> str:
    """The first line of a (driver) error's text, for a one-line message."""
    # Driver errors carry multi-line details (SQLAlchemy adds a "Background on this
    # error" link); the CLI promises one line.
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def create_engine(url: URL, concurrency: int, isolation_level: str | None = None) -> Engine:
    """An engine with a pool of ``concurrency`` connections (SQLite in WAL mode), every
    transaction at ``isolation_level`` (``None``: the server's default)."""
    # One connection per worker thread: a buyer holds at most one at a time, and a pool
    # smaller than the workers would make them queue in the pool instead of the database.
    pool: dict[str, Any] = {
        "poolclass": sa.QueuePool,
        "pool_size": concurrency,
        "max_overflow": 4,
        "pool_timeout": 60,
    }
    if isolation_level is not None:
        pool["isolation_level"] = isolation_level
    backend, database = url.get_backend_name(), url.database or ""
    connect_args: dict[str, Any] = {}
    if backend == "sqlite":
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise LabError(
                "an in-memory SQLite database is private to each connection; "
                "give a file (sqlite:///lab.db) or leave --database out"
            )
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False}
    elif backend in ("postgresql", "mysql", "mariadb"):
        # Fail fast on an unreachable server instead of hanging the CLI.
        connect_args["connect_timeout"] = 10
    try:
        engine = sa.create_engine(url, connect_args=connect_args, **pool)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
        raise LabError(
            f"cannot use database URL {url.render_as_string(hide_password=True)}: "
            f"{first_line(exc)}"
        ) from exc
    if backend == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_on_connect)
    return engine


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


def update_returning(engine: Engine) -> bool:
    """Whether ``UPDATE ... RETURNING`` works on this engine's database."""
    # SQLAlchemy knows per dialect and server version (SQLite from 3.35, PostgreSQL).
    return bool(engine.dialect.update_returning)


def prepare_product(engine: Engine, sku: str, stock: int) -> int:
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
            # Only the lab's own outbox: ``create_all`` leaves an existing shop's outbox of
            # another shape as it is, and that one holds no lab rows to reset.
            columns = {column["name"] for column in sa.inspect(conn).get_columns("outbox")}
            if {"sku", "order_id", "published_at"} <= columns:
                conn.execute(outbox.delete().where(outbox.c.sku == sku))
    return int(product_id)


def create_tables(database_url: str) -> None:
    """Create the shop's tables ahead of the run, for the exporter that probes them."""
    url = normalize_url(database_url)
    engine = create_engine(url, 1)
    try:
        connect_and_prepare(engine, url.render_as_string(hide_password=True), 1)
    finally:
        engine.dispose()


def connect_and_prepare(engine: Engine, shown: str, concurrency: int) -> None:
    """Reach the database, open the workers' connections, create the lab's tables;
    ``shown`` names the database in errors."""
    # Open the workers' connections now, so the first wave of buyers does not spend its
    # time connecting while the others already race.
    held: list[Connection] = []
    try:
        for _ in range(max(1, concurrency)):
            held.append(engine.connect())
    except sa.exc.SQLAlchemyError as exc:
        if not held:
            raise LabError(f"cannot connect to {shown}: {first_line(exc)}") from exc
        raise LabError(
            f"cannot open {concurrency} connections to {shown} (lower --concurrency?):"
            f" {first_line(exc)}"
        ) from exc
    finally:
        for conn in held:
            conn.close()
    # After the connections: a run that cannot get them leaves no tables behind.
    try:
        metadata.create_all(engine)
    except sa.exc.SQLAlchemyError as exc:
        raise LabError(f"cannot create the lab tables in {shown}: {first_line(exc)}") from exc


def save_shop(database_url: str, path: str) -> None:
    """Copy the shop's tables into the SQLite file ``path`` (replaced), for
    ``stocksentry reconcile`` once the embedded servers are gone."""
    target = Path(path)
    source = sa.create_engine(normalize_url(database_url))
    copy = sa.create_engine(f"sqlite:///{target}")
    try:
        target.unlink(missing_ok=True)
        metadata.create_all(copy)
        with source.connect() as src, copy.begin() as dst:
            for table in metadata.sorted_tables:
                result = src.execute(sa.select(table)).mappings()
                while rows := result.fetchmany(2000):
                    dst.execute(table.insert(), [dict(row) for row in rows])
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        raise LabError(f"cannot save the shop to {target}: {first_line(exc)}") from exc
    finally:
        source.dispose()
        copy.dispose()


@dataclass(slots=True)
class LabRun:
    """What every strategy's run shares. ``engine`` is the instrumented one the strategies
    use; ``side`` the lab's own (reset, samples, counts), unseen by the SQL detector."""

    engine: Engine
    side: Engine
    sentry: Sentry
    registry: CollectorRegistry
    config: LabConfig
    run: str
    progress: ProgressSink | None
    redis: Any
    detector: bool
