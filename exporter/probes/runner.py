"""The probe runner: one asyncio task per probe on its own interval and timeout, the last
:class:`~.base.ProbeResult` of each, and :meth:`~ProbeRunner.collect`, which only reads
those results: a scrape never waits for the database or Redis.

Example, in any aiohttp app (the sidecar's server takes ``background=[...]``)::

    registry.register(runner)
    app.cleanup_ctx.append(runner.cleanup_ctx)
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard
from stocksentry.instrumentation.secrets import secret_fragments

from ..config import ELECTION_PROBE, ExporterConfig
from ..durations import format_duration
from .base import (
    LOGGER,
    ErrorLog,
    Probe,
    ProbeResult,
    at_fixed_rate,
    describe_error,
    family,
    new_phase,
)
from .db import build_db_probes
from .election import LeaderElection
from .indexes import IndexAdvice, check_indexes
from .pool import Pool

if TYPE_CHECKING:
    # Imported when a redis: section is configured: the sidecar runs without the
    # redis package otherwise (it comes with the [redis] extra).
    from .redis import RedisSource


class ProbeRunner:
    """Runs the probes of ``config`` in the background and exports their last results;
    ``registry``: where it registers itself as a collector (else register it yourself).

    A scrape sees ``stocksentry_probe_up``, ``_duration_seconds`` and
    ``_last_success_timestamp_seconds`` per probe run here (``leader_election`` included),
    ``stocksentry_probe_leader``, and the figures of each probe whose last run succeeded
    (a failed run exports none: nothing stale). With ``database.leader_election`` only the
    lock holder runs the database probes (cache drift included).

    Example::

        async with ProbeRunner(config, registry=registry) as runner:
            ...
    """

    #: The collector's name, for the server's per-collector error accounting.
    name = "probes"

    def __init__(
        self,
        config: ExporterConfig,
        *,
        registry: CollectorRegistry | None = None,
        error_log_interval: float = 60.0,
    ) -> None:
        self.config = config
        guard_config = config.sku_guard
        self.sku_guard = LabelGuard(guard_config.max_skus, always=guard_config.promo_skus)
        sources = [s.url.reveal() for s in (config.database, config.redis) if s is not None]
        secrets = [fragment for url in sources for fragment in secret_fragments(url)]
        self._errors = ErrorLog(LOGGER, interval=error_log_interval, secrets=secrets)

        self._pool: Pool | None = None
        self._redis: RedisSource | None = None
        self._db_probes: list[Probe] = []
        if config.database is not None:
            self._pool = Pool(config.database)
            self._db_probes.extend(build_db_probes(config, self._pool, self.sku_guard))
        redis = config.redis
        if self._pool is not None and config.probes.cache_drift.enabled and redis is not None:
            try:
                from .redis import CacheDriftProbe, RedisSource
            except ModuleNotFoundError as exc:
                if exc.name is None or exc.name.partition(".")[0] != "redis":
                    raise
                raise ModuleNotFoundError(
                    "the redis: section needs the redis package: "
                    "pip install 'stocksentry[exporter]'",
                    name=exc.name,
                ) from None
            self._redis = RedisSource(redis, timeout=config.probes.cache_drift.timeout)
            self._db_probes.append(
                CacheDriftProbe(config, self._pool, self._redis, guard=self.sku_guard)
            )

        self._election: LeaderElection | None = None
        if config.database is not None and config.database.leader_election:
            self._election = LeaderElection(
                config.database,
                on_elected=self._start_db_probes,
                on_deposed=self._stop_db_probes,
                on_result=lambda result: self._set_result(ELECTION_PROBE, result),
                errors=self._errors,
            )
        # Replaced, never mutated, so collect() in another thread reads a consistent dict.
        self._results: Mapping[str, ProbeResult] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        #: Runs given up on at their timeout, still ending (their sessions are cut).
        self._abandoned: dict[str, asyncio.Task[tuple[Metric, ...]]] = {}
        self._election_task: asyncio.Task[None] | None = None
        self._db_running = False
        self._started = False
        self._stopping = False
        #: Indexes the probes expect but the database lacks; ``None`` until checked (at
        #: the start of the database probes, i.e. on becoming leader).
        self.index_advice: tuple[IndexAdvice, ...] | None = None
        if registry is not None:
            registry.register(self)

    # --- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the background work and return at once (the first runs follow)."""
        if self._started:
            return
        self._started = True
        for note in self.config.notes:
            LOGGER.info("%s", note)
        if self.config.database is None:
            LOGGER.info("no database section: no database probes")
            return
        LOGGER.info(
            "database probes: %s (database URL from %s)",
            ", ".join(p.name for p in self._db_probes) or "none",
            self.config.database.url_source,
        )
        if self._election is not None:
            self._election_task = asyncio.create_task(
                self._election.run(), name="stocksentry-leader-election"
            )
        else:
            await self._start_db_probes()

    async def stop(self) -> None:
        """Cancel every task and wait for it, then close the connections. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        # Probes first: once the election's session closes, another sidecar may lead, and
        # two leaders must not probe at once.
        await self._stop_db_probes()
        if self._election_task is not None:
            self._election_task.cancel()
            await asyncio.wait([self._election_task])
            self._election_task = None
        if self._abandoned:
            await asyncio.wait(list(self._abandoned.values()))
        if self._pool is not None:
            await self._pool.close()
        if self._redis is not None:
            await self._redis.close()

    async def __aenter__(self) -> ProbeRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def cleanup_ctx(self, app: object) -> AsyncIterator[None]:
        """For ``app.cleanup_ctx``: start before ``yield``, stop (cancel, await) after."""
        async with self:
            yield

    async def _start_db_probes(self) -> None:
        if self._stopping or self._db_running:
            return
        self._db_running = True
        if self._election is not None:
            LOGGER.info("leading: this exporter runs the database probes")
        for probe in self._db_probes:
            # Incremental probes start over on every election: what they kept may be
            # hours old, and a rebuild is spread over runs where catching up is not.
            probe.reset()
            self._tasks[probe.name] = asyncio.create_task(
                at_fixed_rate(probe.interval, functools.partial(self.run_once, probe)),
                name=f"stocksentry-probe-{probe.name}",
            )
        if self._pool is not None:
            self._tasks["__index_check__"] = asyncio.create_task(
                self._check_indexes(self._pool), name="stocksentry-index-check"
            )

    async def _stop_db_probes(self) -> None:
        if not self._db_running:
            return
        self._db_running = False
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        names = {p.name for p in self._db_probes}
        self._results = {k: v for k, v in self._results.items() if k not in names}
        if self._pool is not None:
            await self._pool.close_idle()
        if self._election is not None and not self._stopping:
            LOGGER.warning("no longer leading: database probes stopped")

    # --- running probes ------------------------------------------------------------------

    async def run_once(self, probe: Probe) -> ProbeResult:
        """Run ``probe`` once within its timeout, record and return the result (never
        raises for a probe failure). At the timeout the run is cancelled (its session cut:
        :func:`~.dialects.abandoning`) and ends in the background, the result saying what
        it waited for; the next run waits for it within its own timeout."""
        previous = self._results.get(probe.name)
        started = time.perf_counter()
        try:
            families = await self._run_abandoning(probe)
        except Exception as exc:
            message = self._errors.failed(probe.name, self._describe(exc, probe))
            last_success = None if previous is None else previous.last_success
            result = ProbeResult(False, time.perf_counter() - started, last_success, error=message)
        else:
            self._errors.recovered(probe.name)
            result = ProbeResult(True, time.perf_counter() - started, time.time(), families)
        self._set_result(probe.name, result)
        return result

    async def _run_abandoning(self, probe: Probe) -> tuple[Metric, ...]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + probe.timeout
        earlier = self._abandoned.get(probe.name)
        if earlier is not None:
            # Cut, it ends within a few iterations of the loop; this run's own timeout
            # bounds the wait (the probe's state is the earlier run's until it has).
            if not earlier.done():
                await asyncio.wait([earlier], timeout=probe.timeout)
            if not earlier.done():
                raise _NotRunError("the previous run, given up on at its timeout, is still ending")
            del self._abandoned[probe.name]
        context = contextvars.copy_context()
        phase = context.run(new_phase)
        task = asyncio.create_task(
            probe.run(), name=f"stocksentry-run-{probe.name}", context=context
        )
        try:
            # wait() never passes a cancellation on, so neither the timeout nor a stop
            # waits for the run's own clean-up.
            done, _ = await asyncio.wait([task], timeout=max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            self._abandon(probe, task)
            raise
        if not done:
            self._abandon(probe, task)
            timeout = f"timed out after {format_duration(probe.timeout)}"
            raise _NotRunError(f"{timeout} {phase[0]}" if phase[0] else timeout)
        return task.result()

    def _abandon(self, probe: Probe, task: asyncio.Task[tuple[Metric, ...]]) -> None:
        task.cancel()
        self._abandoned[probe.name] = task
        # Its outcome is the timeout, already reported: retrieve it so nothing is logged.
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())

    @staticmethod
    def _describe(exc: Exception, probe: Probe) -> str:
        return str(exc) if isinstance(exc, _NotRunError) else describe_error(exc, probe.timeout)

    def _set_result(self, name: str, result: ProbeResult) -> None:
        self._results = {**self._results, name: result}

    async def _check_indexes(self, pool: Pool) -> None:
        try:
            async with asyncio.timeout(60.0):
                advice = await check_indexes(pool, self.config)
        except Exception as exc:
            LOGGER.warning("index check failed: %s", self._errors.clean(describe_error(exc)))
            return
        self.index_advice = tuple(advice)
        for item in advice:
            LOGGER.warning("%s", item, extra={"probe": item.probe})

    # --- what the rest of the exporter reads ---------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Whether this instance runs the database probes now."""
        return self._db_running

    @property
    def results(self) -> Mapping[str, ProbeResult]:
        """The last result of each probe that has run (a read-only snapshot)."""
        return MappingProxyType(self._results)

    @property
    def probes(self) -> tuple[Probe, ...]:
        """Every probe this runner may run."""
        return tuple(self._db_probes)

    def collect(self) -> Iterator[Metric]:
        """The collector protocol: the last results, with no I/O."""
        results = self._results
        ran = sorted(results.items())
        yield family(catalog.PROBE_UP, [((n,), 1.0 if r.up else 0.0) for n, r in ran])
        yield family(catalog.PROBE_DURATION, [((n,), r.duration) for n, r in ran])
        yield family(
            catalog.PROBE_LAST_SUCCESS,
            [((n,), r.last_success) for n, r in ran if r.last_success is not None],
        )
        if self.config.database is not None:
            yield family(catalog.PROBE_LEADER, [((), 1.0 if self._db_running else 0.0)])
        for result in results.values():
            if result.up:
                yield from result.families

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` may yield, empty (for registry name checks)."""
        specs = [catalog.PROBE_UP, catalog.PROBE_DURATION, catalog.PROBE_LAST_SUCCESS]
        if self.config.database is not None:
            specs.append(catalog.PROBE_LEADER)
        for probe in self._db_probes:
            specs.extend(probe.specs)
        for spec in specs:
            yield family(spec)


class _NotRunError(Exception):
    """A run given up on at its timeout, or not started as the previous one is still
    ending: the message says which."""
