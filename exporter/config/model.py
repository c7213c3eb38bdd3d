"""The declarative config model: every section, key, default, range and doc, once.

Each section is a frozen dataclass; each field says in its metadata what it is:

- :func:`key`: a YAML key, with its :class:`~.kinds.Kind` (type, range, allowed values),
  its default (the dataclass default) and its doc string;
- :func:`section` / :func:`sections`: a nested section (optional: ``None`` when absent),
  or a list of them;
- :func:`url_keys`: the ``url_env`` / ``url_file`` / ``url`` trio of a secret URL;
- :func:`derived`: a value the loader computes (where a URL came from, the notes).

(The helpers and :func:`specs` live in :mod:`.specs`; this module is the data. It runs
past 500 lines because it is one field per key with the key's doc string: splitting it
would scatter the one place a key is written.)

The loader (:mod:`.loader`), the docs key reference (:mod:`.reference`) and the chart's
``values.schema.json`` (``helm/values_schema.py``) read these with :func:`specs`, so they
cannot disagree on a key.

Example::

    >>> [name for name, _ in specs(ServerConfig)][:2]
    ['listen_address', 'port']
    >>> key_names(DatabaseConfig)[:4]
    ('url_env', 'url_file', 'url', 'statement_timeout')
"""

# ruff: noqa: RUF009 - the fields' metadata is built by calls (key(), section() ...) that
# return dataclasses.field objects, the way dataclasses.field itself is called.

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from stocksentry.instrumentation.secrets import Secret

from ..overrides import LOG_FORMATS, LOG_LEVELS, TELEMETRY_PATH_PATTERN
from .kinds import (
    Bool,
    Choice,
    Duration,
    FilePath,
    Host,
    Identifier,
    Integer,
    LabelName,
    LockPattern,
    Named,
    OptionalIdentifier,
    Ratio,
    Sql,
    Template,
    Text,
    TextList,
)
from .specs import (
    URL_KEYS,
    Derived,
    Key,
    Section,
    UrlKeys,
    computed,
    derived,
    field_default,
    key,
    key_names,
    required,
    section,
    sections,
    specs,
    url_keys,
)

__all__ = [
    "BUILTIN_PROBES",
    "CACHE_DRIFT_GRACE",
    "CACHE_DRIFT_INTERVAL",
    "DATABASE_SCHEMES",
    "DEFAULT_ADVISORY_LOCK_KEY",
    "ELECTION_PROBE",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "MYSQL_URL_SCHEMES",
    "POSTGRES_URL_SCHEMES",
    "TELEMETRY_PATH_PATTERN",
    "URL_KEYS",
    "CacheDriftSettings",
    "CustomProbe",
    "DatabaseConfig",
    "Derived",
    "DuplicateOrdersSettings",
    "ExporterConfig",
    "Key",
    "LockWatchConfig",
    "LogConfig",
    "LongTransactionsSettings",
    "NegativeStockSettings",
    "OrderItemsTable",
    "OrdersTable",
    "OutboxSettings",
    "OutboxTable",
    "OversoldSettings",
    "ProbeDefaults",
    "ProbeSettings",
    "ProbesConfig",
    "ProductsTable",
    "RedisConfig",
    "ReservationsTable",
    "SchemaConfig",
    "Section",
    "ServerConfig",
    "SkuGuardConfig",
    "UrlKeys",
    "field_default",
    "key_names",
    "specs",
]

#: The advisory-lock key sidecars compete for when ``database.leader_election`` is on:
#: the ASCII bytes of "stocksen" read as one signed 64-bit integer, so it is unlikely to
#: clash with keys an application picked.
DEFAULT_ADVISORY_LOCK_KEY: Final = 0x73746F636B73656E
#: The health series of the leader election use this probe name.
ELECTION_PROBE: Final = "leader_election"
#: The schemes of a PostgreSQL URL (a libpq ``key=value`` string is PostgreSQL too).
POSTGRES_URL_SCHEMES: Final = (
    "postgresql",
    "postgres",
    "postgresql+psycopg",
    "postgresql+asyncpg",
)
#: The schemes of a MySQL or MariaDB URL, with or without a driver named (the probes use
#: aiomysql whichever is named: see :mod:`stocksentry.exporter.dburl`).
MYSQL_URL_SCHEMES: Final = (
    "mysql",
    "mariadb",
    "mysql+pymysql",
    "mysql+aiomysql",
    "mariadb+pymysql",
    "mariadb+aiomysql",
)
#: Every scheme ``database.url`` accepts.
DATABASE_SCHEMES: Final = (*POSTGRES_URL_SCHEMES, *MYSQL_URL_SCHEMES)

