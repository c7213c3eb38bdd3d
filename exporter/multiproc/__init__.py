"""Read prometheus_client's multiprocess directory, one file at a time, without failing.

The checkout app runs under gunicorn (or any pre-fork server) with
``PROMETHEUS_MULTIPROC_DIR`` set, so every worker writes its values into its own
memory-mapped files in that directory:

- ``counter_<pid>.db``, ``histogram_<pid>.db``, ``summary_<pid>.db``;
- ``gauge_<mode>_<pid>.db`` for each gauge multiprocess mode (``all``, ``liveall``,
  ``min``, ``livemin``, ``max``, ``livemax``, ``sum``, ``livesum``, ``mostrecent``,
  ``livemostrecent``).

prometheus_client's own ``MultiProcessCollector`` reads them all in one pass, and one
truncated or corrupt file (a full disk, a worker killed while the file was being grown, a
stray copy) raises out of ``collect()`` and fails the whole scrape: the SRE loses every
stock metric exactly when something is already wrong. :class:`MultiprocessDirCollector`
reads each file on its own, skips a bad one, counts it in
``stocksentry_multiprocess_files_skipped_total{reason}`` and merges the rest with
prometheus_client's semantics:

- counters, summaries and histograms are summed across pids (histogram buckets are
  made cumulative again and ``_count`` is the ``+Inf`` bucket);
- gauges follow the mode of the file they come from: ``all``/``liveall`` keep one
  series per worker with a ``pid`` label; ``min``/``max``/``sum`` (and their ``live``
  variants) aggregate across workers; ``mostrecent``/``livemostrecent`` keep the value
  with the newest timestamp.

Liveness of ``live*`` gauges. A ``live*`` file counts only while its worker is alive,
decided in two steps:

1. the file must exist: gunicorn's ``child_exit`` hook calling
   ``prometheus_client.multiprocess.mark_process_dead(pid)`` deletes it (this is
   prometheus_client's own rule);
2. when ``check_pids`` is true (the default), ``os.kill(pid, 0)`` must also succeed
   (``PermissionError`` counts as alive: the process exists under another user). This
   drops the gauges of a worker that was SIGKILLed or OOM-killed before any hook ran.

The second check is only meaningful when the exporter sees the app's processes, i.e.
shares its PID namespace (the same container, or a Kubernetes pod with
``shareProcessNamespace: true``). In a sidecar with its own PID namespace every app pid
looks dead (or, worse, matches an unrelated local process), so pass
``check_pids=False`` there and rely on ``mark_process_dead``. A pid part that is not a
number (a custom ``process_identifier``) cannot be checked and counts as alive.

Other choices, each a deliberate difference from ``MultiProcessCollector``:

- an empty file (0 bytes, or a header that says "nothing written yet") is a worker that
  is just starting: it contributes nothing and is not counted as skipped;
- a file that vanishes between listing and reading (``mark_process_dead``) is ignored;
- a key naming what the text exposition cannot carry (a control character in a name, a
  label name that is empty, reserved (``__``) or escapes like another, a sample suffix
  no writer makes) skips its file as ``corrupt``: prometheus_client would write it into
  the text and every parser would refuse the whole scrape;
- a special file named like one of ours (a FIFO, a device, a directory) is skipped as
  ``unreadable`` without being read: opening a FIFO with no writer would block;
- files are read in directory order, the order ``glob`` gives prometheus_client, so
  floating-point sums come out bit for bit the same as ``MultiProcessCollector``'s;
- a missing directory (the app has not started yet) yields only our own health series,
  and is logged once.

Speed. Reading happens in ``collect()``, the only file I/O allowed on the scrape path,
so the reader is built for it: one ``read`` per file (after one ``fstat``), a plain loop
over the fixed binary layout, and the JSON keys parsed once and cached across scrapes
(they name series and hardly ever change), so a scrape is mostly struct unpacking and
dict additions.

Measured against prometheus_client's ``MultiProcessCollector`` (the decision to keep
our reader rests on these figures). Command::

    python benchmarks/bench_multiproc.py --workers 8 --skus 200 --repeats 15

On 2026-12-01, prometheus_client 0.26.0, CPython 3.11.7, a shared 2-core machine: 8 live
workers writing the catalog's app series through ``StockMetrics`` for 200 SKUs plus
``liveall``/``livesum``/``mostrecent`` gauges (40 files, 6 MiB, 3,786 samples). Median
per scrape over 15 interleaved rounds; both readers give the same samples first:

=============================  ===========  ===================
reader                         merge (ms)   merge + text (ms)
=============================  ===========  ===================
ours, ``check_pids=True``      21.5         36.5
ours, ``check_pids=False``     21.6         37.1
prometheus_client              51.0         66.4
=============================  ===========  ===================

What each makes of the same directory with one defect (successes summed over SKUs are
6,394 when healthy):

- a torn file (cut at half its ``used`` bytes), garbage in one key, a 0-byte file of a
  starting worker: ours skips that file and counts it (``truncated``, ``corrupt``; the
  empty file is not counted), serving the rest (5,600 successes without the bad worker's
  file); prometheus_client raises (``struct.error``, ``UnicodeDecodeError``) and the
  whole scrape fails;
- a stray ``backup.db`` (a copy of a counter file): ours skips it (``bad_name``);
  prometheus_client either raises ``ValueError: Invalid metric type`` or, when a real
  counter file came first in directory order, silently adds the copy (7,188 successes);
- a FIFO named ``counter_<pid>.db``: ours refuses it without blocking (``unreadable``);
  prometheus_client blocks in ``open()``, and the scrape with it, for ever;
- every worker gone without ``mark_process_dead`` (SIGKILL, OOM kill): ours drops their
  ``live*`` gauges (0 samples left), prometheus_client keeps all 1,601;
- reads: both read at most the file's size; ours checks every length against ``used``
  before using it and reads nothing past it, and does not read special files at all;
- exemplars: prometheus_client's multiprocess value class stores none, so its reader has
  none to give; ours reads the workers' ``exemplars_<pid>.mmap`` files (written by
  :mod:`stocksentry.instrumentation.mpexemplars`, read by :mod:`.exemplars`) and attaches
  the latest exemplar per bucket across workers. With 16 workers x 500 SKUs recording an
  exemplar on every observation, ours serves OpenMetrics with them in 246 ms against
  prometheus_client's 415 ms for plain text without them (0.59x), and an exemplar costs a
  worker about 1.9 µs per observation (4.2 against 2.3 µs for ``reservation_duration``);
  ``python benchmarks/bench_multiproc.py --workers 16 --skus 500 --repeats 7``.

So ours is kept: it is about 2.4 times faster per merge and 1.8 times per text scrape,
and it is the only one of the two that serves a scrape through a bad file, drops the
gauges of killed workers and carries exemplars.

Worker churn. A pre-fork server recycling its workers leaves every dead worker's files
for ever; with ``compact_dead=True`` (and ``check_pids``: the app's PID namespace) the
collector folds them into ``<type>[_<mode>]_compacted.db`` and
``exemplars_compacted.mmap`` (:mod:`.compaction`, which says what happens to each gauge
mode and why it is safe against concurrent scrapes, crashes and pid reuse). Scrapes hold
a shared ``flock`` on the directory's compaction lock while they list and read.

The module is split so that no part passes 500 lines: :mod:`.files` (names, the binary
layout, reading one file), :mod:`.merge` (one scrape's merge), :mod:`.exemplars` (reading
the workers' exemplar files), :mod:`.compaction` (dead workers' files), and this module
(the collector).

Example::

    from prometheus_client import CollectorRegistry, generate_latest
    from stocksentry.exporter.multiproc import MultiprocessDirCollector

    registry = CollectorRegistry()
    registry.register(MultiprocessDirCollector("/run/stocksentry/prom", check_pids=False))
    print(generate_latest(registry).decode())
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
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
from .exemplars import exemplar_pid, read_exemplars
from .files import (
    GAUGE_MODES,
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

__all__ = [
    "COMPACTED",
    "FILES_MERGED",
    "FILES_SKIPPED",
    "GAUGE_MODES",
    "SKIP_REASONS",
    "Compaction",
    "MultiprocessDirCollector",
    "SkipReason",
]

_log = logging.getLogger(__name__)

#: Counter (exposed as ``..._total``), label ``reason`` (one of :data:`SKIP_REASONS`).
FILES_SKIPPED: Final = catalog.MULTIPROCESS_FILES_SKIPPED
#: Gauge, no labels: how many files the last scrape merged.
FILES_MERGED: Final = catalog.MULTIPROCESS_FILES

# Parsed keys are kept across scrapes; this bounds the cache if label values churn.
_KEY_CACHE_LIMIT: Final = 500_000
# Warnings about bad files are logged once per (file, reason); bounded likewise.
_WARNED_LIMIT: Final = 10_000
#: Seconds between two compactions started by scrapes.
COMPACT_INTERVAL: Final = 30.0


class MultiprocessDirCollector:
    """A prometheus_client collector for a multiprocess directory that survives bad files.

    Thread-safe: two scrapes may call :meth:`collect` at once.

    Args:
        path: the directory the app's workers write (their ``PROMETHEUS_MULTIPROC_DIR``).
        check_pids: also drop ``live*`` gauges whose pid is not alive according to
            ``os.kill(pid, 0)``; see the module docstring for when to turn it off.
        compact_dead: compact the files of dead pids (:mod:`.compaction`) at most every
            ``compact_interval`` seconds, before a scrape. Needs ``check_pids`` (it is
            refused without: every pid of another PID namespace looks dead) and a
            directory this process can write; off by default.

    Example::

        >>> import tempfile
        >>> from prometheus_client import CollectorRegistry
        >>> registry = CollectorRegistry()
        >>> collector = MultiprocessDirCollector(tempfile.mkdtemp())
        >>> registry.register(collector)
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
        self._keys: dict[bytes, Key] = {}
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

    def _key_of(self, raw: bytes) -> Key:
        key = self._keys.get(raw)
        if key is None:
            key = parse_key(raw)
            if len(self._keys) >= _KEY_CACHE_LIMIT:
                # Label churn beyond any sane catalog: start over rather than grow.
                self._keys.clear()
            self._keys[raw] = key
        return key

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
                os.path.join(self.path, name),
                reason,
                detail,
            )

    def _list(self) -> list[str]:
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
            return []
        self._missing_logged = False
        return names

    def compact(self, *, max_pids: int = MAX_PIDS) -> Compaction:
        """Compact the files of at most ``max_pids`` dead pids now (see
        :mod:`.compaction`); what was done.

        Unreadable files of dead pids are counted in the skipped-files counter, like a
        scrape counts them. Refused (``ValueError``) without ``check_pids``.
        """
        if not self.check_pids:
            raise ValueError("compaction needs check_pids (the app's PID namespace)")
        try:
            result = compact(self.path, self._key_of, max_pids=max_pids)
        except FileNotFoundError:
            return Compaction(ran=False)
        for reason, count in result.skipped.items():
            with self._lock:
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
        merge = Merge(self._key_of, self._keys)
        with scrape_lock(str(self.path)):
            self._merge_files(merge, exemplars=exemplars)
        yield from merge.families()
        yield from self._own_metrics(merge.files)

    def _merge_files(self, merge: Merge, *, exemplars: bool) -> None:
        alive: dict[str, bool] = {}
        directory = str(self.path)
        names = self._list()
        # Compacted files first: each names the files folded into it (left by a
        # compaction that was stopped before deleting them), which are then not merged.
        compacted: dict[str, Entries] = {}
        folded: set[str] = set()
        for name in names:
            if name.endswith(f"_{COMPACTED}.db"):
                try:
                    entries, listed = manifest_of(read_entries(os.path.join(directory, name)))
                except FileNotFoundError:
                    continue
                except SkipFile as skip:
                    self._skip(name, skip.reason, skip.detail)
                    continue
                compacted[name] = entries
                folded |= listed
        for name in names:
            if not name.endswith(".db"):
                # An exemplar file (the listing keeps only those and *.db).
                if not exemplars:
                    continue
                try:
                    merge.add_exemplars(read_exemplars(os.path.join(directory, name)))
                except FileNotFoundError:
                    continue
                except SkipFile as skip:
                    self._skip(name, skip.reason, skip.detail)
                continue
            if name in folded:
                continue
            parsed = parse_name(name)
            if parsed is None:
                self._skip(name, "bad_name", "not <type>[_<mode>]_<pid>.db")
                continue
            if parsed.pid == COMPACTED:
                held = compacted.get(name)
                if held is not None:
                    merge.add(parsed, held)
                continue
            if parsed.mode.startswith("live") or parsed.mode == "all":
                if staged(parsed.pid):
                    continue  # a dead pid's gauge, being dropped by a compaction
                if parsed.mode != "all" and self.check_pids:
                    is_alive = alive.get(parsed.pid)
                    if is_alive is None:
                        is_alive = alive[parsed.pid] = pid_alive(parsed.pid)
                    if not is_alive:
                        continue
            try:
                merge.add(parsed, read_entries(os.path.join(directory, name)))
            except FileNotFoundError:
                # Removed since the listing (mark_process_dead): nothing to merge.
                continue
            except SkipFile as skip:
                self._skip(name, skip.reason, skip.detail)

    def _own_metrics(self, files: int) -> Iterator[Metric]:
        skipped = CounterMetricFamily(
            FILES_SKIPPED.base_name, FILES_SKIPPED.help, labels=["reason"]
        )
        for reason, count in self.skipped.items():
            skipped.add_metric([reason], float(count))
        yield skipped
        yield GaugeMetricFamily(FILES_MERGED.name, FILES_MERGED.help, value=float(files))
