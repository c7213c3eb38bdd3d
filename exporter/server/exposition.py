"""The ``/metrics`` exposition: every source collected, encoded, with its errors counted.

:class:`MetricsRenderer` collects the sources one by one into one Prometheus text or
OpenMetrics body; :func:`build_renderer` lines up the server's sources. Rendering is CPU
work (the multiprocess files are read there), so the server runs it in a thread, shared by
the scrapes of one format that arrive together.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from stocksentry.instrumentation import catalog

from ..multiproc import MultiprocessDirCollector
from .buildinfo import BuildInfoCollector
from .settings import ServerSettings

_log = logging.getLogger("stocksentry.exporter.server")

# Errors of one collector are logged at most this often (they recur every scrape).
_ERROR_LOG_INTERVAL_S: Final = 60.0
_EOF: Final = b"# EOF\n"

# The OpenMetrics encoder is untyped in prometheus_client; this gives it a type once.
_encode_openmetrics: Final[Callable[[Collector], bytes]] = openmetrics.generate_latest


class _Families:
    """A collector over a fixed list, the shape prometheus_client's encoders take."""

    __slots__ = ("_families",)

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _encode(families: list[Metric], openmetrics: bool) -> bytes:
    if openmetrics:
        # Each chunk is encoded on its own (so one bad family costs only its collector);
        # the single "# EOF" goes at the very end.
        return _encode_openmetrics(_Families(families)).removesuffix(_EOF)
    return generate_latest(_Families(families))


class MetricsRenderer:
    """Collects every source and encodes one exposition; what ``/metrics`` runs in a thread.

    Sources are tried one by one: a collector that raises in ``collect()``, whose output
    cannot be encoded, or that repeats a family name an earlier source already exposed,
    is left out of the scrape and counted in ``stocksentry_collector_errors_total``
    (its first error and then one a minute, by ``clock``, are logged with the
    traceback). The counter itself is always the last family. Thread-safe.

    Example::

        >>> from prometheus_client import CollectorRegistry, Counter
        >>> registry = CollectorRegistry()
        >>> Counter("demo", "Demo.", registry=registry).inc()
        >>> renderer = MetricsRenderer([("demo", registry)])
        >>> b"demo_total 1.0" in renderer.render(openmetrics=False)
        True
    """

    def __init__(
        self,
        sources: Sequence[tuple[str, Collector]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sources = tuple(sources)
        self._clock = clock
        self._lock = threading.Lock()
        self._errors: dict[str, int] = {name: 0 for name, _ in self._sources}
        self._last_logged: dict[str, float] = {}
        self._inflight: dict[bool, asyncio.Future[bytes]] = {}

    @property
    def source_names(self) -> tuple[str, ...]:
        """The ``collector`` label values, in exposition order."""
        return tuple(name for name, _ in self._sources)

    def errors(self) -> dict[str, int]:
        """A copy of the error counts per collector."""
        with self._lock:
            return dict(self._errors)

    def render(self, *, openmetrics: bool) -> bytes:
        """The exposition of every working source, in OpenMetrics or Prometheus text."""
        chunks: list[bytes] = []
        seen: set[str] = set()
        for name, collector in self._sources:
            # Collectors are other people's code: whatever one raises costs only its own
            # part of the scrape, and is counted and logged (with the traceback) below.
            try:
                families = list(
                    collector.collect(exemplars=False)
                    if not openmetrics and isinstance(collector, MultiprocessDirCollector)
                    else collector.collect()
                )
            except Exception:
                self._failed(name, "collect() raised")
                continue
            names = [family.name for family in families]
            clash = seen.intersection(names)
            if clash:
                self._failed(name, f"repeats metric families {sorted(clash)}", trace=False)
                continue
            try:
                chunk = _encode(families, openmetrics)
            except Exception:
                self._failed(name, "its metrics could not be encoded")
                continue
            seen.update(names)
            chunks.append(chunk)
        chunks.append(_encode([self._own_family()], openmetrics))
        if openmetrics:
            chunks.append(_EOF)
        return b"".join(chunks)

    async def render_shared(self, *, openmetrics: bool) -> bytes:
        """:meth:`render` in a daemon thread, one per format at a time: a scrape joins the
        render of its format already running.

        Not the default executor: ``asyncio.run`` waits for its threads at exit, so a
        collector stuck forever would turn a clean SIGTERM into a SIGKILL.
        """
        future = self._inflight.get(openmetrics)
        if future is None:
            done: concurrent.futures.Future[bytes] = concurrent.futures.Future()

            def run() -> None:
                if done.set_running_or_notify_cancel():
                    try:
                        done.set_result(self.render(openmetrics=openmetrics))
                    except BaseException as exc:
                        done.set_exception(exc)

            threading.Thread(target=run, name="stocksentry-scrape", daemon=True).start()
            future = self._inflight[openmetrics] = asyncio.wrap_future(done)
            future.add_done_callback(lambda _: self._inflight.pop(openmetrics, None))
        # Shielded: a scrape that gives up must not cancel the render others wait for.
        return await asyncio.shield(future)

    def _failed(self, name: str, what: str, *, trace: bool = True) -> None:
        now = self._clock()
        with self._lock:
            self._errors[name] = self._errors.get(name, 0) + 1
            last = self._last_logged.get(name)
            log_it = last is None or now - last >= _ERROR_LOG_INTERVAL_S
            if log_it:
                self._last_logged[name] = now
        if log_it:
            _log.warning(
                "collector %s left out of the scrape: %s (logged at most once a minute)",
                name,
                what,
                exc_info=trace,
            )

    def _own_family(self) -> Metric:
        spec = catalog.COLLECTOR_ERRORS
        family = CounterMetricFamily(spec.base_name, spec.help, labels=list(spec.labels))
        for name, count in self.errors().items():
            family.add_metric([name], float(count))
        return family


def build_renderer(
    settings: ServerSettings, collectors: Sequence[Collector] = ()
) -> MetricsRenderer:
    """The renderer ``/metrics`` uses: multiprocess dir, then ``collectors``, then process."""
    sources: list[tuple[str, Collector]] = []
    if settings.multiprocess_dir is not None:
        multiprocess = MultiprocessDirCollector(
            settings.multiprocess_dir,
            check_pids=settings.multiprocess_check_pids,
            compact_dead=settings.multiprocess_compact,
        )
        sources.append(("multiprocess", multiprocess))
    taken = {"multiprocess", "process"}
    for collector in collectors:
        base = getattr(collector, "name", None)
        if not isinstance(base, str) or not base:
            base = type(collector).__name__
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}#{n}"
        taken.add(name)
        sources.append((name, collector))
    # The exporter's build info and its process, platform and GC metrics (as the default
    # registry has them).
    process = CollectorRegistry()
    process.register(BuildInfoCollector())
    ProcessCollector(registry=process)
    PlatformCollector(registry=process)
    GCCollector(registry=process)
    sources.append(("process", process))
    return MetricsRenderer(sources)