_MINUTE: Final = 60.0
_HOUR: Final = 3600.0
_DAY: Final = 86400.0


# --- the sections ----------------------------------------------------------------------------

#: ``probes.cache_drift.interval`` by default, its own rather than ``probes.defaults``': the
#: probe compares one snapshot of the cache with one of the database per run, so its
#: interval is the resolution of ``redis.grace``. 1 s: a difference lasting D seconds is
#: seen on at least floor(D) runs in a row (the runs keep a fixed rate), for the price of
#: one ``MGET`` and one indexed read of the promo SKUs a second (about 3 ms a run on a
#: shop of 1M products).
CACHE_DRIFT_INTERVAL: Final = 1.0
#: ``redis.grace`` by default. A SKU counts once its difference, first seen on one run, is
#: still there on a run ``grace`` later with every run in between differing too: at 1 s
#: runs, three runs in a row. So a difference lasting 3 s or more always counts (a
#: 5 s-TTL entry left 5 s late counts from its third run, 2 s before it heals), one
#: shorter than 2 s never does, whatever the phase: a cache that catches up within
#: milliseconds of each change is seen differing on isolated runs only. Longer graces
#: hid the seconds-late cache (10 s hid a 5 s TTL entirely); 0 or 1 s would count a
#: healthy cache on one or two unlucky runs. What snapshots cannot tell apart: a sale that
#: moves the stock within the cache's lag before every run for 2 s looks like drift.
CACHE_DRIFT_GRACE: Final = 2.0

_INTERVAL: Final = 15.0
_TIMEOUT: Final = 5.0
_STATEMENT_TIMEOUT: Final = 2.0
_INTERVAL_KIND: Final = Duration(maximum=_HOUR)
_TIMEOUT_KIND: Final = Duration(maximum=10 * _MINUTE)
_COLUMN: Final = Identifier()
_TABLE: Final = Identifier(qualified=True)


