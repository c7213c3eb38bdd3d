"""The lab's strategy names: the one list, light enough for ``--help``.

This module imports nothing, so the ``stocksentry demo`` parser can name and check the
strategies without loading SQLAlchemy. :data:`~stocksentry.exporter.lab.strategies.STRATEGIES`
maps each of these names to its function, in this order.

Example::

    >>> STRATEGY_NAMES[0], sku_for("for_update")
    ('unsafe', 'LAB-FOR_UPDATE')
"""

from __future__ import annotations

__all__ = ["REDIS_STRATEGIES", "SKIPPED_WITHOUT_REDIS", "STRATEGY_NAMES", "sku_for"]

#: Every strategy, in the order the report shows them (unsafe ones first).
STRATEGY_NAMES: tuple[str, ...] = (
    "unsafe",
    "check_then_decrement",
    "naive_lock",
    "atomic",
    "for_update",
    "redlock",
)
#: Strategies that need Redis; without ``redis_url`` they are skipped, with this reason.
REDIS_STRATEGIES = frozenset({"naive_lock", "redlock"})
SKIPPED_WITHOUT_REDIS = "needs --redis URL (a Redis lock strategy)"


def sku_for(strategy: str) -> str:
    """The product row a strategy sells: ``LAB-<STRATEGY>``."""
    return f"LAB-{strategy.upper()}"
