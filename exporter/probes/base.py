"""What every probe shares: its contract, its result, backoff, and quiet error logging.

Example::

    class Answer(Probe):
        specs = (catalog.NEGATIVE_INVENTORY_SKUS,)

        async def run(self) -> tuple[Metric, ...]:
            return (family(catalog.NEGATIVE_INVENTORY_SKUS, [((), 42.0)]),)

    probe = Answer("answer", interval=15.0, timeout=5.0)
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, NoReturn

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from stocksentry.instrumentation.catalog import MetricSpec
from stocksentry.instrumentation.secrets import redact

from ..durations import format_duration

LOGGER: Final = logging.getLogger("stocksentry.exporter.probes")


def family(spec: MetricSpec, samples: Iterable[tuple[Sequence[str], float]] = ()) -> Metric:
    """A gauge or counter family of ``spec`` holding ``samples`` (label values, value),
    e.g. ``family(catalog.DB_DEADLOCKS, [(("shop",), 3.0)])``."""
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
    """The last run of one probe, as a scrape sees it: a failed one has no families
    (nothing stale); ``last_success`` is the time of the last good run."""

    up: bool
    duration: float
    last_success: float | None
    families: tuple[Metric, ...] = ()
    error: str | None = None


class Probe(abc.ABC):
    """One background observation, run every ``interval`` seconds within ``timeout``."""

    #: The metrics :meth:`run` may return (for ``describe()``).
    specs: tuple[MetricSpec, ...] = ()

    def __init__(self, name: str, *, interval: float, timeout: float) -> None:
        self.name = name
        self.interval = interval
        self.timeout = timeout

    @abc.abstractmethod
    async def run(self) -> tuple[Metric, ...]:
        """Observe once and return the families to export until the next run."""

    def reset(self) -> None:
        """Forget what earlier runs kept (on becoming leader: it may be hours old)."""
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} every {format_duration(self.interval)}>"


async def at_fixed_rate(interval: float, step: Callable[[], Awaitable[object]]) -> NoReturn:
    """Run ``step`` every ``interval`` seconds from the start of the previous one (at once
    after one that overran), until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await step()
        await asyncio.sleep(max(0.0, started + interval - loop.time()))


# --- what a run is doing, for the message of a run that timed out ----------------------

#: The phase of the current probe run (a one-item list the runner reads), if any.
_PHASE: ContextVar[list[str] | None] = ContextVar("stocksentry_probe_phase", default=None)


def note_phase(text: str) -> None:
    """Say what the current probe run waits for (``waiting for a free database session``):
    a run that times out is reported with it. Outside a run, nothing happens."""
    phase = _PHASE.get()
    if phase is not None:
        phase[0] = text


def new_phase() -> list[str]:
    """A phase record for a run about to start (the runner sets it in the run's context)."""
    phase = [""]
    _PHASE.set(phase)
    return phase


# --- reconnecting politely -----------------------------------------------------------------


class Backoff:
    """Exponential backoff with jitter between attempts to reach a source that is down;
    meanwhile one attempt at a time goes out, the others are refused at once (reconnecting
    never holds more than one socket into a network that may be silent).

    Example::

        backoff = Backoff(initial=0.5, maximum=30.0)
        with backoff.attempt("database"):   # next attempt in ~0.5 s, ~1 s, ~2 s ... 30 s
            connect()
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
        self.last_error = ""
        self._in_flight = 0

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

    @contextlib.contextmanager
    def attempt(
        self,
        source: str,
        errors: tuple[type[BaseException], ...] = (Exception, asyncio.CancelledError),
    ) -> Iterator[None]:
        """One attempt to reach ``source`` (:class:`ProbeUnavailableError` while backing
        off): one of ``errors`` is a failure (and passes through), the end a success."""
        wait = self.wait_time()
        if wait > 0:
            raise ProbeUnavailableError(
                f"{source} unreachable ({self.last_error}); next attempt in {wait:.1f}s"
            )
        if self.failures and self._in_flight:
            raise ProbeUnavailableError(
                f"{source} unreachable ({self.last_error}); another attempt is under way"
            )
        self._in_flight += 1
        try:
            yield
        except errors as exc:
            self.last_error = (
                "no answer in time"
                if isinstance(exc, asyncio.CancelledError)
                else describe_error(exc)
            )
            self.failed()
            raise
        finally:
            self._in_flight -= 1
        self.succeeded()


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
    """Logs probe failures at most once per ``interval`` per probe, with secrets blanked:
    repeats are counted into the next line; a recovery logs once.

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
        """Count a failure of ``probe``, log it unless one was logged recently; returns
        the message without secrets (what the result keeps)."""
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
