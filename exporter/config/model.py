"""The declarative config model: every section, key, default, range and doc, once.

Each section is a frozen dataclass whose fields carry their spec (:mod:`.specs`): the
loader, the docs' key reference and the chart's ``values.schema.json`` all read these, so
they cannot disagree on a key.
"""

# ruff: noqa: RUF009 - the fields' metadata is built by calls (key(), section() ...) that
# return dataclasses.field objects, the way dataclasses.field itself is called.

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from stocksentry.instrumentation.secrets import Secret

from ..dburl import MYSQL_URL_SCHEMES, POSTGRES_URL_SCHEMES, dialect_of
from ..sidecar_cli import LOG_FORMATS, LOG_LEVELS, TELEMETRY_PATH, TELEMETRY_PATH_PATTERN
from .containment import ContainmentConfig
from .kinds import (
    COLUMN,
    DAY,
    HOUR,
    MINUTE,
    OPTIONAL_COLUMN,
    TABLE,
    Bool,
    Choice,
    ColumnOrOne,
    Duration,
    FilePath,
    Host,
    Integer,
    LockPattern,
    Named,
    Ratio,
    Template,
    Text,
    TextList,
)
from .probing import STATEMENT_TIMEOUT, ProbesConfig
from .specs import derived, key, redis_url, section, url_keys

#: The advisory-lock key sidecars compete for with ``database.leader_election``: the
#: ASCII bytes of "stocksen" as one signed 64-bit integer.
DEFAULT_ADVISORY_LOCK_KEY: Final = 0x73746F636B73656E


