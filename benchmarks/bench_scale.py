"""The probes on a shop of real size: plan shapes, ms per run, share of a core, lab ratio.

Run as ``python benchmarks/bench_scale.py`` (``make bench SCALE=1`` does; the default
size is 1M products and 5M orders). It generates the shop in SQL
(``benchmarks/scaleshop.py``: ``generate_series``, ``UNLOGGED`` tables, the indexes
docs/exporter-config.md asks for, ``VACUUM ANALYZE``) in a database of its own, dropped
at the end; ``--keep`` keeps it under a name made of its size and re-uses it next time.

While it measures, a writer places ``--rate`` orders a second (100k an hour by default)
and refunds one older paid order in fifty, so the incremental probes have recent work;
the measurement starts once ``settle_after`` of those orders is there. It prints:

- each probe's plan shape (the top nodes of ``EXPLAIN``) and any Seq Scan of
  ``products``, ``orders`` or ``order_items``;
- each probe's median ms per run over ``--seconds`` of the probes at the example config's
  intervals, and the sum of (run time / interval) over the probes as a share of one core
  (run time measured by the client, so it bounds the database time from above);
- the oversold probe's rebuild after a start (runs until every active product is counted);
- the lab's checkout throughput with every probe running every second against without
  (median of alternating pairs; target >= 0.98).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from stocksentry.exporter.config import ExporterConfig, load_config
from stocksentry.exporter.probes import ProbeRunner
from stocksentry.exporter.probes.base import Probe, ProbeResult
from stocksentry.exporter.probes.postgres import DbProbe, OversoldProbe

# The generator is shared with the plan test (tests/integration/test_probes_at_scale.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_probes import running_on_a_thread, throughput
from benchmarks.scaleshop import (
    StatementRecorder,
    buffers,
    explain,
    generate,
    plan_shape,
    seq_scans,
)

DEFAULT_DSN = os.environ.get(
    "STOCKSENTRY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("STOCKSENTRY_BENCH_REDIS", "redis://127.0.0.1:6379/0")
EXAMPLE = Path(__file__).resolve().parent.parent / "exporter" / "config.example.yaml"
COMPLETE = "stocksentry scale shop: complete"


def _url(dsn: str, name: str) -> str:
    return dsn.rsplit("/", 1)[0] + "/" + name


@contextmanager
def scale_database(dsn: str, products: int, orders: int, *, keep: bool) -> Iterator[str]:
    """The generated shop's URL; generated now unless ``keep`` finds a complete one."""
    name = f"stocksentry_scale_{products}_{orders}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
            (name,),
        ).fetchone()
        reuse = keep and row is not None and row[0] == COMPLETE
        if not reuse:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    url = _url(dsn, name)
    try:
        if reuse:
            print(f"bench scale reusing database {name}")
        else:
            started = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                facts = generate(conn, products=products, orders=orders)
                conn.execute(f"COMMENT ON DATABASE \"{name}\" IS '{COMPLETE}'")
            print(
                f"bench scale generated products={facts.products} orders={facts.orders}"
                f" order_items={facts.order_items} reservations={facts.reservations}"
                f" outbox={facts.outbox} seconds={time.perf_counter() - started:.0f}"
            )
        yield url
    finally:
        if not keep:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def traffic(url: str, rate: float, products: int, orders: int) -> Iterator[None]:
    """A writer placing ``rate`` paid orders a second and refunding one in fifty."""
    stop = threading.Event()

    def write() -> None:
        rng = random.Random(7)
        with psycopg.connect(url) as conn:
            placed = 0
            while not stop.is_set():
                batch = max(1, round(rate / 4))
                with conn.transaction():
                    for _ in range(batch):
                        placed += 1
                        row = conn.execute(
                            "INSERT INTO orders (external_ref, status, created_at)"
                            " VALUES (%s, %s, now()) RETURNING id",
                            (f"live-{time.time_ns()}-{placed}", rng.choice(("PAID", "PENDING"))),
                        ).fetchone()
                        assert row is not None
                        conn.execute(
                            "INSERT INTO order_items (order_id, product_id, quantity, stock_after)"
                            " VALUES (%s, %s, 1, 0)",
                            (row[0], rng.randint(1, products)),
                        )
                        if placed % 50 == 0:
                            conn.execute(
                                "UPDATE orders SET status = 'REFUNDED' WHERE id = %s",
                                (rng.randint(1, orders),),
                            )
                        if placed % 3 == 0:
                            conn.execute(
                                "UPDATE orders SET status = 'PAID' WHERE id = %s", (row[0],)
                            )
                stop.wait(0.25)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


