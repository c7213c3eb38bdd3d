"""The sidecar's YAML configuration, loaded into a strict, typed, immutable model.

Every section is a frozen dataclass. Unknown keys are refused at every level, values are
checked for type, range and allowed values, and every error is one :class:`ConfigError`
whose message names the file, the line and the dotted key path::

    config.yaml:12: probes.oversold.interval: expected a duration like "5s", got "fast"

The YAML is read through PyYAML's node API (``yaml.compose`` with the safe loader), so
line numbers are those of the key or value at fault and no Python object is ever built
from tags in the file.

Secrets (database and Redis URLs) come from an environment variable (``url_env``) or a
file (``url_file``) named in the config and are resolved at load; they live in
:class:`Secret` wrappers that never show their value in ``repr()`` or ``str()``. A
literal ``url:`` is accepted only without a password.

The keys are documented in ``docs/exporter-config.md``; ``exporter/config.example.yaml``
is an annotated example that loads as is.

Example::

    from stocksentry.exporter.config import ConfigError, load_config

    try:
        config = load_config("/etc/stocksentry/config.yaml")
    except ConfigError as exc:
        print(exc)             # one line: file:line: key.path: what is wrong
        raise SystemExit(2)
    config.probes.negative_stock.interval   # 15.0 (seconds)
    config.database.url                     # Secret('***'); .reveal() gives the URL
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, NoReturn, TypeVar

import yaml
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.secrets import Secret, url_has_password
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .durations import format_duration, parse_duration

__all__ = [
    "BUILTIN_PROBES",
    "DEFAULT_ADVISORY_LOCK_KEY",
    "ConfigError",
    "CustomProbe",
    "DatabaseConfig",
    "DuplicateOrdersSettings",
    "ExporterConfig",
    "LongTransactionsSettings",
    "OrderItemsTable",
    "OrdersTable",
    "OutboxTable",
    "OversoldSettings",
    "ProbeSettings",
    "ProbesConfig",
    "ProductsTable",
    "RedisConfig",
    "ReservationsTable",
    "SchemaConfig",
    "Secret",
    "ServerConfig",
    "SkuGuardConfig",
    "format_duration",
    "load_config",
    "parse_config",
    "parse_duration",
]

#: The advisory-lock key sidecars compete for when ``database.leader_election`` is on:
#: the ASCII bytes of "stocksen" read as one signed 64-bit integer, so it is unlikely to
#: clash with keys an application picked.
DEFAULT_ADVISORY_LOCK_KEY: Final = 0x73746F636B73656E

#: The built-in probes, in the order they are documented.
BUILTIN_PROBES: Final = (
    "negative_stock",
    "oversold",
    "duplicate_orders",
    "lock_waiters",
    "deadlocks",
    "long_transactions",
    "expired_reservations",
    "outbox",
    "cache_drift",
)
#: The health series of the leader election use this probe name.
ELECTION_PROBE: Final = "leader_election"

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_MINUTE: Final = 60.0
_HOUR: Final = 3600.0
_DAY: Final = 86400.0

# Plain SQL identifiers: what PostgreSQL accepts unquoted, minus the case folding (names
# are quoted when SQL is built, so they must be written as stored, usually lower case).
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PROBE_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A libpq key=value connection string carrying a password.
_CONNINFO_PASSWORD = re.compile(r"(?:^|\s)password\s*=", re.IGNORECASE)
# The prefixes of stocksentry's own metrics: a custom gauge may not use them, so it can
# never collide with a metric the catalog has or will have.
_RESERVED_PREFIXES: Final = ("stock_", "stocksentry_")

_TAG_NULL = "tag:yaml.org,2002:null"
_TAG_BOOL = "tag:yaml.org,2002:bool"
_TAG_INT = "tag:yaml.org,2002:int"
_TAG_FLOAT = "tag:yaml.org,2002:float"
_TAG_STR = "tag:yaml.org,2002:str"
_T = TypeVar("_T")
# Builds Python values from single scalar nodes whose tag was already checked.
_CONSTRUCTOR: Final = yaml.constructor.SafeConstructor()


# --- public model --------------------------------------------------------------------------


class ConfigError(Exception):
    """The configuration cannot be used; ``str()`` is one line naming file, line and key.

    Attributes ``source``, ``line`` (1-based, ``None`` when unknown), ``path`` (dotted key
    path, ``""`` for the whole file) and ``message`` hold the parts.

    Example::

        try:
            parse_config("server: {port: 99999}\\n", "config.yaml")
        except ConfigError as exc:
            str(exc)  # 'config.yaml:1: server.port: must be at most 65535, got 99999'
    """

    def __init__(
        self, message: str, *, source: str, line: int | None = None, path: str = ""
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.path = path
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        # One message, one line, whatever a YAML problem or an OS error put in it.
        return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``server``: where ``/metrics`` listens and what it merges."""

    listen_address: str = "0.0.0.0"  # noqa: S104 - a sidecar listens on the pod's address
    port: int = 9464
    #: Prometheus exporter web-config file (TLS, basic auth); ``None``: plain HTTP.
    web_config_file: Path | None = None
    #: The app's prometheus_client multiprocess directory; defaults to the
    #: ``PROMETHEUS_MULTIPROC_DIR`` environment variable at load.
    multiprocess_dir: Path | None = None
    #: Drop ``live*`` gauges of worker pids that are gone. Needs the app's PID namespace
    #: (same host, or ``shareProcessNamespace: true`` in a pod); otherwise every pid looks
    #: dead, so turn it off and let the app's ``mark_process_dead`` hook clean up.
    check_worker_pids: bool = True


