"""Compaction of dead workers' files: the same scrape from fewer files, never a sample twice.

The directories are written by real worker processes (``PROMETHEUS_MULTIPROC_DIR`` set
in their environment only), histograms with exemplars through stocksentry's
``ExemplarHistogram``; values are multiples of 1/8 so that sums are exact in any order.
Pids above Linux's largest possible pid (``PID_MAX_LIMIT``, 2**22) name copies of a dead
worker's files: such a pid can never be alive.
"""

from __future__ import annotations

import os
import shutil
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from mpworkers import Row, Workers, rows, workers_in
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from stocksentry.exporter.multiproc import MultiprocessDirCollector, compaction
from stocksentry.exporter.multiproc.compaction import COMPACTED

#: No Linux process ever has a pid above 2**22.
NEVER_ALIVE = 2**22 + 1


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    with workers_in(tmp_path, exemplars=True) as pool:
        yield pool


def exemplars(families: Iterable[Metric]) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    return sorted(
        (s.name, tuple(sorted(s.labels.items())), repr(s.exemplar))
        for f in families
        for s in f.samples
        if s.exemplar is not None
    )


def scrape(path: Path) -> list[Metric]:
    return list(MultiprocessDirCollector(path).collect())


def total(families: Iterable[Metric], name: str = "mp_reserved_total") -> float:
    return sum(s.value for f in families for s in f.samples if s.name == name)


def without_dead_all(table: list[Row], dead: set[str]) -> list[Row]:
    """The rows minus the ``all`` gauges of dead pids (compaction drops them)."""
    return [r for r in table if not (r[0] == "mp_g_all" and dict(r[4]).get("pid") in dead)]


def test_compaction_gives_exactly_the_uncompacted_merge(workers: Workers) -> None:
    dead_procs = workers.start([0, 1, 2])
    workers.start([3, 4], stay=True)
    dead = {str(proc.pid) for proc in dead_procs}
    before = scrape(workers.path)
    assert exemplars(before)  # the dead workers' exemplars are among them

    collector = MultiprocessDirCollector(workers.path, compact_dead=True)
    result = collector.compact()

    assert result.ran
    assert result.pids == dead
    names = sorted(p.name for p in workers.path.iterdir() if p.name != compaction.LOCK_NAME)
    assert not [n for n in names if any(f"_{pid}." in n for pid in dead)]
    assert f"counter_{COMPACTED}.db" in names
    assert f"exemplars_{COMPACTED}.mmap" in names
    # Every series and exemplar as before, but the per-pid gauges of the dead workers.
    after = scrape(workers.path)
    assert rows(after) == without_dead_all(rows(before), dead)
    assert exemplars(after) == exemplars(before)
    assert total(after) == sum(k + 1 + j * 0.5 for k in range(5) for j in range(3))
    # The OpenMetrics text of the compacted directory is still valid, exemplars included.
    body = openmetrics.generate_latest(collector).decode()
    assert body.endswith("# EOF\n")
    assert "trace_id=" in body

    # A second generation folds into the compacted files.
    (late,) = workers.start([5])
    before = scrape(workers.path)
    assert collector.compact().pids == {str(late.pid)}
    assert rows(scrape(workers.path)) == without_dead_all(rows(before), {str(late.pid)})
    # Nothing left to do: a compaction without dead pids changes nothing.
    assert collector.compact().pids == set()
    assert rows(scrape(workers.path)) == without_dead_all(rows(before), {str(late.pid)})


def _dead_copies(directory: Path, source: Path, count: int) -> list[Path]:
    """Copies of a dead worker's counter file under pids that can never be alive."""
    return [
        Path(shutil.copy(source, directory / f"counter_{NEVER_ALIVE + n}.db"))
        for n in range(count)
    ]


