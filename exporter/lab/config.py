"""What the lab runs and returns: plain dataclasses and constants (``--help`` imports it).

>>> STRATEGY_NAMES[0], sku_for("for_update")
('unsafe', 'LAB-FOR_UPDATE')
>>> config = LabConfig(buyers=200, stock=20, strategies=("unsafe", "atomic"))
>>> config.strategy_names, config.skip_reason("naive_lock")
(('unsafe', 'atomic'), 'needs --redis URL (a Redis lock strategy)')
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any

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


def sku_for(strategy: str) -> str:
    """The product row a strategy sells: ``LAB-<STRATEGY>``."""
    return f"LAB-{strategy.upper()}"


#: Buyers arriving together in a paced sale (``pace_s``): a wave still collides, as a
#: flash sale's buyers do, while the sale lasts long enough for the alert chain to act.
PACE_WAVE = 10


def pace_offset(number: int, buyers: int, pace_s: float) -> float:
    """When buyer ``number`` (from 1) arrives, in seconds from the sale's start.

    >>> [pace_offset(n, 40, 2.0) for n in (1, 10, 11, 40)]
    [0.0, 0.0, 0.5, 1.5]
    """
    if pace_s <= 0:
        return 0.0
    waves = -(-buyers // PACE_WAVE)
    return ((number - 1) // PACE_WAVE) * pace_s / waves


#: The share of buyers who resubmit in the retry scenarios.
SCENARIO_RETRIES = 0.2
#: The outbox scenario's publisher publishes this share of the events, then stalls.
OUTBOX_PUBLISHED_SHARE = 0.25

#: How long a buyer waits for a Redis lock before giving up as ``lock_not_acquired``.
LOCK_WAIT_S = 30.0
#: Pause between attempts at a Redis lock (with jitter): short, the work is milliseconds;
#: shorter pauses make 50 waiting threads spin so fast that they slow the holder down.
LOCK_RETRY_S = 0.01
#: The owned lock's TTL is at least this, and at least 20 times the work.
REDLOCK_MIN_TTL_S = 1.0
#: The ``cache`` label of the stale-cache metric, and the idempotent operation's name.
CACHE_NAME = "lab_stock"
IDEMPOTENT_OPERATION = "checkout"
#: What the lab's Redis keys begin with (locks, the stale cache).
REDIS_PREFIX = "stocksentry-lab:"


def cache_key_template(prefix: str) -> str:
    """The Redis key of the stale cache's stock, ``{sku}`` for the SKU: the exporter's
    ``redis.key_template``, so its cache-drift probe compares it with the database. The
    process id keeps two labs on one Redis apart (the exporter is started before a run's
    id is drawn)."""
    return f"{prefix}{os.getpid()}:cache:{{sku}}"


#: The stock table the SQLAlchemy integration watches.
STOCK_TABLE = "products"
#: The transaction isolation levels the strategies may run at (``--isolation``).
ISOLATION_LEVELS = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")


class LabError(Exception):
    """A set-up problem the CLI reports as one line (bad URL, unreachable database...)."""


@dataclass(frozen=True, slots=True)
class LabConfig:
    """What to run (``database_url=None``: a temporary SQLite file, removed at the end).

    ``work_ms`` is the app's work between reading the stock and writing it: the window in
    which unsafe strategies lose updates. The ranges are checked by ``stocksentry demo``.
    """

    database_url: str | None = None
    buyers: int = 500
    stock: int = 100
    concurrency: int = 50
    work_ms: float = 5.0
    strategies: tuple[str, ...] = ()
    quantity: int = 1
    log_file: str | None = None
    redis_url: str | None = None
    lock_ttl_ms: float | None = None
    retries: float = 0.0
    idempotency: bool = True
    stale_cache: bool = False
    cache_refresh_ms: float = 50.0
    redis_prefix: str = REDIS_PREFIX
    redlock_impl: str = "lab"
    isolation_level: str | None = None
    #: Seconds each sale's buyers are spread over, in waves of :data:`PACE_WAVE` (0: all
    #: at once); ``contain``: run unsafe again with the freeze chain on (docs/containment.md).
    pace_s: float = 0.0
    contain: bool = False

    def __post_init__(self) -> None:
        # SQLAlchemy would pass any string through to the server's SET TRANSACTION.
        if self.isolation_level is not None and self.isolation_level not in ISOLATION_LEVELS:
            raise ValueError(
                f"isolation_level must be one of {', '.join(ISOLATION_LEVELS)},"
                f" got {self.isolation_level!r}"
            )

    @property
    def strategy_names(self) -> tuple[str, ...]:
        """The strategies to run, in order (all of :data:`STRATEGY_NAMES` when none given)."""
        return self.strategies or STRATEGY_NAMES

    @property
    def naive_lock_ttl_s(self) -> float:
        """The naive lock's TTL: ``lock_ttl_ms``, or 80 % of the work (at least 1 ms)."""
        if self.lock_ttl_ms is not None:
            return self.lock_ttl_ms / 1000
        return max(0.001, 0.8 * self.work_ms / 1000)

    @property
    def redlock_ttl_s(self) -> float:
        """The owned lock's TTL: far above the work, so a holder never outlives it."""
        return max(REDLOCK_MIN_TTL_S, 20 * self.work_ms / 1000)

    def skip_reason(self, strategy: str) -> str | None:
        """Why ``strategy`` cannot run with this configuration (``None``: it can)."""
        if strategy in REDIS_STRATEGIES and self.redis_url is None:
            return SKIPPED_WITHOUT_REDIS
        if strategy == "deadlock" and not self.on_server:
            # It needs a server's row locks and deadlock detector (PostgreSQL, InnoDB).
            return "needs PostgreSQL or MySQL / MariaDB (row locks taken in opposite orders)"
        return None

    @property
    def on_server(self) -> bool:
        """Whether the database is a server with row locks (PostgreSQL, MySQL, MariaDB)."""
        url = (self.database_url or "").lower()
        return url.startswith(("postgresql", "postgres:", "mysql", "mariadb"))


