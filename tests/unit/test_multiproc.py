"""MultiprocessDirCollector: prometheus_client's merge, minus the failure on one bad file.

The directories are written by real worker processes (``PROMETHEUS_MULTIPROC_DIR`` set
in their environment only); values are multiples of 1/8 so that sums are exact in any
order.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mpworkers import MODES, Row, Workers, rows, workers_in
from prometheus_client import CollectorRegistry, multiprocess
from scraped import value
from stocksentry.exporter.multiproc import MultiprocessDirCollector
from stocksentry.instrumentation import catalog

SKUS = ("A", "B", "C")


# prometheus_client's multiprocess module is untyped; these give it types once.
MultiProcessCollector: Callable[..., Any] = multiprocess.MultiProcessCollector
mark_process_dead: Callable[[int, str], None] = multiprocess.mark_process_dead


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with workers_in(tmp_path, exemplars=False) as pool:
        yield pool


def prometheus_rows(path: Path) -> list[Row]:
    return rows(MultiProcessCollector(None, path=str(path)).collect())


def test_healthy_directory_merges_exactly_like_prometheus_client(workers: Workers) -> None:
    workers.start([0, 1, 2], stay=True)
    collector = MultiprocessDirCollector(workers.path)

    ours = list(collector.collect())

    assert rows(ours) == prometheus_rows(workers.path)
    assert len(rows(ours)) == len(set(rows(ours)))
    # And the merged values are the workers' totals, not just the same as the reference.
    assert value(ours, "mp_reserved_total", sku="A") == 1 + 2 + 3
    assert value(ours, "mp_reserved_total", sku="C") == 2 + 3 + 4
    # sku B: worker k observes 0, 0.125, ..., 0.125 * (k + 1): 2 + 3 + 4 observations.
    assert value(ours, "mp_latency_seconds_count", sku="B") == 9
    assert value(ours, "mp_latency_seconds_bucket", sku="B", le="0.25") == 2 + 3 + 3
    assert value(ours, "mp_latency_seconds_bucket", sku="B", le="0.5") == 2 + 3 + 4
    assert value(ours, "mp_latency_seconds_bucket", sku="B", le="+Inf") == 9
    assert value(ours, "mp_latency_seconds_sum", sku="B") == 0.125 * (1 + 3 + 6)
    assert value(ours, "mp_batch_size_count") == 9
    assert value(ours, "mp_batch_size_sum") == sum(k + j for k in range(3) for j in range(3))
    assert value(ours, "mp_g_sum", sku="B") == 1 + 11 + 21
    assert value(ours, "mp_g_livesum", sku="B") == 1 + 11 + 21
    assert value(ours, "mp_g_min", sku="C") == 2
    assert value(ours, "mp_g_livemax", sku="C") == 22
    pids = [str(proc.pid) for proc in workers.procs]
    assert [value(ours, "mp_g_liveall", sku="A", pid=pid) for pid in pids] == [0, 10, 20]
    assert value(ours, catalog.MULTIPROCESS_FILES.name) == 3 * (3 + len(MODES))
    assert collector.skipped == {"bad_name": 0, "corrupt": 0, "truncated": 0, "unreadable": 0}


def _corrupt_copy(source: Path, target: Path) -> dict[str, Path]:
    """Copy ``source`` and add one bad file of each kind; returns them by reason."""
    shutil.copytree(source, target)
    originals = sorted(target.glob("counter_*.db"))
    bad: dict[str, Path] = {}

    # Truncated: a real worker file cut to half of what its header says is used.
    truncated = target / "counter_900001.db"
    data = originals[0].read_bytes()
    (used,) = struct.unpack_from("i", data, 0)
    truncated.write_bytes(data[: used // 2])
    bad["truncated"] = truncated

    # Garbage: a sane header, then a key that is not UTF-8.
    garbage = target / "histogram_900002.db"
    entry = struct.pack("i", 24) + b"\xff" * 28 + struct.pack("dd", 1.0, 0.0)
    garbage.write_bytes(struct.pack("ii", 8 + len(entry), 0) + entry + b"\0" * 4096)
    bad["garbage"] = garbage

    # Valid JSON of the wrong shape.
    key = b'{"not": "a list"}'
    pad = b" " * (8 - (len(key) + 4) % 8)
    entry = struct.pack("i", len(key)) + key + pad + struct.pack("dd", 5.0, 0.0)
    shape = target / "gauge_sum_900003.db"
    shape.write_bytes(struct.pack("ii", 8 + len(entry), 0) + entry)
    bad["wrong_shape"] = shape

    # A key length that would send a naive reader backwards, forever.
    backwards = target / "summary_900004.db"
    backwards.write_bytes(struct.pack("iii", 64, 0, -100) + b"\0" * 52)
    bad["negative_length"] = backwards

    # Named like nothing prometheus_client writes.
    odd = target / "gauge_bogusmode_900005.db"
    odd.write_bytes(originals[0].read_bytes())
    bad["bad_name"] = odd
    return bad


def test_truncated_and_garbage_files_are_skipped_counted_and_the_rest_merged(
    workers: Workers, tmp_path: Path
) -> None:
    workers.start([0, 1, 2])
    broken = tmp_path / "broken"
    bad = _corrupt_copy(workers.path, broken)
    # A worker that has just created its file (0 bytes): empty, not broken.
    (broken / "counter_900006.db").touch()

    # prometheus_client's collector gives up on the whole scrape.
    with pytest.raises((RuntimeError, UnicodeDecodeError, struct.error, ValueError)):
        list(MultiProcessCollector(None, path=str(broken)).collect())

    collector = MultiprocessDirCollector(broken, check_pids=False)
    ours = list(collector.collect())
    clean = tmp_path / "clean"
    shutil.copytree(broken, clean)
    for path in bad.values():
        (clean / path.name).unlink()
    # prometheus_client cannot read the empty file either.
    (clean / "counter_900006.db").unlink()

    assert rows(ours) == prometheus_rows(clean)
    assert value(ours, "mp_reserved_total", sku="A") == 1 + 2 + 3
    assert collector.skipped == {"bad_name": 1, "corrupt": 3, "truncated": 1, "unreadable": 0}
    assert value(ours, "stocksentry_multiprocess_files_skipped_total", reason="corrupt") == 3
    assert value(ours, "stocksentry_multiprocess_files_skipped_total", reason="truncated") == 1
    assert value(ours, catalog.MULTIPROCESS_FILES.name) == 3 * (3 + len(MODES)) + 1

    # The counter counts per scrape that met the file.
    again = list(collector.collect())
    assert rows(again) == rows(ours)
    assert value(again, "stocksentry_multiprocess_files_skipped_total", reason="corrupt") == 6
    assert value(again, "stocksentry_multiprocess_files_skipped_total", reason="bad_name") == 2


def test_header_promising_more_than_the_file_holds_is_truncated(tmp_path: Path) -> None:
    (tmp_path / "counter_1.db").write_bytes(struct.pack("ii", 2**31 - 1, 0) + b"\0" * 56)
    (tmp_path / "counter_2.db").write_bytes(b"\x01\x02\x03")
    collector = MultiprocessDirCollector(tmp_path)

    assert rows(collector.collect()) == []
    assert collector.skipped == {"bad_name": 0, "corrupt": 0, "truncated": 2, "unreadable": 0}


def test_live_gauges_of_dead_pids_are_dropped(workers: Workers) -> None:
    (dead,) = workers.start([0])
    (alive,) = workers.start([1], stay=True)
    dead_pid, alive_pid = str(dead.pid), str(alive.pid)

    ours = list(MultiprocessDirCollector(workers.path).collect())

    # live* gauges: only the living worker.
    assert value(ours, "mp_g_livesum", sku="A") == 10
    assert value(ours, "mp_g_livemin", sku="B") == 11
    assert value(ours, "mp_g_livemax", sku="B") == 11
    assert value(ours, "mp_g_livemostrecent", sku="C") == 12
    assert value(ours, "mp_g_liveall", sku="A", pid=alive_pid) == 10
    assert value(ours, "mp_g_liveall", sku="A", pid=dead_pid) is None
    # Other modes keep the dead worker's last values, as prometheus_client does.
    assert value(ours, "mp_g_sum", sku="A") == 0 + 10
    assert value(ours, "mp_g_min", sku="B") == 1
    assert value(ours, "mp_g_all", sku="A", pid=dead_pid) == 0
    # Counters and histograms are never dropped: the dead worker's work happened.
    assert value(ours, "mp_reserved_total", sku="A") == 1 + 2

    # Without the pid check, only the files decide: same as prometheus_client...
    unchecked = MultiprocessDirCollector(workers.path, check_pids=False)
    assert rows(unchecked.collect()) == prometheus_rows(workers.path)
    assert value(unchecked.collect(), "mp_g_livesum", sku="A") == 0 + 10
    # ...until gunicorn's child_exit hook removes the dead worker's live files.
    mark_process_dead(dead.pid, str(workers.path))
    after = list(unchecked.collect())
    assert value(after, "mp_g_livesum", sku="A") == 10
    assert value(after, "mp_g_liveall", sku="A", pid=dead_pid) is None
    assert rows(after) == rows(MultiprocessDirCollector(workers.path).collect())


def test_a_pid_beyond_any_process_is_a_stray_name_not_a_failed_scrape(workers: Workers) -> None:
    (alive,) = workers.start([1], stay=True)
    stray = workers.path / "gauge_livesum_99999999999999999999.db"
    shutil.copy(next(workers.path.glob(f"gauge_livesum_{alive.pid}.db")), stray)
    ours = list(MultiprocessDirCollector(workers.path).collect())
    # Taken as alive, like any file name that is no pid: its values are merged.
    assert value(ours, "mp_g_livesum", sku="A") == 10 + 10


def test_missing_directory_yields_only_health_series(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    registry.register(MultiprocessDirCollector(tmp_path / "not-yet"))

    assert registry.get_sample_value(catalog.MULTIPROCESS_FILES.name) == 0
    assert (
        registry.get_sample_value(
            "stocksentry_multiprocess_files_skipped_total", {"reason": "corrupt"}
        )
        == 0
    )
    assert [m.name for m in registry.collect()] == [
        "stocksentry_multiprocess_files_skipped",
        "stocksentry_multiprocess_files",
    ]


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    # A FIFO with no writer would block open() for ever, and the scrape with it.
    os.mkfifo(tmp_path / "counter_7.db")
    (tmp_path / "histogram_8.db").mkdir()
    collector = MultiprocessDirCollector(tmp_path)

    assert rows(collector.collect()) == []
    assert collector.skipped == {"bad_name": 0, "corrupt": 0, "truncated": 0, "unreadable": 2}
