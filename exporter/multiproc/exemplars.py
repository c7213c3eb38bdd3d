"""Reading the workers' exemplar files (``exemplars_<pid>.mmap``, the layout of
:mod:`stocksentry.instrumentation.mpexemplars`) safely, and writing one.

A slot whose CRC fails is read again up to five times, then left out of this scrape only:
a worker paused in the middle of its rewrite leaves the same torn bytes for as long as it
is paused, so a stable bad checksum is no proof of corruption.
"""

from __future__ import annotations

import math
import os
import zlib
from typing import Final

from prometheus_client.samples import Exemplar
from stocksentry.instrumentation.mpexemplars import (
    CAPACITY,
    FILE_PREFIX,
    FILE_SUFFIX,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    SLOT_HEAD,
    SLOT_SIZE,
    VERSION,
)

from .files import SkipFile, open_regular, write_file

# key bytes -> (timestamp, Exemplar)
ExemplarEntries = dict[bytes, tuple[float, Exemplar]]
_REREADS: Final = 5


def exemplar_pid(name: str) -> str | None:
    """``exemplars_12.mmap`` -> ``"12"``; ``None`` for any other name."""
    if name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX):
        return name[len(FILE_PREFIX) : -len(FILE_SUFFIX)] or None
    return None


def merge_newest(target: ExemplarEntries, entries: ExemplarEntries) -> None:
    """Merge ``entries`` into ``target``: per sample key, the newest timestamp wins."""
    for raw, item in entries.items():
        held = target.get(raw)
        if held is None or item[0] > held[0]:
            target[raw] = item


def parse_slot(data: bytes, pos: int, slot_size: int) -> tuple[bytes, float, Exemplar] | None:
    """One slot, or ``None`` when its CRC fails; ``SkipFile`` when its lengths are wrong."""
    crc, _seq, value, ts, trace_len, span_len, key_len, trace, span = SLOT_HEAD.unpack_from(
        data, pos
    )
    if trace_len > 32 or span_len > 16 or key_len == 0 or SLOT_HEAD.size + key_len > slot_size:
        if zlib.crc32(data[pos + 4 : pos + SLOT_HEAD.size]) == crc:
            raise SkipFile("corrupt", f"slot at {pos} has bad lengths")
        return None
    key_start = pos + SLOT_HEAD.size
    key = data[key_start : key_start + key_len]
    if zlib.crc32(data[pos + 4 : key_start], zlib.crc32(key)) != crc:
        return None
    # An observation of +Inf or -Inf is the app's (its exemplar lands in an end bucket):
    # only NaN (never written) or a timestamp that is no time is corruption.
    if math.isnan(value) or not math.isfinite(ts):
        raise SkipFile("corrupt", f"slot at {pos} has a non-finite value")
    try:
        labels = {
            "trace_id": trace[:trace_len].decode("ascii"),
            "span_id": span[:span_len].decode("ascii"),
        }
    except UnicodeDecodeError:
        raise SkipFile("corrupt", f"slot at {pos} has non-ASCII ids") from None
    return key, ts, Exemplar({k: v for k, v in labels.items() if v}, value, ts)


def read_exemplars(path: str) -> ExemplarEntries:
    """Every exemplar of one file, or ``SkipFile``; ``FileNotFoundError`` passes."""
    with open_regular(path) as (f, fd, size):
        if size == 0:
            return {}  # a starting worker
        header = f.read(HEADER_SIZE)
        if len(header) < HEADER_SIZE:
            raise SkipFile("truncated", f"{len(header)} bytes, shorter than the header")
        magic, version, slot_size, capacity, crc, used = HEADER.unpack_from(header)
        if magic != MAGIC or zlib.crc32(header[:20]) != crc:
            if header == bytes(HEADER_SIZE):
                return {}  # sized, header not written yet
            raise SkipFile("corrupt", "bad magic or header checksum")
        if version != VERSION or slot_size < SLOT_HEAD.size or used > capacity:
            raise SkipFile("corrupt", f"version {version}, {used}/{capacity} slots")
        if size < HEADER_SIZE + capacity * slot_size:
            raise SkipFile("truncated", f"{size} bytes for {capacity} slots")
        data = f.read(used * slot_size)
        if len(data) < used * slot_size:
            raise SkipFile("truncated", f"read {len(data)} of {used * slot_size} bytes")
        out: ExemplarEntries = {}
        for index in range(used):
            pos = index * slot_size
            got = parse_slot(data, pos, slot_size)
            for _ in range(_REREADS):
                if got is not None:
                    break
                again = os.pread(fd, slot_size, HEADER_SIZE + pos)
                if len(again) < slot_size:
                    raise SkipFile("truncated", f"slot at {HEADER_SIZE + pos} cut short")
                got = parse_slot(again, 0, slot_size)
            if got is None:
                continue  # still being rewritten: the next scrape will have it
            key, ts, exemplar = got
            held = out.get(key)
            if held is None or ts > held[0]:
                out[key] = (ts, exemplar)
        return out


def write_exemplars(path: str, entries: ExemplarEntries) -> None:
    """Write ``entries`` (the newest :data:`CAPACITY` of them) as an exemplar file."""
    newest = sorted(entries.items(), key=lambda item: item[1][0], reverse=True)[:CAPACITY]
    slots = bytearray(len(newest) * SLOT_SIZE)
    for index, (raw, (timestamp, exemplar)) in enumerate(newest):
        trace = exemplar.labels.get("trace_id", "").encode("ascii")
        span = exemplar.labels.get("span_id", "").encode("ascii")
        fields = (exemplar.value, timestamp, len(trace), len(span), len(raw), trace, span)
        # The CRC covers the key, then the slot after the CRC (as the worker writes it).
        crc = zlib.crc32(SLOT_HEAD.pack(0, 0, *fields)[4:], zlib.crc32(raw))
        offset = index * SLOT_SIZE
        SLOT_HEAD.pack_into(slots, offset, crc, 0, *fields)
        slots[offset + SLOT_HEAD.size : offset + SLOT_HEAD.size + len(raw)] = raw
    head = HEADER.pack(MAGIC, VERSION, SLOT_SIZE, CAPACITY, 0, 0)[:20]
    header = HEADER.pack(MAGIC, VERSION, SLOT_SIZE, CAPACITY, zlib.crc32(head), len(newest))
    data = header.ljust(HEADER_SIZE, b"\0") + bytes(slots)
    write_file(path, data.ljust(HEADER_SIZE + CAPACITY * SLOT_SIZE, b"\0"))
