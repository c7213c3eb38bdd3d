"""The chart's ``values.schema.json``, built from the exporter's config model.

``helm/sync.py`` writes it to ``helm/stocksentry/values.schema.json``. The ``config`` part
mirrors ``stocksentry.exporter.config``: its sections and keys are read from the model
(the key lists the loader accepts, the table dataclasses, ``BUILTIN_PROBES``, the
``Literal`` of ``oversold.scope``), and each key gets its JSON type from the tables
below. A key the model gains without a type here stops the build with its name, so the
schema cannot silently fall behind the exporter. Keys the chart fills in itself (the
``server`` section, ``url_env`` / ``url_file`` / ``url``) are refused in values.

Helm validates values against this schema on install, upgrade, template and lint, so a
typo'd key (``additionalProperties: false`` on every section), a wrong type or a value
outside an enum fails before anything reaches the cluster.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from stocksentry.exporter import config as model

Schema = dict[str, Any]

#: The keys of the exporter config the chart sets itself, never from values.
CHART_OWNED: dict[str, frozenset[str]] = {
    "server": frozenset(model._SERVER_KEYS),
    "database": frozenset({"url_env", "url_file", "url"}),
    "redis": frozenset({"url_env", "url_file", "url"}),
}

_IDENT = "[A-Za-z_][A-Za-z0-9_$]{0,62}"
DURATION: Schema = {
    "description": 'Seconds, or a duration string like "500ms", "5s", "1m30s".',
    "type": ["number", "string"],
    "minimum": 0,
    "pattern": r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$",
}
IDENTIFIER: Schema = {"type": "string", "pattern": f"^{_IDENT}$"}
TABLE: Schema = {"type": "string", "pattern": rf"^{_IDENT}(\.{_IDENT})?$"}
OPTIONAL_COLUMN: Schema = {
    "description": 'A column name, or "" for not mapped.',
    "type": "string",
    "pattern": f"^({_IDENT})?$",
}
NAMES: Schema = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "uniqueItems": True,
}
BOOL: Schema = {"type": "boolean"}
STRING: Schema = {"type": "string", "minLength": 1}
# Helm holds numbers as float64: integers beyond 2^53 would not survive the trip.
_SAFE_INT = 2**53 - 1

#: JSON type of each exporter key, by section (the model says which keys exist).
CONFIG_TYPES: dict[str, dict[str, Schema]] = {
    "sku_guard": {
        "promo_skus": {**NAMES, "description": "Quote numeric SKUs: Helm would reformat them."},
        "max_skus": {"type": "integer", "minimum": 0, "maximum": 10_000},
    },
    "database": {
        "statement_timeout": DURATION,
        "lock_timeout": DURATION,
        "connect_timeout": DURATION,
        "leader_election": BOOL,
        "advisory_lock_key": {"type": "integer", "minimum": -_SAFE_INT, "maximum": _SAFE_INT},
        "leader_retry_interval": DURATION,
        "max_connections": {"type": "integer", "minimum": 1, "maximum": 32},
        "application_name": STRING,
    },
    "schema.products": {
        "table": TABLE,
        "id": IDENTIFIER,
        "sku": IDENTIFIER,
        "stock": IDENTIFIER,
        "allocation": OPTIONAL_COLUMN,
    },
    "schema.orders": {
        "table": TABLE,
        "id": IDENTIFIER,
        "status": IDENTIFIER,
        "paid_statuses": {**NAMES, "minItems": 1},
        "external_ref": OPTIONAL_COLUMN,
        "idempotency_key": OPTIONAL_COLUMN,
        "created_at": IDENTIFIER,
    },
    "schema.order_items": {
        "table": TABLE,
        "order_id": IDENTIFIER,
        "product_id": IDENTIFIER,
        "quantity": IDENTIFIER,
    },
    "schema.reservations": {
        "table": TABLE,
        "expires_at": IDENTIFIER,
        "released_at": IDENTIFIER,
        "status": IDENTIFIER,
        "held_statuses": NAMES,
    },
    "schema.outbox": {
        "table": TABLE,
        "created_at": IDENTIFIER,
        "published_at": IDENTIFIER,
    },
    "redis": {
        "key_template": {"type": "string", "pattern": r"^[^{}]*\{sku\}[^{}]*$"},
        "tolerance": {"type": "integer", "minimum": 0, "maximum": 2**31},
        "grace": DURATION,
    },
    "probe": {"enabled": BOOL, "interval": DURATION, "timeout": DURATION},
    "probe.extra": {"window": DURATION, "threshold": DURATION},
    "probes.custom": {
        "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,62}$"},
        "sql": STRING,
        "metric": {"type": "string", "pattern": "^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
        "help": STRING,
        "value_column": STRING,
        "label_columns": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
            "uniqueItems": True,
        },
        "interval": DURATION,
        "timeout": DURATION,
        "max_series": {"type": "integer", "minimum": 1, "maximum": 10_000},
    },
}


class SchemaDriftError(Exception):
    """The exporter's model has a key this schema does not type (or the reverse)."""


