"""The sidecar's YAML configuration, loaded into a strict, typed, immutable model.

Every section is a frozen dataclass. Unknown keys are refused at every level, values are
checked for type, range and allowed values, and every error is one :class:`ConfigError`
whose message names the file, the line and the dotted key path::

    config.yaml:12: probes.oversold.interval: expected a duration like "5s", got "fast"

Secrets (database and Redis URLs) come from an environment variable (``url_env``) or a
file (``url_file``) named in the config and are resolved at load; they live in
:class:`Secret` wrappers that never show their value in ``repr()`` or ``str()``. A
literal ``url:`` is accepted only without a password. Durations use the one grammar of
:mod:`stocksentry.exporter.durations` (Prometheus's).

The package, one role per module:

- :mod:`.model`: the declarative model. Every key, its kind, default, range, allowed
  values and doc string is written once, in the dataclass field's metadata;
- :mod:`.kinds`: how a value of each kind is read from YAML, documented and schema'd;
- :mod:`.yamlsource`: the YAML node reader (lines kept, no tag ever constructed), shared
  with :mod:`stocksentry.exporter.webconfig`;
- :mod:`.loader`: YAML to model, through the specs, plus the rules that relate keys;
- :mod:`.env`: secret URLs and the multiprocess directory from the environment;
- :mod:`.reference`: the key reference of ``docs/exporter-config.md``, generated.

Why a model of our own (dataclass field metadata) rather than pydantic 2: every error
message users see is ours and asserted by tests (``must be at most 10m, got 33m20s``, a
"did you mean" for unknown keys, the line of the value), and YAML must be read as written
(``007`` stays the SKU ``"007"``, ``!!bool maybe`` is an error, not a value): with
pydantic every field would need its own validator and every error its message rewritten,
on top of an adapter from an error's ``loc`` to the YAML node, which is more code than the
small generic walk in :mod:`.loader` that reads the YAML nodes directly, where the lines
are. The chart's JSON schema must be shaped for Helm anyway (float64 integers, chart-owned
keys, ``""`` for an unmapped column), so pydantic's generator would not be used as is.
And the sidecar's install stays as it is: no new dependency, and no import cost (pydantic
2.14 measured ~115 ms to import and build a model of this size, ``python -X importtime``
says ~40-55 ms for ``import pydantic`` alone, where this package adds a few ms).

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

from stocksentry.instrumentation.secrets import Secret

from ..durations import format_duration, parse_duration
from .errors import ConfigError
from .loader import load_config, parse_config
from .model import (
    BUILTIN_PROBES,
    DEFAULT_ADVISORY_LOCK_KEY,
    ELECTION_PROBE,
    CacheDriftSettings,
    CustomProbe,
    DatabaseConfig,
    DuplicateOrdersSettings,
    ExporterConfig,
    LockWatchConfig,
    LogConfig,
    LongTransactionsSettings,
    OrderItemsTable,
    OrdersTable,
    OutboxTable,
    OversoldSettings,
    ProbeDefaults,
    ProbesConfig,
    ProbeSettings,
    ProductsTable,
    RedisConfig,
    ReservationsTable,
    SchemaConfig,
    ServerConfig,
    SkuGuardConfig,
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
    "Secret",
    "ServerConfig",
    "SkuGuardConfig",
    "format_duration",
    "load_config",
    "parse_config",
    "parse_duration",
]
