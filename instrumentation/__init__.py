"""stocksentry's instrumentation for checkout applications.

Record reservations, paid orders, refunds due to oversell, idempotency replays and stale
cache decisions as Prometheus metrics, JSON log lines and OpenTelemetry spans::

    from stocksentry.instrumentation import configure, reservation

    configure(promo_skus=["EGG-01"])
    with reservation("EGG-01", strategy="atomic") as r:
        r.success(old_stock=1, new_stock=0)

Importing this package pulls in prometheus-client, opentelemetry-api and structlog only.
The SQLAlchemy integration (``instrument_sqlalchemy``, ``uninstrument_sqlalchemy``,
``StockTable``) is loaded from :mod:`.sqlalchemy` on first access, so SQLAlchemy is
imported only by applications that use it.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import api
from .api import *  # noqa: F403 - the recording API, its names listed once in api.__all__
from .catalog import CONFLICT_REASONS, OUTCOMES, OVERFLOW_VALUE, MetricSpec
from .guard import LabelGuard, sanitize_label_value
from .metrics import StockMetrics
from .tracing import configure_tracing

if TYPE_CHECKING:
    from .sqlalchemy import StockTable, instrument_sqlalchemy, uninstrument_sqlalchemy

# Names served by a submodule that needs an optional extra, imported when first used.
_LAZY = {
    "StockTable": "sqlalchemy",
    "instrument_sqlalchemy": "sqlalchemy",
    "uninstrument_sqlalchemy": "sqlalchemy",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = import_module(f".{module_name}", __name__)
    except ImportError as exc:
        raise ImportError(
            f"{name} needs the {module_name} extra: pip install 'stocksentry[{module_name}]'"
        ) from exc
    return getattr(module, name)


__all__ = [
    "CONFLICT_REASONS",
    "OUTCOMES",
    "OVERFLOW_VALUE",
    "LabelGuard",
    "MetricSpec",
    "StockMetrics",
    "StockTable",
    "configure_tracing",
    "instrument_sqlalchemy",
    "sanitize_label_value",
    "uninstrument_sqlalchemy",
]
__all__ += api.__all__