def example_config(url: str, *, interval: float | None = None) -> ExporterConfig:
    """exporter/config.example.yaml as it is, on ``url``; ``interval`` overrides every
    probe's (the lab ratio runs every probe every second)."""
    config = load_config(
        EXAMPLE,
        environ={"STOCKSENTRY_DATABASE_URL": url, "STOCKSENTRY_REDIS_URL": REDIS_URL},
    )
    if interval is None:
        return config
    probes = config.probes
    changed: dict[str, Any] = {
        name: dataclasses.replace(settings, interval=interval)
        for name, settings in probes.builtin().items()
    }
    changed["custom"] = tuple(dataclasses.replace(c, interval=interval) for c in probes.custom)
    return dataclasses.replace(config, probes=dataclasses.replace(probes, **changed))


class RecordingRunner(ProbeRunner):
    """A runner that keeps every run's result per probe."""

    def __init__(self, config: ExporterConfig) -> None:
        super().__init__(config)
        self.runs: dict[str, list[ProbeResult]] = {}

    async def run_once(self, probe: Probe) -> ProbeResult:
        result = await super().run_once(probe)
        self.runs.setdefault(probe.name, []).append(result)
        return result


async def rebuild(runner: ProbeRunner) -> tuple[int, float, float]:
    """Run oversold until every active product is counted: (runs, max ms, total ms)."""
    probe = next(p for p in runner.probes if isinstance(p, OversoldProbe))
    durations: list[float] = []
    while True:
        result = await runner.run_once(probe)
        if not result.up:
            raise RuntimeError(f"oversold failed: {result.error}")
        durations.append(result.duration * 1000)
        if probe.totals.pending == 0 or len(durations) >= 200:
            return len(durations), max(durations), sum(durations)


async def plans(runner: ProbeRunner) -> list[tuple[str, str, list[str], float]]:
    """Each database probe's statements: plan shape with the executed plan's server time
    and buffers, the big tables read by Seq Scan, and the server time (ms)."""
    out: list[tuple[str, str, list[str], float]] = []
    for probe in runner.probes:
        if not isinstance(probe, DbProbe):
            continue

        async def capture(conn: Any, probe: DbProbe = probe) -> list[tuple[str, list[str], float]]:
            recorder: Any = StatementRecorder(conn)
            # The cache-drift probe's database part is its SKU lookup; the rest is Redis.
            query = getattr(probe, "_database_stock", None) or probe.query
            await query(recorder)
            found = []
            for statement, params in recorder.statements:
                plan = await explain(conn, statement, params, analyze=True)
                ms = float(plan["Execution Time"])
                cost = f"exec_ms={ms:.1f} buffers={buffers(plan)} shape: "
                found.append((cost + plan_shape(plan), seq_scans(plan), ms))
            return found

        try:
            shapes = await probe.pool.read(capture)
        except Exception as exc:  # a probe that cannot run here (no Redis ...) says so
            out.append((probe.name, f"(not explained: {type(exc).__name__})", [], 0.0))
            continue
        for shape, scans, ms in shapes:
            out.append((probe.name, shape, scans, ms))
    return out


