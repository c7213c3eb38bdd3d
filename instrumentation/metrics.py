"""The app-side metrics of the catalog, bound to one registry: :class:`StockMetrics`, the
layer under :class:`~stocksentry.instrumentation.Sentry` that most applications use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import REGISTRY

from . import catalog, mpexemplars
from .catalog import OVERFLOW_VALUE, MetricSpec
from .guard import CACHE_CHAR_BUDGET, MAX_CACHED_KEY_LENGTH, LabelGuard

#: The budget of each label whose values come from the app but are not SKUs (strategy,
#: operation, cache, lock, table names: small sets, unless the app has a bug).
SMALL_LABEL_BUDGET = 50
#: The parts of the instrumentation that count their own failures
#: (``stocksentry_instrumentation_errors_total{component}``).
INSTRUMENTATION_COMPONENTS: tuple[str, ...] = (
    "api",
    "metrics",
    "logging",
    "tracing",
    "sqlalchemy",
    "locks",
    "freeze",
)


#: Labels whose values come from a closed list: checked, never guarded.
_CHECKED: dict[tuple[str, str], tuple[str, ...]] = {
    (catalog.RESERVATION_CONFLICT.name, "reason"): catalog.CONFLICT_REASONS,
    (catalog.RESERVATION_DURATION.name, "outcome"): catalog.OUTCOMES,
    (catalog.LOCK_ACQUIRE_DURATION.name, "outcome"): catalog.LOCK_OUTCOMES,
}
#: The series primed for a SKU, a table and a lock (their first label; a checked second
#: label gets every value).
_SKU_SERIES = (
    catalog.RESERVATION_CONFLICT,
    catalog.ORDERS_PAID,
    catalog.REFUND_DUE_TO_OVERSELL,
    catalog.INVENTORY_NEGATIVE,
)
_TABLE_SERIES = (
    catalog.DB_LOCK_WAIT,
    catalog.DB_DEADLOCK,
    catalog.DB_SERIALIZATION_FAILURE,
    catalog.UNSAFE_READ_MODIFY_WRITE,
)
_LOCK_SERIES = (
    catalog.LOCK_ACQUIRE_RETRIES,
    catalog.LOCK_HOLD_RATIO,
    catalog.LOCK_EXPIRED_WHILE_HELD,
    catalog.LOCK_RELEASE_NOT_OWNED,
    catalog.LOCK_EXTEND_FAILURES,
    catalog.LOCK_ACQUIRE_DURATION,
)


def _make(spec: MetricSpec, registry: CollectorRegistry | None) -> Any:
    if spec.kind == "counter":
        return Counter(spec.base_name, spec.help, spec.labels, registry=registry)
    if spec.kind == "histogram":
        # Multiprocess mode keeps no exemplars: the histograms that carry them write their
        # own file for the sidecar (see mpexemplars).
        cls = mpexemplars.histogram_class() if spec.exemplars else Histogram
        return cls(
            spec.name, spec.help, spec.labels, buckets=spec.buckets or (), registry=registry
        )
    raise ValueError(f"{spec.name}: the app records no {spec.kind}")


class StockMetrics:
    """Every app-side metric of the catalog in one registry, with guarded labels.

    ``promo_skus`` always keep their own ``sku`` series; beyond them at most ``max_skus``
    distinct SKUs do, per process, the rest fold into ``__other__`` and count
    ``stocksentry_label_overflow_total{metric=...}``.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        promo_skus: Iterable[str] = (),
        max_skus: int = 100,
        max_label_length: int = 64,
    ) -> None:
        self.registry = registry
        promo_skus = tuple(promo_skus)  # used twice: by the guard and to prime the series
        self._promo_skus = promo_skus
        # Strategies and locks whose known sibling series were created (bounded by the
        # small guards' budget: a label past it folds, and folded ones are not primed).
        self._primed_strategies: set[str] = set()
        self._primed_locks: set[str] = set()
        self.sku_guard = LabelGuard(max_skus, always=promo_skus, max_length=max_label_length)
        # Raw values that sanitise to an admitted label can be endless (a hostile client
        # varying the part past the length cap): the caches stop growing at this size, and
        # in characters at CACHE_CHAR_BUDGET for all of them together (keys longer than
        # MAX_CACHED_KEY_LENGTH are never cached); later keys take the guarded path, still
        # correct. Counted without a lock: a race can only miscount by a few keys.
        self._cache_limit = 32 * (max_skus + len(promo_skus)) + 4096
        self._cached_chars = 0
        self._small_guards: dict[str, LabelGuard] = {
            name: LabelGuard(SMALL_LABEL_BUDGET, max_length=max_label_length)
            for name in ("strategy", "operation", "cache", "lock", "table", "component")
        }
        self._metrics: dict[str, Any] = {spec.name: _make(spec, registry) for spec in catalog.APP}
        # The labelled children, keyed by the tuple of raw values the app passed: after the
        # first event for a key, recording skips the guards and prometheus_client's lock.
        self._children: dict[str, dict[tuple[Any, ...], Any]] = {
            spec.name: {} for spec in catalog.APP
        }
        # A counter series is born at its first increment, so a burst between two scrapes
        # shows up already at its full count and `increase()` sees nothing; alerts on
        # promo SKUs must not miss the first oversell. Series whose labels are known in
        # advance start at zero instead.
        for outcome in catalog.OUTCOMES:
            self._metrics[catalog.RESERVATION_DURATION.name].labels(outcome)
        for component in INSTRUMENTATION_COMPONENTS:
            self._metrics[catalog.INSTRUMENTATION_ERRORS.name].labels(component)
        self.prime_skus(promo_skus)

    def prime_skus(self, skus: Iterable[str]) -> None:
        """Create the per-SKU counters of ``skus`` at zero: conflicts (every reason), paid
        orders, refunds due to oversell and negative-stock writes.

        Done for the promo SKUs at construction; a SKU past the guard's budget is not
        primed (priming never folds into ``__other__`` nor counts an overflow).
        """
        for sku in skus:
            self._prime_series(self.sku_guard(sku), _SKU_SERIES)

    def prime_tables(self, tables: Iterable[str]) -> None:
        """Create the per-table series (lock waits, deadlocks, serialization failures,
        unsafe read-modify-writes) of ``tables`` at zero, as for tables known in advance.
        """
        for table in tables:
            self._prime_series(self._small_guards["table"](table), _TABLE_SERIES)

    def prime_lock(self, lock: str) -> None:
        """Create the series of ``lock`` at zero: its acquire outcomes, retries, hold
        ratio, expiries while held, releases not owned and extension failures.

        Called by the lock wrappers at a lock's first acquire attempt. Once per lock name;
        a name past the ``lock`` label's budget is not primed.
        """
        if lock in self._primed_locks or len(self._primed_locks) >= SMALL_LABEL_BUDGET:
            return
        # The guard alone: priming must not count label overflows.
        label = self._small_guards["lock"](lock)
        if label is not OVERFLOW_VALUE:
            self._primed_locks.add(lock)
            self._prime_series(label, _LOCK_SERIES)

    def _prime_series(self, label: str, specs: tuple[MetricSpec, ...]) -> None:
        """Create ``specs``' series of ``label`` (a guarded first label; not when folded)."""
        if label is OVERFLOW_VALUE:
            return
        for spec in specs:
            metric = self._metrics[spec.name]
            if len(spec.labels) == 1:
                metric.labels(label)
            else:
                for value in _CHECKED[(spec.name, spec.labels[1])]:
                    metric.labels(label, value)

    def metric(self, spec: MetricSpec) -> Any:
        """The prometheus_client object behind ``spec`` (for reading values in tests)."""
        return self._metrics[spec.name]

    def unregister(self) -> None:
        """Remove every metric of this instance from its registry."""
        if self.registry is None:
            return
        for metric in self._metrics.values():
            with contextlib.suppress(KeyError):
                self.registry.unregister(metric)

    def register(self) -> None:
        """Put back what :meth:`unregister` removed (the same metrics, their counts kept)."""
        if self.registry is not None:
            for metric in self._metrics.values():
                self.registry.register(metric)

    # --- the labelled children ---------------------------------------------------------

    def cached_child(self, spec: MetricSpec, *values: Any) -> Any:
        """The child of ``spec`` for the raw label ``values`` once an event has cached it,
        else ``None``: a hot path may keep it and record on it directly."""
        return self._children[spec.name].get(values)

    def _child(self, spec: MetricSpec, *values: Any) -> Any:
        """The child of ``spec`` for the raw label ``values``, from the cache when it can."""
        # A child is never falsy (prometheus_client's metrics define no __bool__ nor __len__).
        return self._children[spec.name].get(values) or self._new_child(spec, values)

    def _new_child(self, spec: MetricSpec, values: tuple[Any, ...]) -> Any:
        labels: list[str] = []
        guarded: list[Any] = []  # the raw values that went through a guard
        for name, value in zip(spec.labels, values, strict=True):
            allowed = _CHECKED.get((spec.name, name))
            if allowed is not None:
                if value not in allowed:
                    raise ValueError(f"unknown {name} {value!r}")
                labels.append(value)
                continue
            guard = self.sku_guard if name == "sku" else self._small_guards[name]
            label = guard(value)
            if label is OVERFLOW_VALUE:
                self._metrics[catalog.LABEL_OVERFLOW.name].labels(spec.name).inc()
            labels.append(label)
            guarded.append(value)
        child = self._metrics[spec.name].labels(*labels)
        if spec is catalog.RESERVATION_SUCCESS:
            self._prime_strategy(labels[1])
        # Overflowed raw values are not cached: each one must count its overflow.
        cache = self._children[spec.name]
        if OVERFLOW_VALUE not in labels and self._may_cache(cache, guarded):
            cache[values] = child
        return child

    def _may_cache(self, cache: dict[Any, Any], keys: list[Any]) -> bool:
        """Whether a key made of ``keys`` fits the children caches' bounds; if so, counted."""
        size = 0
        for key in keys:
            if not isinstance(key, str) or len(key) > MAX_CACHED_KEY_LENGTH:
                return False
            size += len(key)
        if len(cache) >= self._cache_limit or self._cached_chars + size > CACHE_CHAR_BUDGET:
            return False
        self._cached_chars += size
        return True

    def _prime_strategy(self, strategy: str) -> None:
        # A strategy seen once is a strategy of this app: its success series for every
        # promo SKU start at zero now, not at their first sale.
        if strategy is OVERFLOW_VALUE or strategy in self._primed_strategies:
            return
        self._primed_strategies.add(strategy)
        for promo in self._promo_skus:
            self._metrics[catalog.RESERVATION_SUCCESS.name].labels(self.sku_guard(promo), strategy)

    # --- events ------------------------------------------------------------------------

    def reservation_finished(
        self,
        sku: str,
        strategy: str,
        outcome: str,
        seconds: float | None,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        """Record one ended reservation: its outcome's counter (``error`` counts none) and
        its duration (none when ``seconds`` is ``None``). The duration child is resolved
        first, so a bad ``outcome`` records nothing.
        """
        duration = self._child(catalog.RESERVATION_DURATION, outcome)
        if outcome == "success":
            self._child(catalog.RESERVATION_SUCCESS, sku, strategy).inc()
        elif outcome != "error":
            self._child(catalog.RESERVATION_CONFLICT, sku, outcome).inc()
        if seconds is not None:
            duration.observe(seconds, exemplar)

    def count(self, spec: MetricSpec, *labels: str, amount: float = 1.0) -> None:
        """Add ``amount`` to the counter ``spec``, under the raw label values ``labels``
        (in the order of ``spec.labels``; guarded or checked as for every event)."""
        self._child(spec, *labels).inc(amount)

    def observe(
        self,
        spec: MetricSpec,
        value: float,
        *labels: str,
        exemplar: dict[str, str] | None = None,
    ) -> None:
        """Observe ``value`` in the histogram ``spec`` under the raw label values ``labels``;
        ``exemplar`` (``trace_id``/``span_id``) only where the spec carries exemplars."""
        self._child(spec, *labels).observe(value, exemplar)
