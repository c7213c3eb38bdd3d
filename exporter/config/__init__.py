"""The sidecar's YAML configuration, loaded into a strict, typed, immutable model.

Unknown keys are refused at every level, values are checked for type, range and allowed
values, and every error is one :class:`ConfigError` naming the file, line and key::

    config.yaml:12: probes.oversold.interval: expected a duration like "5s", got "fast"

Secret URLs come from ``url_env`` or ``url_file`` and are held in a
:class:`~stocksentry.instrumentation.secrets.Secret`. The keys are documented in
``docs/exporter-config.md`` (which also says why this is not pydantic).

Example::

    config = load_config("exporter/config.example.yaml")
    config.probes.negative_stock.interval   # 15.0 (seconds)
"""

from __future__ import annotations

from .errors import ConfigError
from .loader import load_config, parse_config
from .model import (
    DEFAULT_ADVISORY_LOCK_KEY,
    DatabaseConfig,
    ExporterConfig,
    LockWatchConfig,
    LogConfig,
    OrderItemsTable,
    OrdersTable,
    OutboxTable,
    ProductsTable,
    RedisConfig,
    ReservationsTable,
    SchemaConfig,
    ServerConfig,
    SkuGuardConfig,
)
from .probing import (
    BUILTIN_PROBES,
    ELECTION_PROBE,
    CacheDriftSettings,
    CustomProbe,
    DuplicateOrdersSettings,
    LongTransactionsSettings,
    OversoldSettings,
    ProbeDefaults,
    ProbesConfig,
    ProbeSettings,
)

__all__ = [
    "BUILTIN_PROBES",
    "DEFAULT_ADVISORY_LOCK_KEY",
    "ELECTION_PROBE",
    "CacheDriftSettings",
    "ConfigError",
    "CustomProbe",
    "DatabaseConfig",
    "DuplicateOrdersSettings",
    "ExporterConfig",
    "LockWatchConfig",
    "LogConfig",
    "LongTransactionsSettings",
    "OrderItemsTable",
    "OrdersTable",
    "OutboxTable",
    "OversoldSettings",
    "ProbeDefaults",
    "ProbeSettings",
    "ProbesConfig",
    "ProductsTable",
    "RedisConfig",
    "ReservationsTable",
    "SchemaConfig",
    "ServerConfig",
    "SkuGuardConfig",
    "load_config",
    "parse_config",
]
