"""The multiprocess files: their names, their binary layout, and reading one safely.

Example::

    >>> parse_name("gauge_livesum_12.db")
    FileName(typ='gauge', mode='livesum', pid='12')
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final, Literal

from prometheus_client.metrics_core import Metric

SkipReason = Literal["bad_name", "corrupt", "truncated", "unreadable"]
#: Why a file was skipped (docs/exporter-server.md, "Skipped files"); ``unreadable`` also
#: covers what is not a regular file (a FIFO, a device, a directory named ``*.db``).
SKIP_REASONS: Final[tuple[SkipReason, ...]] = ("bad_name", "corrupt", "truncated", "unreadable")

#: The gauge multiprocess modes prometheus_client writes, one file per mode and pid.
_MODES: Final = ("all", "min", "max", "sum", "mostrecent")
GAUGE_MODES: Final[frozenset[str]] = frozenset((*_MODES, *(f"live{mode}" for mode in _MODES)))
SUMMED_TYPES: Final[frozenset[str]] = frozenset({"counter", "histogram", "summary"})


# The file layout, as prometheus_client's mmap_dict writes it (native byte order, since
# writer and reader share a machine): a 4-byte int "bytes used", 4 bytes of padding, then
# entries of [4-byte key length][UTF-8 key, padded to 8-byte alignment][value: double]
# [timestamp: double].
INT: Final = struct.Struct("i")
TWO_DOUBLES: Final = struct.Struct("dd")
HEADER_SIZE: Final = 8
# The sample names prometheus_client's multiprocess mode writes: the metric's name and
# one of these suffixes (gauges none, counters _total, histograms _bucket and _sum...).
_SAMPLE_SUFFIXES: Final = frozenset(
    {"", "_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info"}
)
# Names the text exposition cannot carry: prometheus_client writes a name with a trailing
# newline as it is (its check of the classic character set ends in "$"), breaking the text.
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A label name as the text exposition writes it: prometheus_client (0.21 and later) escapes
# each character outside the classic set to "_" (a leading digit too). The "__" prefix is
# reserved for Prometheus itself, and parsers refuse it.
_NOT_LEGACY: Final = re.compile(r"^[0-9]|[^a-zA-Z0-9_]")
_EXPOSED_LABEL_NAME: Final = re.compile(r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*\Z")
# One read covers small files; the header says how much more to read.
_FIRST_READ: Final = 64 * 1024


class SkipFile(Exception):
    """Raised by the reader when one file must be skipped; carries the reason."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: SkipReason = reason