def scenario_config(config: LabConfig, strategy: str) -> LabConfig:
    """The configuration ``strategy`` runs with (the scenarios' resubmits or late cache)."""
    if strategy == "retry_no_key":
        return replace(config, retries=config.retries or SCENARIO_RETRIES, idempotency=False)
    if strategy == "retry_idempotent":
        return replace(config, retries=config.retries or SCENARIO_RETRIES, idempotency=True)
    if strategy == "stale_cache":
        return replace(config, stale_cache=True)
    if config.contain and strategy != "unsafe":
        # --contain paces the two unsafe sales; the others run as ever.
        return replace(config, pace_s=0.0)
    return config


@dataclass(frozen=True, slots=True)
class DbFigures:
    """What the database says after a strategy's run, counted by SQL (``duplicate_orders``:
    the orders beyond the first of each idempotency key that has several)."""

    orders: int
    units: int
    negative_writes: int
    final_stock: int
    duplicate_keys: int = 0
    duplicate_orders: int = 0


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """One strategy's run: the database's figures (counted by SQL) and the registry's
    ``metrics`` (those without a ``sku`` label as their rise over the run); ``consistent``
    when every metric total equals its count (``mismatches`` says which did not).
    ``samples`` is the stock over time, ``(seconds, stock)``.
    """

    strategy: str
    sku: str
    stock_initial: int
    buyers: int
    sold: int = 0
    orders: int = 0
    oversold: int = 0
    lost_updates: int = 0
    final_stock: int = 0
    conflicts: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    negative_writes: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    wall_s: float = 0.0
    metrics: dict[str, int] = field(default_factory=dict)
    db: DbFigures = DbFigures(0, 0, 0, 0)
    consistent: bool = True
    mismatches: tuple[str, ...] = ()
    first_error: str | None = None
    skipped: str | None = None
    reservations: int = 0
    resubmitted: int = 0
    replays: int = 0
    stale_cache_hits: int = 0
    unsafe_read_modify_write: int | None = None
    locks: dict[str, float] = field(default_factory=dict)
    samples: tuple[tuple[float, int], ...] = ()
    notes: tuple[str, ...] = ()
    #: Unix times of the sale's start and end, and of the first unit sold beyond the stock.
    started_at: float = 0.0
    ended_at: float = 0.0
    first_oversell_at: float | None = None
    #: Unix time of the first reservation refused because the SKU was frozen.
    first_refused_at: float | None = None
    #: ``stock_db_deadlock_total`` over the run and the outbox events left unpublished (SQL).
    deadlocks: int = 0
    outbox_unpublished: int = 0
    #: The exporter's probe figures for this strategy's SKU, read from its /metrics.
    probes: dict[str, float] = field(default_factory=dict)
    #: Alert name -> ``{"state": "firing"|"pending", "after_s": seconds}`` from Prometheus.
    alerts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def skip(cls, config: LabConfig, strategy: str, reason: str) -> StrategyResult:
        return cls(
            strategy=strategy,
            sku=sku_for(strategy),
            stock_initial=config.stock,
            buyers=config.buyers,
            final_stock=config.stock,
            db=DbFigures(0, 0, 0, config.stock),
            skipped=reason,
        )

    def to_dict(self) -> dict[str, Any]:
        """One item of ``--format json`` (a skipped strategy: its name, sku and reason)."""
        if self.skipped is not None:
            return {"strategy": self.strategy, "sku": self.sku, "skipped": self.skipped}
        # Its tuples (mismatches, notes, samples) are JSON arrays.
        return {**asdict(self), "duplicate_orders": self.db.duplicate_orders}
