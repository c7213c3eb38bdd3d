"""The lab's strategy names: the one list, light enough for ``--help`` (no imports).

>>> STRATEGY_NAMES[0], sku_for("for_update")
('unsafe', 'LAB-FOR_UPDATE')
"""

#: Every strategy, in the order the report shows them (unsafe ones first).
STRATEGY_NAMES: tuple[str, ...] = (
    "unsafe",
    "check_then_decrement",
    "naive_lock",
    "atomic",
    "for_update",
    "redlock",
    # Scenarios around the atomic update: a fifth of the buyers resubmit, without and with
    # an idempotency key; the availability decision read from a late cache; an outbox whose
    # publisher stalls; two SKUs locked in opposite orders (a deadlock).
    "retry_no_key",
    "retry_idempotent",
    "stale_cache",
    "outbox",
    "deadlock",
)
#: The strategies that must sell exactly the stock, without a finding or an alert.
SAFE_STRATEGIES = frozenset({"atomic", "for_update", "redlock", "retry_idempotent"})
#: Strategies that need Redis; without ``redis_url`` they are skipped, with this reason.
REDIS_STRATEGIES = frozenset({"naive_lock", "redlock"})
SKIPPED_WITHOUT_REDIS = "needs --redis URL (a Redis lock strategy)"
#: Strategies that need a server's row locks and deadlock detector (PostgreSQL, InnoDB).
POSTGRES_STRATEGIES = frozenset({"deadlock"})
SKIPPED_WITHOUT_POSTGRES = (
    "needs PostgreSQL or MySQL / MariaDB (row locks taken in opposite orders)"
)


def sku_for(strategy: str) -> str:
    """The product row a strategy sells: ``LAB-<STRATEGY>``."""
    return f"LAB-{strategy.upper()}"
