"""How many keyspace notifications per second the lock watcher sustains, and at what CPU.

Run as ``python benchmarks/bench_lockwatch.py`` (``make bench`` does). A private
redis-server (``notify-keyspace-events Kg$x``; the shared server is never touched) gets
lock traffic at fixed offered rates: each lock cycle is ``SET key v NX PX 10000`` then
``DEL key`` on one of 1,000 ``lock:product:SKU-n`` keys, three notifications (``set``,
``expire``, ``del``), sent in pipelines paced to the rate. The watcher runs in a child
process of its own (a :class:`LockWatcher`, exactly as in the sidecar), which reports its
received-event count and its CPU time.

For each offered rate, the median over ``--repeats`` of: events received per second, the
watcher's CPU (share of one core) and its CPU microseconds per notification (the
headline), with the ratio of received to offered beside. A rate is *sustained* when every
notification arrived and the watcher was still subscribed. Figures on a shared machine are
noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import redis
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.lab.observe import free_port
from stocksentry.exporter.lockwatch.watcher import LockWatcher

KEYS = 1000
EVENTS_PER_CYCLE = 3


def start_redis(directory: str) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("bench_lockwatch: redis-server is not installed (make services)")
    port = free_port()
    process = subprocess.Popen(  # noqa: S603 - redis-server from PATH, fixed arguments
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", directory, "--notify-keyspace-events", "Kg$x"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                process.terminate()
                sys.exit("bench_lockwatch: redis-server did not start")
            time.sleep(0.05)
    client.close()
    return process, url


def _child(url: str, conn: Connection) -> None:
    """The watcher's process: run it, answer ``snap`` with (events, cpu s, wall s, up)."""
    config = parse_config(f"lock_watch:\n  url: {url}\n  patterns: ['lock:product:{{sku}}']\n")
    assert config.lock_watch is not None
    watcher = LockWatcher(config.lock_watch, config.sku_guard)

    def serve() -> None:
        while True:
            if conn.recv() == "stop":
                return
            events = sum(watcher.tracker.events.values())
            conn.send((events, time.process_time(), time.monotonic(), watcher.connected))

    async def main() -> None:
        await watcher.start()
        await watcher.wait_subscribed()
        conn.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, serve)
        await watcher.stop()

    asyncio.run(main())


def offer(url: str, rate: float, seconds: float) -> int:
    """Send lock cycles at ``rate`` notifications/s for ``seconds``; returns events sent."""
    client = redis.Redis.from_url(url)
    cycles_per_s = rate / EVENTS_PER_CYCLE
    batch = 200 if rate == float("inf") else max(1, int(cycles_per_s / 100))
    sent = 0
    start = time.monotonic()
    n = 0
    while (now := time.monotonic()) - start < seconds:
        due = sent + 1 if rate == float("inf") else int((now - start) * cycles_per_s)
        if sent >= due:
            time.sleep(min(0.002, (sent + batch - due) / cycles_per_s))
            continue
        pipe = client.pipeline(transaction=False)
        for _ in range(batch):
            key = f"lock:product:SKU-{n % KEYS}"
            pipe.set(key, "token", nx=True, px=10_000)
            pipe.delete(key)
            n += 1
        pipe.execute()
        sent += batch
    client.close()
    return sent * EVENTS_PER_CYCLE


def measure(url: str, conn: Connection, rate: float, seconds: float) -> dict[str, float]:
    conn.send("snap")
    events0, cpu0, wall0, _ = conn.recv()
    offered = offer(url, rate, seconds)
    deadline = time.monotonic() + 5.0
    while True:
        conn.send("snap")
        events1, cpu1, wall1, up = conn.recv()
        if events1 - events0 >= offered or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    received = events1 - events0
    wall = wall1 - wall0
    cpu = cpu1 - cpu0
    return {
        "offered_per_s": offered / wall,
        "received_per_s": received / wall,
        "received_share": received / offered if offered else 1.0,
        "cpu_share": cpu / wall,
        "cpu_us_per_event": cpu / received * 1e6 if received else float("nan"),
        "sustained": float(received >= offered and bool(up)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates",
        default="3000,10000,20000,40000,80000",
        help="offered notifications per second, comma-separated",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one step")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates = [float("inf") if r == "max" else float(r) for r in args.rates.split(",")]
    directory = tempfile.mkdtemp(prefix="stocksentry-bench-redis-")
    server, url = start_redis(directory)
    parent, child_end = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_child, args=(url, child_end))
    child.start()
    try:
        if not parent.poll(15) or parent.recv() != "ready":
            sys.exit("bench_lockwatch: the watcher did not subscribe")
        offer(url, 3000, 0.5)  # warm-up, then let it drain
        time.sleep(1.0)
        print(
            f"lock watcher: {args.repeats} repeats of {args.seconds:g} s per offered rate "
            "(medians; shared machine, noisy)"
        )
        print(
            f"{'offered ev/s':>13} {'received ev/s':>14} {'received':>9} {'CPU':>6} "
            f"{'µs CPU/event':>13}  sustained"
        )
        best = 0.0
        for rate in rates:
            runs = [measure(url, parent, rate, args.seconds) for _ in range(args.repeats)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            sustained = all(r["sustained"] for r in runs)
            if sustained:
                best = max(best, med["received_per_s"])
            print(
                f"{med['offered_per_s']:13.0f} {med['received_per_s']:14.0f} "
                f"{med['received_share']:8.1%} {med['cpu_share']:6.0%} "
                f"{med['cpu_us_per_event']:13.1f}  {'yes' if sustained else 'no'}"
            )
        print(
            f"sustained: {best:.0f} notifications/s "
            f"({best / EVENTS_PER_CYCLE:.0f} lock acquire+release cycles/s)"
        )
    finally:
        parent.send("stop")
        child.join(10)
        if child.is_alive():
            child.terminate()
        server.terminate()
        server.wait(10)
        shutil.rmtree(Path(directory), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
