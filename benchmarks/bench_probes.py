"""Checkout throughput of the lab on PostgreSQL with the exporter's probes running, against
without them: the probes must not slow the sale they watch (target ratio >= 0.98).

Run as ``python benchmarks/bench_probes.py`` (``make bench`` does). Each repeat runs the
lab's ``atomic`` strategy once without and once with a :class:`ProbeRunner` probing every
``--interval`` seconds in a background event loop, in alternating order; the printed ratio
is the median of the per-pair throughput ratios (with / without).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.lab.config import LabConfig
from stocksentry.exporter.lab.run import run_lab
from stocksentry.exporter.probes import ProbeRunner

DEFAULT_DSN = os.environ.get(
    "STOCKSENTRY_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    """A fresh database for the run, dropped at the end whatever happens."""
    name = f"stocksentry_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield dsn.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def probes_running(url: str, interval: float) -> Iterator[ProbeRunner]:
    """A ProbeRunner on its own event loop thread, every built-in probe on."""
    config = parse_config(
        f"""
database:
  url: {url}
  leader_election: false
schema:
  products:
    allocation: initial_stock
probes:
  defaults:
    interval: {interval}
    timeout: 2s
""",
        environ={},
    )
    with running_on_a_thread(ProbeRunner(config), 10.0, 30.0) as runner:
        yield runner


@contextmanager
def running_on_a_thread(
    runner: ProbeRunner, start_timeout: float = 30.0, stop_timeout: float = 60.0
) -> Iterator[ProbeRunner]:
    """``runner`` started on an event loop thread of its own, stopped at the end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(runner.start(), loop).result(timeout=start_timeout)
    try:
        yield runner
    finally:
        asyncio.run_coroutine_threadsafe(runner.stop(), loop).result(timeout=stop_timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def throughput(url: str, buyers: int, concurrency: int) -> float:
    """Reservations per second of one atomic run that sells every unit."""
    (result,) = run_lab(
        LabConfig(
            database_url=url,
            buyers=buyers,
            stock=buyers,
            concurrency=concurrency,
            work_ms=0.0,
            strategies=("atomic",),
        )
    )
    if result.sold != buyers or not result.consistent:
        raise RuntimeError(f"the lab run was not clean: {result}")
    return buyers / result.wall_s


def alternate(
    repeats: int, without: Callable[[], float], with_probes: Callable[[], float]
) -> tuple[list[float], list[float], list[float]]:
    """Throughputs without and with probes, and each pair's ratio (with / without).

    Which side runs first alternates, so drift hits both alike.
    """
    bare: list[float] = []
    probed: list[float] = []
    for repeat in range(repeats):
        if repeat % 2 == 0:
            bare.append(without())
            probed.append(with_probes())
        else:
            probed.append(with_probes())
            bare.append(without())
    return bare, probed, [p / b for p, b in zip(probed, bare, strict=True)]


def measure(url: str, args: argparse.Namespace) -> None:
    """Alternate runs with and without probes; print the median throughput ratio."""
    throughput(url, args.buyers, args.concurrency)  # creates the schema, warms up
    # The indexes the probes expect (docs/exporter-config.md), as a production shop has.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE INDEX ON orders (created_at)")
        conn.execute("CREATE INDEX ON products (available_stock) WHERE available_stock < 0")

    def with_probes() -> float:
        with probes_running(url, args.interval):
            return throughput(url, args.buyers, args.concurrency)

    bare, probed, ratios = alternate(
        args.repeats, lambda: throughput(url, args.buyers, args.concurrency), with_probes
    )
    print(
        f"bench settings repeats={args.repeats} buyers={args.buyers} "
        f"concurrency={args.concurrency} probe_interval={args.interval}s"
    )
    print(
        f"bench lab_throughput_with_probes ratio={statistics.median(ratios):.3f} "
        f"with_per_s={statistics.median(probed):.0f} "
        f"without_per_s={statistics.median(bare):.0f}"
    )


def on_postgresql(work: Callable[[], object]) -> int:
    """Run ``work``: 0, or 2 with one line on stderr when PostgreSQL cannot be reached."""
    try:
        work()
    except psycopg.OperationalError as exc:
        print(f"bench: cannot reach PostgreSQL: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--buyers", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()

    def work() -> None:
        with scratch_database(args.dsn) as url:
            measure(url, args)

    return on_postgresql(work)


if __name__ == "__main__":
    sys.exit(main())
