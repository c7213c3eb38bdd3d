"""`stocksentry timeline --format json` over 100,000 and 1,000,000 log lines: wall time
and peak RSS, medians over repeats, side by side.

Run as ``python benchmarks/bench_timeline.py`` (``make bench`` does). The input is written
by stocksentry's own logging (``configure_logging`` + ``reservation`` +
``payment_callback``): per request a ``stock_check``, a ``stock_update`` and a
``payment_callback``, with three correlation keys (request id, idempotency key, payment
reference) over 1,000 SKUs. A few lost updates (two requests writing the same ``from`` ->
``to``) and duplicate executions (one idempotency key reserved twice, one payment
reference paid twice) are planted, so the report has findings to get right. The inputs
are written once and cached in the temp directory (``--cache``).

Each run is a child process (``stocksentry timeline --format json FILE``); its wall time
is measured around it, and its CPU time (user + system) and peak RSS come from
``os.wait4``'s resource usage of that child alone. On a machine shared with other work
the wall time follows the load; the CPU time much less so. ``--save DIR`` keeps each
size's JSON report, ``--compare DIR`` checks that the reports are the same as ones saved
before (exit status 1 when they differ): the way to show a change keeps the findings
exact.

``--before DIR`` also runs an older copy of the ``timeline`` package (a directory such as
``git archive``'s of ``exporter/investigate/timeline``) in the same rounds, alternating
with the current one, and checks that both give the same findings and timelines (the
fields added since, such as each finding's ``cause`` and the per-SKU ``summary``, left
out): on a shared, noisy machine a before/after comparison is only fair side by side.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stocksentry.instrumentation import configure, payment_callback, reservation
from stocksentry.instrumentation.logs import configure_logging

SKUS = 1_000
START_STOCK = 1_000
#: Bump when the generated input changes, so that a cached file is not reused.
INPUT_VERSION = 1
SIZES = (100_000, 1_000_000)


def generate(path: Path, lines: int, seed: int = 7) -> None:
    """Write about ``lines`` JSON lines of reservations and payments to ``path``."""
    rng = random.Random(seed)
    stock = dict.fromkeys((f"SKU-{i:04d}" for i in range(SKUS)), START_STOCK)
    skus = list(stock)
    tmp = path.with_suffix(".partial")
    with tmp.open("w", encoding="utf-8") as out:
        configure_logging("INFO", stream=out, bridge_stdlib=False)
        configure(promo_skus=skus[:10])
        request = 0
        written = 0
        while written < lines:
            request += 1
            sku = rng.choice(skus)
            before = stock[sku]
            if before <= 0:
                before = stock[sku] = START_STOCK  # a restock: values start over
            plant = request % 5_003
            rid, key, ref = f"R{request}", f"K{request}", f"P{request}"
            order = f"O{request}"
            with reservation(sku, request_id=rid, idempotency_key=key, order_id=order) as r:
                r.stock_check(available=before)
                r.success(old_stock=before, new_stock=before - 1)
            written += 2
            if plant == 1:
                # A lost update: a second request read the same stock and wrote over it.
                with reservation(sku, request_id=f"{rid}x", idempotency_key=f"{key}x") as r:
                    r.stock_check(available=before)
                    r.success(old_stock=before, new_stock=before - 1)
                written += 2
            elif plant == 2:
                # A duplicate execution: the same idempotency key reserved again.
                stock[sku] = before - 1
                with reservation(sku, request_id=f"{rid}d", idempotency_key=key) as r:
                    r.stock_check(available=before - 1)
                    r.success(old_stock=before - 1, new_stock=before - 2)
                written += 2
            stock[sku] -= 1
            with payment_callback(sku, order_id=f"O{request}", payment_reference=ref):
                pass
            written += 1
            if plant == 3:
                # A payment reference paid twice.
                with payment_callback(sku, order_id=f"O{request}", payment_reference=ref):
                    pass
                written += 1
    configure_logging("INFO", stream=io.StringIO(), bridge_stdlib=False)
    tmp.replace(path)


def cached_input(cache: Path, lines: int) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"timeline-{lines}-v{INPUT_VERSION}.jsonl"
    if not path.exists():
        started = time.perf_counter()
        generate(path, lines)
        took = time.perf_counter() - started
        print(f"  generated {path} ({lines:,} lines) in {took:.0f} s", flush=True)
    return path


# Runs stocksentry with the timeline package taken from another directory (--before).
_WITH_PACKAGE = (
    "import sys; import stocksentry.exporter.investigate.timeline as t; "
    "t.__path__[:] = [sys.argv.pop(1)]; from stocksentry.exporter.cli import main; "
    "sys.argv[0] = 'stocksentry'; sys.exit(main())"
)


def run_once(command: list[str], path: Path, report: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of one
    ``timeline --format json`` child."""
    with report.open("wb") as out:
        started = time.perf_counter()
        child = subprocess.Popen(  # noqa: S603 - our own command line
            [*command, "timeline", "--format", "json", str(path)], stdout=out
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):
        raise SystemExit(f"bench_timeline: timeline exited {child.returncode} on {path}")
    # ru_maxrss is in KiB on Linux.
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


