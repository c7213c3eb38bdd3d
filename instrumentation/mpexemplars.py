"""Exemplars in multiprocess mode: each worker writes its latest one per bucket to a file.

prometheus_client's multiprocess value class drops exemplars. With
``PROMETHEUS_MULTIPROC_DIR`` set, :class:`~stocksentry.instrumentation.metrics.StockMetrics`
builds its histograms from :class:`ExemplarHistogram`, which also writes each observation's
exemplar into ``exemplars_<pid>.mmap`` in that directory (not ``*.db``: prometheus_client's
own collector would refuse the file); :mod:`stocksentry.exporter.multiproc` reads them
(docs/exporter-server.md).

The file is a fixed table, so it is bounded: a :data:`HEADER`, then :data:`CAPACITY` slots of
:data:`SLOT_SIZE` bytes, one per (metric, labels, bucket), each a :data:`SLOT_HEAD` and then
prometheus_client's own mmap key of the bucket (so the reader matches it byte for byte); the
slot's CRC covers everything after it. A slot is rewritten by one slice assignment (one
bytecode, so threads of a worker never interleave); a reader in another process that catches
it half written sees a CRC mismatch and reads it again. A new slot is written completely
before the count in use is raised. Keys longer than a slot allows, exemplars past the
capacity (counted in :attr:`ExemplarFile.dropped`) and exemplar labels other than
``trace_id`` and ``span_id`` are not carried. A file reused by a new process with the same
pid is started afresh.
"""

from __future__ import annotations

import bisect
import logging
import math
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Self

from prometheus_client import Histogram
from prometheus_client.mmap_dict import mmap_key
from prometheus_client.utils import floatToGoString

_log = logging.getLogger(__name__)
# floatToGoString is untyped in prometheus_client; this gives it a type once.
_go_float: Final[Callable[[float], str]] = floatToGoString

MAGIC: Final = b"SSEXEMP1"
VERSION: Final = 1
#: ``exemplars_<pid>.mmap``.
FILE_PREFIX: Final = "exemplars_"
FILE_SUFFIX: Final = ".mmap"
#: magic 8s, version, slot size, capacity, CRC-32 of the 20 bytes before it, slots used.
HEADER: Final = struct.Struct("=8sIIIII")
HEADER_SIZE: Final = 32
SLOT_SIZE: Final = 384
CAPACITY: Final = 2048
#: crc32, seq, value, timestamp, trace_len, span_len, key_len, pad, trace_id, span_id.
SLOT_HEAD: Final = struct.Struct("=IIddBBH4x32s16s")
_BODY: Final = struct.Struct("=IddBBH4x32s16s")
_CRC: Final = struct.Struct("=I")
_KEY_MAX: Final = SLOT_SIZE - SLOT_HEAD.size
_USED_OFFSET: Final = 24  # the last field of HEADER