@dataclass(frozen=True, slots=True)
class SkuGuardConfig:
    """``sku_guard``: the bound on per-SKU series (see ``LabelGuard``)."""

    promo_skus: tuple[str, ...] = ()
    max_skus: int = 100


@dataclass(frozen=True, slots=True)
class DatabaseConfig:
    """``database``: the PostgreSQL the probes read, and how carefully they read it."""

    url: Secret
    #: Where the URL came from, for messages: ``env NAME``, ``file PATH`` or ``literal``.
    url_source: str = "literal"
    statement_timeout: float = 2.0
    lock_timeout: float = 0.2
    connect_timeout: float = 5.0
    leader_election: bool = True
    advisory_lock_key: int = DEFAULT_ADVISORY_LOCK_KEY
    leader_retry_interval: float = 5.0
    max_connections: int = 3
    application_name: str = "stocksentry-exporter"


@dataclass(frozen=True, slots=True)
class ProductsTable:
    """``schema.products``: one row per SKU with its current stock."""

    table: str = "products"
    id: str = "id"
    sku: str = "sku"
    stock: str = "available_stock"
    #: The SKU's inventory for the sale; without it oversold units cannot be computed.
    allocation: str | None = None


@dataclass(frozen=True, slots=True)
class OrdersTable:
    """``schema.orders``: orders with their status, keys and creation time."""

    table: str = "orders"
    id: str = "id"
    status: str = "status"
    paid_statuses: tuple[str, ...] = ("PAID", "PROCESSING", "COMPLETED")
    external_ref: str | None = "external_ref"
    idempotency_key: str | None = None
    created_at: str = "created_at"


@dataclass(frozen=True, slots=True)
class OrderItemsTable:
    """``schema.order_items``: which product, how many, in which order."""

    table: str = "order_items"
    order_id: str = "order_id"
    product_id: str = "product_id"
    quantity: str = "quantity"


@dataclass(frozen=True, slots=True)
class ReservationsTable:
    """``schema.reservations``: stock held for a checkout until ``expires_at``.

    A reservation still holds its stock when ``released_at`` is null or, with a status
    column instead, when its status is one of ``held_statuses``.
    """

    table: str = "reservations"
    expires_at: str = "expires_at"
    released_at: str | None = "released_at"
    status: str | None = None
    held_statuses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """``schema.outbox``: the transactional outbox; unpublished rows have no ``published_at``."""

    table: str = "outbox"
    created_at: str = "created_at"
    published_at: str = "published_at"


@dataclass(frozen=True, slots=True)
class SchemaConfig:
    """``schema``: how the shop's tables are named; defaults follow the common layout."""

    products: ProductsTable = field(default_factory=ProductsTable)
    orders: OrdersTable = field(default_factory=OrdersTable)
    order_items: OrderItemsTable = field(default_factory=OrderItemsTable)
    reservations: ReservationsTable | None = None
    outbox: OutboxTable | None = None


@dataclass(frozen=True, slots=True)
class RedisConfig:
    """``redis``: the stock cache compared with the database by ``cache_drift``."""

    url: Secret
    url_source: str = "literal"
    key_template: str = "stock:{sku}"
    tolerance: int = 0
    grace: float = 10.0

    def key(self, sku: str) -> str:
        """The cache key of ``sku``; with ``key_template: "stock:{sku}"``, ``key("A")`` is
        ``"stock:A"``."""
        return self.key_template.replace("{sku}", sku)


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """One probe's schedule: on or off, how often, and how long a run may take."""

    enabled: bool = True
    interval: float = 15.0
    timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class OversoldSettings(ProbeSettings):
    """``probes.oversold``; ``scope: promo`` limits the scan to the promo SKUs."""

    scope: Literal["all", "promo"] = "all"


@dataclass(frozen=True, slots=True)
class DuplicateOrdersSettings(ProbeSettings):
    """``probes.duplicate_orders``: orders created within ``window`` are compared."""

    window: float = _HOUR


@dataclass(frozen=True, slots=True)
class LongTransactionsSettings(ProbeSettings):
    """``probes.long_transactions``: transactions open longer than ``threshold``."""

    threshold: float = 30.0


@dataclass(frozen=True, slots=True)
class CustomProbe:
    """One entry of ``probes.custom``: read-only SQL exported as a gauge."""

    name: str
    sql: str
    metric: str
    help: str
    value_column: str = "value"
    label_columns: tuple[str, ...] = ()
    interval: float = 15.0
    timeout: float = 5.0
    max_series: int = 100


@dataclass(frozen=True, slots=True)
class ProbesConfig:
    """``probes``: every built-in probe's settings and the custom ones.

    ``enabled`` is the effective value: a probe whose prerequisites are missing (no
    database, no allocation column, no Redis ...) is off, and
    :attr:`ExporterConfig.notes` says why.
    """

    negative_stock: ProbeSettings = ProbeSettings()
    oversold: OversoldSettings = OversoldSettings()
    duplicate_orders: DuplicateOrdersSettings = DuplicateOrdersSettings()
    lock_waiters: ProbeSettings = ProbeSettings()
    deadlocks: ProbeSettings = ProbeSettings()
    long_transactions: LongTransactionsSettings = LongTransactionsSettings()
    expired_reservations: ProbeSettings = ProbeSettings()
    outbox: ProbeSettings = ProbeSettings()
    cache_drift: ProbeSettings = ProbeSettings()
    custom: tuple[CustomProbe, ...] = ()

    def builtin(self) -> dict[str, ProbeSettings]:
        """The built-in probes by name, in documentation order."""
        return {name: getattr(self, name) for name in BUILTIN_PROBES}


