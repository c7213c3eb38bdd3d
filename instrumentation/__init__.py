"""stocksentry's instrumentation for checkout applications.

Record reservations, paid orders, refunds due to oversell, idempotency replays and stale
cache decisions as Prometheus metrics, JSON log lines and OpenTelemetry spans::

    from stocksentry.instrumentation import configure, reservation

    configure(promo_skus=["EGG-01"])
    with reservation("EGG-01", strategy="atomic") as r:
        r.success(old_stock=1, new_stock=0)

Importing this package pulls in prometheus-client, opentelemetry-api and structlog only;
the SQLAlchemy integration is :mod:`.sqlalchemy`.
"""

from __future__ import annotations

from . import api
from .api import *  # noqa: F403 - the recording API, its names listed once in api.__all__
from .catalog import CONFLICT_REASONS, OUTCOMES, OVERFLOW_VALUE, MetricSpec
from .guard import LabelGuard, sanitize_label_value
from .metrics import StockMetrics
from .tracing import configure_tracing

__all__ = [
    "CONFLICT_REASONS",
    "OUTCOMES",
    "OVERFLOW_VALUE",
    "LabelGuard",
    "MetricSpec",
    "StockMetrics",
    "configure_tracing",
    "sanitize_label_value",
]
__all__ += api.__all__
