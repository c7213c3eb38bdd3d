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
- files are read in directory order, the order ``glob`` gives prometheus_client, so
  floating-point sums come out bit for bit the same as ``MultiProcessCollector``'s;
- a missing directory (the app has not started yet) yields only our own health series,
  and is logged once.

Speed. Reading happens in ``collect()``, the only file I/O allowed on the scrape path,
so the reader is built for it: one ``read`` per file (after one ``fstat``), a plain loop
over the fixed binary layout, and the JSON keys parsed once and cached across scrapes
(they name series and hardly ever change), so a scrape is mostly struct unpacking and
dict additions.

Example::

    from prometheus_client import CollectorRegistry, generate_latest
    from stocksentry.exporter.multiproc import MultiprocessDirCollector

    registry = CollectorRegistry()
    registry.register(MultiprocessDirCollector("/run/stocksentry/prom", check_pids=False))
    print(generate_latest(registry).decode())
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString
from stocksentry.instrumentation import catalog

__all__ = [
    "FILES_MERGED",
    "FILES_SKIPPED",
    "GAUGE_MODES",
    "SKIP_REASONS",
    "MultiprocessDirCollector",
    "SkipReason",
]

_log = logging.getLogger(__name__)

SkipReason = Literal["bad_name", "corrupt", "truncated", "unreadable"]
#: Why a file was skipped: ``bad_name`` (``*.db`` not named ``<type>[_<mode>]_<pid>.db``),
#: ``truncated`` (shorter than its own header says), ``corrupt`` (the content does not
#: parse: bad lengths, invalid UTF-8 or JSON, a key of the wrong shape),
#: ``unreadable`` (an ``OSError`` other than "not found", e.g. permissions).
SKIP_REASONS: Final[tuple[SkipReason, ...]] = ("bad_name", "corrupt", "truncated", "unreadable")

#: The gauge multiprocess modes prometheus_client writes, one file per mode and pid.
GAUGE_MODES: Final[frozenset[str]] = frozenset(
    {
        "all",
        "liveall",
        "min",
        "livemin",
        "max",
        "livemax",
        "sum",
        "livesum",
        "mostrecent",
        "livemostrecent",
    }
)
_SUMMED_TYPES: Final[frozenset[str]] = frozenset({"counter", "histogram", "summary"})


#: Counter (exposed as ``..._total``), label ``reason`` (one of :data:`SKIP_REASONS`).
FILES_SKIPPED: Final = catalog.MULTIPROCESS_FILES_SKIPPED
#: Gauge, no labels: how many files the last scrape merged.
FILES_MERGED: Final = catalog.MULTIPROCESS_FILES

# The file layout, as prometheus_client's mmap_dict writes it (native byte order, since
# writer and reader share a machine): a 4-byte int "bytes used", 4 bytes of padding, then
# entries of [4-byte key length][UTF-8 key, padded to 8-byte alignment][value: double]
# [timestamp: double].
_INT: Final = struct.Struct("i")
_TWO_DOUBLES: Final = struct.Struct("dd")
_HEADER_SIZE: Final = 8
# One read covers small files; the header says how much more to read.
_FIRST_READ: Final = 64 * 1024
# Parsed keys are kept across scrapes; this bounds the cache if label values churn.
_KEY_CACHE_LIMIT: Final = 500_000
# Warnings about bad files are logged once per (file, reason); bounded likewise.
_WARNED_LIMIT: Final = 10_000

# floatToGoString is untyped in prometheus_client; this gives it a type once.
_go_float: Final[Callable[[float], str]] = floatToGoString


