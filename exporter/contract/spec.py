"""The metric contract: the catalog as a machine-readable, language-neutral spec.

Built from :mod:`stocksentry.instrumentation.catalog` and ``.events`` plus each label's
allowed values and bounds; ``docs/metric-contract.json`` is it written out.

    >>> metric = next(m for m in contract()["metrics"] if m["name"] == "stock_orders_paid_total")
    >>> metric["type"], [label["name"] for label in metric["labels"]]
    ('counter', ['sku'])
"""

from __future__ import annotations

import json
from typing import Any, Final

from stocksentry.instrumentation import catalog, events
from stocksentry.instrumentation.catalog import MetricSpec
from stocksentry.instrumentation.freeze import FREEZE_SOURCES

#: Metrics an app must expose for the overview dashboard and the checkout alerts to work;
#: the others are expected once the app uses the feature (locks, idempotency ...).
REQUIRED: Final = frozenset(
    {
        catalog.RESERVATION_SUCCESS.name,
        catalog.RESERVATION_CONFLICT.name,
        catalog.RESERVATION_DURATION.name,
        catalog.ORDERS_PAID.name,
    }
)
#: Labels whose values are a closed list: (metric, label) -> the values.
ALLOWED: Final[dict[tuple[str, str], tuple[str, ...]]] = {
    (catalog.RESERVATION_CONFLICT.name, "reason"): catalog.CONFLICT_REASONS,
    (catalog.RESERVATION_DURATION.name, "outcome"): catalog.OUTCOMES,
    (catalog.LOCK_ACQUIRE_DURATION.name, "outcome"): catalog.LOCK_OUTCOMES,
    (catalog.LOCKWATCH_EVENT_COUNT.name, "event"): catalog.LOCKWATCH_EVENTS,
    (catalog.LOCKWATCH_LEASES_LOST.name, "reason"): catalog.LOCKWATCH_LOST_REASONS,
    (catalog.FREEZE_ACTION_COUNT.name, "source"): FREEZE_SOURCES,
    (catalog.FREEZE_ACTION_COUNT.name, "action"): catalog.FREEZE_ACTIONS,
}
#: Distinct values one open label may hold per metric (the SKU guard's default budget;
#: an app with promo SKUs adds them on top, see ``--max-label-values``).
MAX_VALUES: Final = 100
#: Every label value: at most this long, only these characters (the guard's sanitiser).
LABEL_MAX_LENGTH: Final = 64
LABEL_CHARSET: Final = r"[A-Za-z0-9_.:/@#+\-]"
#: The correlation fields every log line may carry (bound per request by the app).
CORRELATION_FIELDS: Final = (
    "request_id",
    "idempotency_key",
    "order_id",
    "payment_reference",
    "trace_id",
    "span_id",
)


def _label(spec: MetricSpec, name: str) -> dict[str, Any]:
    allowed = ALLOWED.get((spec.name, name))
    if allowed is not None:
        return {"name": name, "allowed": list(allowed)}
    label: dict[str, Any] = {"name": name, "max_values": MAX_VALUES}
    if name == "sku":
        label["guarded"] = True
    return label


def _metric(spec: MetricSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": spec.name,
        "type": spec.kind,
        "help": spec.help,
        "labels": [_label(spec, name) for name in spec.labels],
        "source": spec.source,
        "required": spec.name in REQUIRED,
        "samples": list(spec.sample_names),
    }
    if spec.buckets is not None:
        entry["buckets"] = list(spec.buckets)
    return entry


def contract() -> dict[str, Any]:
    """The whole contract as plain data (what ``docs/metric-contract.json`` holds)."""
    return {
        "format": "stocksentry-metric-contract",
        "version": 1,
        "label_values": {
            "max_length": LABEL_MAX_LENGTH,
            "charset": LABEL_CHARSET,
            "overflow": catalog.OVERFLOW_VALUE,
            "empty": "__empty__",
        },
        "metrics": [_metric(spec) for spec in catalog.ALL],
        "log_lines": {
            "format": "one JSON object per line: timestamp (ISO-8601), event, the event's "
            "fields, the correlation fields",
            "correlation_fields": list(CORRELATION_FIELDS),
            "events": [
                {"event": e.name, "level": e.level, "fields": list(e.fields)}
                for e in (events.STOCK_CHECK, events.STOCK_UPDATE)
            ],
        },
    }


def contract_json() -> str:
    """:func:`contract` as stable JSON text (two-space indent, final newline)."""
    return json.dumps(contract(), indent=2, ensure_ascii=False) + "\n"