def strict(properties: dict[str, Schema], *, description: str = "", **extra: Any) -> Schema:
    """An object schema that refuses keys it does not list."""
    schema: Schema = {"type": "object"}
    if description:
        schema["description"] = description
    schema.update(extra)
    schema["properties"] = properties
    schema["additionalProperties"] = False
    return schema


def _section(name: str, keys: typing.Iterable[str], *, description: str = "") -> Schema:
    """The strict object schema of one exporter section, typed from ``CONFIG_TYPES``."""
    owned = CHART_OWNED.get(name, frozenset())
    types = CONFIG_TYPES[name]
    wanted = [key for key in keys if key not in owned]
    untyped = [key for key in wanted if key not in types]
    unknown = sorted(set(types) - set(wanted))
    if untyped or unknown:
        raise SchemaDriftError(
            f"config.{name}: the exporter model and helm/values_schema.py disagree; "
            f"keys without a type here: {untyped}, typed keys the model lacks: {unknown}"
        )
    return strict({key: types[key] for key in wanted}, description=description)


def _fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def config_schema() -> Schema:
    """The ``config`` value: the exporter config minus what the chart owns."""
    if set(model._TOP_KEYS) != {"server", *(s for s in _CONFIG_SECTIONS)}:
        raise SchemaDriftError(
            f"config: the exporter's top-level sections {model._TOP_KEYS} changed; "
            "update helm/values_schema.py"
        )
    tables = {
        "products": model.ProductsTable,
        "orders": model.OrdersTable,
        "order_items": model.OrderItemsTable,
        "reservations": model.ReservationsTable,
        "outbox": model.OutboxTable,
    }
    if list(tables) != _fields(model.SchemaConfig):
        raise SchemaDriftError("config.schema: the exporter's tables changed")
    schema_sections = {
        table: _section(f"schema.{table}", _fields(cls)) for table, cls in tables.items()
    }
    for optional in ("reservations", "outbox"):
        # Optional tables: null (or leaving them out) means not mapped, the probe is off.
        schema_sections[optional]["type"] = ["object", "null"]

    scope = typing.get_args(typing.get_type_hints(model.OversoldSettings)["scope"])
    extra_types = {**CONFIG_TYPES["probe.extra"], "scope": {"type": "string", "enum": list(scope)}}
    probes: dict[str, Schema] = {
        "defaults": strict({"interval": DURATION, "timeout": DURATION}),
    }
    for name in model.BUILTIN_PROBES:
        properties = {key: CONFIG_TYPES["probe"][key] for key in model._PROBE_KEYS}
        for key in model._PROBE_EXTRA.get(name, ()):
            if key not in extra_types:
                raise SchemaDriftError(f"config.probes.{name}.{key} has no type here")
            properties[key] = extra_types[key]
        probes[name] = strict(properties)
    custom = _section("probes.custom", model._CUSTOM_KEYS)
    custom["required"] = ["name", "sql", "metric"]
    probes["custom"] = {"type": "array", "items": custom}

    return strict(
        {
            "sku_guard": _section("sku_guard", _fields(model.SkuGuardConfig)),
            "database": _section(
                "database",
                model._DATABASE_KEYS,
                description="Probe session settings; the URL comes from database.existingSecret.",
            ),
            "schema": strict(schema_sections),
            "redis": _section(
                "redis",
                model._REDIS_KEYS,
                description="Cache settings; the URL comes from redis.existingSecret.",
            ),
            "probes": strict(probes),
        },
        description=(
            "The exporter config (docs/exporter-config.md) without server and URLs, "
            "which the chart fills in."
        ),
    )


