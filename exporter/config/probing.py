"""The ``probes`` section of the config model: each probe's schedule and options."""

# ruff: noqa: RUF009 - the fields' metadata is built by calls (key(), section() ...).

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from .kinds import (
    DAY,
    HOUR,
    LABEL_NAME,
    MINUTE,
    Bool,
    Choice,
    Duration,
    Integer,
    Named,
    Sql,
    Text,
    TextList,
)
from .specs import Section, computed, key, required, section, sections, specs

#: The health series of the leader election use this probe name.
ELECTION_PROBE: Final = "leader_election"
STATEMENT_TIMEOUT: Final = 2.0
_INTERVAL: Final = 15.0
_TIMEOUT: Final = 5.0
_INTERVAL_KIND: Final = Duration(maximum=HOUR)
_TIMEOUT_KIND: Final = Duration(maximum=10 * MINUTE)


@dataclass(frozen=True, slots=True)
class ProbeDefaults:
    """``probes.defaults``: the schedule of every probe that does not set its own."""

    interval: float = key(_INTERVAL, _INTERVAL_KIND, "how often a probe runs")
    timeout: float = key(_TIMEOUT, _TIMEOUT_KIND, "how long a run may take")


def _scheduled(name: str) -> Any:
    """A probe's ``interval`` or ``timeout``: by default that of ``probes.defaults``."""
    default, kind, doc = {
        "interval": (_INTERVAL, _INTERVAL_KIND, "how often it runs"),
        "timeout": (
            _TIMEOUT,
            _TIMEOUT_KIND,
            "how long a run may take; one set here may not be longer than the probe's "
            "`interval` (a slow run delays the next: runs never overlap)",
        ),
    }[name]
    return key(
        default, kind, doc, inherit=f"probes.defaults.{name}", default_doc="`probes.defaults`"
    )


def _statement_timeout() -> Any:
    """A probe's own ``statement_timeout``: by default ``database.statement_timeout``."""
    return key(
        STATEMENT_TIMEOUT,
        Duration(maximum=10 * MINUTE),
        "`SET LOCAL statement_timeout` of its transactions; keep it below `timeout`",
        inherit="database.statement_timeout",
        default_doc="`database.statement_timeout`",
    )


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    """One probe's schedule: on or off, how often, and how long a run may take."""

    enabled: bool = key(
        True,
        Bool(),
        "on when what it needs is configured; `true` without it is an error",
        default_doc="`true` when configured",
    )
    interval: float = _scheduled("interval")
    timeout: float = _scheduled("timeout")
    statement_timeout: float = _statement_timeout()


def _top_skus(what: str) -> Any:
    """How many SKUs a probe names in its per-SKU series (alerts name them)."""
    return key(
        10,
        Integer(1, 1_000),
        f"the SKUs with the most {what} get a `sku` series of their own (through the SKU "
        "guard), the rest are summed under `__other__`",
    )


@dataclass(frozen=True, slots=True)
class NegativeStockSettings(ProbeSettings):
    """``probes.negative_stock``: SKUs below zero, the worst named one by one."""

    top_skus: int = _top_skus("units below zero")


@dataclass(frozen=True, slots=True)
class OutboxSettings(ProbeSettings):
    """``probes.outbox``: unpublished events, and when one counts as stuck."""

    max_publish_latency: float = key(
        30.0,
        Duration(maximum=DAY),
        "an event unpublished for longer is stuck: the sidecar logs it and StockOutboxLag "
        "fires (the probe exports it as the alert's threshold)",
    )


@dataclass(frozen=True, slots=True)
class OversoldSettings(ProbeSettings):
    """``probes.oversold`` (docs/exporter-config.md, "How oversold counts")."""

    scope: Literal["all", "promo"] = key(
        "all",
        Choice(("all", "promo")),
        "`all`: every SKU, incrementally; `promo`: only `sku_guard.promo_skus`, their "
        "whole history each run",
    )
    settle_after: float = key(
        2 * MINUTE,
        Duration(maximum=DAY, allow_zero=True),
        "orders created this recently are read again on every run (payments, refunds "
        "and cancellations show at the next run); older ones are added once to kept totals",
    )
    clock_margin: float = key(
        5.0,
        Duration(maximum=HOUR, allow_zero=True),
        "how far an order's `created_at` may precede its transaction's start on the "
        "database's clock (app clock skew, timestamp taken before `BEGIN`)",
    )
    recount_period: float = key(
        # Half an hour: after a start (or a change of leader) an old product oversold
        # before it, with no recent order, is counted within the hour.
        30 * MINUTE,
        Duration(maximum=7 * DAY),
        "one pass of the rolling recount over every product, a chunk per run: finds SKUs "
        "oversold long ago (after a start, within this period) and corrects kept totals "
        "after a change to an older order",
    )
    recount_batch: int = key(
        2000,
        Integer(1, 100_000),
        "products seen for the first time counted from their history per run; keep it "
        "above the distinct products sold per interval (an uncounted product's oversell "
        "waits for its turn); it also paces the rebuild after a start or a leader change",
    )
    max_tracked_products: int = key(
        200_000,
        Integer(1_000, 10_000_000),
        "products whose totals are kept; the least recently sold beyond it are dropped",
    )


