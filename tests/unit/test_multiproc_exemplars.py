"""The exemplar files of multiprocess workers: writing, merging, torn and corrupt files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from stocksentry.exporter.multiproc import MultiprocessDirCollector
from stocksentry.exporter.multiproc.exemplars import exemplar_pid, read_exemplars
from stocksentry.exporter.multiproc.files import SkipFile
from stocksentry.instrumentation import mpexemplars
from stocksentry.instrumentation.mpexemplars import HEADER_SIZE, SLOT_SIZE, ExemplarFile

KEY = b'["m", "m_bucket", {"le": "0.5"}, "Help."]'
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def write(directory: Path, value: float = 0.3, trace: str = TRACE) -> Path:
    table = ExemplarFile(str(directory))
    table.write(KEY, value, trace, SPAN)
    return directory / f"exemplars_{os.getpid()}.mmap"


def test_a_written_exemplar_reads_back(tmp_path: Path) -> None:
    path = write(tmp_path)
    ((key, (_, exemplar)),) = read_exemplars(str(path)).items()
    assert key == KEY
    assert exemplar.labels == {"trace_id": TRACE, "span_id": SPAN}
    assert exemplar.value == 0.3
    assert exemplar_pid(path.name) == str(os.getpid())
    assert exemplar_pid("counter_1.db") is None


def test_rewrites_keep_one_slot_and_the_latest(tmp_path: Path) -> None:
    table = ExemplarFile(str(tmp_path))
    for i in range(5):
        table.write(KEY, float(i), TRACE, SPAN)
    entries = read_exemplars(str(tmp_path / f"exemplars_{os.getpid()}.mmap"))
    assert [e.value for _, e in entries.values()] == [4.0]


def test_capacity_and_long_keys_are_bounded(tmp_path: Path) -> None:
    table = ExemplarFile(str(tmp_path))
    table.write(b"x" * SLOT_SIZE, 1.0, TRACE, SPAN)
    assert table.dropped == 1
    path = tmp_path / f"exemplars_{os.getpid()}.mmap"
    assert path.stat().st_size == HEADER_SIZE + mpexemplars.CAPACITY * SLOT_SIZE


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[: HEADER_SIZE - 4], "truncated"),
        (lambda data: b"garbage!" + data[8:], "corrupt"),
        (lambda data: data[: HEADER_SIZE + 100], "truncated"),
    ],
)
def test_a_damaged_exemplar_file_is_skipped_and_counted(
    tmp_path: Path, damage: object, reason: str
) -> None:
    path = write(tmp_path)
    data = path.read_bytes()
    bad = tmp_path / "exemplars_999999.mmap"
    bad.write_bytes(damage(data))  # type: ignore[operator]
    with pytest.raises(SkipFile) as raised:
        read_exemplars(str(bad))
    assert raised.value.reason == reason
    collector = MultiprocessDirCollector(tmp_path, check_pids=False)
    registry = CollectorRegistry()
    registry.register(collector)
    assert (
        registry.get_sample_value(
            "stocksentry_multiprocess_files_skipped_total", {"reason": reason}
        )
        == 1.0
    )
    assert collector.skipped[reason] == 1  # type: ignore[index]


def test_a_slot_that_stays_bad_is_left_out_and_the_file_still_counts(tmp_path: Path) -> None:
    """A flipped byte inside a slot's key fails its checksum on every re-read: that slot is
    left out, the file is not skipped (a worker paused mid-write looks the same)."""
    table = ExemplarFile(str(tmp_path))
    table.write(KEY, 0.3, TRACE, SPAN)  # slot 0, which the flipped byte below damages
    table.write(KEY + b"-other", 0.5, TRACE, SPAN)
    path = tmp_path / f"exemplars_{os.getpid()}.mmap"
    good = read_exemplars(str(path))
    assert len(good) == 2
    data = path.read_bytes()
    bad = tmp_path / "exemplars_999999.mmap"
    bad.write_bytes(data[: HEADER_SIZE + 90] + b"\xff" + data[HEADER_SIZE + 91 :])
    assert list(read_exemplars(str(bad))) == [KEY + b"-other"]


def test_an_empty_exemplar_file_is_a_starting_worker(tmp_path: Path) -> None:
    (tmp_path / "exemplars_5.mmap").write_bytes(b"")
    (tmp_path / "exemplars_6.mmap").write_bytes(bytes(HEADER_SIZE + 10))
    collector = MultiprocessDirCollector(tmp_path)
    list(collector.collect())
    assert sum(collector.skipped.values()) == 0


def test_latest_exemplar_wins_across_workers(tmp_path: Path) -> None:
    from stocksentry.exporter.multiproc.exemplars import merge_newest
    from stocksentry.exporter.multiproc.merge import Merge

    path = write(tmp_path, trace="a" * 32)
    older = read_exemplars(str(path))
    path = write(tmp_path, trace="b" * 32)
    newer = read_exemplars(str(path))
    merge = Merge(lambda raw: None)  # type: ignore[arg-type, return-value]
    merge_newest(merge.exemplars, newer)
    merge_newest(merge.exemplars, older)
    ((_, exemplar),) = merge.exemplars.values()
    assert exemplar.labels["trace_id"] == "b" * 32


def test_a_slot_caught_half_written_is_read_again(tmp_path: Path) -> None:
    path = write(tmp_path)
    good = path.read_bytes()
    # The snapshot is torn, the file itself is whole: the re-read finds the good slot.
    torn = bytearray(good)
    torn[HEADER_SIZE + 9] ^= 0xFF
    from stocksentry.exporter.multiproc import exemplars as reader

    real_slot = reader.parse_slot
    calls: list[int] = []

    def first_torn(data: bytes, pos: int, size: int):  # type: ignore[no-untyped-def]
        calls.append(pos)
        if len(calls) == 1:
            return real_slot(bytes(torn[HEADER_SIZE:]), pos, size)
        return real_slot(data, pos, size)

    reader.parse_slot = first_torn  # type: ignore[assignment]
    try:
        entries = read_exemplars(str(path))
    finally:
        reader.parse_slot = real_slot  # type: ignore[assignment]
    assert len(calls) == 2
    assert [e.value for _, e in entries.values()] == [0.3]


def test_a_slot_that_keeps_changing_is_left_out_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stocksentry.exporter.multiproc import exemplars as reader

    path = write(tmp_path)
    good = path.read_bytes()
    reads = iter(range(1, 100))

    def busy_writer(fd: int, size: int, offset: int) -> bytes:
        # Each read catches the worker mid-write at a different point.
        torn = bytearray(good[offset : offset + size])
        torn[9] ^= next(reads)
        return bytes(torn)

    torn_file = bytearray(good)
    torn_file[HEADER_SIZE + 9] ^= 0xFF
    path.write_bytes(bytes(torn_file))
    monkeypatch.setattr(reader.os, "pread", busy_writer)
    assert read_exemplars(str(path)) == {}


BUSY_WORKER = """
import time
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.metrics import StockMetrics
metrics = StockMetrics()
end = time.monotonic() + 1.0
k = 0
while time.monotonic() < end:
    k += 1
    exemplar = {"trace_id": f"{k:032x}", "span_id": f"{k:016x}"}
    metrics.observe(catalog.RESERVATION_DURATION, (k % 50) / 100, "success", exemplar=exemplar)