_CONFIG_SECTIONS = ("sku_guard", "database", "schema", "redis", "probes")

# --- the chart's own values ------------------------------------------------------------

STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
ANY_OBJECT: Schema = {"type": "object"}
ANY_LIST: Schema = {"type": "array", "items": {"type": "object"}}
K8S_NAME: Schema = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$",
}
LABEL_VALUE: Schema = {
    "type": "string",
    "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
LABEL_KEY: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": 316,
    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
}
ENV_NAME: Schema = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
SECRET_KEY: Schema = {"type": "string", "pattern": r"^[-._a-zA-Z0-9]+$", "maxLength": 253}
PORT: Schema = {"type": "integer", "minimum": 1, "maximum": 65535}
PROM_DURATION: Schema = {
    "description": 'A Prometheus duration ("30s", "1m"), or "" for the Prometheus default.',
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
    r"(([0-9]+)s)?(([0-9]+)ms)?)$",
}
INT_OR_PERCENT: Schema = {
    "type": ["integer", "string"],
    "minimum": 0,
    "pattern": "^[0-9]+%$",
}
QUANTITIES: Schema = {
    "type": "object",
    "additionalProperties": {"type": ["string", "number"]},
}
PROBE_TIMING: Schema = strict(
    {
        key: {"type": "integer", "minimum": 0 if key == "initialDelaySeconds" else 1}
        for key in (
            "initialDelaySeconds",
            "periodSeconds",
            "timeoutSeconds",
            "failureThreshold",
            "successThreshold",
        )
    },
    description="Timings only: the chart sets the HTTP path, port and scheme.",
)


def _secret_ref(what: str) -> Schema:
    return strict(
        {
            "enabled": BOOL,
            "existingSecret": {
                **K8S_NAME,
                "description": f'Secret holding the {what} URL; "" for "<fullname>-{what}".',
            },
            "secretKey": SECRET_KEY,
            "envName": ENV_NAME,
        }
    )


def _monitor(*, pod: bool) -> Schema:
    properties: dict[str, Schema] = {"enabled": BOOL}
    if pod:
        properties["selector"] = {
            **STRING_MAP,
            "description": "mode: sidecar only: matchLabels of the application's pods.",
            "propertyNames": LABEL_KEY,
        }
    properties.update(
        {
            "namespace": K8S_NAME,
            "additionalLabels": STRING_MAP,
            "annotations": STRING_MAP,
            "interval": PROM_DURATION,
            "scrapeTimeout": PROM_DURATION,
            "scheme": {"type": "string", "enum": ["", "http", "https"]},
            "tlsConfig": ANY_OBJECT,
            "basicAuth": ANY_OBJECT,
            "honorLabels": BOOL,
            "relabelings": ANY_LIST,
            "metricRelabelings": ANY_LIST,
        }
    )
    return strict(properties)