#: Seconds a client has to send a whole request head. A scrape's head is a few hundred
#: bytes sent at once; ten seconds leave room for a congested link and none for a client
#: that trickles (Go's and Python's clients send the head in one write).
HEADER_TIMEOUT: Final = 10.0
#: Seconds a client has to send a request body after its head. No endpoint of the
#: exporter reads one (they are all GET); a body is drained and dropped, and this bounds
#: how long that may take.
BODY_TIMEOUT: Final = 30.0
#: Seconds a TLS handshake may take (asyncio's default is 60): two round trips and a
#: signature, well under a second on any network Prometheus scrapes over.
TLS_HANDSHAKE_TIMEOUT: Final = 10.0
#: Seconds an idle kept-alive connection stays open between two requests (aiohttp's own
#: default is an hour). Longer than the usual scrape intervals (15 s to 1 min), so
#: Prometheus keeps reusing its connection; short enough that idle connections of clients
#: long gone do not pile up.
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
    #: Prometheus exporter web-config file (TLS, basic auth); ``None``: plain HTTP.
    web_config_file: Path | None = key(
        None,
        FilePath("file"),
        "TLS and basic auth, in the web-config format of the Prometheus exporters",
    )
    #: The app's prometheus_client multiprocess directory; defaults to the
    #: ``PROMETHEUS_MULTIPROC_DIR`` environment variable at load.
    multiprocess_dir: Path | None = key(
        None,
        FilePath("dir"),
        "the app's prometheus_client multiprocess directory, merged into `/metrics`",
        default_doc="`$PROMETHEUS_MULTIPROC_DIR` at load",
    )
    #: Drop ``live*`` gauges of worker pids that are gone. Needs the app's PID namespace
    #: (same host, or ``shareProcessNamespace: true`` in a pod); otherwise every pid looks
    #: dead, so turn it off and let the app's ``mark_process_dead`` hook clean up.
    check_worker_pids: bool = key(
        True,
        Bool(),
        "drop `live*` gauges of app workers whose pid is gone; needs the app's PID namespace "
        "(same host, or `shareProcessNamespace: true` in the pod), so set `false` in a "
        "sidecar without it",
    )
    #: Fold the files of dead workers into one (a pre-fork server that recycles workers
    #: leaves one file per pid for ever). Needs what ``check_worker_pids`` needs, and a
    #: writable multiprocess directory.
    compact_dead_workers: bool = key(
        False,
        Bool(),
        "fold the multiprocess files of dead workers (counters, histograms, summed gauges, "
        "exemplars) into one, at most every 30 s and 100 pids at a time; needs "
        "`check_worker_pids: true` and a writable multiprocess directory",
    )
    telemetry_path: str = key(
        "/metrics",
        Named(
            TELEMETRY_PATH_PATTERN,
            "a path starting with / other than /, /healthz and /readyz",
            "URL path",
        ),
        "where the metrics are served (`--web.telemetry-path` overrides it)",
    )
    header_timeout: float = key(
        HEADER_TIMEOUT,
        Duration(maximum=_HOUR),
        "time a client has to send a whole request head; a slower one is disconnected",
    )
    body_timeout: float = key(
        BODY_TIMEOUT,
        Duration(maximum=_HOUR),
        "time a client has to send a request body after its head",
    )
    tls_handshake_timeout: float = key(
        TLS_HANDSHAKE_TIMEOUT,
        Duration(maximum=_HOUR),
        "time a TLS handshake may take",
    )
    keepalive_timeout: float = key(
        KEEPALIVE_TIMEOUT,
        Duration(maximum=24 * _HOUR),
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
    """``database``: the PostgreSQL, MySQL or MariaDB the probes read, and how carefully.

    The dialect comes from the URL's scheme (:attr:`dialect`).
    """

    url: Secret = url_keys(
        DATABASE_SCHEMES,
        "PostgreSQL, MySQL or MariaDB",
        "the database URL: PostgreSQL (`postgresql://`, `postgres://` or a libpq "
        "`key=value` string), MySQL (`mysql://`) or MariaDB (`mariadb://`)",
        accept_conninfo=True,
    )
    #: Where the URL came from, for messages: ``env NAME``, ``file PATH`` or ``literal``.
    url_source: str = derived("literal", "where the URL came from")
    statement_timeout: float = key(
        _STATEMENT_TIMEOUT,
        Duration(maximum=10 * _MINUTE),
        "`SET LOCAL statement_timeout` of every probe transaction whose probe does not "
        "set its own `statement_timeout` (MariaDB: `max_statement_time`, MySQL: "
        "`max_execution_time`)",
    )
    lock_timeout: float = key(
        0.2,
        Duration(maximum=10 * _MINUTE),
        "`SET LOCAL lock_timeout`: a probe gives up instead of queueing behind checkout "
        "(MySQL/MariaDB: `innodb_lock_wait_timeout` and `lock_wait_timeout`, whole seconds, "
        "at least 1)",
    )
    connect_timeout: float = key(
        5.0,
        Duration(maximum=5 * _MINUTE),
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
        Duration(maximum=10 * _MINUTE),
        "how often followers try the lock and the leader checks its session; the server "
        "ends an election session silent for 3 intervals (at least 1 s)",
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
        """``postgresql``, or ``mysql`` for a MySQL or MariaDB URL (one probe family, which
        asks the server which of the two it is)."""
        scheme = self.url.reveal().split("://", 1)[0].lower()
        return "mysql" if scheme in MYSQL_URL_SCHEMES else "postgresql"


@dataclass(frozen=True, slots=True)
class ProductsTable:
    """``schema.products``: one row per SKU with its current stock."""

    table: str = key("products", _TABLE, "the table")
    id: str = key("id", _COLUMN, "primary key, referenced by `order_items.product_id`")
    sku: str = key("sku", _COLUMN, "the SKU (label value)")
    stock: str = key("available_stock", _COLUMN, "current stock")
    #: The SKU's inventory for the sale; without it oversold units cannot be computed.
    allocation: str | None = key(
        None,
        OptionalIdentifier(),
        "the SKU's inventory for the sale, e.g. `initial_stock`; without it only negative "
        "stock is visible and `oversold` is off",
    )


@dataclass(frozen=True, slots=True)
class OrdersTable:
    """``schema.orders``: orders with their status, keys and creation time."""

    table: str = key("orders", _TABLE, "the table")
    id: str = key("id", _COLUMN, "primary key, referenced by `order_items.order_id`")
    status: str = key("status", _COLUMN, "compared with literals, so enum columns work")
    paid_statuses: tuple[str, ...] = key(
        ("PAID", "PROCESSING", "COMPLETED"),
        TextList(Text(allow_numbers=True), non_empty=True),
        "statuses counted as sold",
    )
    external_ref: str | None = key(
        "external_ref",
        OptionalIdentifier(),
        "compared for duplicate orders; `null` switches it off",
    )
    idempotency_key: str | None = key(
        None, OptionalIdentifier(), "mapped: also compared for duplicate orders"
    )
    created_at: str = key("created_at", _COLUMN, "limits the duplicate search to a recent window")


@dataclass(frozen=True, slots=True)
class OrderItemsTable:
    """``schema.order_items``: which product, how many, in which order."""

    table: str = key("order_items", _TABLE, "the table")
    order_id: str = key("order_id", _COLUMN, "the order (`orders.id`)")
    product_id: str = key("product_id", _COLUMN, "the product (`products.id`)")
    quantity: str = key("quantity", _COLUMN, "units of the product in the order")


@dataclass(frozen=True, slots=True)
class ReservationsTable:
    """``schema.reservations``: stock held for a checkout until ``expires_at``.

    A reservation still holds its stock when ``released_at`` is null or, with a status
    column instead, when its status is one of ``held_statuses``.
    """

    table: str = key("reservations", _TABLE, "the table")
    expires_at: str = key("expires_at", _COLUMN, "when the hold ends")
    released_at: str | None = key(
        "released_at",
        _COLUMN,
        "null while the reservation holds its stock; not with `status`",
        default_doc="`released_at` (none with `status`)",
    )
    status: str | None = key(
        None, _COLUMN, "a status column instead of `released_at`; needs `held_statuses`"
    )
    held_statuses: tuple[str, ...] = key(
        (),
        TextList(Text(allow_numbers=True)),
        "with `status`: the statuses of reservations still holding stock, e.g. `[HELD]`",
    )


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """``schema.outbox``: the transactional outbox; unpublished rows have no ``published_at``."""

    table: str = key("outbox", _TABLE, "the table")
    created_at: str = key("created_at", _COLUMN, "when the event was written")
    published_at: str = key("published_at", _COLUMN, "null until the event is published")
    id: str | None = key(
        None,
        OptionalIdentifier(),
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

    url: Secret = url_keys(
        ("redis", "rediss", "unix"), "Redis", "`redis://`, `rediss://` or `unix://`"
    )
    url_source: str = derived("literal", "where the URL came from")
    key_template: str = key("stock:{sku}", Template("sku"), "the cache key of a SKU's stock")
    # 0: the difference that matters most is in the last units (cached 1, database 0 is
    # the "available" that oversells); a tolerance of n hides every cache that still says
    # "n left" of a sold-out SKU.
    tolerance: int = key(
        0,
        Integer(0, 2**31, label="integer ≥ 0"),
        "units of difference that do not count; 0, since a cache that says 1 of a sold-out "
        "SKU is the one that oversells",
    )
    # See CACHE_DRIFT_GRACE: with cache_drift's 1 s runs, three differing runs in a row.
    grace: float = key(
        CACHE_DRIFT_GRACE,
        Duration(maximum=_DAY, allow_zero=True),
        "how long a difference must last, without interruption, to count; with "
        "`probes.cache_drift.interval` at 1 s, a difference seen on three runs in a row: "
        "a cache 3 s or more late counts, one that catches up within 2 s never does",
    )

    def key(self, sku: str) -> str:
        """The cache key of ``sku``; with ``key_template: "stock:{sku}"``, ``key("A")`` is
        ``"stock:A"``."""
        return self.key_template.replace("{sku}", sku)


@dataclass(frozen=True, slots=True)
class LockWatchConfig:
    """``lock_watch``: the Redis lock watcher (keyspace notifications of lock keys)."""

    url: Secret = url_keys(
        ("redis", "rediss", "unix"),
        "Redis",
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
        Duration(maximum=_DAY),
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
        1.0, Duration(maximum=10 * _MINUTE), "wait between two connection attempts"
    )
    health_check_interval: float = key(
        5.0,
        Duration(maximum=10 * _MINUTE),
        "a quiet subscription is checked with `PING` this often, so a dead link is noticed",
    )
    connect_timeout: float = key(5.0, Duration(maximum=5 * _MINUTE), "connection timeout")


@dataclass(frozen=True, slots=True)
class ProbeDefaults:
    """``probes.defaults``: the schedule of every probe that does not set its own."""

    interval: float = key(_INTERVAL, _INTERVAL_KIND, "how often a probe runs")
    timeout: float = key(_TIMEOUT, _TIMEOUT_KIND, "how long a run may take")


def _scheduled(name: str) -> Any:
    """A probe's ``interval`` or ``timeout``: by default that of ``probes.defaults``."""
    default, kind, doc = {
        "interval": (_INTERVAL, _INTERVAL_KIND, "how often it runs"),
        "timeout": (_TIMEOUT, _TIMEOUT_KIND, "how long a run may take"),
    }[name]
    return key(
        default, kind, doc, inherit=f"probes.defaults.{name}", default_doc="`probes.defaults`"
    )


def _statement_timeout() -> Any:
    """A probe's own ``statement_timeout``: by default ``database.statement_timeout``."""
    return key(
        _STATEMENT_TIMEOUT,
        Duration(maximum=10 * _MINUTE),
        "`SET LOCAL statement_timeout` of its transactions; keep it below `timeout`",
        inherit="database.statement_timeout",
        default_doc="`database.statement_timeout`",
    )


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """One probe's schedule: on or off, how often, and how long a run may take."""

    enabled: bool = key(
        True,
        Bool(),
        "on when what it needs is configured; `true` without it is an error",
        default_doc="`true` when configured",
    )
    interval: float = _scheduled("interval")
    timeout: float = _scheduled("timeout")
    statement_timeout: float = _statement_timeout()


def _top_skus(what: str) -> Any:
    """How many SKUs a probe names in its per-SKU series (alerts name them)."""
    return key(
        10,
        Integer(1, 1_000),
        f"the SKUs with the most {what} get a `sku` series of their own (through the SKU "
        "guard), the rest are summed under `__other__`",
    )


@dataclass(frozen=True, slots=True)
class NegativeStockSettings(ProbeSettings):
    """``probes.negative_stock``: SKUs below zero, the worst named one by one."""

    top_skus: int = _top_skus("units below zero")


@dataclass(frozen=True, slots=True)
class OutboxSettings(ProbeSettings):
    """``probes.outbox``: unpublished events, and when one counts as stuck."""

    max_publish_latency: float = key(
        30.0,
        Duration(maximum=_DAY),
        "an event unpublished for longer is stuck: the sidecar logs it and StockOutboxLag "
        "fires (the probe exports it as the alert's threshold)",
    )


@dataclass(frozen=True, slots=True)
class OversoldSettings(ProbeSettings):
    """``probes.oversold``; ``scope: promo`` limits the scan to the promo SKUs.

    ``scope: all`` runs incrementally: per-product totals kept between runs, orders
    created within ``settle_after`` read again each run, a rolling recount of every
    product once per ``recount_period`` (docs/exporter-config.md, "How oversold counts").
    """

    scope: Literal["all", "promo"] = key(
        "all",
        Choice(("all", "promo")),
        "`all`: every SKU, incrementally; `promo`: only `sku_guard.promo_skus`, their "
        "whole history each run",
    )
    settle_after: float = key(
        2 * _MINUTE,
        Duration(maximum=_DAY, allow_zero=True),
        "orders created this recently are read again on every run (payments, refunds "
        "and cancellations show at the next run); older ones are added once to kept totals",
    )
    clock_margin: float = key(
        5.0,
        Duration(maximum=_HOUR, allow_zero=True),
        "how far an order's `created_at` may precede its transaction's start on the "
        "database's clock (app clock skew, timestamp taken before `BEGIN`)",
    )
    recount_period: float = key(
        _DAY,
        Duration(maximum=7 * _DAY),
        "one pass of the rolling recount over every product, a chunk per run: finds SKUs "
        "oversold long ago and corrects kept totals after a change to an older order",
    )
    recount_batch: int = key(
        2000,
        Integer(1, 100_000),
        "products seen for the first time counted from their history per run; keep it "
        "above the distinct products sold per interval (an uncounted product's oversell "
        "waits for its turn); it also paces the rebuild after a start or a leader change",
    )
    max_tracked_products: int = key(
        200_000,
        Integer(1_000, 10_000_000),
        "products whose totals are kept; the least recently sold beyond it are dropped",
    )


@dataclass(frozen=True, slots=True)
class DuplicateOrdersSettings(ProbeSettings):
    """``probes.duplicate_orders``: orders created within ``window`` are compared."""

    window: float = key(
        _HOUR, Duration(maximum=31 * _DAY), "orders created within it are compared"
    )
    clock_margin: float = key(
        5.0,
        Duration(maximum=_HOUR, allow_zero=True),
        "how far an order's `created_at` may precede its transaction's start on the "
        "database's clock (as `oversold.clock_margin`)",
    )
    top_skus: int = _top_skus("duplicate keys")


@dataclass(frozen=True, slots=True)
class CacheDriftSettings(ProbeSettings):
    """``probes.cache_drift``: the promo SKUs' cached stock against the database's.

    Its interval is its own (``redis.grace`` is counted in its runs), not
    ``probes.defaults``'.
    """

    interval: float = key(
        CACHE_DRIFT_INTERVAL,
        _INTERVAL_KIND,
        "how often it runs; its own default, not `probes.defaults`: `redis.grace` is "
        "counted in its runs, so keep the interval at most half the grace",
    )
    top_skus: int = _top_skus("units of drift")


@dataclass(frozen=True, slots=True)
class LongTransactionsSettings(ProbeSettings):
    """``probes.long_transactions``: transactions open longer than ``threshold``."""

    threshold: float = key(
        30.0, Duration(maximum=_DAY), "transactions open longer than this count"
    )


@dataclass(frozen=True, slots=True)
class CustomProbe:
    """One entry of ``probes.custom``: read-only SQL exported as a gauge."""

    name: str = required(
        Named(
            "[a-z][a-z0-9_]{0,62}",
            "a probe name (lower case, digits and _)",
            "probe name",
        ),
        "probe name, not a built-in name; the `probe` label of its health series",
    )
    sql: str = required(Sql(), "one `SELECT`; a trailing `;` is removed")
    metric: str = required(
        Named("[a-zA-Z_:][a-zA-Z0-9_:]*", "a metric name", "metric name"),
        "gauge name; not a catalog name, and not starting with `stock_` or `stocksentry_` "
        "(reserved for stocksentry's own metrics)",
    )
    help: str = computed(
        Text(),
        "help text",
        lambda values: f"Custom probe {values['name']}.",
        "`Custom probe <name>.`",
    )
    value_column: str = key(
        "value", Text(), "column holding the sample value; rows where it is null are skipped"
    )
    label_columns: tuple[str, ...] = key(
        (),
        TextList(LabelName()),
        "columns exported as labels; a `sku` label goes through the SKU guard, others are "
        "sanitised like every label",
    )
    interval: float = _scheduled("interval")
    timeout: float = _scheduled("timeout")
    statement_timeout: float = _statement_timeout()
    max_series: int = key(
        100, Integer(1, 10_000), "label sets beyond it are dropped, with one warning"
    )


@dataclass(frozen=True, slots=True)
class ProbesConfig:
    """``probes``: every built-in probe's settings and the custom ones.

    ``enabled`` is the effective value: a probe whose prerequisites are missing (no
    database, no allocation column, no Redis ...) is off, and
    :attr:`ExporterConfig.notes` says why.
    """

    defaults: ProbeDefaults = section(ProbeDefaults, "the schedule of every other probe")
    negative_stock: NegativeStockSettings = section(NegativeStockSettings, "SKUs below zero")
    oversold: OversoldSettings = section(OversoldSettings, "paid units beyond the allocation")
    duplicate_orders: DuplicateOrdersSettings = section(
        DuplicateOrdersSettings, "keys with more than one order"
    )
    lock_waiters: ProbeSettings = section(ProbeSettings, "sessions waiting for a lock")
    deadlocks: ProbeSettings = section(ProbeSettings, "the database's deadlock counter")
    long_transactions: LongTransactionsSettings = section(
        LongTransactionsSettings, "long transactions holding stock locks"
    )
    expired_reservations: ProbeSettings = section(ProbeSettings, "expired, unreleased holds")
    outbox: OutboxSettings = section(OutboxSettings, "unpublished events and their lag")
    cache_drift: CacheDriftSettings = section(CacheDriftSettings, "cache against database stock")
    custom: tuple[CustomProbe, ...] = sections(CustomProbe, "custom SQL probes")

    def builtin(self) -> dict[str, ProbeSettings]:
        """The built-in probes by name, in documentation order."""
        return {name: getattr(self, name) for name in BUILTIN_PROBES}


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
    #: The file the configuration came from, for messages.
    source: str = derived("<string>", "the file the configuration came from")
    #: Informational lines for the start-up log, e.g. why a probe is off.
    notes: tuple[str, ...] = derived((), "why probes are off")


#: The built-in probes, in the order they are documented: the sections of ``probes``
#: that hold a probe's settings.
BUILTIN_PROBES: Final = tuple(
    name
    for name, spec in specs(ProbesConfig)
    if isinstance(spec, Section) and issubclass(spec.cls, ProbeSettings)
)