@contextlib.contextmanager
def open_regular(path: str) -> Iterator[tuple[BinaryIO, int, int]]:
    """Open ``path`` for reading as ``(file, fd, size)``; :class:`SkipFile` unless it is a
    regular file (``O_NONBLOCK``: a FIFO must not block the scrape in ``open()``), and for
    any ``OSError`` but ``FileNotFoundError``, also while reading it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SkipFile("unreadable", "not a regular file")
            yield f, fd, info.st_size
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SkipFile("unreadable", f"{type(exc).__name__}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Key:
    """One parsed mmap key: which sample of which metric, with which labels."""

    metric: str
    sample: str
    help: str
    # The labels for the output Sample (shared across scrapes, never mutated).
    labels_dict: dict[str, str]
    # Histogram buckets only: the bound, and the labels without ``le``.
    le: float | None
    labels_without_le: tuple[tuple[str, str], ...]


def parse_key(raw: bytes) -> Key:
    """Parse and validate one key; raises ``SkipFile('corrupt')`` on anything odd."""
    try:
        decoded = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # RecursionError: garbage such as "[[[[..." nested deeper than json can go.
        raise SkipFile("corrupt", f"key is not UTF-8 JSON: {exc}") from None
    if not (isinstance(decoded, list) and len(decoded) == 4):
        raise SkipFile("corrupt", "key is not a 4-item JSON list")
    metric, sample, labels, help_text = decoded
    if not (
        isinstance(metric, str)
        and isinstance(sample, str)
        and isinstance(help_text, str)
        and isinstance(labels, dict)
        and sample.startswith(metric)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise SkipFile("corrupt", "key has fields of the wrong type")
    try:
        # Metric() applies prometheus_client's own name validation; failing here (not
        # while building the output) keeps a bad name confined to its file.
        Metric(metric, help_text, "unknown")
    except ValueError as exc:
        raise SkipFile("corrupt", str(exc)) from None
    # A name the exposition cannot write (a control character, a label name "", " " or
    # "__x", two label names that escape alike, a sample suffix no writer makes) would
    # break the whole scrape's text, not just this file's series.
    if sample[len(metric) :] not in _SAMPLE_SUFFIXES or _CONTROL.search(metric):
        raise SkipFile("corrupt", "key has a sample name the exposition cannot write")
    exposed = {_NOT_LEGACY.sub("_", name) for name in labels}
    if (
        len(exposed) < len(labels)
        or not all(map(_EXPOSED_LABEL_NAME.match, exposed))
        or any(map(_CONTROL.search, labels))
    ):
        raise SkipFile("corrupt", "key has a label name the exposition cannot write")
    label_items = tuple(sorted(labels.items()))
    le: float | None = None
    without_le = label_items
    if sample.endswith("_bucket") and "le" in labels:
        try:
            le = float(labels["le"])
        except ValueError:
            raise SkipFile("corrupt", f"bucket bound {labels['le']!r} is not a number") from None
        without_le = tuple(item for item in label_items if item[0] != "le")
    return Key(metric, sample, help_text, dict(label_items), le, without_le)


# (key bytes, value, timestamp) for every entry of one file.
Entries = list[tuple[bytes, float, float]]


def read_entries(path: str) -> Entries:
    """Read every entry of one file, or raise ``SkipFile``; ``FileNotFoundError`` passes.

    The file is read completely before anything is merged, so a file that turns out bad
    halfway contributes nothing.
    """
    with open_regular(path) as (f, _, size):
        if size == 0:
            # Created by a starting worker, not sized yet.
            return []
        if size < HEADER_SIZE:
            raise SkipFile("truncated", f"{size} bytes, shorter than the header")
        data = f.read(min(size, _FIRST_READ))
        if len(data) < HEADER_SIZE:
            # Shrunk since the fstat: someone truncated it under us.
            raise SkipFile("truncated", f"read {len(data)} bytes, shorter than the header")
        (used,) = INT.unpack_from(data, 0)
        if used == 0:
            # Sized but nothing written yet.
            return []
        if used < HEADER_SIZE:
            raise SkipFile("corrupt", f"header says {used} bytes used")
        if used > size:
            raise SkipFile("truncated", f"header says {used} bytes used, file has {size}")
        if used > len(data):
            data += f.read(used - len(data))
            if len(data) < used:
                raise SkipFile("truncated", f"read {len(data)} of {used} bytes")

    entries: Entries = []
    pos = HEADER_SIZE
    while pos < used:
        # Every bound is checked before it is used: a garbage length must neither read
        # past `used` nor move `pos` backwards (which would loop forever).
        if pos + 4 > used:
            raise SkipFile("corrupt", f"entry header at {pos} runs past {used}")
        (length,) = INT.unpack_from(data, pos)
        if length <= 0:
            raise SkipFile("corrupt", f"key length {length} at {pos}")
        value_pos = pos + 4 + length + (8 - (length + 4) % 8)
        end = value_pos + 16
        if end > used:
            raise SkipFile("corrupt", f"entry at {pos} runs past {used}")
        value, timestamp = TWO_DOUBLES.unpack_from(data, value_pos)
        entries.append((data[pos + 4 : pos + 4 + length], value, timestamp))
        pos = end
    return entries


def write_entries(path: str, entries: Entries) -> None:
    """Write ``entries`` in the layout :func:`read_entries` reads."""
    parts = [b""]
    for raw, value, timestamp in entries:
        padding = b"\0" * (8 - (len(raw) + 4) % 8)
        parts.append(INT.pack(len(raw)) + raw + padding + TWO_DOUBLES.pack(value, timestamp))
    parts[0] = INT.pack(sum(map(len, parts)) + HEADER_SIZE) + b"\0" * 4
    write_file(path, b"".join(parts))


def write_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (created, truncated, not through a symlink) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class FileName:
    typ: str
    mode: str  # gauge mode, "" for other types
    pid: str


def parse_name(name: str) -> FileName | None:
    """``counter_12.db`` -> (counter, "", 12); ``gauge_livesum_12.db`` -> (gauge, livesum, 12)."""
    stem = name[:-3]
    typ, _, rest = stem.partition("_")
    if typ == "gauge":
        mode, _, pid = rest.partition("_")
        if mode not in GAUGE_MODES or not pid:
            return None
        return FileName(typ, mode, pid)
    if typ in SUMMED_TYPES and rest:
        return FileName(typ, "", rest)
    return None


def pid_alive(pid: str) -> bool:
    """True unless ``pid`` is a number and no such process exists here."""
    try:
        number = int(pid)
        # os.kill(0 or negative) addresses process groups, not one process.
        if number > 0:
            os.kill(number, 0)
    except ProcessLookupError:
        return False
    except (ValueError, OverflowError, OSError):
        # Not a number, or one beyond any pid (os.kill overflows): a stray file, taken as
        # alive like any name that is no pid; PermissionError: it exists, under another user.
        pass
    return True


# key bytes -> (value, timestamp), as folded by :func:`fold`.
Values = dict[bytes, tuple[float, float]]


def fold(target: Values, mode: str, entries: Entries) -> None:
    """Fold one file's entries into ``target`` by gauge ``mode`` (``live`` prefix
    removed): ``""`` (counters, histograms, summaries) and ``sum`` add, ``min``/``max``
    keep the smaller/larger, ``mostrecent`` the strictly newer timestamp (as
    prometheus_client merges)."""
    if mode in ("", "sum"):
        for raw, value, _ in entries:
            held = target.get(raw)
            target[raw] = ((held[0] if held is not None else 0.0) + value, 0.0)
    elif mode in ("min", "max"):
        smaller = mode == "min"
        for raw, value, timestamp in entries:
            held = target.get(raw)
            if held is None or (value < held[0] if smaller else value > held[0]):
                target[raw] = (value, timestamp)
    else:
        for raw, value, timestamp in entries:
            held = target.get(raw)
            if timestamp > (held[1] if held is not None else 0.0):
                target[raw] = (value, timestamp)