def test_a_scrape_during_compaction_never_counts_a_sample_twice_nor_loses_one(
    workers: Workers, tmp_path: Path
) -> None:
    (dead,) = workers.start([0])
    workers.start([1], stay=True)
    source = workers.path / f"counter_{dead.pid}.db"
    one = sum(1 + j * 0.5 for j in range(3))  # what one copy of worker 0 adds
    base = total(scrape(workers.path))
    spare = tmp_path / "spare"
    spare.mkdir()
    copies = _dead_copies(spare, source, 120)
    added = 0
    stop = threading.Event()
    errors: list[str] = []
    seen: list[float] = []

    def scraper() -> None:
        # A reader of its own, as a second scrape (or another process) would be.
        reader = MultiprocessDirCollector(workers.path)
        last = base
        while not stop.is_set():
            value = total(reader.collect())
            ceiling = base + one * added
            seen.append(value)
            # Never more than what was written, never less than an earlier scrape saw.
            if not last <= value <= ceiling:
                errors.append(f"scrape saw {value}, earlier {last}, at most {ceiling}")
            last = value

    compactor = MultiprocessDirCollector(workers.path, compact_dead=True)
    threads = [threading.Thread(target=scraper) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for batch in range(12):
            for copy in copies[batch * 10 : (batch + 1) * 10]:
                # Counted first: a scrape between the rename and the count would see the
                # file above a ceiling that does not include it yet.
                added += 1
                os.rename(copy, workers.path / copy.name)  # a worker's file, atomically
            scraped = len(seen)
            compactor.compact()
            # Let the scrapers run between compactions (and during the next one).
            deadline = time.monotonic() + 20
            while len(seen) < scraped + 2 and time.monotonic() < deadline:
                time.sleep(0.001)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    compactor.compact()

    assert errors == []
    assert len(seen) >= 24  # the scrapes really ran alongside
    final = scrape(workers.path)
    assert total(final) == base + one * 120
    assert not list(workers.path.glob(f"counter_{NEVER_ALIVE}*"))


def test_corrupt_files_of_dead_pids_are_set_aside_and_counted(workers: Workers) -> None:
    (dead,) = workers.start([0])
    good = workers.path / f"counter_{dead.pid}.db"
    data = good.read_bytes()
    (used,) = struct.unpack_from("i", data, 0)
    torn = workers.path / f"counter_{NEVER_ALIVE}.db"
    torn.write_bytes(data[: used // 2])
    garbage = workers.path / f"histogram_{NEVER_ALIVE}.db"
    entry = struct.pack("i", 24) + b"\xff" * 28 + struct.pack("dd", 1.0, 0.0)
    garbage.write_bytes(struct.pack("ii", 8 + len(entry), 0) + entry + b"\0" * 64)
    bad_exemplars = workers.path / f"exemplars_{NEVER_ALIVE}.mmap"
    bad_exemplars.write_bytes(b"garbage!" + bytes(100))
    reader = MultiprocessDirCollector(workers.path)
    before = list(reader.collect())
    assert reader.skipped == {"bad_name": 0, "corrupt": 2, "truncated": 1, "unreadable": 0}

    collector = MultiprocessDirCollector(workers.path, compact_dead=True)
    result = collector.compact()

    assert result.skipped == {"truncated": 1, "corrupt": 2}
    assert collector.skipped == {"bad_name": 0, "corrupt": 2, "truncated": 1, "unreadable": 0}
    for bad in (torn, garbage, bad_exemplars):
        assert not bad.exists()
        assert Path(f"{bad}.corrupt").exists()  # kept for a human, no longer read
    after = MultiprocessDirCollector(workers.path)
    assert rows(after.collect()) == without_dead_all(rows(before), {str(dead.pid)})
    assert sum(after.skipped.values()) == 0


def test_a_compaction_stopped_after_its_rename_counts_nothing_twice(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers.start([0, 1])
    workers.start([2], stay=True)
    before = rows(scrape(workers.path))
    dead = {str(p.pid) for p in workers.procs[:2]}

    real_unlink = os.unlink

    def killed(path: str) -> None:
        if ".staged-" in str(path):
            raise KeyboardInterrupt  # the sidecar killed between rename and deletes
        real_unlink(path)

    monkeypatch.setattr(compaction.os, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        compaction.compact(workers.path, lambda raw: None)  # type: ignore[arg-type, return-value]
    monkeypatch.setattr(compaction.os, "unlink", real_unlink)
    assert list(workers.path.glob("*.staged-*"))  # left behind, already folded

    assert rows(scrape(workers.path)) == without_dead_all(before, dead)
    MultiprocessDirCollector(workers.path, compact_dead=True).compact()
    assert not list(workers.path.glob("*.staged-*"))
    assert rows(scrape(workers.path)) == without_dead_all(before, dead)


def test_a_pid_reused_during_compaction_keeps_its_file(
    workers: Workers, monkeypatch: pytest.MonkeyPatch
) -> None:
    (dead,) = workers.start([0])
    before = rows(scrape(workers.path))

    def reused(pid: str) -> bool:
        # Dead when the directory is listed, alive again once its files are renamed.
        return pid == str(dead.pid) and any(workers.path.glob(f"*_{pid}.staged-*"))

    monkeypatch.setattr(compaction, "pid_alive", reused)
    result = MultiprocessDirCollector(workers.path, compact_dead=True).compact()

    assert result.pids == set()
    assert result.restored == len(list(workers.path.glob(f"*_{dead.pid}.*")))
    assert result.restored >= 3
    assert not list(workers.path.glob("*.staged-*"))
    assert rows(scrape(workers.path)) == before


def test_compaction_needs_the_pid_check(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="check_pids"):
        MultiprocessDirCollector(tmp_path, check_pids=False, compact_dead=True)
    with pytest.raises(ValueError, match="check_pids"):
        MultiprocessDirCollector(tmp_path, check_pids=False).compact()


def test_scrapes_compact_at_most_once_per_interval(workers: Workers) -> None:
    workers.start([0])
    collector = MultiprocessDirCollector(workers.path, compact_dead=True, compact_interval=3600)
    first = rows(collector.collect())
    assert list(workers.path.glob(f"counter_{COMPACTED}.db"))
    workers.start([1])
    second = rows(collector.collect())  # within the interval: merged, not compacted
    assert len(list(workers.path.glob("counter_*.db"))) == 2
    assert second != first


def test_one_compaction_takes_at_most_max_pids_dead_pids(workers: Workers, tmp_path: Path) -> None:
    (dead,) = workers.start([0])
    _dead_copies(workers.path, workers.path / f"counter_{dead.pid}.db", 4)
    before = total(scrape(workers.path))
    collector = MultiprocessDirCollector(workers.path, compact_dead=True)

    done = [len(collector.compact(max_pids=2).pids) for _ in range(4)]

    assert done == [2, 2, 1, 0]
    assert total(scrape(workers.path)) == before == 5 * sum(1 + j * 0.5 for j in range(3))


def test_the_sidecars_setting_compacts_before_its_scrape(workers: Workers) -> None:
    from stocksentry.exporter.server.exposition import build_renderer
    from stocksentry.exporter.server.settings import ServerSettings

    workers.start(range(3))  # three workers that have exited: their pids are dead
    plain = ServerSettings("127.0.0.1", 0, multiprocess_dir=workers.path)
    before = build_renderer(plain).render(openmetrics=False)
    files_before = sorted(p.name for p in workers.path.glob("*.db"))
    compacting = ServerSettings(
        "127.0.0.1", 0, multiprocess_dir=workers.path, multiprocess_compact=True
    )
    after = build_renderer(compacting).render(openmetrics=False)
    files_after = sorted(p.name for p in workers.path.glob("*.db"))
    assert len(files_after) < len(files_before)
    assert all(COMPACTED in name for name in files_after)

    def app_lines(body: bytes) -> list[str]:
        # The app's series only (our own health series differ by design), less the
        # per-pid series of "all" gauges, which compaction drops with their dead pids.
        return sorted(
            line
            for line in body.decode().splitlines()
            if line.startswith("mp_") and not line.startswith("mp_g_all{")
        )

    assert app_lines(after) == app_lines(before)