async def measure_probes(url: str, seconds: float) -> None:
    """The probes of the example config at its intervals, run one at a time (so a run's
    time is its own, not time spent waiting for a pooled session)."""
    config = example_config(url)
    runner = RecordingRunner(config)
    # The writer runs already: let the recent part fill up (settle_after and the margin)
    # so the rebuild and every run below see a steady state's recent orders.
    settings = config.probes.oversold
    fill = settings.settle_after + settings.clock_margin
    print(f"bench scale waiting {fill:.0f}s for the recent orders of a steady state")
    await asyncio.sleep(fill)
    try:
        runs, worst, total = await rebuild(runner)
        print(
            f"bench scale oversold_rebuild runs={runs} max_ms={worst:.1f} total_ms={total:.0f}"
            " (after a start or a leader change, until every active product is counted)"
        )
        for probe in runner.probes:
            if not isinstance(probe, OversoldProbe):
                first = await runner.run_once(probe)
                print(f"bench scale first_run probe={probe.name} ms={first.duration * 1000:.1f}")
        runner.runs.clear()
        loop = asyncio.get_running_loop()
        started = loop.time()
        due = {p.name: started + 0.05 * i for i, p in enumerate(runner.probes)}
        by_name = {p.name: p for p in runner.probes}
        while True:
            name = min(due, key=lambda n: due[n])
            if due[name] - started > seconds:
                break
            await asyncio.sleep(max(0.0, due[name] - loop.time()))
            await runner.run_once(by_name[name])
            due[name] += by_name[name].interval
        wall = loop.time() - started
        server_ms: dict[str, float] = {}
        for name, shape, scans, ms in await plans(runner):
            server_ms[name] = server_ms.get(name, 0.0) + ms  # one run's statements
            flag = f" SEQ_SCAN={','.join(scans)}" if scans else ""
            print(f"bench scale plan probe={name}{flag} {shape}")
    finally:
        await runner.stop()
    share = 0.0
    measured = 0.0
    server_share = sum(ms / 1000 / intervals_of(runner)[n] for n, ms in server_ms.items())
    intervals = {p.name: p.interval for p in runner.probes}
    for name, results in sorted(runner.runs.items()):
        if name not in intervals:
            continue
        run_ms = [r.duration * 1000 for r in results]
        down = sum(1 for r in results if not r.up)
        median = statistics.median(run_ms)
        share += median / 1000 / intervals[name]
        measured += sum(run_ms) / 1000
        print(
            f"bench scale probe={name} median_ms={median:.1f} runs={len(run_ms)}"
            f" interval_s={intervals[name]:g} failed_runs={down}"
        )
    print(
        f"bench scale probes_share_of_one_core={share * 100:.2f}% (sum of median run time /"
        f" interval, client-side) measured_run_time_over_wall={measured / wall * 100:.2f}%"
        f" over {wall:.0f}s server_execution_share={server_share * 100:.2f}% (EXPLAIN"
        " ANALYZE time of one steady-state run's statements / interval)"
    )


def intervals_of(runner: ProbeRunner) -> dict[str, float]:
    return {p.name: p.interval for p in runner.probes}


@contextmanager
def probes_every_second(url: str) -> Iterator[None]:
    """Every probe of the example config, every second, on a loop thread of its own."""
    with running_on_a_thread(ProbeRunner(example_config(url, interval=1.0))):
        yield


def measure_lab(url: str, repeats: int, buyers: int, concurrency: int) -> None:
    throughput(url, buyers, concurrency)  # creates the lab's own rows, warms up
    ratios: list[float] = []
    bare: list[float] = []
    probed: list[float] = []
    for repeat in range(repeats):
        pair: dict[bool, float] = {}
        for with_probes in (repeat % 2 == 1, repeat % 2 == 0):
            if with_probes:
                with probes_every_second(url):
                    time.sleep(1.0)  # the first runs, the oversold rebuild, then the sale
                    pair[True] = throughput(url, buyers, concurrency)
            else:
                pair[False] = throughput(url, buyers, concurrency)
        bare.append(pair[False])
        probed.append(pair[True])
        ratios.append(pair[True] / pair[False])
    print(
        f"bench scale lab_throughput_with_probes_every_1s ratio={statistics.median(ratios):.3f}"
        f" (median of pairs; pairs {' '.join(f'{r:.2f}' for r in ratios)})"
        f" with_per_s={statistics.median(probed):.0f} without_per_s={statistics.median(bare):.0f}"
        f" repeats={repeats} buyers={buyers} concurrency={concurrency}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--products", type=int, default=1_000_000)
    parser.add_argument("--orders", type=int, default=5_000_000)
    parser.add_argument(
        "--keep", action="store_true", help="keep the generated shop and re-use a kept one"
    )
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rate", type=float, default=28.0, help="orders a second meanwhile")
    parser.add_argument(
        "--lab-repeats", type=int, default=5, help="pairs of lab runs (0: no lab run)"
    )
    parser.add_argument("--buyers", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.products < 10 or args.orders < 10:
        parser.error("--products and --orders must be at least 10")
    try:
        with scale_database(args.dsn, args.products, args.orders, keep=args.keep) as url:
            print(
                f"bench scale settings products={args.products} orders={args.orders}"
                f" rate_per_s={args.rate:g} seconds={args.seconds:g} config={EXAMPLE.name}"
            )
            with traffic(url, args.rate, args.products, args.orders):
                asyncio.run(measure_probes(url, args.seconds))
            if args.lab_repeats:
                measure_lab(url, args.lab_repeats, args.buyers, args.concurrency)
    except psycopg.OperationalError as exc:
        print(f"bench: cannot reach PostgreSQL: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