@dataclass(frozen=True, slots=True)
class ExporterConfig:
    """The whole configuration. Build it with :func:`load_config` or :func:`parse_config`."""

    server: ServerConfig = ServerConfig()
    sku_guard: SkuGuardConfig = SkuGuardConfig()
    database: DatabaseConfig | None = None
    schema: SchemaConfig = SchemaConfig()
    redis: RedisConfig | None = None
    probes: ProbesConfig = ProbesConfig()
    #: The file the configuration came from, for messages.
    source: str = "<string>"
    #: Informational lines for the start-up log, e.g. why a probe is off.
    notes: tuple[str, ...] = ()


# --- durations -----------------------------------------------------------------------------


# --- loading -------------------------------------------------------------------------------


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """Load and validate the YAML file at ``path``.

    Relative paths inside the file (``url_file``, ``web_config_file``,
    ``multiprocess_dir``) are taken relative to the file's folder. ``environ`` defaults to
    ``os.environ``. Raises :class:`ConfigError`, and nothing else, for every problem.

    Example::

        config = load_config("exporter/config.example.yaml")
    """
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", source=source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError("the file is not UTF-8 text", source=source, line=line) from None
    return parse_config(text, source, environ=environ, base_dir=Path(path).parent)


def parse_config(
    text: str,
    source: str = "<string>",
    *,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> ExporterConfig:
    """Validate a configuration given as YAML text; ``source`` names it in errors.

    Example::

        config = parse_config("sku_guard: {promo_skus: [EGG-01]}\\n")
        config.sku_guard.promo_skus   # ('EGG-01',)
        config.database               # None: no database, no database probes
    """
    ctx = _Context(
        source,
        os.environ if environ is None else environ,
        Path.cwd() if base_dir is None else base_dir,
    )
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        # problem and context only: str(exc) would quote a snippet of the file, which may
        # sit next to something secret.
        what = "; ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(
            f"invalid YAML: {what}",
            source=source,
            line=None if mark is None else mark.line + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {type(exc).__name__}", source=source) from None
    except RecursionError:
        # yaml.compose recurses once per nesting level: "[[[[..." thousands deep.
        raise ConfigError("invalid YAML: nested too deeply", source=source) from None
    if root is None or (isinstance(root, ScalarNode) and root.tag == _TAG_NULL):
        raise ConfigError(
            "the file is empty; expected a mapping of sections "
            "(server, sku_guard, database, schema, redis, probes)",
            source=source,
            line=1,
        )
    return _build(ctx, root)


# --- the node reader -----------------------------------------------------------------------


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _describe(node: Node, *, secret: bool = False) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == _TAG_NULL:
        return "nothing (null)"
    if secret:
        return "a value (not shown)"
    value = str(node.value)
    if len(value) > 60:
        value = value[:57] + "..."
    return json.dumps(value, ensure_ascii=False)


class _Context:
    """Where errors point, and where secrets and relative paths are looked up."""

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        self.source = source
        self.environ = environ
        self.base_dir = base_dir
        self.notes: list[str] = []

    def fail(self, node: Node | None, path: str, message: str) -> NoReturn:
        raise ConfigError(
            message, source=self.source, line=None if node is None else _line(node), path=path
        )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Map:
    """A YAML mapping whose keys were checked against ``allowed`` on construction.

    Unknown and duplicate keys are refused first, so a typo is reported at its own line
    before anything that depends on it.
    """

    def __init__(self, ctx: _Context, node: Node, path: str, allowed: Iterable[str]) -> None:
        if not isinstance(node, MappingNode):
            where = path or "the top level"
            if path:
                ctx.fail(node, path, f"expected a mapping, got {_describe(node)}")
            raise ConfigError(
                f"expected a mapping at {where}, got {_describe(node)}",
                source=ctx.source,
                line=_line(node),
            )
        self.ctx = ctx
        self.node = node
        self.path = path
        self.keys: dict[str, Node] = {}
        self.values: dict[str, Node] = {}
        names = tuple(allowed)
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag != _TAG_STR:
                ctx.fail(key_node, path, f"keys must be plain names, got {_describe(key_node)}")
            key = str(key_node.value)
            if key in self.values:
                ctx.fail(key_node, _join(path, key), "duplicate key")
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = (
                    f'did you mean "{close[0]}"?'
                    if close
                    else "expected one of: " + ", ".join(names)
                )
                ctx.fail(key_node, _join(path, key), f"unknown key ({hint})")
            self.keys[key] = key_node
            self.values[key] = value_node

    def child(self, key: str) -> str:
        return _join(self.path, key)

    def get(self, key: str) -> Node | None:
        """The value node, or ``None`` when the key is absent or explicitly null."""
        node = self.values.get(key)
        if node is None or (isinstance(node, ScalarNode) and node.tag == _TAG_NULL):
            return None
        return node

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def require(self, key: str) -> Node:
        node = self.get(key)
        if node is None:
            where = self.values.get(key, self.node)
            self.ctx.fail(where, self.child(key), "is required")
        return node

    # Typed readers: each returns ``default`` when the key is absent or null.

    def text(self, key: str, default: str, *, allow_numbers: bool = False) -> str:
        node = self.get(key)
        return default if node is None else _str(self.ctx, node, self.child(key), allow_numbers)

    def flag(self, key: str, default: bool) -> bool:
        node = self.get(key)
        if node is None:
            return default
        if not isinstance(node, ScalarNode) or node.tag != _TAG_BOOL:
            self.ctx.fail(node, self.child(key), f"expected true or false, got {_describe(node)}")
        return bool(_construct(self.ctx, node, self.child(key), "expected true or false"))

    def integer(self, key: str, default: int, *, minimum: int, maximum: int) -> int:
        node = self.get(key)
        if node is None:
            return default
        path = self.child(key)
        if not isinstance(node, ScalarNode) or node.tag != _TAG_INT:
            self.ctx.fail(node, path, f"expected a whole number, got {_describe(node)}")
        value = int(_construct(self.ctx, node, path, "expected a whole number"))
        if value < minimum:
            self.ctx.fail(node, path, f"must be at least {minimum}, got {value}")
        if value > maximum:
            self.ctx.fail(node, path, f"must be at most {maximum}, got {value}")
        return value

    def duration(
        self, key: str, default: float, *, maximum: float, allow_zero: bool = False
    ) -> float:
        node = self.get(key)
        if node is None:
            return default
        path = self.child(key)
        example = 'expected a duration like "5s", "500ms" or "1m" (or a number of seconds)'
        if not isinstance(node, ScalarNode) or node.tag not in (_TAG_INT, _TAG_FLOAT, _TAG_STR):
            self.ctx.fail(node, path, f"{example}, got {_describe(node)}")
        raw: str | float
        if node.tag == _TAG_STR:
            raw = str(node.value)
        else:
            raw = float(_construct(self.ctx, node, path, example))
            if raw < 0:
                self.ctx.fail(node, path, f"must not be negative, got {node.value}")
        try:
            seconds = parse_duration(raw)
        except ValueError:
            self.ctx.fail(node, path, f"{example}, got {_describe(node)}")
        if seconds == 0 and not allow_zero:
            self.ctx.fail(node, path, "must be greater than zero")
        if seconds > maximum:
            self.ctx.fail(
                node,
                path,
                f"must be at most {format_duration(maximum)}, got {format_duration(seconds)}",
            )
        return seconds

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        node = self.get(key)
        if node is None:
            return default
        value = _str(self.ctx, node, self.child(key), False)
        if value not in choices:
            allowed = ", ".join(f'"{c}"' for c in choices)
            self.ctx.fail(
                node, self.child(key), f"expected one of {allowed}, got {_describe(node)}"
            )
        return value

    def text_list(
        self, key: str, default: tuple[str, ...], *, allow_numbers: bool = False
    ) -> tuple[str, ...]:
        node = self.get(key)
        if node is None:
            return default
        path = self.child(key)
        if not isinstance(node, SequenceNode):
            self.ctx.fail(node, path, f"expected a list, got {_describe(node)}")
        values: list[str] = []
        for index, item in enumerate(node.value):
            item_path = f"{path}[{index}]"
            value = _str(self.ctx, item, item_path, allow_numbers)
            if value in values:
                self.ctx.fail(item, item_path, f"duplicate value {_describe(item)}")
            values.append(value)
        return tuple(values)

    def identifier(self, key: str, default: str, *, qualified: bool = False) -> str:
        node = self.get(key)
        if node is None:
            return default
        return _identifier(self.ctx, node, self.child(key), qualified)

    def opt_identifier(self, key: str, default: str | None) -> str | None:
        node = self.get(key)
        if node is None:
            # An explicit null switches an optional column off even when it has a default.
            return None if key in self.values else default
        return _identifier(self.ctx, node, self.child(key), False)

    def mapping(self, key: str, allowed: Iterable[str]) -> _Map | None:
        node = self.get(key)
        return None if node is None else _Map(self.ctx, node, self.child(key), allowed)


def _construct(ctx: _Context, node: ScalarNode, path: str, expected: str) -> float:
    """The value of a bool, int or float scalar (its tag already checked).

    An explicit tag the constructor refuses (``!!bool maybe``, ``!!int abc``) or a
    resolver edge case (``0b_``) is a config error at the value, not a traceback.
    """
    try:
        if node.tag == _TAG_BOOL:
            return bool(_CONSTRUCTOR.construct_yaml_bool(node))
        if node.tag == _TAG_INT:
            return int(_CONSTRUCTOR.construct_yaml_int(node))
        return float(_CONSTRUCTOR.construct_yaml_float(node))
    except (ValueError, KeyError, IndexError, TypeError, yaml.YAMLError):
        ctx.fail(node, path, f"{expected}, got {_describe(node)}")


def _str(ctx: _Context, node: Node, path: str, allow_numbers: bool) -> str:
    tags = (_TAG_STR, _TAG_INT, _TAG_FLOAT) if allow_numbers else (_TAG_STR,)
    if not isinstance(node, ScalarNode) or node.tag not in tags:
        ctx.fail(node, path, f"expected a string, got {_describe(node)}")
    value = str(node.value)
    if not value.strip():
        ctx.fail(node, path, "must not be empty")
    return value


def _identifier(ctx: _Context, node: Node, path: str, qualified: bool) -> str:
    value = _str(ctx, node, path, False)
    parts = value.split(".")
    if len(parts) > (2 if qualified else 1) or not all(_IDENTIFIER.fullmatch(p) for p in parts):
        shape = (
            "a plain SQL identifier, optionally schema-qualified (schema.table)"
            if qualified
            else "a plain SQL identifier (letters, digits, _ and $, not starting with a digit)"
        )
        ctx.fail(node, path, f"{_describe(node)} is not {shape}")
    return value


# --- secrets -------------------------------------------------------------------------------


def _secret_url(
    section: _Map,
    *,
    schemes: tuple[str, ...],
    accept_conninfo: bool,
    what: str,
) -> tuple[Secret, str]:
    """Resolve ``url_env`` / ``url_file`` / ``url`` (exactly one) of ``section``."""
    ctx = section.ctx
    # In document order, so that "only one of" points at the later of two keys.
    given = sorted(
        (key for key in ("url_env", "url_file", "url") if key in section.values),
        key=lambda key: _line(section.keys[key]),
    )
    if not given:
        ctx.fail(section.node, section.path, "one of url_env, url_file or url is required")
    if len(given) > 1:
        second = given[1]
        ctx.fail(
            section.keys[second],
            section.child(second),
            f"give only one of url_env, url_file and url (found {', '.join(given)})",
        )
    key = given[0]
    node = section.require(key)
    path = section.child(key)
    if key == "url":
        if not isinstance(node, ScalarNode) or node.tag != _TAG_STR:
            ctx.fail(node, path, f"expected a string, got {_describe(node, secret=True)}")
        value = str(node.value).strip()
        if url_has_password(value):
            ctx.fail(
                node,
                path,
                "the URL carries a password; put the URL in an environment variable "
                "(url_env) or a file (url_file) instead",
            )
        origin = "literal"
        label = "the URL"
    elif key == "url_env":
        name = _str(ctx, node, path, False)
        if not _ENV_NAME.fullmatch(name):
            ctx.fail(node, path, f"{_describe(node)} is not an environment variable name")
        value = ctx.environ.get(name, "").strip()
        if not value:
            ctx.fail(node, path, f"environment variable {name} is not set or empty")
        origin = f"env {name}"
        label = f"environment variable {name}"
    else:
        file_path = _path(ctx, node, path)
        try:
            value = file_path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            ctx.fail(node, path, f"cannot read {file_path}: {exc.strerror}")
        except UnicodeDecodeError:
            ctx.fail(node, path, f"{file_path} is not UTF-8 text")
        if not value:
            ctx.fail(node, path, f"{file_path} is empty")
        origin = f"file {file_path}"
        label = str(file_path)
    scheme_ok = any(value.startswith(f"{s}://") for s in schemes) or (
        accept_conninfo and "://" not in value and "=" in value
    )
    if not scheme_ok:
        # Never echo the value: it may be a secret that is only badly formatted.
        expected = " or ".join(f"{s}://" for s in schemes)
        ctx.fail(node, path, f"{label} does not hold a {what} URL ({expected}...)")
    return Secret(value), origin


def _path(ctx: _Context, node: Node, path: str) -> Path:
    text = _str(ctx, node, path, False)
    if "\0" in text:
        ctx.fail(node, path, "must not contain a NUL character")
    try:
        value = Path(text).expanduser()
    except (RuntimeError, ValueError, OSError) as exc:
        # "~nouser/x": no such user, or no home directory to expand "~" to.
        ctx.fail(node, path, f"cannot expand {_describe(node)}: {exc}")
    return value if value.is_absolute() else ctx.base_dir / value


# --- sections ------------------------------------------------------------------------------

_TOP_KEYS = ("server", "sku_guard", "database", "schema", "redis", "probes")


def _build(ctx: _Context, root: Node) -> ExporterConfig:
    top = _Map(ctx, root, "", _TOP_KEYS)
    server = _server(ctx, top.mapping("server", _SERVER_KEYS))
    sku_guard = _sku_guard(top.mapping("sku_guard", ("promo_skus", "max_skus")))
    database = _database(top.mapping("database", _DATABASE_KEYS))
    schema = _schema(
        top.mapping("schema", ("products", "orders", "order_items", "reservations", "outbox"))
    )
    redis = _redis(top.mapping("redis", _REDIS_KEYS))
    probes = _probes(
        ctx,
        top.mapping("probes", (*BUILTIN_PROBES, "defaults", "custom")),
        database,
        schema,
        redis,
        sku_guard,
    )
    return ExporterConfig(
        server=server,
        sku_guard=sku_guard,
        database=database,
        schema=schema,
        redis=redis,
        probes=probes,
        source=ctx.source,
        notes=tuple(ctx.notes),
    )


_SERVER_KEYS = (
    "listen_address",
    "port",
    "web_config_file",
    "multiprocess_dir",
    "check_worker_pids",
)


def _server(ctx: _Context, section: _Map | None) -> ServerConfig:
    default = ServerConfig()
    if section is None:
        return ServerConfig(multiprocess_dir=_multiprocess_from_env(ctx))
    address = section.text("listen_address", default.listen_address)
    node = section.get("listen_address")
    if node is not None and not _is_host(address):
        ctx.fail(node, "server.listen_address", f"{_describe(node)} is not an IP address or host")
    web_config: Path | None = None
    node = section.get("web_config_file")
    if node is not None:
        web_config = _path(ctx, node, "server.web_config_file")
        if not web_config.is_file() or not os.access(web_config, os.R_OK):
            ctx.fail(node, "server.web_config_file", f"{web_config} is not a readable file")
    multiprocess: Path | None
    node = section.get("multiprocess_dir")
    if node is None:
        multiprocess = _multiprocess_from_env(ctx)
    else:
        multiprocess = _path(ctx, node, "server.multiprocess_dir")
        if not multiprocess.is_dir():
            ctx.fail(node, "server.multiprocess_dir", f"{multiprocess} is not a directory")
    return ServerConfig(
        listen_address=address,
        port=section.integer("port", default.port, minimum=0, maximum=65535),
        web_config_file=web_config,
        multiprocess_dir=multiprocess,
        check_worker_pids=section.flag("check_worker_pids", default.check_worker_pids),
    )


def _multiprocess_from_env(ctx: _Context) -> Path | None:
    value = ctx.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    if not value:
        return None
    directory = Path(value)
    if not directory.is_dir():
        raise ConfigError(
            f"PROMETHEUS_MULTIPROC_DIR names {value}, which is not a directory",
            source=ctx.source,
            path="server.multiprocess_dir",
        )
    return directory


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return bool(re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?", text))
    return True


def _sku_guard(section: _Map | None) -> SkuGuardConfig:
    if section is None:
        return SkuGuardConfig()
    return SkuGuardConfig(
        promo_skus=section.text_list("promo_skus", (), allow_numbers=True),
        max_skus=section.integer("max_skus", 100, minimum=0, maximum=10_000),
    )


_DATABASE_KEYS = (
    "url_env",
    "url_file",
    "url",
    "statement_timeout",
    "lock_timeout",
    "connect_timeout",
    "leader_election",
    "advisory_lock_key",
    "leader_retry_interval",
    "max_connections",
    "application_name",
)


def _database(section: _Map | None) -> DatabaseConfig | None:
    if section is None:
        return None
    url, origin = _secret_url(
        section, schemes=("postgresql", "postgres"), accept_conninfo=True, what="PostgreSQL"
    )
    d = DatabaseConfig(url=url)
    return DatabaseConfig(
        url=url,
        url_source=origin,
        statement_timeout=section.duration(
            "statement_timeout", d.statement_timeout, maximum=10 * _MINUTE
        ),
        lock_timeout=section.duration("lock_timeout", d.lock_timeout, maximum=10 * _MINUTE),
        connect_timeout=section.duration(
            "connect_timeout", d.connect_timeout, maximum=5 * _MINUTE
        ),
        leader_election=section.flag("leader_election", d.leader_election),
        advisory_lock_key=section.integer(
            "advisory_lock_key", d.advisory_lock_key, minimum=_INT64_MIN, maximum=_INT64_MAX
        ),
        leader_retry_interval=section.duration(
            "leader_retry_interval", d.leader_retry_interval, maximum=10 * _MINUTE
        ),
        max_connections=section.integer(
            "max_connections", d.max_connections, minimum=1, maximum=32
        ),
        application_name=section.text("application_name", d.application_name),
    )


def _schema(section: _Map | None) -> SchemaConfig:
    if section is None:
        return SchemaConfig()
    p, o, i = ProductsTable(), OrdersTable(), OrderItemsTable()
    products, orders, items = p, o, i
    m = section.mapping("products", ("table", "id", "sku", "stock", "allocation"))
    if m is not None:
        products = ProductsTable(
            table=m.identifier("table", p.table, qualified=True),
            id=m.identifier("id", p.id),
            sku=m.identifier("sku", p.sku),
            stock=m.identifier("stock", p.stock),
            allocation=m.opt_identifier("allocation", p.allocation),
        )
    m = section.mapping(
        "orders",
        (
            "table",
            "id",
            "status",
            "paid_statuses",
            "external_ref",
            "idempotency_key",
            "created_at",
        ),
    )
    if m is not None:
        paid = m.text_list("paid_statuses", o.paid_statuses, allow_numbers=True)
        if not paid:
            m.ctx.fail(m.values["paid_statuses"], m.child("paid_statuses"), "must not be empty")
        orders = OrdersTable(
            table=m.identifier("table", o.table, qualified=True),
            id=m.identifier("id", o.id),
            status=m.identifier("status", o.status),
            paid_statuses=paid,
            external_ref=m.opt_identifier("external_ref", o.external_ref),
            idempotency_key=m.opt_identifier("idempotency_key", o.idempotency_key),
            created_at=m.identifier("created_at", o.created_at),
        )
    m = section.mapping("order_items", ("table", "order_id", "product_id", "quantity"))
    if m is not None:
        items = OrderItemsTable(
            table=m.identifier("table", i.table, qualified=True),
            order_id=m.identifier("order_id", i.order_id),
            product_id=m.identifier("product_id", i.product_id),
            quantity=m.identifier("quantity", i.quantity),
        )
    reservations: ReservationsTable | None = None
    node = section.values.get("reservations")
    if node is not None and not (isinstance(node, ScalarNode) and node.tag == _TAG_NULL):
        m = _Map(
            section.ctx,
            node,
            "schema.reservations",
            ("table", "expires_at", "released_at", "status", "held_statuses"),
        )
        r = ReservationsTable()
        if m.has("status"):
            if m.has("released_at"):
                m.ctx.fail(
                    m.keys["released_at"],
                    m.child("released_at"),
                    "give either released_at or status with held_statuses, not both",
                )
            held = m.text_list("held_statuses", (), allow_numbers=True)
            if not held:
                m.ctx.fail(
                    m.values.get("held_statuses", m.keys["status"]),
                    m.child("held_statuses"),
                    "is required with status: the statuses of reservations still holding stock",
                )
            reservations = ReservationsTable(
                table=m.identifier("table", r.table, qualified=True),
                expires_at=m.identifier("expires_at", r.expires_at),
                released_at=None,
                status=m.identifier("status", "status"),
                held_statuses=held,
            )
        else:
            if m.has("held_statuses"):
                m.ctx.fail(
                    m.keys["held_statuses"], m.child("held_statuses"), "needs status as well"
                )
            reservations = ReservationsTable(
                table=m.identifier("table", r.table, qualified=True),
                expires_at=m.identifier("expires_at", r.expires_at),
                released_at=m.identifier("released_at", "released_at"),
            )
    outbox: OutboxTable | None = None
    node = section.values.get("outbox")
    if node is not None and not (isinstance(node, ScalarNode) and node.tag == _TAG_NULL):
        m = _Map(section.ctx, node, "schema.outbox", ("table", "created_at", "published_at"))
        b = OutboxTable()
        outbox = OutboxTable(
            table=m.identifier("table", b.table, qualified=True),
            created_at=m.identifier("created_at", b.created_at),
            published_at=m.identifier("published_at", b.published_at),
        )
    return SchemaConfig(
        products=products,
        orders=orders,
        order_items=items,
        reservations=reservations,
        outbox=outbox,
    )


_REDIS_KEYS = ("url_env", "url_file", "url", "key_template", "tolerance", "grace")


def _redis(section: _Map | None) -> RedisConfig | None:
    if section is None:
        return None
    url, origin = _secret_url(
        section, schemes=("redis", "rediss", "unix"), accept_conninfo=False, what="Redis"
    )
    template = section.text("key_template", "stock:{sku}")
    node = section.get("key_template")
    if node is not None:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError:
            fields = ["?"]
        if fields != ["sku"]:
            section.ctx.fail(
                node,
                "redis.key_template",
                f'must contain "{{sku}}" exactly once and no other {{...}} field, '
                f"got {_describe(node)}",
            )
    return RedisConfig(
        url=url,
        url_source=origin,
        key_template=template,
        tolerance=section.integer("tolerance", 0, minimum=0, maximum=2**31),
        grace=section.duration("grace", 10.0, maximum=_DAY, allow_zero=True),
    )


_PROBE_KEYS = ("enabled", "interval", "timeout")
_PROBE_EXTRA: Final[dict[str, tuple[str, ...]]] = {
    "oversold": ("scope",),
    "duplicate_orders": ("window",),
    "long_transactions": ("threshold",),
}
_CUSTOM_KEYS = (
    "name",
    "sql",
    "metric",
    "help",
    "value_column",
    "label_columns",
    "interval",
    "timeout",
    "max_series",
)


def _probes(
    ctx: _Context,
    section: _Map | None,
    database: DatabaseConfig | None,
    schema: SchemaConfig,
    redis: RedisConfig | None,
    sku_guard: SkuGuardConfig,
) -> ProbesConfig:
    interval, timeout = 15.0, 5.0
    defaults = None if section is None else section.mapping("defaults", ("interval", "timeout"))
    if defaults is not None:
        interval = defaults.duration("interval", interval, maximum=_HOUR)
        timeout = defaults.duration("timeout", timeout, maximum=10 * _MINUTE)

    # Why a probe cannot run with this configuration; None when it can.
    missing: dict[str, str | None] = dict.fromkeys(
        BUILTIN_PROBES, "there is no database section" if database is None else None
    )
    if database is not None:
        if schema.products.allocation is None:
            missing["oversold"] = (
                "schema.products.allocation is not mapped (without it only negative stock "
                "is visible: a lost update from 1 to 0 twice leaves the stock at 0)"
            )
        if schema.orders.external_ref is None and schema.orders.idempotency_key is None:
            missing["duplicate_orders"] = (
                "neither schema.orders.external_ref nor schema.orders.idempotency_key is mapped"
            )
        if schema.reservations is None:
            missing["expired_reservations"] = "schema.reservations is not mapped"
        if schema.outbox is None:
            missing["outbox"] = "schema.outbox is not mapped"
        if redis is None:
            missing["cache_drift"] = "there is no redis section"
        elif not sku_guard.promo_skus:
            missing["cache_drift"] = "sku_guard.promo_skus is empty (it compares promo SKUs)"

    settings: dict[str, ProbeSettings] = {}
    for name in BUILTIN_PROBES:
        allowed = _PROBE_KEYS + _PROBE_EXTRA.get(name, ())
        m = None if section is None else section.mapping(name, allowed)
        enabled = True if m is None else m.flag("enabled", True)
        reason = missing[name]
        if reason is not None and enabled:
            if m is not None and m.has("enabled"):
                ctx.fail(m.values["enabled"], m.child("enabled"), f"cannot be true: {reason}")
            if database is not None:
                ctx.notes.append(f"probe {name} is off: {reason}")
            enabled = False
        every = interval if m is None else m.duration("interval", interval, maximum=_HOUR)
        limit = timeout if m is None else m.duration("timeout", timeout, maximum=10 * _MINUTE)
        if name == "oversold":
            scope = "all" if m is None else m.choice("scope", "all", ("all", "promo"))
            if scope == "promo" and enabled and not sku_guard.promo_skus:
                where = None if m is None else m.values["scope"]
                ctx.fail(where, "probes.oversold.scope", "promo needs sku_guard.promo_skus")
            settings[name] = OversoldSettings(
                enabled, every, limit, scope="promo" if scope == "promo" else "all"
            )
        elif name == "duplicate_orders":
            window = _HOUR if m is None else m.duration("window", _HOUR, maximum=31 * _DAY)
            settings[name] = DuplicateOrdersSettings(enabled, every, limit, window=window)
        elif name == "long_transactions":
            threshold = 30.0 if m is None else m.duration("threshold", 30.0, maximum=_DAY)
            settings[name] = LongTransactionsSettings(enabled, every, limit, threshold=threshold)
        else:
            settings[name] = ProbeSettings(enabled, every, limit)

    custom: list[CustomProbe] = []
    node = None if section is None else section.get("custom")
    if node is not None:
        if not isinstance(node, SequenceNode):
            ctx.fail(node, "probes.custom", f"expected a list, got {_describe(node)}")
        if database is None and node.value:
            ctx.fail(node, "probes.custom", "custom probes need a database section")
        for index, item in enumerate(node.value):
            custom.append(_custom(ctx, item, f"probes.custom[{index}]", custom, interval, timeout))
    return ProbesConfig(
        negative_stock=settings["negative_stock"],
        oversold=_as(OversoldSettings, settings["oversold"]),
        duplicate_orders=_as(DuplicateOrdersSettings, settings["duplicate_orders"]),
        lock_waiters=settings["lock_waiters"],
        deadlocks=settings["deadlocks"],
        long_transactions=_as(LongTransactionsSettings, settings["long_transactions"]),
        expired_reservations=settings["expired_reservations"],
        outbox=settings["outbox"],
        cache_drift=settings["cache_drift"],
        custom=tuple(custom),
    )


def _as(kind: type[_T], value: object) -> _T:
    assert isinstance(value, kind)  # noqa: S101 - built just above with this type
    return value


def _custom(
    ctx: _Context,
    node: Node,
    path: str,
    earlier: list[CustomProbe],
    interval: float,
    timeout: float,
) -> CustomProbe:
    m = _Map(ctx, node, path, _CUSTOM_KEYS)
    name_node = m.require("name")
    name = _str(ctx, name_node, m.child("name"), False)
    if not _PROBE_NAME.fullmatch(name):
        ctx.fail(
            name_node,
            m.child("name"),
            f"{_describe(name_node)} is not a probe name (lower case, digits and _)",
        )
    if name in BUILTIN_PROBES or name == ELECTION_PROBE:
        ctx.fail(name_node, m.child("name"), f'"{name}" is the name of a built-in probe')
    if any(c.name == name for c in earlier):
        ctx.fail(name_node, m.child("name"), f'another custom probe is named "{name}"')

    sql_node = m.require("sql")
    sql = _str(ctx, sql_node, m.child("sql"), False).strip().rstrip(";").strip()
    if not sql:
        ctx.fail(sql_node, m.child("sql"), "must not be empty")

    metric_node = m.require("metric")
    metric = _str(ctx, metric_node, m.child("metric"), False)
    metric_path = m.child("metric")
    if not _METRIC_NAME.fullmatch(metric):
        ctx.fail(metric_node, metric_path, f"{_describe(metric_node)} is not a metric name")
    for spec in catalog.ALL:
        if metric in (spec.name, spec.base_name, *spec.sample_names):
            ctx.fail(
                metric_node,
                metric_path,
                f'"{metric}" collides with the catalog metric {spec.name}',
            )
    if metric.startswith(_RESERVED_PREFIXES):
        ctx.fail(
            metric_node,
            metric_path,
            f'"{metric}": the prefixes stock_ and stocksentry_ are reserved for '
            "stocksentry's own metrics",
        )
    if any(c.metric == metric for c in earlier):
        ctx.fail(metric_node, metric_path, f'another custom probe exports "{metric}"')

    value_column = m.text("value_column", "value")
    labels = m.text_list("label_columns", ())
    for index, label in enumerate(labels):
        label_node = m.values["label_columns"].value[index]
        label_path = f"{m.child('label_columns')}[{index}]"
        if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
            ctx.fail(label_node, label_path, f"{_describe(label_node)} is not a label name")
        if label == value_column:
            ctx.fail(label_node, label_path, "the value column cannot also be a label")
    return CustomProbe(
        name=name,
        sql=sql,
        metric=metric,
        help=m.text("help", f"Custom probe {name}."),
        value_column=value_column,
        label_columns=labels,
        interval=m.duration("interval", interval, maximum=_HOUR),
        timeout=m.duration("timeout", timeout, maximum=10 * _MINUTE),
        max_series=m.integer("max_series", 100, minimum=1, maximum=10_000),
    )