#: What the report gained since the findings alone were compared: left out of the check
#: that two versions' reports agree, so that an older version can be run beside.
_NEW_FINDING_FIELDS = ("cause", "units", "first", "last")


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    """The report without the fields an older version does not write."""
    out = {key: value for key, value in data.items() if key not in ("summary", "stock_events")}
    out["more"] = {key: value for key, value in data["more"].items() if key != "findings"}
    out["findings"] = [
        {key: value for key, value in finding.items() if key not in _NEW_FINDING_FIELDS}
        for finding in data["findings"]
    ]
    return out


def _kinds(data: dict[str, Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for finding in data["findings"]:
        kinds[finding["kind"]] = kinds.get(finding["kind"], 0) + 1
    return kinds


def _figures(walls: list[float], cpus: list[float], rss: list[float]) -> str:
    return (
        f"{statistics.median(walls):6.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
        f"CPU {statistics.median(cpus):6.2f} s ({min(cpus):.2f}-{max(cpus):.2f}), "
        f"peak RSS {statistics.median(rss):5.0f} MB ({min(rss):.0f}-{max(rss):.0f})"
    )


def _load() -> str:
    """The load averages over 1, 5 and 15 minutes: the wall time follows them."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "stocksentry-bench"
    )
    parser.add_argument("--save", type=Path, help="keep each size's JSON report here")
    parser.add_argument("--compare", type=Path, help="compare the reports with these")
    parser.add_argument(
        "--before", type=Path, help="also run the timeline package in this directory"
    )
    args = parser.parse_args()
    command = [str(Path(sys.executable).with_name("stocksentry"))]
    commands = {"now": command}
    if args.before is not None:
        commands["before"] = [sys.executable, "-c", _WITH_PACKAGE, str(args.before.resolve())]
    print("timeline --format json: wall time and peak RSS (median of repeats; min-max)")
    print(f"  load average before: {_load()}", flush=True)
    results: dict[int, tuple[list[float], list[float]]] = {}
    differ = False
    for size in args.sizes:
        path = cached_input(args.cache, size)
        figures: dict[str, tuple[list[float], list[float], list[float]]] = {
            name: ([], [], []) for name in commands
        }
        reports: dict[str, bytes] = {}
        with tempfile.TemporaryDirectory() as scratch:
            report = Path(scratch) / "report.json"
            for round_ in range(max(args.repeats, 1)):
                # Alternating which goes first, so that neither always runs on a warm cache.
                order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
                for name in order:
                    for into, value in zip(
                        figures[name], run_once(commands[name], path, report), strict=True
                    ):
                        into.append(value)
                    reports[name] = report.read_bytes()
        data = json.loads(reports["now"])
        if args.save is not None:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / f"report-{size}.json").write_bytes(reports["now"])
        walls, cpus, rss = figures["now"]
        results[size] = (walls, rss)
        print(
            f"  {size:>9,} lines: {_figures(walls, cpus, rss)}; findings {_kinds(data)}, "
            f"keys forgotten {data['keys_forgotten']:,}",
            flush=True,
        )
        if "before" in figures:
            before_walls, before_cpus, before_rss = figures["before"]
            same = reports["before"] == reports["now"] or _comparable(
                json.loads(reports["before"])
            ) == _comparable(data)
            differ |= not same
            print(
                f"    before: {_figures(before_walls, before_cpus, before_rss)}; now/before: "
                f"wall x{statistics.median(walls) / statistics.median(before_walls):.2f}, "
                f"CPU x{statistics.median(cpus) / statistics.median(before_cpus):.2f}; "
                f"findings and timelines {'the same' if same else 'DIFFER'}",
                flush=True,
            )
        if args.compare is not None:
            before = json.loads((args.compare / f"report-{size}.json").read_text("utf-8"))
            same = _comparable(before) == _comparable(data)
            differ |= not same
            print(f"    report {'identical to' if same else 'DIFFERS from'} {args.compare}")
    print(f"  load average after: {_load()}")
    if len(results) >= 2:
        small, big = min(results), max(results)
        rss_ratio = statistics.median(results[big][1]) / statistics.median(results[small][1])
        time_ratio = statistics.median(results[big][0]) / statistics.median(results[small][0])
        print(f"  {big:,} vs {small:,}: time x{time_ratio:.1f}, peak RSS x{rss_ratio:.2f}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
