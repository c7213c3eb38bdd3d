"""Our multiprocess reader against prometheus_client's ``MultiProcessCollector``.

Two questions, one directory. The directory: ``--workers`` (8) real worker processes with
``PROMETHEUS_MULTIPROC_DIR`` set, each recording the catalog's app series through
``StockMetrics`` for ``--skus`` (200) SKUs (reservation successes, conflicts of every
reason, paid orders, refunds, negative writes, durations per outcome, lock waits and hold
ratios) plus three gauges in the ``liveall`` (per SKU), ``livesum`` and ``mostrecent``
modes. The workers stay alive while the timing runs, so ``check_pids`` has live pids to
check, then exit.

1. Speed: the median time per scrape over ``--repeats`` interleaved rounds of
   ``merge`` (``list(collector.collect())``) and ``merge+text`` (the same through
   ``generate_latest``), for ours with ``check_pids`` on and off and for
   prometheus_client's collector (a fresh one per scrape, as a server builds it).
   Before timing, the samples of ours (``check_pids=False``) and prometheus_client's are
   compared; the run fails if they differ.
2. Behaviour: copies of the directory with one defect each (a torn file, a garbage key,
   a 0-byte file of a starting worker, a stray ``*.db`` name, a FIFO in place of a file,
   dead workers whose ``live*`` gauges remain, OpenMetrics exemplars), and what each
   reader makes of them. The FIFO case runs in a daemon thread with a timeout, since a
   reader that opens it blocks.

3. Worker churn (``--recycled N``, 1,000 by default; 0 skips it): a directory of 4 live
   workers and N dead ones (one real worker that exited, its files copied under N pids
   that no process can have), ``--recycled-skus`` (20) SKUs each: the median scrape
   (text, and OpenMetrics with exemplars) before and after
   :meth:`~stocksentry.exporter.multiproc.MultiprocessDirCollector.compact`, which is
   timed once; the samples must be the same after as before.

Run::

    python benchmarks/bench_multiproc.py [--workers 8] [--skus 200] [--repeats 15]
        [--recycled 1000] [--recycled-skus 20]
"""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from stocksentry.exporter.multiproc import MultiprocessDirCollector
from stocksentry.exporter.multiproc.compaction import MAX_PIDS
from stocksentry.instrumentation import mpexemplars

# The OpenMetrics encoder is untyped in prometheus_client; this gives it a type once.
generate_openmetrics: Callable[[Collector], bytes] = openmetrics.generate_latest

WORKER = textwrap.dedent(
    """
    import sys
    from prometheus_client import Gauge
    from stocksentry.instrumentation.metrics import StockMetrics
    from stocksentry.instrumentation import catalog

    worker, skus = int(sys.argv[1]), int(sys.argv[2])
    names = [f"SKU-{i:05d}" for i in range(skus)]
    metrics = StockMetrics(promo_skus=names, max_skus=skus)
    cache_age = Gauge("bench_cache_age_seconds", "Age.", ["sku"], multiprocess_mode="liveall")
    inflight = Gauge("bench_inflight_reservations", "In flight.", multiprocess_mode="livesum")
    last_sale = Gauge("bench_last_sale_timestamp", "Last.", multiprocess_mode="mostrecent")
    for i, sku in enumerate(names):
        n = 1 + (i + worker) % 7
        for _ in range(n):
            metrics.count(catalog.RESERVATION_SUCCESS, sku, "atomic")
        reasons = catalog.CONFLICT_REASONS
        metrics.count(catalog.RESERVATION_CONFLICT, sku, reasons[i % len(reasons)])
        metrics.count(catalog.ORDERS_PAID, sku, amount=n)
        if i % 17 == 0:
            metrics.count(catalog.REFUND_DUE_TO_OVERSELL, sku)
            metrics.count(catalog.INVENTORY_NEGATIVE, sku)
        cache_age.labels(sku).set((i * 3 + worker) % 60)
    for j, outcome in enumerate(catalog.OUTCOMES):
        for k in range(20):
            # Every observation carries an exemplar, as under a recording tracer.
            exemplar = {"trace_id": f"{worker:08x}{j:08x}{k:016x}", "span_id": f"{k:016x}"}
            seconds = ((j * 20 + k + worker) % 1000) / 1000
            metrics.observe(catalog.RESERVATION_DURATION, seconds, outcome, exemplar=exemplar)
            table = ("products", "orders")[k % 2]
            metrics.observe(catalog.DB_LOCK_WAIT, seconds / 3, table, exemplar=exemplar)
    for lock in ("stock", "order"):
        metrics.observe(catalog.LOCK_ACQUIRE_DURATION, 0.01 * (worker + 1), lock, "acquired")
        metrics.observe(catalog.LOCK_HOLD_RATIO, 0.1 * (worker % 10), lock)
    inflight.set(worker)
    last_sale.set(1_700_000_000 + worker)
    print("ready", flush=True)
    sys.stdin.read()  # stay alive until the benchmark closes our stdin
    """
)


