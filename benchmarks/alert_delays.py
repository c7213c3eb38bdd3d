"""Seconds from a failure to its alert firing: the proof table of the end-to-end alert tests.

Runs ``tests/integration/test_alerting_e2e.py::test_each_failure_mode_fires_its_own_alert``
``--repeats`` times (a real Prometheus scraping and evaluating at 1 s, the exporter probing
every 0.5 s, the lab selling 40 units to 200 buyers per failure mode, a fresh stack each
run), collects the seconds each run recorded from the start of selling to each expected
alert's firing, and prints the table failure mode -> alert -> median / max seconds, with
the alerts that fired alongside. Then runs the two safe-strategy tests (atomic and
FOR UPDATE; redlock with its read-modify-write inside the owned lock and the idempotent
retry) and reports whether anything fired.

Needs what the integration tests need (PostgreSQL, Redis, Prometheus, Alertmanager;
``make services tools``). Not part of ``make bench``: a run takes minutes.

Usage::

    .venv/bin/python benchmarks/alert_delays.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/integration/test_alerting_e2e.py"
MODES_TEST = f"{TEST}::test_each_failure_mode_fires_its_own_alert"
SAFE_TESTS = (
    f"{TEST}::test_safe_strategies_fire_nothing",
    f"{TEST}::test_redlock_and_idempotent_retry_fire_nothing",
)


def pytest(args: list[str], env_file: Path | None) -> int:
    """Run pytest quietly; returns its exit status."""
    env = None
    if env_file is not None:
        env = {**os.environ, "STOCKSENTRY_ALERT_DELAYS_FILE": str(env_file)}
    # Our own interpreter and fixed arguments.
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    tail = "\n".join(lines[-1:])
    print(f"  pytest {' '.join(args)}: exit {done.returncode} ({tail})", file=sys.stderr)
    # Which runs failed, and the first line of each error, for the record.
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            print(f"    {line[:300]}", file=sys.stderr)
    return done.returncode


def table(lines: list[dict[str, object]]) -> str:
    """The markdown table of the collected lines."""
    seconds: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    cofiring: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        key = (str(line["mode"]), str(line["strategy"]), str(line["alert"]))
        seconds[key].append(float(line["seconds"]))  # type: ignore[arg-type]
        cofiring[str(line["mode"])].update(line["cofiring"])  # type: ignore[arg-type]
    rows = [
        "| failure mode (lab strategy) | alert | runs | median s | max s | fired alongside |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for (mode, strategy, alert), values in sorted(seconds.items()):
        alongside = ", ".join(sorted(cofiring[mode])) or "none"
        rows.append(
            f"| {mode} ({strategy}) | {alert} | {len(values)} |"
            f" {statistics.median(values):.1f} | {max(values):.1f} | {alongside} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of every failure mode")
    parser.add_argument("--no-safe", action="store_true", help="skip the safe strategies")
    args = parser.parse_args(argv)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="stocksentry-alert-delays-") as work:
        out = Path(work) / "delays.jsonl"
        for repeat in range(1, args.repeats + 1):
            print(f"run {repeat}/{args.repeats}", file=sys.stderr)
            failures += pytest([MODES_TEST], out) != 0
        lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    print(table(lines))
    if not args.no_safe:
        quiet = all(pytest([test], None) == 0 for test in SAFE_TESTS)
        print(
            "\nsafe strategies (atomic, for_update, redlock, retry_idempotent):"
            f" {'no alert fired' if quiet else 'a test FAILED (an alert fired or the run broke)'}"
        )
        failures += not quiet
    print(f"\nfailed pytest runs: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