print("done", flush=True)
"""


def test_reads_during_a_real_workers_writes_never_skip(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    # Our own snippet, run by this interpreter.
    proc = subprocess.Popen([sys.executable, "-c", BUSY_WORKER], env=env)
    reads = 0
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            for path in tmp_path.glob("exemplars_*.mmap"):
                read_exemplars(str(path))  # a SkipFile here fails the test
                reads += 1
    finally:
        assert proc.wait(timeout=30) == 0
    (path,) = tmp_path.glob("exemplars_*.mmap")
    assert len(read_exemplars(str(path))) >= 1
    assert reads > 0


_RESERVATION_CHILD = """
import sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
from stocksentry.instrumentation import configure, reservation
configure(promo_skus=["EGG-01"])
with reservation("EGG-01", strategy="atomic") as r:
    r.success(old_stock=2, new_stock=1)
    print(trace.format_trace_id(trace.get_current_span().get_span_context().trace_id))
"""


def test_a_reservation_in_a_worker_leaves_its_exemplar_for_the_sidecar(tmp_path):
    """The recording API's own hot path (not only StockMetrics) writes the exemplar."""
    import os
    import subprocess
    import sys

    from stocksentry.exporter.multiproc import MultiprocessDirCollector

    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", _RESERVATION_CHILD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    trace_id = done.stdout.split()[-1]
    exemplars = [
        sample.exemplar
        for family in MultiprocessDirCollector(str(tmp_path)).collect()
        for sample in family.samples
        if sample.name == "stock_reservation_duration_seconds_bucket" and sample.exemplar
    ]
    assert [e.labels["trace_id"] for e in exemplars] == [trace_id]


def test_a_text_scrape_leaves_the_exemplar_files_unread(tmp_path: Path) -> None:
    """Prometheus text carries no exemplars: the files are read for OpenMetrics only."""
    from stocksentry.exporter.server.exposition import MetricsRenderer

    (tmp_path / "exemplars_999999.mmap").write_bytes(b"garbage!" + bytes(HEADER_SIZE))
    collector = MultiprocessDirCollector(tmp_path, check_pids=False)
    renderer = MetricsRenderer([("app", collector)])
    renderer.render(openmetrics=False)
    assert collector.skipped.get("corrupt", 0) == 0  # type: ignore[attr-defined]
    renderer.render(openmetrics=True)
    assert collector.skipped["corrupt"] == 1  # type: ignore[index]