class _SkipFile(Exception):
    """Raised by the reader when one file must be skipped; carries the reason."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: SkipReason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Key:
    """One parsed mmap key: which sample of which metric, with which labels."""

    metric: str
    sample: str
    help: str
    # The labels for the output Sample (shared across scrapes, never mutated).
    labels_dict: dict[str, str]
    # Histogram buckets only: the bound, and the labels without ``le``.
    le: float | None
    labels_without_le: tuple[tuple[str, str], ...]


def _parse_key(raw: bytes) -> _Key:
    """Parse and validate one key; raises ``_SkipFile('corrupt')`` on anything odd."""
    try:
        decoded = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: garbage such as "[[[[..." nested deeper than json can go.
        raise _SkipFile("corrupt", f"key is not UTF-8 JSON: {exc}") from None
    if not (isinstance(decoded, list) and len(decoded) == 4):
        raise _SkipFile("corrupt", "key is not a 4-item JSON list")
    metric, sample, labels, help_text = decoded
    if not (
        isinstance(metric, str)
        and isinstance(sample, str)
        and isinstance(help_text, str)
        and isinstance(labels, dict)
        and sample.startswith(metric)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise _SkipFile("corrupt", "key has fields of the wrong type")
    try:
        # Metric() applies prometheus_client's own name validation; failing here (not
        # while building the output) keeps a bad name confined to its file.
        Metric(metric, help_text, "unknown")
    except ValueError as exc:
        raise _SkipFile("corrupt", str(exc)) from None
    label_items = tuple(sorted(labels.items()))
    le: float | None = None
    without_le = label_items
    if sample.endswith("_bucket") and "le" in labels:
        try:
            le = float(labels["le"])
        except ValueError:
            raise _SkipFile("corrupt", f"bucket bound {labels['le']!r} is not a number") from None
        without_le = tuple(item for item in label_items if item[0] != "le")
    return _Key(metric, sample, help_text, dict(label_items), le, without_le)


# (key bytes, value, timestamp) for every entry of one file.
_Entries = list[tuple[bytes, float, float]]


def _read_entries(path: str) -> _Entries:
    """Read every entry of one file, or raise ``_SkipFile``; ``FileNotFoundError`` passes.

    The file is read completely before anything is merged, so a file that turns out bad
    halfway contributes nothing.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                # Created by a starting worker, not sized yet.
                return []
            if size < _HEADER_SIZE:
                raise _SkipFile("truncated", f"{size} bytes, shorter than the header")
            data = f.read(min(size, _FIRST_READ))
            if len(data) < _HEADER_SIZE:
                # Shrunk since the fstat: someone truncated it under us.
                raise _SkipFile("truncated", f"read {len(data)} bytes, shorter than the header")
            (used,) = _INT.unpack_from(data, 0)
            if used == 0:
                # Sized but nothing written yet.
                return []
            if used < _HEADER_SIZE:
                raise _SkipFile("corrupt", f"header says {used} bytes used")
            if used > size:
                raise _SkipFile("truncated", f"header says {used} bytes used, file has {size}")
            if used > len(data):
                data += f.read(used - len(data))
                if len(data) < used:
                    raise _SkipFile("truncated", f"read {len(data)} of {used} bytes")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _SkipFile("unreadable", f"{type(exc).__name__}: {exc}") from None

    entries: _Entries = []
    append = entries.append
    unpack_int = _INT.unpack_from
    unpack_two = _TWO_DOUBLES.unpack_from
    pos = _HEADER_SIZE
    while pos < used:
        # Every bound is checked before it is used: a garbage length must neither read
        # past `used` nor move `pos` backwards (which would loop forever).
        if pos + 4 > used:
            raise _SkipFile("corrupt", f"entry header at {pos} runs past {used}")
        (length,) = unpack_int(data, pos)
        if length <= 0:
            raise _SkipFile("corrupt", f"key length {length} at {pos}")
        value_pos = pos + 4 + length + (8 - (length + 4) % 8)
        end = value_pos + 16
        if end > used:
            raise _SkipFile("corrupt", f"entry at {pos} runs past {used}")
        value, timestamp = unpack_two(data, value_pos)
        append((data[pos + 4 : pos + 4 + length], value, timestamp))
        pos = end
    return entries


@dataclass(frozen=True, slots=True)
class _FileName:
    typ: str
    mode: str  # gauge mode, "" for other types
    pid: str


def _parse_name(name: str) -> _FileName | None:
    """``counter_12.db`` -> (counter, "", 12); ``gauge_livesum_12.db`` -> (gauge, livesum, 12)."""
    stem = name[:-3]
    typ, _, rest = stem.partition("_")
    if typ == "gauge":
        mode, _, pid = rest.partition("_")
        if mode not in GAUGE_MODES or not pid:
            return None
        return _FileName(typ, mode, pid)
    if typ in _SUMMED_TYPES and rest:
        return _FileName(typ, "", rest)
    return None


