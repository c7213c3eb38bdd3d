"""What every probe shares: its contract, its result, backoff, and quiet error logging.

A probe is an object with a name, an interval, a timeout and an async :meth:`Probe.run`
that returns the metric families of one observation. The runner calls it in the
background and keeps the last :class:`ProbeResult`; a scrape only reads that result.

Example::

    class Answer(Probe):
        specs = (catalog.NEGATIVE_INVENTORY_SKUS,)

        async def run(self) -> tuple[Metric, ...]:
            return (family(catalog.NEGATIVE_INVENTORY_SKUS, [((), 42.0)]),)

    probe = Answer("answer", interval=15.0, timeout=5.0)
"""

from __future__ import annotations

import abc
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.catalog import MetricSpec
from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value
from stocksentry.instrumentation.secrets import redact, secret_fragments

from ..config import CustomProbe, ExporterConfig
from ..durations import format_duration

__all__ = [
    "LONG_TRANSACTIONS",
    "LONG_TRANSACTION_MAX",
    "PROBE_LEADER",
    "Backoff",
    "CustomRows",
    "DialectProbes",
    "ErrorLog",
    "Probe",
    "ProbeResult",
    "ProbeUnavailableError",
    "build_db_probes",
    "describe_error",
    "family",
    "redact",
    "secret_fragments",
]

LOGGER: Final = logging.getLogger("stocksentry.exporter.probes")


# Short names for the catalog specs the probes use most.
LONG_TRANSACTIONS: Final = catalog.DB_LONG_TRANSACTIONS
LONG_TRANSACTION_MAX: Final = catalog.DB_LONG_TRANSACTION_MAX
PROBE_LEADER: Final = catalog.PROBE_LEADER


def family(spec: MetricSpec, samples: Iterable[tuple[Sequence[str], float]] = ()) -> Metric:
    """A gauge or counter family of ``spec`` holding ``samples`` (label values, value).

    Example::

        family(catalog.DB_DEADLOCKS, [(("shop",), 3.0)])
    """
    metric: Metric
    if spec.kind == "gauge":
        metric = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
    elif spec.kind == "counter":
        metric = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    else:
        raise ValueError(f"{spec.name}: probes export gauges and counters, not {spec.kind}")
    for labels, value in samples:
        metric.add_metric(list(labels), value)
    return metric


# --- the contract --------------------------------------------------------------------------


class ProbeUnavailableError(Exception):
    """The probe's source is known to be down; the next attempt waits for the backoff."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """The last run of one probe, as a scrape sees it.

    A failed run has ``up=False`` and no families: a probe that cannot see the database
    exports nothing stale. ``last_success`` keeps the time of the last good run.
    """

    up: bool
    duration: float
    last_success: float | None
    families: tuple[Metric, ...] = ()
    error: str | None = None


class Probe(abc.ABC):
    """One background observation, run every ``interval`` seconds within ``timeout``.

    ``needs_leader``: with leader election on, only the leader runs the probe.
    """

    #: The metrics :meth:`run` may return (for ``describe()``).
    specs: tuple[MetricSpec, ...] = ()
    needs_leader: bool = True

    def __init__(self, name: str, *, interval: float, timeout: float) -> None:
        self.name = name
        self.interval = interval
        self.timeout = timeout

    @abc.abstractmethod
    async def run(self) -> tuple[Metric, ...]:
        """Observe once and return the families to export until the next run."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} every {format_duration(self.interval)}>"


# --- reconnecting politely -----------------------------------------------------------------


