"""The chart's ``values.schema.json``, built from the exporter's config model.

``helm/sync.py`` writes it to ``helm/stocksentry/values.schema.json``. The ``config`` part
is generated from the declarative model of ``stocksentry.exporter.config`` (its field
specs: :func:`~stocksentry.exporter.config.specs.specs`): every section and key, its JSON
type, range, allowed values, pattern (durations use ``durations.DURATION_PATTERN``),
default and description come from there, so the schema cannot fall behind the exporter.
What is the chart's own knowledge stays here: the ``server`` section and the secret URLs
(``url_env`` / ``url_file`` / ``url``) are filled in by the chart and refused in values;
Helm holds numbers as float64, so integer bounds are clipped to +/- 2^53; and Helm drops
nulls, so an optional column is unmapped with ``""``.

Helm validates values against this schema on install, upgrade, template and lint, so a
typo'd key (``additionalProperties: false`` on every section), a wrong type or a value
outside an enum fails before anything reaches the cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from stocksentry.exporter.config import model, specs
from stocksentry.exporter.config.kinds import TextList
from stocksentry.exporter.durations import DURATION_PATTERN

Schema = dict[str, Any]

#: Sections of the exporter config the chart writes itself, never from values.
CHART_SECTIONS = frozenset({"server"})
#: Where the chart takes what it owns instead, for the descriptions.
CHART_NOTES = {
    "database": "Probe session settings; the URL comes from database.existingSecret.",
    "redis": "Cache settings; the URL comes from redis.existingSecret.",
}

BOOL: Schema = {"type": "boolean"}
STRING: Schema = {"type": "string", "minLength": 1}
# Helm holds numbers as float64: integers beyond 2^53 would not survive the trip.
_SAFE_INT = 2**53 - 1


def strict(properties: dict[str, Schema], *, description: str = "", **extra: Any) -> Schema:
    """An object schema that refuses keys it does not list."""
    schema: Schema = {"type": "object"}
    if description:
        schema["description"] = description
    schema.update(extra)
    schema["properties"] = properties
    schema["additionalProperties"] = False
    return schema


def key_schema(cls: type, name: str, spec: specs.Key) -> Schema:
    """The schema of one key of section ``cls``, shaped for Helm."""
    schema: Schema = {"description": spec.doc, **spec.kind.json_schema()}
    if schema.get("type") == "integer":
        schema["minimum"] = max(schema["minimum"], -_SAFE_INT)
        schema["maximum"] = min(schema["maximum"], _SAFE_INT)
    if spec.kind.null_clears:
        # Helm drops nulls: the chart's template turns "" into null for these columns.
        schema["pattern"] = f"^({schema['pattern'][1:-1]})?$"
        schema["description"] += ' ("" for not mapped)'
    if isinstance(spec.kind, TextList) and getattr(spec.kind.item, "allow_numbers", False):
        schema["description"] += "; quote numeric values: Helm would reformat them"
    if spec.inherit is not None:
        schema["description"] += f"; default: {spec.inherit}"
    elif not spec.required and spec.computed is None:
        default = specs.field_default(cls, name)
        if default is None and spec.kind.null_clears:
            schema["default"] = ""
        elif default is not None and not (isinstance(default, int) and abs(default) > _SAFE_INT):
            schema["default"] = spec.kind.json_value(default)
    return schema


def section_schema(cls: type, *, description: str = "", nullable: bool = False) -> Schema:
    """The strict object schema of one exporter section, from the model's specs."""
    properties: dict[str, Schema] = {}
    required: list[str] = []
    for name, spec in specs.specs(cls):
        if isinstance(spec, specs.UrlKeys) or name in CHART_SECTIONS:
            continue
        if isinstance(spec, specs.Section):
            sub = section_schema(
                spec.cls, description=CHART_NOTES.get(name, spec.doc), nullable=spec.optional
            )
            if spec.many:
                sub.pop("description")
                sub = {"description": spec.doc, "type": "array", "items": sub}
            properties[name] = sub
        else:
            properties[name] = key_schema(cls, name, spec)
            if spec.required:
                required.append(name)
    extra: dict[str, Any] = {"required": required} if required else {}
    schema = strict(properties, description=description, **extra)
    if nullable:
        # Optional sections: null (or leaving them out) means not configured.
        schema["type"] = ["object", "null"]
    return schema