def _pid_alive(pid: str) -> bool:
    """True unless ``pid`` is a number and no such process exists here."""
    try:
        number = int(pid)
    except ValueError:
        return True
    if number <= 0:
        # os.kill(0 or negative) addresses process groups, not one process.
        return True
    try:
        os.kill(number, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


class _Merge:
    """Accumulators for one scrape; files are added one by one, families built at the end."""

    def __init__(self, key_of: Callable[[bytes], _Key], known: dict[bytes, _Key]) -> None:
        self._key_of = key_of
        self._known = known
        # counter/summary/histogram: key -> sum over pids; dicts keep first-seen order.
        self.summed: dict[str, dict[bytes, float]] = {t: {} for t in _SUMMED_TYPES}
        # all/liveall: (key, pid) -> value.
        self.per_pid: dict[tuple[bytes, str], float] = {}
        # min/max/sum (and live variants): key -> value; mostrecent: key -> (ts, value).
        self.aggregated: dict[str, dict[bytes, float]] = {}
        self.most_recent: dict[bytes, tuple[float, float]] = {}
        self.files = 0

    def add(self, name: _FileName, entries: _Entries) -> None:
        # Validate every key before merging anything: a bad key skips the whole file.
        # Keys seen by an earlier scrape are already valid, so this is one lookup each.
        known = self._known
        for raw, _, _ in entries:
            if raw not in known:
                self._key_of(raw)
        self.files += 1
        if name.typ != "gauge":
            acc = self.summed[name.typ]
            get = acc.get
            for raw, value, _ in entries:
                acc[raw] = get(raw, 0.0) + value
            return
        mode = name.mode.removeprefix("live")
        if mode == "all":
            per_pid = self.per_pid
            for raw, value, _ in entries:
                per_pid[(raw, name.pid)] = value
        elif mode == "mostrecent":
            recent = self.most_recent
            for raw, value, timestamp in entries:
                held = recent.get(raw)
                # Strictly newer than what we hold (or than 0.0): prometheus_client's rule.
                if timestamp > (held[0] if held else 0.0):
                    recent[raw] = (timestamp, value)
        else:
            acc = self.aggregated.setdefault(mode, {})
            get = acc.get
            if mode == "sum":
                for raw, value, _ in entries:
                    acc[raw] = get(raw, 0.0) + value
            elif mode == "min":
                for raw, value, _ in entries:
                    current = get(raw)
                    if current is None or value < current:
                        acc[raw] = value
            else:  # max
                for raw, value, _ in entries:
                    current = get(raw)
                    if current is None or value > current:
                        acc[raw] = value

    def families(self) -> list[Metric]:
        """Build the merged families: counters, gauges, histograms, summaries.

        Help comes from the first file (in directory order) that names the metric, as in
        prometheus_client. A metric written under two types keeps the type that comes
        first here; the rest is dropped rather than exposed under a wrong TYPE line.
        """
        key_of = self._key_of
        by_name: dict[str, Metric] = {}

        def samples_of(key: _Key, typ: str) -> list[Sample] | None:
            family = by_name.get(key.metric)
            if family is None:
                family = by_name[key.metric] = Metric(key.metric, key.help, typ)
            elif family.type != typ:
                return None
            return family.samples

        for raw, value in self.summed["counter"].items():
            key = key_of(raw)
            samples = samples_of(key, "counter")
            if samples is not None:
                samples.append(Sample(key.sample, key.labels_dict, value))

        for (raw, pid), value in self.per_pid.items():
            key = key_of(raw)
            samples = samples_of(key, "gauge")
            if samples is not None:
                samples.append(Sample(key.sample, {**key.labels_dict, "pid": pid}, value))
        for acc in self.aggregated.values():
            for raw, value in acc.items():
                key = key_of(raw)
                samples = samples_of(key, "gauge")
                if samples is not None:
                    samples.append(Sample(key.sample, key.labels_dict, value))
        for raw, (_, value) in self.most_recent.items():
            key = key_of(raw)
            samples = samples_of(key, "gauge")
            if samples is not None:
                samples.append(Sample(key.sample, key.labels_dict, value))

        # Histograms: buckets are stored per bound and per pid; sum them, then make them
        # cumulative per label set and derive _count from the +Inf bucket.
        Group = tuple[str, tuple[tuple[str, str], ...]]
        buckets_of: dict[Group, dict[float, float]] = {}
        # The first key of each group stands for its metric (name, help).
        others_of: dict[Group, tuple[_Key, list[Sample]]] = {}
        for raw, value in self.summed["histogram"].items():
            key = key_of(raw)
            group = (key.metric, key.labels_without_le)
            first = others_of.get(group)
            if first is None:
                first = others_of[group] = (key, [])
                buckets_of[group] = {}
            others = first[1]
            if key.le is None:
                others.append(Sample(key.sample, key.labels_dict, value))
            else:
                buckets = buckets_of[group]
                buckets[key.le] = buckets.get(key.le, 0.0) + value
        for group, (first_key, others) in others_of.items():
            metric_name, labels = group
            samples = samples_of(first_key, "histogram")
            if samples is None:
                continue
            buckets = buckets_of[group]
            if buckets:
                running = 0.0
                for bound in sorted(buckets):
                    running += buckets[bound]
                    samples.append(
                        Sample(
                            f"{metric_name}_bucket",
                            dict((*labels, ("le", _go_float(bound)))),
                            running,
                        )
                    )
                samples.append(Sample(f"{metric_name}_count", dict(labels), running))
            samples.extend(others)

        for raw, value in self.summed["summary"].items():
            key = key_of(raw)
            samples = samples_of(key, "summary")
            if samples is not None:
                samples.append(Sample(key.sample, key.labels_dict, value))
        return [family for family in by_name.values() if family.samples]


class MultiprocessDirCollector:
    """A prometheus_client collector for a multiprocess directory that survives bad files.

    Thread-safe: two scrapes may call :meth:`collect` at once.

    Args:
        path: the directory the app's workers write (their ``PROMETHEUS_MULTIPROC_DIR``).
        check_pids: also drop ``live*`` gauges whose pid is not alive according to
            ``os.kill(pid, 0)``; see the module docstring for when to turn it off.

    Example::

        >>> import tempfile
        >>> from prometheus_client import CollectorRegistry
        >>> registry = CollectorRegistry()
        >>> collector = MultiprocessDirCollector(tempfile.mkdtemp())
        >>> registry.register(collector)
        >>> registry.get_sample_value("stocksentry_multiprocess_files")
        0.0
    """

    def __init__(self, path: str | os.PathLike[str], *, check_pids: bool = True) -> None:
        self.path = Path(path)
        self.check_pids = check_pids
        self._lock = threading.Lock()
        self._skipped: dict[SkipReason, int] = dict.fromkeys(SKIP_REASONS, 0)
        self._keys: dict[bytes, _Key] = {}
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

    def _key_of(self, raw: bytes) -> _Key:
        key = self._keys.get(raw)
        if key is None:
            key = _parse_key(raw)
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
                names = [entry.name for entry in it if entry.name.endswith(".db")]
        except FileNotFoundError:
            if not self._missing_logged:
                self._missing_logged = True
                _log.warning(
                    "multiprocess directory %s does not exist (yet); no app metrics", self.path
                )
            return []
        self._missing_logged = False
        return names

    def collect(self) -> Iterator[Metric]:
        """Merge every readable file, then yield the health series of this collector."""
        merge = _Merge(self._key_of, self._keys)
        alive: dict[str, bool] = {}
        directory = str(self.path)
        for name in self._list():
            parsed = _parse_name(name)
            if parsed is None:
                self._skip(name, "bad_name", "not <type>[_<mode>]_<pid>.db")
                continue
            if parsed.mode.startswith("live") and self.check_pids:
                is_alive = alive.get(parsed.pid)
                if is_alive is None:
                    is_alive = alive[parsed.pid] = _pid_alive(parsed.pid)
                if not is_alive:
                    continue
            try:
                merge.add(parsed, _read_entries(os.path.join(directory, name)))
            except FileNotFoundError:
                # Removed since the listing (mark_process_dead): nothing to merge.
                continue
            except _SkipFile as skip:
                self._skip(name, skip.reason, skip.detail)
        yield from merge.families()
        yield from self._own_metrics(merge.files)

    def _own_metrics(self, files: int) -> Iterator[Metric]:
        skipped = CounterMetricFamily(
            FILES_SKIPPED.base_name, FILES_SKIPPED.help, labels=["reason"]
        )
        for reason, count in self.skipped.items():
            skipped.add_metric([reason], float(count))
        yield skipped
        yield GaugeMetricFamily(FILES_MERGED.name, FILES_MERGED.help, value=float(files))