class Backoff:
    """Exponential backoff with jitter between attempts to reach a source that is down.

    Example::

        backoff = Backoff(initial=0.5, maximum=30.0)
        if backoff.wait_time() == 0:
            try:
                connect()
            except OSError:
                backoff.failed()      # next attempt in ~0.5 s, then ~1 s, ~2 s ... 30 s
            else:
                backoff.succeeded()
    """

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self._clock = clock
        self._delay = 0.0
        self._next_attempt = 0.0
        self.failures = 0

    def wait_time(self) -> float:
        """Seconds until the next attempt is allowed (0: now)."""
        return max(0.0, self._next_attempt - self._clock())

    def failed(self) -> float:
        """Record a failed attempt; returns the delay before the next one."""
        self.failures += 1
        self._delay = min(self.maximum, self._delay * 2 if self._delay else self.initial)
        # Jitter keeps many sidecars that lost the same database from reconnecting at once.
        delay = self._delay * random.uniform(0.8, 1.0)  # noqa: S311 - jitter, not a secret
        self._next_attempt = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        """Record a success: the next failure starts again at ``initial``."""
        self.failures = 0
        self._delay = 0.0
        self._next_attempt = 0.0


# --- errors without secrets, without floods ------------------------------------------------


def describe_error(exc: BaseException, timeout: float | None = None) -> str:
    """One line naming the error: its class (and SQLSTATE) and first words."""
    if isinstance(exc, TimeoutError) and timeout is not None:
        return f"timed out after {format_duration(timeout)}"
    sqlstate = getattr(exc, "sqlstate", None)
    name = type(exc).__name__
    if sqlstate:
        name = f"{name} (SQLSTATE {sqlstate})"
    message = " ".join(str(exc).split())
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{name}: {message}" if message else name


@dataclass(slots=True)
class _ErrorState:
    failures: int = 0
    suppressed: int = 0
    last_logged: float | None = None