def config_schema() -> Schema:
    """The ``config`` value: the exporter config minus what the chart owns."""
    return section_schema(
        model.ExporterConfig,
        description=(
            "The exporter config (docs/exporter-config.md) without server and URLs, "
            "which the chart fills in."
        ),
    )


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
    "pattern": f"^({DURATION_PATTERN[1:-1]})?$",
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


#: The rules the chart renders: its alert and setting names become the keys the
#: prometheusRule section accepts.
RULES_SOURCE = (
    Path(__file__).resolve().parents[1] / "alert_rules" / "source" / "stocksentry.rules.yml"
)
PROM_LABEL: Schema = {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}
#: A Prometheus label name that is not one the rules group by themselves.
LOCATION_LABEL: Schema = {
    **PROM_LABEL,
    "not": {"enum": ["instance", "job", "le", "sku", "table", "lock", "cache"]},
}
#: An http(s) URL that can sit in YAML and JSON strings as it is.
URL: Schema = {"type": "string", "pattern": '^https?://[^\\s"\\\\]+$'}


def _rule_names() -> tuple[list[str], list[str]]:
    """The alert names and the settings' keys (record name after its last ':')."""
    groups = yaml.safe_load(RULES_SOURCE.read_text(encoding="utf-8"))["groups"]
    alerts = sorted(r["alert"] for g in groups for r in g["rules"] if "alert" in r)
    settings = [
        r["record"].rsplit(":", 1)[-1]
        for g in groups
        if g["name"] == "stocksentry-settings"
        for r in g["rules"]
    ]
    return alerts, settings


def _prometheus_rule() -> Schema:
    alerts, settings = _rule_names()
    alert_name: Schema = {"enum": alerts}
    setting_values: dict[str, Schema] = {
        key: {
            "type": ["number", "string"] if key == "promo_active" else "number",
            "description": (
                "PromQL yielding one series, 1 during a promo and 0 otherwise, or a number"
                if key == "promo_active"
                else f"replaces the expression of the record ending in :{key} (vector(<n>))"
            ),
        }
        for key in settings
    }
    return strict(
        {
            "enabled": BOOL,
            "namespace": K8S_NAME,
            "additionalLabels": STRING_MAP,
            "annotations": STRING_MAP,
            "disabled": {
                "type": "object",
                "description": "Alerts left out: {AlertName: true}.",
                "propertyNames": alert_name,
                "additionalProperties": BOOL,
            },
            "additionalRuleLabels": {**STRING_MAP, "propertyNames": PROM_LABEL},
            "additionalRuleAnnotations": STRING_MAP,
            "customRules": {
                "type": "object",
                "description": "Per alert: labels, annotations, severity, for.",
                "propertyNames": alert_name,
                "additionalProperties": strict(
                    {
                        "labels": {**STRING_MAP, "propertyNames": PROM_LABEL},
                        "annotations": STRING_MAP,
                        "severity": {"type": "string", "enum": ["critical", "warning", "info"]},
                        "for": PROM_DURATION,
                    }
                ),
            },
            "settings": strict(setting_values),
        }
    )


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
                "compactDeadWorkers": BOOL,
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
        "scrapeJob": {"type": "string", "pattern": '^[^"\\\\]+$'},
        "locationLabels": {
            "type": "array",
            "items": LOCATION_LABEL,
            "minItems": 1,
            "uniqueItems": True,
        },
        "links": strict(
            {
                # Empty by default: required (templates/validate.yaml) with the rules or
                # the dashboards, whose runbook links would otherwise lead nowhere.
                "runbookBaseUrl": {"type": "string", "pattern": '^(https?://[^\\s"\\\\]+)?$'},
                "dashboardBaseUrl": {"type": "string", "pattern": '^(https?://[^\\s"\\\\]+)?$'},
            },
            required=["runbookBaseUrl"],
        ),
        "prometheusRule": _prometheus_rule(),
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