# The server's deadlines: a scrape's request head comes in one write; no endpoint reads a
# body; a TLS handshake is two round trips; an idle connection outlives a scrape interval.
HEADER_TIMEOUT: Final = 10.0
BODY_TIMEOUT: Final = 30.0
TLS_HANDSHAKE_TIMEOUT: Final = 10.0
KEEPALIVE_TIMEOUT: Final = 150.0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``server``: where ``/metrics`` listens and what it merges."""

    listen_address: str = key(
        "0.0.0.0",  # noqa: S104 - a sidecar listens on the pod's address
        Host(),
        "where `/metrics`, `/healthz`, `/readyz` listen",
    )
    port: int = key(19464, Integer(0, 65535), "`0` picks a free port")
    web_config_file: Path | None = key(
        None,
        FilePath("file"),
        "TLS and basic auth, in the web-config format of the Prometheus exporters",
    )
    multiprocess_dir: Path | None = key(
        None,
        FilePath("dir"),
        "the app's prometheus_client multiprocess directory, merged into `/metrics`",
        default_doc="`$PROMETHEUS_MULTIPROC_DIR` at load",
    )
    check_worker_pids: bool = key(
        True,
        Bool(),
        "drop `live*` gauges of app workers whose pid is gone; needs the app's PID namespace "
        "(same host, or `shareProcessNamespace: true` in the pod), so set `false` in a "
        "sidecar without it",
    )
    compact_dead_workers: bool = key(
        False,
        Bool(),
        "fold the multiprocess files of dead workers (counters, histograms, summed gauges, "
        "exemplars) into one, at most every 30 s and 100 pids at a time; needs "
        "`check_worker_pids: true` and a writable multiprocess directory",
    )
    telemetry_path: str = key(
        "/metrics",
        Named(TELEMETRY_PATH_PATTERN, TELEMETRY_PATH, "URL path"),
        "where the metrics are served (`--web.telemetry-path` overrides it)",
    )
    header_timeout: float = key(
        HEADER_TIMEOUT,
        Duration(maximum=HOUR),
        "time a client has to send a whole request head; a slower one is disconnected",
    )
    body_timeout: float = key(
        BODY_TIMEOUT,
        Duration(maximum=HOUR),
        "time a client has to send a request body after its head",
    )
    tls_handshake_timeout: float = key(
        TLS_HANDSHAKE_TIMEOUT, Duration(maximum=HOUR), "time a TLS handshake may take"
    )
    keepalive_timeout: float = key(
        KEEPALIVE_TIMEOUT,
        Duration(maximum=24 * HOUR),
        "how long an idle kept-alive connection stays open between two scrapes",
    )


@dataclass(frozen=True, slots=True)
class LogConfig:
    """``log``: what the exporter logs and how (``--log.level``, ``--log.format`` override)."""

    level: str = key("info", Choice(LOG_LEVELS), "the least severe level written")
    format: str = key(
        "json",
        Choice(LOG_FORMATS),
        "`json`: one JSON object a line (what `stocksentry timeline` and log pipelines "
        "read); `logfmt`: `key=value` pairs, the Prometheus exporters' default",
    )


@dataclass(frozen=True, slots=True)
class SkuGuardConfig:
    """``sku_guard``: the bound on per-SKU series (see ``LabelGuard``)."""

    promo_skus: tuple[str, ...] = key(
        (),
        TextList(Text(allow_numbers=True)),
        "SKUs that always keep their own `sku` series; `cache_drift` compares exactly these; "
        "`oversold` with `scope: promo` scans only these",
    )
    max_skus: int = key(
        100,
        Integer(0, 10_000),
        "other SKUs that may get their own series before the rest fold into `__other__`",
    )


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    """``database``: the PostgreSQL, MySQL or MariaDB the probes read, and how carefully."""

    url: Secret = url_keys(
        (*POSTGRES_URL_SCHEMES, *MYSQL_URL_SCHEMES),
        "PostgreSQL, MySQL or MariaDB",
        "the database URL: PostgreSQL (`postgresql://`, `postgres://` or a libpq "
        "`key=value` string), MySQL (`mysql://`) or MariaDB (`mariadb://`)",
        accept_conninfo=True,
    )
    #: Where the URL came from, for messages: ``env NAME``, ``file PATH`` or ``literal``.
    url_source: str = derived("literal", "where the URL came from")
    statement_timeout: float = key(
        STATEMENT_TIMEOUT,
        Duration(maximum=10 * MINUTE),
        "`SET LOCAL statement_timeout` of every probe transaction whose probe does not "
        "set its own `statement_timeout` (MariaDB: `max_statement_time`, MySQL: "
        "`max_execution_time`)",
    )
    lock_timeout: float = key(
        0.2,
        Duration(maximum=10 * MINUTE),
        "`SET LOCAL lock_timeout`: a probe gives up instead of queueing behind checkout "
        "(MySQL/MariaDB: `innodb_lock_wait_timeout` and `lock_wait_timeout`, whole seconds, "
        "at least 1)",
    )
    connect_timeout: float = key(
        5.0,
        Duration(maximum=5 * MINUTE),
        "connection timeout (libpq takes whole seconds, at least 2)",
    )
    leader_election: bool = key(
        True, Bool(), "only the sidecar holding the advisory lock runs the database probes"
    )
    advisory_lock_key: int = key(
        DEFAULT_ADVISORY_LOCK_KEY,
        Integer(-(2**63), 2**63 - 1, label="64-bit integer"),
        "the `pg_try_advisory_lock` key (MySQL/MariaDB: "
        "`GET_LOCK('stocksentry.<database>.<key>', 0)`)",
        default_doc=f'`{DEFAULT_ADVISORY_LOCK_KEY}` (`"stocksen"`)',
    )
    leader_retry_interval: float = key(
        5.0,
        Duration(maximum=10 * MINUTE),
        "how often followers try the lock and the leader renews its lease; the server "
        "ends an election session silent for 3 intervals (at least 1 s), and a leader that "
        "cannot renew stops leading one interval before that",
    )
    max_connections: int = key(
        3, Integer(1, 32), "probe sessions of the leader (plus one for the election)"
    )
    application_name: str = key(
        "stocksentry-exporter",
        Text(),
        "unless the URL sets one; shows in `pg_stat_activity` (MySQL: the `program_name` "
        "connection attribute)",
    )

    @property
    def dialect(self) -> str:
        """``postgresql``, or ``mysql`` for a MySQL or MariaDB URL (one probe family)."""
        return "mysql" if dialect_of(self.url.reveal()) in ("mysql", "mariadb") else "postgresql"


@dataclass(frozen=True, slots=True)
class ProductsTable:
    """``schema.products``: one row per SKU with its current stock."""

    table: str = key("products", TABLE, "the table")
    id: str = key("id", COLUMN, "primary key, referenced by `order_items.product_id`")
    sku: str = key("sku", COLUMN, "the SKU (label value)")
    stock: str = key("available_stock", COLUMN, "current stock")
    allocation: str | None = key(
        None,
        OPTIONAL_COLUMN,
        "the SKU's inventory for the sale, e.g. `initial_stock`; without it only negative "
        "stock is visible and `oversold` is off",
    )


@dataclass(frozen=True, slots=True)
class OrdersTable:
    """``schema.orders``: orders with their status, keys and creation time."""

    table: str = key("orders", TABLE, "the table")
    id: str = key("id", COLUMN, "primary key, referenced by `order_items.order_id`")
    status: str = key("status", COLUMN, "compared with literals, so enum columns work")
    paid_statuses: tuple[str, ...] = key(
        ("PAID", "PROCESSING", "COMPLETED"),
        TextList(Text(allow_numbers=True), non_empty=True),
        "statuses counted as sold",
    )
    external_ref: str | None = key(
        "external_ref",
        OPTIONAL_COLUMN,
        "compared for duplicate orders; `null` switches it off",
    )
    idempotency_key: str | None = key(
        None, OPTIONAL_COLUMN, "mapped: also compared for duplicate orders"
    )
    created_at: str = key("created_at", COLUMN, "limits the duplicate search to a recent window")


@dataclass(frozen=True, slots=True)
class OrderItemsTable:
    """``schema.order_items``: which product, how many, in which order."""

    table: str = key("order_items", TABLE, "the table")
    order_id: str = key("order_id", COLUMN, "the order (`orders.id`)")
    product_id: str = key("product_id", COLUMN, "the product (`products.id`)")
    quantity: str | int = key(
        "quantity",
        ColumnOrOne(),
        "units of the product in the order; `1`: one unit per row (no quantity column)",
    )


@dataclass(frozen=True, slots=True)
class ReservationsTable:
    """``schema.reservations``: stock held for a checkout until ``expires_at`` (while
    ``released_at`` is null, or its ``status`` is one of ``held_statuses``)."""

    table: str = key("reservations", TABLE, "the table")
    expires_at: str = key("expires_at", COLUMN, "when the hold ends")
    released_at: str | None = key(
        "released_at",
        COLUMN,
        "null while the reservation holds its stock; not with `status`",
        default_doc="`released_at` (none with `status`)",
    )
    status: str | None = key(
        None, COLUMN, "a status column instead of `released_at`; needs `held_statuses`"
    )
    held_statuses: tuple[str, ...] = key(
        (),
        TextList(Text(allow_numbers=True)),
        "with `status`: the statuses of reservations still holding stock, e.g. `[HELD]`",
    )


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """``schema.outbox``: the transactional outbox; unpublished rows have no ``published_at``."""

    table: str = key("outbox", TABLE, "the table")
    created_at: str = key("created_at", COLUMN, "when the event was written")
    published_at: str = key("published_at", COLUMN, "null until the event is published")
    id: str | None = key(
        None,
        OPTIONAL_COLUMN,
        "the event's id, e.g. `id`: the sidecar's `outbox stuck` log line names the oldest "
        "stuck event by it",
    )


@dataclass(frozen=True, slots=True)
class SchemaConfig:
    """``schema``: how the shop's tables are named; defaults follow the common layout."""

    products: ProductsTable = section(ProductsTable, "one row per SKU with its current stock")
    orders: OrdersTable = section(OrdersTable, "orders with their status, keys and time")
    order_items: OrderItemsTable = section(OrderItemsTable, "the lines of each order")
    reservations: ReservationsTable | None = section(
        ReservationsTable,
        "stock held for a checkout; `reservations: {}` maps the defaults",
        optional=True,
    )
    outbox: OutboxTable | None = section(OutboxTable, "the transactional outbox", optional=True)


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """``redis``: the stock cache compared with the database by ``cache_drift``."""

    url: Secret = redis_url("`redis://`, `rediss://` or `unix://`")
    url_source: str = derived("literal", "where the URL came from")
    key_template: str = key("stock:{sku}", Template("sku"), "the cache key of a SKU's stock")
    tolerance: int = key(
        0,
        Integer(0, 2**31, label="integer ≥ 0"),
        "units of difference that do not count; 0, since a cache that says 1 of a sold-out "
        "SKU is the one that oversells",
    )
    grace: float = key(
        2.0,  # docs/exporter-config.md, "cache_drift": three 1 s runs in a row
        Duration(maximum=DAY, allow_zero=True),
        "how long a difference must last, without interruption, to count; with "
        "`probes.cache_drift.interval` at 1 s, a difference seen on three runs in a row: "
        "a cache 3 s or more late counts, one that catches up within 2 s never does",
    )

    def key(self, sku: str) -> str:
        """The cache key of ``sku``: ``key_template`` with ``{sku}`` replaced."""
        return self.key_template.replace("{sku}", sku)