def values_schema() -> Schema:
    """The whole ``values.schema.json``."""
    properties: dict[str, Schema] = {
        "global": {"type": "object", "description": "Set by Helm for umbrella charts."},
        "mode": {"type": "string", "enum": ["prober", "sidecar"]},
        "nameOverride": {"type": "string", "maxLength": 63},
        "fullnameOverride": {"type": "string", "maxLength": 63},
        "namespaceOverride": {"type": "string", "maxLength": 63},
        "commonLabels": STRING_MAP,
        "image": strict(
            {
                "repository": STRING,
                "tag": {"type": "string", "pattern": r"^([\w][\w.-]{0,127})?$"},
                "digest": {"type": "string", "pattern": "^(sha256:[a-f0-9]{64})?$"},
                "pullPolicy": {"type": "string", "enum": ["Always", "IfNotPresent", "Never"]},
            },
            required=["repository"],
        ),
        "imagePullSecrets": {
            "type": "array",
            "items": strict({"name": {**K8S_NAME, "minLength": 1}}, required=["name"]),
        },
        "port": PORT,
        "database": _secret_ref("database"),
        "redis": _secret_ref("redis"),
        "config": config_schema(),
        "webConfig": strict(
            {"existingSecret": K8S_NAME, "fileKey": SECRET_KEY, "tls": BOOL},
        ),
        "sidecar": strict(
            {
                "multiprocessDir": {"type": "string", "pattern": "^/[^\\s]*$"},
                "multiprocessSizeLimit": {
                    "type": "string",
                    "pattern": r"^([0-9]+(\.[0-9]+)?(Ki|Mi|Gi|K|M|G)?)?$",
                },
                "checkWorkerPids": BOOL,
                "portName": {
                    "type": "string",
                    "maxLength": 15,
                    "pattern": "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
                },
            }
        ),
        "replicaCount": {"type": "integer", "minimum": 1},
        "revisionHistoryLimit": {"type": "integer", "minimum": 0},
        "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
        "serviceAccount": strict(
            {"create": BOOL, "name": K8S_NAME, "annotations": STRING_MAP},
        ),
        "podAnnotations": STRING_MAP,
        "podLabels": STRING_MAP,
        "podSecurityContext": ANY_OBJECT,
        "containerSecurityContext": ANY_OBJECT,
        "resources": strict(
            {"requests": QUANTITIES, "limits": QUANTITIES, "claims": ANY_LIST},
        ),
        "livenessProbe": PROBE_TIMING,
        "readinessProbe": PROBE_TIMING,
        "priorityClassName": {"type": "string"},
        "nodeSelector": STRING_MAP,
        "tolerations": ANY_LIST,
        "affinity": ANY_OBJECT,
        "topologySpreadConstraints": ANY_LIST,
        "service": strict(
            {
                "enabled": BOOL,
                "type": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                "port": PORT,
                "annotations": STRING_MAP,
                "labels": STRING_MAP,
            }
        ),
        "podDisruptionBudget": strict(
            {
                "enabled": BOOL,
                "minAvailable": INT_OR_PERCENT,
                "maxUnavailable": INT_OR_PERCENT,
            }
        ),
        "networkPolicy": strict(
            {"enabled": BOOL, "ingressFrom": ANY_LIST, "egress": ANY_LIST},
        ),
        "serviceMonitor": _monitor(pod=False),
        "podMonitor": _monitor(pod=True),
        "prometheusRule": strict(
            {
                "enabled": BOOL,
                "namespace": K8S_NAME,
                "additionalLabels": STRING_MAP,
                "annotations": STRING_MAP,
            }
        ),
        "dashboards": strict(
            {
                "enabled": BOOL,
                "namespace": K8S_NAME,
                "label": LABEL_KEY,
                "labelValue": LABEL_VALUE,
                "folder": {"type": "string"},
                "folderAnnotation": LABEL_KEY,
                "additionalLabels": STRING_MAP,
                "annotations": STRING_MAP,
            }
        ),
    }
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "stocksentry chart values",
        "description": "Generated by helm/sync.py from helm/values_schema.py; do not edit.",
        **strict(properties, required=["mode", "image", "port", "config"]),
    }