class ErrorLog:
    """Logs probe failures at most once per ``interval`` per probe, with secrets blanked.

    The first failure logs at once; repeats within ``interval`` are counted and reported
    with the next line; a recovery logs once.

    Example::

        errors = ErrorLog(LOGGER, interval=60.0, secrets=secret_fragments(url))
        errors.failed("negative_stock", "OperationalError: connection refused")
        errors.recovered("negative_stock")
    """

    def __init__(
        self,
        logger: logging.Logger = LOGGER,
        *,
        interval: float = 60.0,
        secrets: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self.secrets = tuple(secrets)
        self._clock = clock
        self._state: dict[str, _ErrorState] = {}

    def clean(self, text: str) -> str:
        """``text`` without secrets, on one line."""
        return redact(text, self.secrets)

    def failed(self, probe: str, message: str) -> str:
        """Count a failure of ``probe``; log it unless one was logged recently.

        Returns the message without secrets (what the result keeps).
        """
        message = self.clean(message)
        state = self._state.setdefault(probe, _ErrorState())
        state.failures += 1
        now = self._clock()
        if state.last_logged is not None and now - state.last_logged < self.interval:
            state.suppressed += 1
            return message
        note = (
            f" ({state.suppressed} more failures since the last message)"
            if state.suppressed
            else ""
        )
        self.logger.warning("probe %s failed: %s%s", probe, message, note, extra={"probe": probe})
        state.last_logged = now
        state.suppressed = 0
        return message

    def recovered(self, probe: str) -> None:
        """Note a success of ``probe``; logs once when it had been failing."""
        state = self._state.get(probe)
        if state is None or not state.failures:
            return
        self.logger.info(
            "probe %s recovered after %d failed runs",
            probe,
            state.failures,
            extra={"probe": probe},
        )
        del self._state[probe]


# --- custom SQL's rows as a gauge, on any dialect --------------------------------------------


class CustomRows:
    """A ``probes.custom`` entry's rows as its one gauge (what every dialect's custom probe
    exports from the columns and rows its driver returned).

    Each row gives one sample: the value from ``value_column`` (rows where it is null are
    skipped), labels from ``label_columns`` (a ``sku`` label goes through the SKU guard,
    others are sanitised); rows with the same labels are summed; past ``max_series`` label
    sets the rest are dropped with one warning.
    """

    def __init__(
        self,
        custom: CustomProbe,
        guard: LabelGuard,
        *,
        name: str,
        number: Callable[[object], float],
    ) -> None:
        self.custom = custom
        self.name = name
        # The dialect's reading of a numeric column (MySQL's status values are text).
        self._number = number
        self.spec = MetricSpec(
            custom.metric, "gauge", custom.help, custom.label_columns, source="probe"
        )
        self._guard = guard
        self._warned = False

    def export(
        self, columns: Sequence[str], rows: Iterable[Sequence[object]]
    ) -> tuple[Metric, ...]:
        """The gauge family of ``rows`` whose columns are named ``columns``."""
        columns = list(columns)
        wanted = (self.custom.value_column, *self.custom.label_columns)
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise ValueError(
                f"the SQL returned no column {', '.join(missing)} (columns: {', '.join(columns)})"
            )
        value_at = columns.index(self.custom.value_column)
        label_at = [columns.index(c) for c in self.custom.label_columns]
        is_sku = [c == "sku" for c in self.custom.label_columns]
        samples: dict[tuple[str, ...], float] = {}
        for row in rows:
            if row[value_at] is None:
                continue
            value = self._number(row[value_at])
            labels = tuple(
                self._guard("" if row[i] is None else str(row[i]))
                if sku
                else sanitize_label_value("" if row[i] is None else row[i])
                for i, sku in zip(label_at, is_sku, strict=True)
            )
            if labels not in samples and len(samples) >= self.custom.max_series:
                if not self._warned:
                    LOGGER.warning(
                        "custom probe %s returned more than %d label sets; the rest are dropped",
                        self.name,
                        self.custom.max_series,
                        extra={"probe": self.name},
                    )
                    self._warned = True
                continue
            samples[labels] = samples.get(labels, 0.0) + value
        return (family(self.spec, sorted(samples.items())),)


ProbeT = TypeVar("ProbeT", bound=Probe)


@dataclass(frozen=True, slots=True)
class DialectProbes(Generic[ProbeT]):
    """One dialect's database probe classes, by the config section that enables each:
    what :func:`build_db_probes` builds from (PostgreSQL's and MySQL's differ only in
    their SQL and their pool)."""

    negative_stock: Callable[[ExporterConfig, Any, LabelGuard], ProbeT]
    oversold: Callable[[ExporterConfig, Any, LabelGuard], ProbeT]
    duplicate_orders: Callable[[ExporterConfig, Any, LabelGuard], ProbeT]
    lock_waiters: Callable[[ExporterConfig, Any], ProbeT]
    deadlocks: Callable[[ExporterConfig, Any], ProbeT]
    long_transactions: Callable[[ExporterConfig, Any], ProbeT]
    expired_reservations: Callable[[ExporterConfig, Any], ProbeT]
    outbox: Callable[[ExporterConfig, Any], ProbeT]
    custom: Callable[[CustomProbe, Any, LabelGuard], ProbeT]


def build_db_probes(
    config: ExporterConfig, pool: object, guard: LabelGuard, kit: DialectProbes[ProbeT]
) -> list[ProbeT]:
    """The enabled database probes of ``config`` on ``pool``, from ``kit``'s classes
    (cache drift is built by the runner). The SKU-labelled ones share ``guard``."""
    p = config.probes
    guarded = (
        (p.negative_stock.enabled, kit.negative_stock),
        (p.oversold.enabled, kit.oversold),
        (p.duplicate_orders.enabled, kit.duplicate_orders),
    )
    plain = (
        (p.lock_waiters.enabled, kit.lock_waiters),
        (p.deadlocks.enabled, kit.deadlocks),
        (p.long_transactions.enabled, kit.long_transactions),
        (p.expired_reservations.enabled, kit.expired_reservations),
        (p.outbox.enabled, kit.outbox),
    )
    probes = [make(config, pool, guard) for enabled, make in guarded if enabled]
    probes += [make(config, pool) for enabled, make in plain if enabled]
    probes += [kit.custom(custom, pool, guard) for custom in p.custom]
    return probes
