"""stocksentry's instrumentation for checkout applications.

Record reservations, paid orders, refunds due to oversell, idempotency replays and stale
cache decisions as Prometheus metrics, JSON log lines and OpenTelemetry spans::

    from stocksentry.instrumentation import configure, reservation

    configure(promo_skus=["EGG-01"])
    with reservation("EGG-01", strategy="atomic") as r:
        r.success(old_stock=1, new_stock=0)

Importing this package pulls in prometheus-client, opentelemetry-api and structlog only.
The SQLAlchemy integration lives in :mod:`stocksentry.instrumentation.sqlalchemy` (the
``sqlalchemy`` extra).
"""

from __future__ import annotations

from .api import (
    configure,
    get_sentry,
    payment_callback,
    record_idempotency_conflict,
    record_idempotency_replay,
    record_negative_inventory,
    record_paid_order,
    record_refund_due_to_oversell,
    record_reservation,
    record_stale_cache_hit,
    reservation,
    reserves,
)
from .catalog import (
    CONFLICT_REASONS,
    OUTCOMES,
    OVERFLOW_VALUE,
    ConflictReason,
    MetricSpec,
    Outcome,
)
from .freezeview import FreezeSettings, FreezeView
from .guard import LabelGuard, sanitize_label_value
from .metrics import StockMetrics
from .outcomes import ReservationConflict, SkuFrozen, classify_exception
from .payment import PaymentCallback
from .reservation import Reservation, current_reservation
from .sentry import Sentry
from .tracing import configure_tracing

__all__ = [
    "CONFLICT_REASONS",
    "OUTCOMES",
    "OVERFLOW_VALUE",
    "ConflictReason",
    "FreezeSettings",
    "FreezeView",
    "LabelGuard",
    "MetricSpec",
    "Outcome",
    "PaymentCallback",
    "Reservation",
    "ReservationConflict",
    "Sentry",
    "SkuFrozen",
    "StockMetrics",
    "classify_exception",
    "configure",
    "configure_tracing",
    "current_reservation",
    "get_sentry",
    "payment_callback",
    "record_idempotency_conflict",
    "record_idempotency_replay",
    "record_negative_inventory",
    "record_paid_order",
    "record_refund_due_to_oversell",
    "record_reservation",
    "record_stale_cache_hit",
    "reservation",
    "reserves",
    "sanitize_label_value",
]
