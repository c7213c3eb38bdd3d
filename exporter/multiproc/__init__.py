"""Read prometheus_client's multiprocess directory, one file at a time, without failing:
a bad file is skipped and counted, the rest merged as prometheus_client merges them
(docs/exporter-server.md, "The multiprocess directory")."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Final

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from stocksentry.instrumentation import catalog

from .compaction import (
    COMPACTED,
    MAX_PIDS,
    Compaction,
    compact,
    manifest_of,
    scrape_lock,
    staged,
)
from .exemplars import exemplar_pid, merge_newest, read_exemplars
from .files import (
    SKIP_REASONS,
    Entries,
    Key,
    SkipFile,
    SkipReason,
    parse_key,
    parse_name,
    pid_alive,
    read_entries,
)
from .merge import Merge

__all__ = ["Compaction", "MultiprocessDirCollector"]

_log = logging.getLogger(__name__)

_KEY_CACHE_LIMIT: Final = 500_000
# Warnings about bad files are logged once per (file, reason); bounded likewise.
_WARNED_LIMIT: Final = 10_000
#: Seconds between two compactions started by scrapes.
COMPACT_INTERVAL: Final = 30.0


class MultiprocessDirCollector:
    """A prometheus_client collector for a multiprocess directory that survives bad files.

    Thread-safe. ``path`` is the workers' ``PROMETHEUS_MULTIPROC_DIR``; ``check_pids``
    also drops ``live*`` gauges of pids that ``os.kill(pid, 0)`` finds gone (off when the
    exporter does not share the app's PID namespace); ``compact_dead`` compacts the files
    of dead pids (:mod:`.compaction`) at most every ``compact_interval`` seconds, before a
    scrape (needs ``check_pids`` and a directory this process can write).

    Example::

        >>> import tempfile
        >>> from prometheus_client import CollectorRegistry
        >>> registry = CollectorRegistry()
        >>> registry.register(MultiprocessDirCollector(tempfile.mkdtemp()))
        >>> registry.get_sample_value("stocksentry_multiprocess_files")
        0.0
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        check_pids: bool = True,
        compact_dead: bool = False,
        compact_interval: float = COMPACT_INTERVAL,
    ) -> None:
        if compact_dead and not check_pids:
            raise ValueError(
                "compact_dead needs check_pids: without the app's PID namespace every "
                "worker looks dead"
            )
        self.path = Path(path)
        self.check_pids = check_pids
        self.compact_dead = compact_dead
        self.compact_interval = compact_interval
        self._next_compaction = 0.0
        self._compact_lock = threading.Lock()
        self._lock = threading.Lock()
        self._skipped: dict[SkipReason, int] = dict.fromkeys(SKIP_REASONS, 0)
        # Parsed keys are kept across scrapes (bounded, if label values churn).
        self._key_of: Callable[[bytes], Key] = functools.lru_cache(_KEY_CACHE_LIMIT)(parse_key)
        self._warned: set[tuple[str, str]] = set()
        self._missing_logged = False

    def describe(self) -> Iterable[Metric]:
        """Nothing: the series are only known by reading the files (no I/O at register)."""
        return ()

    @property
    def skipped(self) -> dict[SkipReason, int]:
        """A copy of the skipped-file counts by reason since this collector was made."""
        with self._lock:
            return dict(self._skipped)

    def _skip(self, name: str, reason: SkipReason, detail: str) -> None:
        with self._lock:
            self._skipped[reason] += 1
            first = (name, reason) not in self._warned
            if first:
                if len(self._warned) >= _WARNED_LIMIT:
                    self._warned.clear()
                self._warned.add((name, reason))
        if first:
            _log.warning(
                "skipping multiprocess file %s (%s): %s; the other files are still merged",
                self._path(name),
                reason,
                detail,
            )

    def compact(self, *, max_pids: int = MAX_PIDS) -> Compaction:
        """Compact the files of at most ``max_pids`` dead pids now; what was done.

        Unreadable files of dead pids are counted as skipped, as a scrape counts them.
        """
        if not self.check_pids:
            raise ValueError("compaction needs check_pids (the app's PID namespace)")
        try:
            result = compact(self.path, self._key_of, max_pids=max_pids)
        except FileNotFoundError:
            return Compaction(ran=False)
        with self._lock:
            for reason, count in result.skipped.items():
                self._skipped[reason] += count
        if result.pids:
            _log.info(
                "compacted the files of %d dead workers in %s (%d folded, %d gauges dropped)",
                len(result.pids),
                self.path,
                result.folded,
                result.dropped,
            )
        return result

    def _maybe_compact(self) -> None:
        now = time.monotonic()
        if now < self._next_compaction or not self._compact_lock.acquire(blocking=False):
            return
        try:
            self._next_compaction = now + self.compact_interval
            self.compact()
        except Exception as exc:  # whatever it is, never the scrape's failure
            # The files stay as they are (or as the manifest says), merged as before.
            _log.warning("compaction of %s failed: %s", self.path, exc)
        finally:
            self._compact_lock.release()

    def collect(self, *, exemplars: bool = True) -> Iterator[Metric]:
        """Merge every readable file, then yield the health series of this collector.

        ``exemplars=False`` leaves the workers' exemplar files unread: a Prometheus text
        scrape cannot carry exemplars, and reading them is a good part of a big merge.
        """
        if self.compact_dead:
            self._maybe_compact()
        merge = Merge(self._key_of)
        with scrape_lock(str(self.path)):
            self._merge_files(merge, exemplars=exemplars)
        yield from merge.families()
        spec = catalog.MULTIPROCESS_FILES_SKIPPED
        skipped = CounterMetricFamily(spec.base_name, spec.help, labels=["reason"])
        for reason, count in self.skipped.items():
            skipped.add_metric([reason], float(count))
        yield skipped
        spec = catalog.MULTIPROCESS_FILES
        yield GaugeMetricFamily(spec.name, spec.help, value=float(merge.files))

    @contextlib.contextmanager
    def _reading(self, name: str) -> Iterator[None]:
        """Around reading one file: a file that vanished since the listing
        (``mark_process_dead``) is passed over, a bad one skipped (counted, logged once)."""
        try:
            yield
        except FileNotFoundError:
            pass
        except SkipFile as skip:
            self._skip(name, skip.reason, str(skip))

    def _merge_files(self, merge: Merge, *, exemplars: bool) -> None:
        alive = functools.cache(pid_alive)
        try:
            with os.scandir(self.path) as it:
                # Directory order, as glob gives prometheus_client: floating-point sums
                # then come out bit for bit the same as MultiProcessCollector's.
                names = [
                    entry.name
                    for entry in it
                    if entry.name.endswith(".db") or exemplar_pid(entry.name) is not None
                ]
        except FileNotFoundError:
            if not self._missing_logged:
                self._missing_logged = True
                _log.warning(
                    "multiprocess directory %s does not exist (yet); no app metrics", self.path
                )
            return
        self._missing_logged = False
        # Compacted files first: each names the files folded into it (left by a
        # compaction that was stopped before deleting them), which are then not merged.
        compacted: dict[str, Entries] = {}
        folded: set[str] = set()
        for name in names:
            if name.endswith(f"_{COMPACTED}.db"):
                with self._reading(name):
                    compacted[name], listed = manifest_of(read_entries(self._path(name)))
                    folded |= listed
        for name in names:
            if not name.endswith(".db"):
                # An exemplar file (the listing keeps only those and *.db).
                if exemplars:
                    with self._reading(name):
                        merge_newest(merge.exemplars, read_exemplars(self._path(name)))
                continue
            if name in folded:
                continue
            parsed = parse_name(name)
            if parsed is None:
                self._skip(name, "bad_name", "not <type>[_<mode>]_<pid>.db")
                continue
            if parsed.pid == COMPACTED:
                if name in compacted:
                    with self._reading(name):
                        merge.add(parsed, compacted[name])
                continue
            if parsed.mode.startswith("live") or parsed.mode == "all":
                if staged(parsed.pid):
                    continue  # a dead pid's gauge, being dropped by a compaction
                if parsed.mode != "all" and self.check_pids and not alive(parsed.pid):
                    continue
            with self._reading(name):
                merge.add(parsed, read_entries(self._path(name)))

    def _path(self, name: str) -> str:
        return os.path.join(self.path, name)
