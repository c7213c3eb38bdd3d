"""What ``import stocksentry.instrumentation`` costs a process, from ``python -X importtime``.

Run it with the interpreter of the install to measure; the figure that matters is the
core install's (``pip install stocksentry``: prometheus-client, opentelemetry-api,
structlog), whose venv has none of the extras::

    python3 -m venv /tmp/corevenv && /tmp/corevenv/bin/pip install -e .
    python benchmarks/bench_import.py --python /tmp/corevenv/bin/python [--repeats 21]

Each repeat is a fresh process (``-X importtime``, compiled files already cached); the
figures are medians over the repeats: the package's cumulative import time, the share of
it spent in stocksentry's own modules (their self time), and the slowest modules by self
time. Import time on a shared machine is noisy: the minimum is printed beside the median.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence

PACKAGE = "stocksentry.instrumentation"
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)$")


def one_run(python: str) -> tuple[int, dict[str, int]]:
    """The package's cumulative import time and every module's self time, in µs."""
    done = subprocess.run(  # noqa: S603 - the interpreter given, a fixed command line
        [python, "-X", "importtime", "-c", f"import {PACKAGE}"],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
    )
    cumulative = None
    own: dict[str, int] = {}
    for line in done.stderr.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        self_us, cumulative_us, _, name = match.groups()
        own[name] = int(self_us)
        if name == PACKAGE:
            cumulative = int(cumulative_us)
    if cumulative is None:
        raise RuntimeError(f"{python} did not import {PACKAGE}:\n{done.stderr[-2000:]}")
    return cumulative, own


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--python", default=sys.executable, help="interpreter of the install")
    parser.add_argument("--repeats", type=int, default=21, help="processes (21)")
    parser.add_argument("--top", type=int, default=12, help="slowest modules listed (12)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    one_run(args.python)  # compiled files in place before the timed runs
    totals: list[int] = []
    selves: dict[str, list[int]] = defaultdict(list)
    ours: list[int] = []
    for _ in range(args.repeats):
        total, own = one_run(args.python)
        totals.append(total)
        for name, self_us in own.items():
            selves[name].append(self_us)
        ours.append(sum(us for name, us in own.items() if name.startswith("stocksentry")))
    modules = sorted(selves, key=lambda name: statistics.median(selves[name]), reverse=True)
    print(
        f"bench import {PACKAGE} median_ms={statistics.median(totals) / 1000:.1f} "
        f"min_ms={min(totals) / 1000:.1f} own_modules_ms={statistics.median(ours) / 1000:.1f} "
        f"repeats={args.repeats} load_average={os.getloadavg()[0]:.2f} "
        f"modules={len(selves)} python={args.python}"
    )
    for name in modules[: args.top]:
        print(f"bench import_self {name} median_ms={statistics.median(selves[name]) / 1000:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