class _Raw:
    """prometheus_client's collector, built fresh per scrape as in its docs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterable[Metric]:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.path))  # type: ignore[no-untyped-call]  # untyped upstream
        return list(registry.collect())


class _Listed:
    """A collector over a list, for the encoders."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def start_workers(path: Path, workers: int, skus: int) -> list[subprocess.Popen[str]]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(path)}
    procs = [
        # Our own worker script, run by this interpreter.
        subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", WORKER, str(n), str(skus)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(workers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"worker {proc.pid} failed: exit {proc.wait(timeout=60)}")
    return procs


def stop_workers(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
    codes = [proc.wait(timeout=60) for proc in procs]
    if any(codes):
        raise SystemExit(f"a worker failed: exit codes {codes}")


def samples(collector: Collector, prefixes: tuple[str, ...]) -> set[tuple[object, ...]]:
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in collector.collect()
        if family.name.startswith(prefixes)
        for s in family.samples
    }


def merge_only(collector: Collector) -> list[Metric]:
    return list(collector.collect())


def timed(fn: Callable[[], object], results: dict[str, list[float]], key: str) -> None:
    gc.collect()
    start = time.perf_counter()
    fn()
    results.setdefault(key, []).append((time.perf_counter() - start) * 1000)


def attempt(fn: Callable[[], object], timeout: float = 3.0) -> str:
    """What ``fn`` did: 'ok: ...', 'raised ...' or 'hung'; in a daemon thread."""
    outcome: list[str] = []

    def run() -> None:
        try:
            value = fn()
        except Exception as exc:  # what a reader does with bad input is the finding here
            outcome.append(f"raised {type(exc).__name__}: {str(exc)[:60]}")
        else:
            outcome.append(f"ok: {value}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"hung (no answer after {timeout:.0f} s)"


def summary(families: list[Metric]) -> str:
    """Sample count, and the successes summed over SKUs (which must not change)."""
    count = sum(len(f.samples) for f in families if f.name.startswith(("stock_", "bench_")))
    successes = sum(
        s.value for f in families for s in f.samples if s.name == "stock_reservation_success_total"
    )
    return f"{count} samples, successes {successes:.0f}"


def behaviour(path: Path, scratch: Path) -> list[tuple[str, str, str]]:
    """(case, ours, prometheus_client's) for each defect, on copies of ``path``."""
    rows: list[tuple[str, str, str]] = []
    files = sorted(p.name for p in path.glob("*.db"))
    counter_file = next(name for name in files if name.startswith("counter_"))

    def copy(case: str) -> Path:
        target = scratch / case
        shutil.copytree(path, target)
        return target

    def ours_summary(directory: Path) -> str:
        collector = MultiprocessDirCollector(directory, check_pids=False)
        families = list(collector.collect())
        skipped = {k: v for k, v in collector.skipped.items() if v}
        return f"{summary(families)}, skipped {skipped or 'none'}"

    def raw_summary(directory: Path) -> str:
        return summary(list(_Raw(directory).collect()))

    def case(name: str, directory: Path) -> None:
        rows.append(
            (
                name,
                attempt(lambda: ours_summary(directory)),
                attempt(lambda: raw_summary(directory)),
            )
        )

    case("healthy directory", copy("healthy"))

    torn = copy("torn")
    data = (torn / counter_file).read_bytes()
    (used,) = struct.unpack_from("i", data, 0)
    (torn / counter_file).write_bytes(data[: used // 2])
    case("torn file (cut at half its used bytes)", torn)

    garbage = copy("garbage")
    spoilt = bytearray((garbage / counter_file).read_bytes())
    spoilt[12:20] = b"\xff\xfe{[\x00\x01\x02\x03"
    (garbage / counter_file).write_bytes(bytes(spoilt))
    case("garbage in one key", garbage)

    empty = copy("empty")
    (empty / "counter_999999.db").write_bytes(b"")
    case("0-byte file of a starting worker", empty)

    stray = copy("stray")
    shutil.copy(stray / counter_file, stray / "backup.db")
    case("stray file name (backup.db)", stray)

    fifo = copy("fifo")
    os.mkfifo(fifo / "counter_999998.db")
    case("FIFO named like a counter file", fifo)

    return rows


def dead_pids(path: Path) -> tuple[str, str]:
    """Series of the ``live*`` gauges once every worker is gone (no mark_process_dead)."""
    prefixes = ("bench_cache_age", "bench_inflight")
    ours = len(samples(MultiprocessDirCollector(path, check_pids=True), prefixes))
    raw = len(samples(_Raw(path), prefixes))
    return f"{ours} live* samples", f"{raw} live* samples"


def exemplars(path: Path) -> tuple[str, str]:
    """Whether OpenMetrics output from each reader carries any exemplar."""

    def count(collector: Collector) -> str:
        body = generate_openmetrics(_Listed(list(collector.collect()))).decode()
        found = sum(1 for line in body.splitlines() if " # {" in line)
        return f"{found} exemplars"

    return count(MultiprocessDirCollector(path, check_pids=False)), count(_Raw(path))


HOT = textwrap.dedent(
    """
    import statistics, timeit
    from stocksentry.instrumentation import catalog
    from stocksentry.instrumentation.metrics import StockMetrics
    m = StockMetrics()
    ex = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7"}
    d = catalog.RESERVATION_DURATION
    for name, fn in (
        ("without exemplar", lambda: m.observe(d, 0.02, "success")),
        ("with exemplar", lambda: m.observe(d, 0.02, "success", exemplar=ex)),
    ):
        fn()
        runs = [min(timeit.repeat(fn, number=20000, repeat=3)) / 20000 * 1e6 for _ in range(5)]
        print(f"{name:<18} {statistics.median(runs):6.2f}")
    """
)


def hot_path() -> list[str]:
    """µs per ``reservation_duration`` in multiprocess mode, with and without an exemplar."""
    with tempfile.TemporaryDirectory(prefix="stocksentry-bench-hot-") as tmp:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": tmp}
        # Our own snippet, run by this interpreter.
        out = subprocess.run(  # noqa: S603
            [sys.executable, "-c", HOT], env=env, capture_output=True, text=True, check=True
        )
    return out.stdout.splitlines()


#: No Linux process ever has a pid above 2**22 (PID_MAX_LIMIT).
NEVER_ALIVE = 2**22 + 1


def _copy_worker(source: Path, pid: int, target: Path) -> None:
    """A dead worker's files as another dead pid's: only the bytes in use (the exemplar
    table stays sparse past its used slots), so 1,000 copies stay small on disk."""
    dead = source.name.rsplit("_", 1)[0]  # e.g. "counter", "gauge_livesum", "exemplars"
    suffix = source.suffix
    data = source.read_bytes()
    if suffix == ".db":
        (used,) = struct.unpack_from("i", data, 0)
        (target / f"{dead}_{pid}{suffix}").write_bytes(data[: max(used, 8)])
        return
    used = mpexemplars.HEADER.unpack_from(data)[5]
    path = target / f"{dead}_{pid}{suffix}"
    path.write_bytes(data[: mpexemplars.HEADER_SIZE + used * mpexemplars.SLOT_SIZE])
    os.truncate(path, len(data))


def recycled(count: int, skus: int, repeats: int) -> list[str]:
    """The scrape of 4 live workers and ``count`` dead ones, before and after compaction."""
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="stocksentry-bench-churn-") as tmp:
        path = Path(tmp) / "prom"
        path.mkdir()
        live = start_workers(path, 4, skus)
        try:
            dead = start_workers(path, 1, skus)
            stop_workers(dead)
            template = [p for p in path.iterdir() if f"_{dead[0].pid}." in p.name]
            for n in range(count - 1):
                for source in template:
                    _copy_worker(source, NEVER_ALIVE + n, path)
            # Scrapes by a reader that does not compact; the compaction is timed on its own.
            collector = MultiprocessDirCollector(path, check_pids=True)
            prefixes = ("stock_", "bench_")

            def scrape_times() -> tuple[float, float, int, int]:
                times: dict[str, list[float]] = {}
                cases: dict[str, Callable[[], object]] = {
                    "text": partial(generate_latest, collector),
                    "openmetrics": partial(generate_openmetrics, collector),
                }
                for fn in cases.values():
                    fn()
                for round_ in range(repeats):
                    order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
                    for key in order:
                        timed(cases[key], times, key)
                files = [p for p in path.iterdir() if not p.name.startswith(".")]
                size = sum(p.stat().st_blocks * 512 for p in files)
                return (
                    statistics.median(times["text"]),
                    statistics.median(times["openmetrics"]),
                    len(files),
                    size,
                )

            before_samples = samples(collector, prefixes)
            before = scrape_times()
            # As a sidecar does it: one compaction of at most MAX_PIDS dead pids per
            # interval, until none is left.
            compactor = MultiprocessDirCollector(path, compact_dead=True)
            runs: list[float] = []
            compacted_pids = folded = dropped = 0
            while True:
                started = time.perf_counter()
                result = compactor.compact()
                runs.append((time.perf_counter() - started) * 1000)
                if not result.pids:
                    break
                compacted_pids += len(result.pids)
                folded += result.folded
                dropped += result.dropped
            after_samples = samples(collector, prefixes)
            after = scrape_times()
        finally:
            stop_workers(live)
    # Adding the dead workers' values first is another order of additions: a sum of
    # fractional values (durations' _sum) may differ in its last bits, nothing more.
    before_values = {sample[:2]: float(str(sample[2])) for sample in before_samples}
    after_values = {sample[:2]: float(str(sample[2])) for sample in after_samples}
    rounded = sum(1 for key, value in after_values.items() if before_values.get(key) != value)
    same = (
        f"the same ({rounded} sums of fractions differ in their last bits)"
        if before_values.keys() == after_values.keys()
        and all(
            math.isclose(value, before_values[key], rel_tol=1e-12, abs_tol=1e-12)
            for key, value in after_values.items()
        )
        else "DIFFERENT"
    )
    lines.append(
        f"worker churn: 4 live + {count} dead workers x {skus} SKUs; median ms per scrape "
        f"over {repeats} rounds:"
    )
    for label, (text, om, files, size) in (("before compaction", before), ("after", after)):
        lines.append(
            f"  {label:<18} text {text:8.1f}  openmetrics {om:8.1f}  "
            f"({files} files, {size // 1024} KiB on disk)"
        )
    lines.append(
        f"  compaction of {compacted_pids} dead pids in {len(runs) - 1} runs of at most "
        f"{MAX_PIDS}: median {statistics.median(runs[:-1] or [0.0]):.0f} ms per run, "
        f"{sum(runs):.0f} ms in all ({folded} files folded, {dropped} dropped); a run with "
        f"nothing to do {runs[-1]:.1f} ms"
    )
    lines.append(
        f"  samples after: {same}; text scrape x{after[0] / before[0]:.3f} of before, "
        f"OpenMetrics x{after[1] / before[1]:.3f}"
    )
    if same == "DIFFERENT":
        lines.append("INVALID: compaction changed the samples")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--skus", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--recycled", type=int, default=1000)
    parser.add_argument("--recycled-skus", type=int, default=20)
    args = parser.parse_args(argv)
    # The defect cases make our reader warn about each bad file; the table says it.
    logging.getLogger("stocksentry.exporter.multiproc").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory(prefix="stocksentry-bench-mp-") as tmp:
        path = Path(tmp) / "prom"
        path.mkdir()
        procs = start_workers(path, args.workers, args.skus)
        try:
            db_files = sorted(path.glob("*.db"))
            print(
                f"directory: {len(db_files)} files from {args.workers} workers x {args.skus} "
                f"SKUs, {sum(p.stat().st_size for p in db_files) // 1024} KiB"
            )
            prefixes = ("stock_", "bench_")
            ours_checked = MultiprocessDirCollector(path, check_pids=True)
            ours_unchecked = MultiprocessDirCollector(path, check_pids=False)
            raw = _Raw(path)
            expected = samples(raw, prefixes)
            if samples(ours_unchecked, prefixes) != expected or not expected:
                print("INVALID: ours and prometheus_client's samples differ", file=sys.stderr)
                return 1
            if samples(ours_checked, prefixes) != expected:
                print("INVALID: check_pids dropped series of live workers", file=sys.stderr)
                return 1
            readers: dict[str, Collector] = {
                "ours check_pids": ours_checked,
                "ours no check": ours_unchecked,
                "prometheus_client": raw,
            }
            cases: dict[str, Callable[[], object]] = {}
            for name, reader in readers.items():
                cases[f"{name} merge"] = partial(merge_only, reader)
                cases[f"{name} merge+text"] = partial(generate_latest, reader)
            # OpenMetrics: ours carries the workers' exemplars, prometheus_client has none.
            cases["ours no check merge+openmetrics"] = partial(
                generate_openmetrics, ours_unchecked
            )
            for fn in cases.values():
                fn()  # warm-up: imports, page cache, our key cache
            times: dict[str, list[float]] = {}
            for round_ in range(args.repeats):
                order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
                for key in order:
                    timed(cases[key], times, key)
            rows = behaviour(path, Path(tmp) / "cases")
        finally:
            stop_workers(procs)
        dead = dead_pids(path)
        seen = exemplars(path)

    print(f"samples merged: {len(expected)}; rounds: {args.repeats}; median ms per scrape:")
    for key, values in times.items():
        print(f"  {key:<34} {statistics.median(values):7.1f}")
    with_exemplars = statistics.median(times["ours no check merge+openmetrics"])
    raw_text = statistics.median(times["prometheus_client merge+text"])
    print(
        f"  ratio ours OpenMetrics with exemplars / prometheus_client text without: "
        f"{with_exemplars / raw_text:.2f}"
    )
    print("hot path, median µs per observe (multiprocess mode):")
    for line in hot_path():
        print(f"  {line}")
    print("behaviour (ours | prometheus_client):")
    for name, ours, theirs in rows:
        print(f"  {name}:\n    ours: {ours}\n    prometheus_client: {theirs}")
    print("  every worker gone, no mark_process_dead:")
    print(f"    ours: {dead[0]}\n    prometheus_client: {dead[1]}")
    print(f"  OpenMetrics exemplars:\n    ours: {seen[0]}\n    prometheus_client: {seen[1]}")
    if args.recycled > 0:
        churn = recycled(args.recycled, args.recycled_skus, max(3, args.repeats // 3))
        for line in churn:
            print(line, flush=True)
        if any(line.startswith("INVALID") for line in churn):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