class ExemplarFile:
    """This process's exemplar table, opened lazily and again after a fork."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.dropped = 0
        self._lock = threading.Lock()
        self._pid = -1
        self._mm: mmap.mmap | None = None
        self._used = 0
        # key bytes -> (slot offset, crc32 of the key, write sequence)
        self._slots: dict[bytes, list[int]] = {}
        self._broken = False

    def _open(self) -> mmap.mmap | None:
        with self._lock:
            pid = os.getpid()
            if self._pid == pid and self._mm is not None:
                return self._mm
            self._pid = pid
            self._mm = None
            self._slots = {}
            self._used = 0
            path = os.path.join(self.directory, f"{FILE_PREFIX}{pid}{FILE_SUFFIX}")
            size = HEADER_SIZE + CAPACITY * SLOT_SIZE
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    os.ftruncate(fd, 0)  # a dead process with our pid: start afresh
                    os.ftruncate(fd, size)
                    if hasattr(os, "posix_fallocate"):
                        # Allocated now: a full disk later must not SIGBUS the worker.
                        os.posix_fallocate(fd, 0, size)
                    mm = mmap.mmap(fd, size)
                finally:
                    os.close(fd)
            except OSError as exc:
                if not self._broken:
                    _log.warning("exemplars not written to %s: %s", path, exc)
                self._broken = True
                return None
            crc = zlib.crc32(HEADER.pack(MAGIC, VERSION, SLOT_SIZE, CAPACITY, 0, 0)[:20])
            # The file was just zeroed: the header's padding up to HEADER_SIZE is there.
            mm[0 : HEADER.size] = HEADER.pack(MAGIC, VERSION, SLOT_SIZE, CAPACITY, crc, 0)
            self._mm = mm
            return mm

    def write(self, key: bytes, value: float, trace_id: str, span_id: str) -> None:
        """Record the latest exemplar of the sample ``key`` (a prometheus_client mmap key)."""
        mm = self._mm
        if mm is None or self._pid != os.getpid():
            if self._broken:
                return
            mm = self._open()
            if mm is None:
                return
        trace = trace_id.encode("ascii", "replace")
        span = span_id.encode("ascii", "replace")
        if len(trace) > 32 or len(span) > 16:
            self.dropped += 1
            return
        slot = self._slots.get(key)
        if slot is not None:
            self._write_slot(mm, slot, key, value, trace, span)
            return
        with self._lock:  # a new slot: claimed, written whole, then counted in use
            slot = self._slots.get(key)
            if slot is None:
                if len(key) > _KEY_MAX or self._used >= CAPACITY:
                    self.dropped += 1
                    return
                slot = [HEADER_SIZE + self._used * SLOT_SIZE, zlib.crc32(key), 0]
                start = slot[0] + SLOT_HEAD.size
                mm[start : start + len(key)] = key
            self._write_slot(mm, slot, key, value, trace, span)
            if key not in self._slots:
                self._slots[key] = slot
                self._used += 1
                # Raised only once the slot is complete: the reader never sees half.
                _CRC.pack_into(mm, _USED_OFFSET, self._used)

    @staticmethod
    def _write_slot(
        mm: mmap.mmap, slot: list[int], key: bytes, value: float, trace: bytes, span: bytes
    ) -> None:
        slot[2] = seq = (slot[2] + 1) & 0xFFFFFFFF
        body = _BODY.pack(seq, value, time.time(), len(trace), len(span), len(key), trace, span)
        # One slice assignment: atomic against this worker's other threads.
        mm[slot[0] : slot[0] + SLOT_HEAD.size] = _CRC.pack(zlib.crc32(body, slot[1])) + body


_FILE: ExemplarFile | None = None
_FILE_LOCK = threading.Lock()


def _file() -> ExemplarFile | None:
    global _FILE
    table = _FILE
    if table is not None:
        return table
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return None
    with _FILE_LOCK:
        if _FILE is None:
            _FILE = ExemplarFile(directory)
        return _FILE


class ExemplarHistogram(Histogram):
    """A prometheus_client ``Histogram`` that also writes exemplars to the worker's file.

    Only used in multiprocess mode, where prometheus_client itself keeps no exemplar: the
    observation goes to prometheus_client without its exemplar (it would be validated and
    dropped), and the exemplar to :class:`ExemplarFile`, under the mmap key of its bucket
    (built from the constructor's arguments and the child's label values, as
    prometheus_client builds its own).
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Iterable[str] = (),
        *,
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, documentation, labelnames, buckets=buckets, **kwargs)
        bounds = [float(bound) for bound in buckets]
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._ss_meta = (name, documentation, tuple(labelnames), bounds)
        # A labelled parent's children get theirs from labels().
        self._ss_keys = None if self._ss_meta[2] else self._bucket_keys(())

    def _bucket_keys(self, values: Sequence[object]) -> list[bytes]:
        name, documentation, labelnames, bounds = self._ss_meta
        return [
            mmap_key(
                name,
                name + "_bucket",
                [*labelnames, "le"],
                [*(str(value) for value in values), _go_float(bound)],
                documentation,
            ).encode("utf-8")
            for bound in bounds
        ]

    def labels(self, *values: Any, **named: Any) -> Self:
        """The labelled child, as ``Histogram.labels``."""
        child = super().labels(*values, **named)
        if child._ss_keys is None:
            labelnames = self._ss_meta[2]
            child._ss_keys = self._bucket_keys(values or [named[n] for n in labelnames])
        return child

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Observe ``amount``; carry ``exemplar`` (``trace_id``/``span_id``) to the sidecar."""
        super().observe(amount)
        keys = self._ss_keys
        target = _file()
        if not exemplar or keys is None or target is None:
            return
        index = bisect.bisect_left(self._ss_meta[3], amount)
        if index >= len(keys):
            return  # NaN
        try:
            trace_id, span_id = exemplar.get("trace_id", ""), exemplar.get("span_id", "")
            target.write(keys[index], amount, trace_id, span_id)
        except (OSError, ValueError, TypeError, struct.error, AttributeError) as exc:
            # Never into the host app: an exemplar is a convenience.
            _log.debug("exemplar not written: %s", exc)


def histogram_class() -> Any:
    """``ExemplarHistogram`` when ``PROMETHEUS_MULTIPROC_DIR`` is set, else ``Histogram``."""
    return ExemplarHistogram if os.environ.get("PROMETHEUS_MULTIPROC_DIR") else Histogram
