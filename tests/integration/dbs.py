"""The databases of the ``db`` fixture (conftest.py): one SQLAlchemy test over PostgreSQL
(psycopg 3 / asyncpg) and MariaDB (PyMySQL / aiomysql), with what differs said once."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

#: The probes that read the shop's database (cache_drift reads Redis too).
ALL_DB_PROBES = (
    "negative_stock",
    "oversold",
    "duplicate_orders",
    "lock_waiters",
    "deadlocks",
    "long_transactions",
    "expired_reservations",
    "outbox",
)

#: The shop's products, orders and their items on PostgreSQL, as the probes read them.
PG_SHOP_TABLES = """
CREATE TABLE products (
    id bigserial PRIMARY KEY,
    sku text NOT NULL UNIQUE,
    available_stock integer NOT NULL,
    initial_stock integer NOT NULL
);
CREATE TABLE orders (
    id bigserial PRIMARY KEY,
    status text NOT NULL,
    external_ref text,
    idempotency_key text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE order_items (
    id bigserial PRIMARY KEY,
    order_id bigint NOT NULL REFERENCES orders (id),
    product_id bigint NOT NULL REFERENCES products (id),
    quantity integer NOT NULL
);
"""


@dataclass(frozen=True)
class Db:
    """A fresh database of one kind, and its dialect's ways."""

    name: str  # "postgresql" or "mariadb"
    url: str  # sync SQLAlchemy URL
    async_url: str
    #: The database's own URL (postgresql:// or mysql://), as the exporter's config takes it.
    raw_url: str
    #: DDL of the table ``products`` (id, sku, name, available_stock), and nothing more.
    products_ddl: str
    #: Makes the session's lock waits time out after one second.
    lock_timeout_sql: str
    #: The error codes of a deadlock and of a lock wait timeout.
    deadlock: str
    lock_timeout: str
    #: A shared row lock clause.
    share_clause: str
    #: Counts the sessions of this database that wait for a row lock now.
    lock_waiters_sql: str

    @property
    def dialect(self) -> str:
        """The exporter's dialect name: ``postgresql`` or ``mysql`` (MariaDB)."""
        return "mysql" if self.name == "mariadb" else "postgresql"

    @property
    def mysql(self) -> bool:
        return self.name == "mariadb"

    @property
    def returning(self) -> bool:
        """Whether ``UPDATE … RETURNING`` exists (MariaDB has none)."""
        return self.name == "postgresql"

    def create_products(self, rows: str) -> None:
        """Create ``products`` and insert ``rows`` (``(sku, name, stock), …``)."""
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(self.products_ddl)
                conn.exec_driver_sql(
                    f"INSERT INTO products (sku, name, available_stock) VALUES {rows}"
                )
        finally:
            engine.dispose()


def postgresql(database: str) -> Db:
    return Db(
        name="postgresql",
        raw_url=database,
        url=database.replace("postgresql://", "postgresql+psycopg://", 1),
        async_url=database.replace("postgresql://", "postgresql+asyncpg://", 1),
        products_ddl="CREATE TABLE products (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
        " sku TEXT UNIQUE NOT NULL, name TEXT, available_stock INTEGER NOT NULL)",
        lock_timeout_sql="SET LOCAL lock_timeout = '1s'",
        deadlock="40P01",
        lock_timeout="55P03",
        share_clause="FOR SHARE",
        lock_waiters_sql="SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )


def mariadb(database: str) -> Db:
    return Db(
        name="mariadb",
        raw_url=database,
        url=database.replace("mysql://", "mysql+pymysql://", 1),
        async_url=database.replace("mysql://", "mysql+aiomysql://", 1),
        products_ddl="CREATE TABLE products (id BIGINT AUTO_INCREMENT PRIMARY KEY,"
        " sku VARCHAR(64) UNIQUE NOT NULL, name VARCHAR(200), available_stock INTEGER NOT NULL)"
        " ENGINE=InnoDB",
        lock_timeout_sql="SET SESSION innodb_lock_wait_timeout = 1",  # whole seconds
        deadlock="1213",
        lock_timeout="1205",
        share_clause="LOCK IN SHARE MODE",
        # MariaDB and MySQL 8 alike; other databases of the server (other runs) not counted.
        lock_waiters_sql="SELECT count(*) FROM information_schema.innodb_trx t"
        " JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id"
        " WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()",
    )


def error_code(exc: BaseException) -> str:
    """The MariaDB error number or the PostgreSQL SQLSTATE of a SQLAlchemy error."""
    orig = getattr(exc, "orig", exc)
    if orig.args and isinstance(orig.args[0], int):
        return str(orig.args[0])  # PyMySQL: (errno, message)
    return str(orig.sqlstate)