@dataclass(frozen=True, slots=True)
class LockWatchConfig:
    """``lock_watch``: the Redis lock watcher (keyspace notifications of lock keys)."""

    url: Secret = redis_url(
        "the Redis holding the locks: `redis://`, `rediss://` or `unix://`; the database "
        "number of the URL is the one watched",
    )
    url_source: str = derived("literal", "where the URL came from")
    patterns: tuple[str, ...] = key(
        ("lock:product:{sku}",),
        TextList(LockPattern(), non_empty=True),
        "lock keys to watch: `*` matches any text, `{sku}` the SKU (bounded by `sku_guard`); "
        "the `lock` label is the key with the SKU guarded, or the pattern itself without "
        "`{sku}`",
    )
    configure_notifications: bool = key(
        False,
        Bool(),
        "add the missing `notify-keyspace-events` flags (`Kg$x`) with `CONFIG SET`, again "
        "after every reconnect; `false`: only check them and say which to set",
    )
    reacquire_window: float = key(
        30.0,
        Duration(maximum=DAY),
        "a lease acquired within this time after the same key expired is a re-acquisition",
    )
    foreign_release_ratio: float = key(
        0.5,
        Ratio(),
        "a re-acquired lease deleted before this share of its TTL passed counts as a "
        "suspected release not owned (`stock_lock_release_not_owned_total`)",
    )
    max_tracked_locks: int = key(
        10_000,
        Integer(1, 1_000_000),
        "leases followed at once; acquisitions beyond it are counted, not followed",
    )
    reconnect_interval: float = key(
        1.0, Duration(maximum=10 * MINUTE), "wait between two connection attempts"
    )
    health_check_interval: float = key(
        5.0,
        Duration(maximum=10 * MINUTE),
        "a subscription that heard nothing this long sends `PING`, which must be answered "
        "within `connect_timeout`, so a dead or silent link is noticed",
    )
    connect_timeout: float = key(
        5.0,
        Duration(maximum=5 * MINUTE),
        "connection timeout, and the deadline of the health check's `PING`",
    )


@dataclass(frozen=True, slots=True)
class ExporterConfig:
    """The whole configuration. Build it with :func:`load_config` or :func:`parse_config`."""

    server: ServerConfig = section(ServerConfig, "where `/metrics` listens")
    log: LogConfig = section(LogConfig, "the exporter's own log lines")
    sku_guard: SkuGuardConfig = section(SkuGuardConfig, "the bound on per-SKU series")
    database: DatabaseConfig | None = section(
        DatabaseConfig, "the PostgreSQL, MySQL or MariaDB the probes read", optional=True
    )
    schema: SchemaConfig = section(SchemaConfig, "how the shop's tables are named")
    redis: RedisConfig | None = section(
        RedisConfig, "the stock cache `cache_drift` compares", optional=True
    )
    probes: ProbesConfig = section(ProbesConfig, "the probes' schedules and options")
    lock_watch: LockWatchConfig | None = section(
        LockWatchConfig, "the Redis lock watcher", optional=True
    )
    containment: ContainmentConfig | None = section(
        ContainmentConfig, "per-SKU freezes and the Alertmanager webhook", optional=True
    )
    source: str = derived("<string>", "the file the configuration came from")
    notes: tuple[str, ...] = derived((), "why probes are off")