@dataclass(frozen=True, slots=True)
class DuplicateOrdersSettings(ProbeSettings):
    """``probes.duplicate_orders``: orders created within ``window`` are compared."""

    window: float = key(HOUR, Duration(maximum=31 * DAY), "orders created within it are compared")
    clock_margin: float = key(
        5.0,
        Duration(maximum=HOUR, allow_zero=True),
        "how far an order's `created_at` may precede its transaction's start on the "
        "database's clock (as `oversold.clock_margin`)",
    )
    top_skus: int = _top_skus("duplicate keys")


@dataclass(frozen=True, slots=True)
class CacheDriftSettings(ProbeSettings):
    """``probes.cache_drift``: the promo SKUs' cached stock against the database's."""

    interval: float = key(
        1.0,
        _INTERVAL_KIND,
        "how often it runs; its own default, not `probes.defaults`: `redis.grace` is "
        "counted in its runs, so keep the interval at most half the grace",
    )
    top_skus: int = _top_skus("units of drift")


@dataclass(frozen=True, slots=True)
class LongTransactionsSettings(ProbeSettings):
    """``probes.long_transactions``: transactions open longer than ``threshold``."""

    threshold: float = key(30.0, Duration(maximum=DAY), "transactions open longer than this count")


@dataclass(frozen=True, slots=True)
class CustomProbe:
    """One entry of ``probes.custom``: read-only SQL exported as a gauge."""

    name: str = required(
        Named(
            "[a-z][a-z0-9_]{0,62}",
            "a probe name (lower case, digits and _)",
            "probe name",
        ),
        "probe name, not a built-in name; the `probe` label of its health series",
    )
    sql: str = required(Sql(), "one `SELECT`; a trailing `;` is removed")
    metric: str = required(
        Named("[a-zA-Z_:][a-zA-Z0-9_:]*", "a metric name", "metric name"),
        "gauge name; not a catalog name, and not starting with `stock_` or `stocksentry_` "
        "(reserved for stocksentry's own metrics)",
    )
    help: str = computed(
        Text(),
        "help text",
        lambda values: f"Custom probe {values['name']}.",
        "`Custom probe <name>.`",
    )
    value_column: str = key(
        "value", Text(), "column holding the sample value; rows where it is null are skipped"
    )
    label_columns: tuple[str, ...] = key(
        (),
        TextList(LABEL_NAME),
        "columns exported as labels; a `sku` label goes through the SKU guard, others are "
        "sanitised like every label",
    )
    interval: float = _scheduled("interval")
    timeout: float = _scheduled("timeout")
    statement_timeout: float = _statement_timeout()
    max_series: int = key(
        100, Integer(1, 10_000), "label sets beyond it are dropped, with one warning"
    )


@dataclass(frozen=True, slots=True)
class ProbesConfig:
    """``probes``: every built-in probe's settings (``enabled`` is the effective value:
    :attr:`ExporterConfig.notes` says why a probe is off) and the custom ones."""

    defaults: ProbeDefaults = section(ProbeDefaults, "the schedule of every other probe")
    negative_stock: NegativeStockSettings = section(NegativeStockSettings, "SKUs below zero")
    oversold: OversoldSettings = section(OversoldSettings, "paid units beyond the allocation")
    duplicate_orders: DuplicateOrdersSettings = section(
        DuplicateOrdersSettings, "keys with more than one order"
    )
    lock_waiters: ProbeSettings = section(ProbeSettings, "sessions waiting for a lock")
    deadlocks: ProbeSettings = section(ProbeSettings, "the database's deadlock counter")
    long_transactions: LongTransactionsSettings = section(
        LongTransactionsSettings, "long transactions holding stock locks"
    )
    expired_reservations: ProbeSettings = section(ProbeSettings, "expired, unreleased holds")
    outbox: OutboxSettings = section(OutboxSettings, "unpublished events and their lag")
    cache_drift: CacheDriftSettings = section(CacheDriftSettings, "cache against database stock")
    custom: tuple[CustomProbe, ...] = sections(CustomProbe, "custom SQL probes")

    def builtin(self) -> dict[str, ProbeSettings]:
        """The built-in probes by name, in documentation order."""
        return {name: getattr(self, name) for name in BUILTIN_PROBES}


#: The built-in probes, in documentation order: the sections of ``probes`` that hold one.
BUILTIN_PROBES: Final = tuple(
    name
    for name, spec in specs(ProbesConfig)
    if isinstance(spec, Section) and issubclass(spec.cls, ProbeSettings)
)
