"""The metric catalog: every metric stocksentry emits, defined once.

Everything else (the recording API, the exporter's probes, dashboards, alert-rule tests and
docs) refers to these specs, so a rename breaks the build instead of leaving an empty panel.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, get_args

MetricKind = Literal["counter", "gauge", "histogram"]
Source = Literal["app", "probe", "exporter"]
# prometheus_client's multiprocess modes for gauges (``mostrecent`` unless a spec names one).
MultiprocessMode = Literal[
    "all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum", "mostrecent"
]

#: Reasons a reservation did not succeed without an error (DESIGN: conflict reasons).
ConflictReason = Literal[
    "out_of_stock",
    "lost_race",
    "lock_timeout",
    "lock_not_acquired",
    "deadlock",
    "serialization_failure",
    "frozen",
]
#: Every outcome a reservation can end with; ``error`` is an exception from the app.
Outcome = Literal["success", ConflictReason, "error"]
# The tuples are read from the Literals (typing flattens the nested one), so the type the
# recording API checks and the values the metrics, docs and rules use are one list.
CONFLICT_REASONS: tuple[str, ...] = get_args(ConflictReason)
OUTCOMES: tuple[str, ...] = get_args(Outcome)
#: The outcomes of a distributed lock acquire (``stock_lock_acquire_duration_seconds``).
LOCK_OUTCOMES: tuple[str, ...] = ("acquired", "timeout", "error")

#: The value a bounded label folds into once its budget is spent.
OVERFLOW_VALUE = "__other__"
#: The ``sku`` label of a reservation or order the app gave no usable SKU for (``None``,
#: bytes that are not UTF-8): recorded under this value and counted as an ``api`` error.
UNKNOWN_SKU = "__unknown__"

# Reservations in a healthy checkout take milliseconds; a lock queue at promo start can take
# seconds. The buckets cover both ends so that p99 is meaningful in either regime.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# Hold time over TTL: anything at or above 1.0 means the lock expired while held.
HOLD_RATIO_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.5, 2.0, 5.0)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric of the catalog.

    ``name`` is the name as exposed in the Prometheus text format (counters end in
    ``_total``); :attr:`base_name` is what prometheus_client's constructors take.
    """

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    source: Source = "app"
    buckets: tuple[float, ...] | None = None
    multiprocess_mode: MultiprocessMode | None = None
    exemplars: bool = False

    def __post_init__(self) -> None:
        # A gauge is one process's latest reading unless its spec says otherwise.
        if self.kind == "gauge" and self.multiprocess_mode is None:
            object.__setattr__(self, "multiprocess_mode", "mostrecent")

    @property
    def base_name(self) -> str:
        """The name without the ``_total`` suffix that prometheus_client adds to counters."""
        if self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    @property
    def sample_names(self) -> tuple[str, ...]:
        """The sample names this metric produces in the text exposition format."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_count", f"{self.name}_sum")
        return (self.name,)


#: A metric the exporter's probes compute; one of the exporter's own health.
_probe = functools.partial(MetricSpec, source="probe")
_exporter = functools.partial(MetricSpec, source="exporter")


# --- recorded by the app (instrumentation) -------------------------------------------------

RESERVATION_SUCCESS = MetricSpec(
    "stock_reservation_success_total",
    "counter",
    "Stock reservations that succeeded.",
    ("sku", "strategy"),
)
RESERVATION_CONFLICT = MetricSpec(
    "stock_reservation_conflict_total",
    "counter",
    "Stock reservations refused by a conflict (out_of_stock, lost_race, lock_timeout, "
    "lock_not_acquired, deadlock, serialization_failure; frozen: the SKU is frozen).",
    ("sku", "reason"),
)
RESERVATION_DURATION = MetricSpec(
    "stock_reservation_duration_seconds",
    "histogram",
    "Duration of stock reservations by outcome.",
    ("outcome",),
    buckets=LATENCY_BUCKETS,
    exemplars=True,
)
ORDERS_PAID = MetricSpec(
    "stock_orders_paid_total", "counter", "Orders confirmed as paid.", ("sku",)
)
REFUND_DUE_TO_OVERSELL = MetricSpec(
    "stock_refund_due_to_oversell_total",
    "counter",
    "Paid orders refunded because the stock was not there (oversell).",
    ("sku",),
)
INVENTORY_NEGATIVE = MetricSpec(
    "stock_inventory_negative_total",
    "counter",
    "Stock writes that left the stock below zero.",
    ("sku",),
)
IDEMPOTENCY_REPLAY = MetricSpec(
    "stock_idempotency_replay_total",
    "counter",
    "Requests answered from a stored result because their idempotency key was seen before.",
    ("operation",),
)
IDEMPOTENCY_CONFLICT = MetricSpec(
    "stock_idempotency_conflict_total",
    "counter",
    "Requests that reused an idempotency key with a different payload.",
    ("operation",),
)
CACHE_STALE_HIT = MetricSpec(
    "stock_cache_stale_hit_total",
    "counter",
    "Stock decisions taken on a cached value that the database contradicted.",
    ("cache",),
)
DB_LOCK_WAIT = MetricSpec(
    "stock_db_lock_wait_duration_seconds",
    "histogram",
    "Duration of locking statements on stock tables.",
    ("table",),
    buckets=LATENCY_BUCKETS,
    exemplars=True,
)
DB_DEADLOCK = MetricSpec(
    "stock_db_deadlock_total", "counter", "Deadlocks reported by the database.", ("table",)
)
DB_SERIALIZATION_FAILURE = MetricSpec(
    "stock_db_serialization_failure_total",
    "counter",
    "Serialization failures reported by the database.",
    ("table",),
)
UNSAFE_READ_MODIFY_WRITE = MetricSpec(
    "stock_unsafe_read_modify_write_total",
    "counter",
    "Unlocked read of a stock column followed by a write of a value computed outside SQL.",
    ("table",),
)
LOCK_ACQUIRE_DURATION = MetricSpec(
    "stock_lock_acquire_duration_seconds",
    "histogram",
    "Time spent acquiring a distributed lock, by outcome.",
    ("lock", "outcome"),
    buckets=LATENCY_BUCKETS,
)
LOCK_HOLD_RATIO = MetricSpec(
    "stock_lock_hold_ratio",
    "histogram",
    "Distributed lock hold time divided by its TTL (1.0 and above: expired while held).",
    ("lock",),
    buckets=HOLD_RATIO_BUCKETS,
)
LOCK_EXPIRED_WHILE_HELD = MetricSpec(
    "stock_lock_expired_while_held_total",
    "counter",
    "Distributed locks whose TTL ran out while the holder was still working.",
    ("lock",),
)
LOCK_STALE_FENCING_TOKEN = MetricSpec(
    "stock_lock_stale_fencing_token_total",
    "counter",
    "Writes carrying a fencing token below one already written for the row: a holder whose "
    "lock had run out (refused by the database when the UPDATE compares the token).",
    ("lock", "table"),
)
LOCK_RELEASE_NOT_OWNED = MetricSpec(
    "stock_lock_release_not_owned_total",
    "counter",
    "Releases of a distributed lock that the releaser no longer owned.",
    ("lock",),
)
LOCK_EXTEND_FAILURES = MetricSpec(
    "stock_lock_extend_failures_total",
    "counter",
    "Distributed lock extensions refused: the lock was no longer owned or could not be "
    "extended again.",
    ("lock",),
)
LOCK_ACQUIRE_RETRIES = MetricSpec(
    "stock_lock_acquire_retries_total",
    "counter",
    "Distributed lock acquire attempts after the first one.",
    ("lock",),
)
# --- computed by the exporter's probes -----------------------------------------------------

NEGATIVE_INVENTORY_SKUS = _probe(
    "stock_inventory_negative_skus", "gauge", "SKUs whose stock is below zero."
)
NEGATIVE_INVENTORY_UNITS = _probe(
    "stock_inventory_negative_units", "gauge", "Units below zero summed over all SKUs."
)
NEGATIVE_INVENTORY_SKU_UNITS = _probe(
    "stock_inventory_negative_sku_units",
    "gauge",
    "Units below zero of each of the SKUs lowest below zero (the rest summed under "
    "__other__); promo SKUs always, at 0 when not below zero.",
    ("sku",),
)
OVERSOLD_UNITS = _probe(
    "stock_oversold_units",
    "gauge",
    "Paid units beyond the SKU's inventory for the sale.",
    ("sku",),
)
DUPLICATE_ORDER_KEYS = _probe(
    "stock_duplicate_order_keys",
    "gauge",
    "Idempotency keys or external references with more than one order in the window.",
)
DUPLICATE_ORDER_SKU_KEYS = _probe(
    "stock_duplicate_order_sku_keys",
    "gauge",
    "Keys with more than one order in the window among whose orders' items the SKU is, "
    "for the SKUs with the most such keys (the rest summed under __other__).",
    ("sku",),
)
DB_LOCK_WAITERS = _probe(
    "stock_db_lock_waiters", "gauge", "Sessions currently waiting for a lock."
)
DB_LOCK_WAIT_MAX = _probe("stock_db_lock_wait_max_seconds", "gauge", "Longest current lock wait.")
DB_DEADLOCKS = _probe(
    "stock_db_server_deadlock_total",
    "counter",
    "Deadlocks since the database statistics were reset (pg_stat_database).",
    ("database",),
)
DB_LONG_TRANSACTIONS = _probe(
    "stock_db_long_transactions",
    "gauge",
    "Transactions open longer than the threshold that hold locks on stock tables.",
)
DB_LONG_TRANSACTION_MAX = _probe(
    "stock_db_long_transaction_max_seconds",
    "gauge",
    "Age of the oldest transaction holding locks on stock tables (0 when none is over the "
    "threshold).",
)
RESERVATIONS_EXPIRED_UNRELEASED = _probe(
    "stock_reservations_expired_unreleased",
    "gauge",
    "Reservations past their expiry whose stock was not given back.",
)
OUTBOX_PENDING = _probe("stock_outbox_pending_events", "gauge", "Outbox events not yet published.")
OUTBOX_LAG = _probe(
    "stock_outbox_lag_seconds", "gauge", "Age of the oldest unpublished outbox event."
)
OUTBOX_STUCK = _probe(
    "stock_outbox_stuck_events",
    "gauge",
    "Outbox events unpublished for longer than the configured publish latency.",
)
OUTBOX_MAX_PUBLISH_LATENCY = _probe(
    "stock_outbox_max_publish_latency_seconds",
    "gauge",
    "The publish latency the outbox probe is configured with (the alert's threshold).",
)
CACHE_DRIFT_SKUS = _probe(
    "stock_cache_drift_skus",
    "gauge",
    "SKUs whose cached stock differs from the database beyond tolerance and grace.",
    ("cache",),
)
CACHE_DRIFT_SKU_UNITS = _probe(
    "stock_cache_drift_sku_units",
    "gauge",
    "Units between the cached and the database stock of each of the SKUs drifting the "
    "most beyond tolerance and grace (+Inf: the cached value is not a number; the rest "
    "summed under __other__); every compared SKU always, at 0 when not drifting.",
    ("cache", "sku"),
)

# --- the exporter's own health -------------------------------------------------------------

PROBE_UP = _exporter(
    "stocksentry_probe_up",
    "gauge",
    "1 when the probe's last run succeeded, 0 otherwise.",
    ("probe",),
)
PROBE_DURATION = _exporter(
    "stocksentry_probe_duration_seconds", "gauge", "Duration of the probe's last run.", ("probe",)
)
PROBE_LAST_SUCCESS = _exporter(
    "stocksentry_probe_last_success_timestamp_seconds",
    "gauge",
    "Unix time of the probe's last successful run.",
    ("probe",),
)

PROBE_LEADER = _exporter(
    "stocksentry_probe_leader",
    "gauge",
    "1 when this exporter runs the database probes (it holds the advisory lock), 0 otherwise.",
)
COLLECTOR_ERRORS = _exporter(
    "stocksentry_collector_errors_total",
    "counter",
    "Scrapes in which a collector was left out because its collect() raised, its output "
    "could not be encoded, or it repeated a metric family another collector had already "
    "exposed.",
    ("collector",),
)
MULTIPROCESS_FILES_SKIPPED = _exporter(
    "stocksentry_multiprocess_files_skipped_total",
    "counter",
    "Multiprocess files skipped while merging a scrape because they were truncated, "
    "corrupt, unreadable or badly named; counted once per scrape that skipped them.",
    ("reason",),
)
MULTIPROCESS_FILES = _exporter(
    "stocksentry_multiprocess_files", "gauge", "Multiprocess files merged into the last scrape."
)
BUILD_INFO = _exporter(
    "stocksentry_build_info",
    "gauge",
    "Always 1; its labels say which build of the exporter runs: the package version, the "
    "source revision (unknown when the build did not record it) and the Python version.",
    ("version", "revision", "python_version"),
)

INSTRUMENTATION_ERRORS = MetricSpec(
    "stocksentry_instrumentation_errors_total",
    "counter",
    "Failures inside stocksentry's instrumentation (swallowed, never raised into the app).",
    ("component",),
)
LABEL_OVERFLOW = MetricSpec(
    "stocksentry_label_overflow_total",
    "counter",
    "Label values folded into __other__ because the label's series budget was spent.",
    ("metric",),
)

# --- computed by the exporter's Redis lock watcher --------------------------------------------
# The watcher also exports stock_lock_hold_ratio, stock_lock_expired_while_held_total and
# stock_lock_release_not_owned_total above, with the same meaning and labels, so the lock
# alerts and panels work for apps that run no stocksentry code (docs/lockwatch.md).

#: The ``event`` values of ``stocksentry_lockwatch_events_total``.
LOCKWATCH_EVENTS: tuple[str, ...] = (
    "set",
    "expire",
    "persist",
    "del",
    "expired",
    "evicted",
    "other",
)
#: The ``reason`` values of ``stocksentry_lockwatch_leases_lost_total``.
LOCKWATCH_LOST_REASONS: tuple[str, ...] = ("disconnect", "tracked_limit", "end_unseen", "evicted")

LOCK_ACQUISITIONS = _probe(
    "stock_lock_acquisitions_total",
    "counter",
    "Distributed lock acquisitions seen by the Redis lock watcher (a SET of a watched key).",
    ("lock",),
)
LOCKWATCH_EVENT_COUNT = _exporter(
    "stocksentry_lockwatch_events_total",
    "counter",
    "Keyspace notifications of watched lock keys received by the lock watcher, by event.",
    ("event",),
)
LOCKWATCH_CONNECTED = _exporter(
    "stocksentry_lockwatch_connected",
    "gauge",
    "1 while the lock watcher is subscribed to Redis keyspace notifications, 0 otherwise.",
)
LOCKWATCH_NOTIFICATIONS = _exporter(
    "stocksentry_lockwatch_notifications_enabled",
    "gauge",
    "1 when Redis's notify-keyspace-events holds the flags the lock watcher needs, 0 when "
    "it lacks one; absent when CONFIG GET is refused.",
)
LOCKWATCH_RECONNECTS = _exporter(
    "stocksentry_lockwatch_reconnects_total",
    "counter",
    "Times the lock watcher subscribed again after losing its Redis connection.",
)
LOCKWATCH_DISCONNECTED_SECONDS = _exporter(
    "stocksentry_lockwatch_disconnected_seconds_total",
    "counter",
    "Seconds the lock watcher was not subscribed after its first subscription: keyspace "
    "notifications of that time are lost.",
)
LOCKWATCH_LEASES_LOST = _exporter(
    "stocksentry_lockwatch_leases_lost_total",
    "counter",
    "Lock leases the watcher stopped following before seeing their end (disconnect, "
    "tracked_limit, end_unseen, evicted): their hold time and release are not counted.",
    ("reason",),
)

# --- containment: per-SKU freezes (docs/containment.md) ------------------------------------

#: The ``action`` values of ``stocksentry_freeze_actions_total``: a freeze made, lifted or run
#: out; one the webhook would have made in dry run, or refused past its blast-radius limit.
FREEZE_ACTIONS: tuple[str, ...] = ("freeze", "unfreeze", "expire", "dry_run", "over_limit")

SKU_FROZEN = _exporter(
    "stocksentry_sku_frozen",
    "gauge",
    "1 for each SKU frozen now (checkouts honouring the freeze refuse it), read from Redis "
    "by the sidecar.",
    ("sku",),
)
FREEZE_ACTION_COUNT = _exporter(
    "stocksentry_freeze_actions_total",
    "counter",
    "Freeze changes seen by the sidecar, by who made them (person, alert) and action "
    "(freeze, unfreeze, expire, dry_run, over_limit).",
    ("source", "action"),
)

#: Every metric, in catalog order (the order of definition above).
ALL: tuple[MetricSpec, ...] = tuple(
    v for v in list(globals().values()) if isinstance(v, MetricSpec)
)

#: Metrics recorded inside the app.
APP: tuple[MetricSpec, ...] = tuple(m for m in ALL if m.source == "app")

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in ALL}


def sample_names() -> frozenset[str]:
    """Every sample name the catalog can produce (for checking dashboards and rules)."""
    return frozenset(s for m in ALL for s in m.sample_names)


def markdown_table() -> str:
    """The catalog as the Markdown table of ``docs/metrics.md`` (``make generate``)."""
    rows = [
        "| metric | type | labels | source | help |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in ALL:
        kind = f"{m.kind} (exemplars)" if m.exemplars else m.kind
        labels = ", ".join(m.labels) if m.labels else "—"
        rows.append(f"| `{m.name}` | {kind} | {labels} | {m.source} | {m.help} |")
    return "\n".join(rows) + "\n"
