"""Instructions per reservation, mode by mode, counted by callgrind: load-independent figures.

Wall-clock microseconds on a shared machine move with its load; the instructions a
reservation executes do not. Each mode runs in a process of its own under
``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``), twice: once with ``--n`` reservations
after the warm-up and once with none. The difference of the two totals over ``--n`` is what
one reservation costs, start-up and imports cancelled out. The worker thread of the span
processor is counted too: each child flushes it before exiting.

Modes (the in-memory reservations of ``bench_reservation.py``, so the same marks: a
``stock_check`` and a ``success``, two JSON lines with logging on):

- ``bare``: the check-then-take reservation on a dict, no stocksentry;
- ``metrics``, ``metrics_log``, ``metrics_log_span``: the same inside
  ``sentry.reservation(...)`` as in ``bench_reservation.py``;
- ``sdk_span``: the OpenTelemetry SDK's own span start and end with the same four
  attributes, around the bare reservation (the floor the span mode cannot go under);
- ``sqlite_bare``, ``sqlalchemy``: one in-memory SQLite transaction of two statements,
  bare and with ``instrument_sqlalchemy(spans="off")``; reported per statement.

``--code DIR`` runs the modes on the ``instrumentation/`` of another checkout (a worktree of
an older commit, say), through a package path of its own, so before and after are counted
by the same harness. Run::

    python benchmarks/callgrind_reservation.py [--n 2000] [--code DIR] [--json FILE]

The report: instructions per reservation of each mode, and its overhead over ``bare``
(per statement over ``sqlite_bare`` for ``sqlalchemy``).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# The in-memory reservations are bench_reservation's: one definition of what is measured.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: The modes, in report order, with the mode each one's overhead is counted against.
MODES: dict[str, str | None] = {
    "bare": None,
    "metrics": "bare",
    "metrics_log": "bare",
    "metrics_log_span": "bare",
    "sdk_span": "bare",
    "sqlite_bare": None,
    "sqlalchemy": "sqlite_bare",
}
#: Modes whose op is a SQLite transaction of two statements: reported per statement.
PER_STATEMENT = frozenset({"sqlite_bare", "sqlalchemy"})
WARMUP = 300
#: Log lines are written to memory: the sink is emptied every so many ops, in every mode.
SINK_EVERY = 250
_TOTALS = re.compile(r"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


# --- the child: one mode, n reservations -----------------------------------------------------


def child(mode: str, n: int) -> dict[str, Any]:
    """Run ``mode`` ``WARMUP`` then ``n`` times; what it did, for the parent's checks."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from stocksentry import instrumentation
    from stocksentry.instrumentation import catalog
    from stocksentry.instrumentation.logs import configure_logging

    from benchmarks.bench_reservation import (
        INITIAL_STOCK,
        QTY,
        SKU,
        STRATEGY,
        DroppingSpanExporter,
        bare_memory,
        instrumented_memory,
        lite_cases,
        reservation_sentries,
    )

    sink = io.StringIO()
    configure_logging("INFO", stream=sink, json=True, bridge_stdlib=False)
    exporter = DroppingSpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    op: Callable[[], None]
    cleanup: Callable[[], None] = lambda: None  # noqa: E731 - replaced by the SQLite modes
    sentry = None
    if mode == "bare":
        op = bare_memory({SKU: INITIAL_STOCK})
    elif mode in ("metrics", "metrics_log", "metrics_log_span"):
        sentry = reservation_sentries(provider)[mode]
        op = instrumented_memory({SKU: INITIAL_STOCK}, sentry)
    elif mode == "sdk_span":
        tracer = provider.get_tracer("bench")
        inner = bare_memory({SKU: INITIAL_STOCK})

        def op() -> None:
            span = tracer.start_span(
                "stock.reserve",
                attributes={"stock.sku": SKU, "stock.strategy": STRATEGY, "stock.qty": QTY},
            )
            inner()
            span.set_attribute("stock.outcome", "success")
            span.end()

    elif mode in PER_STATEMENT:
        name = "bare" if mode == "sqlite_bare" else mode
        cases = lite_cases(provider)
        op = next(case.op for case in cases if case.name == name)

        def cleanup() -> None:
            for case in cases:
                case.engine.dispose()

    else:
        raise SystemExit(f"callgrind_reservation: unknown mode {mode!r}")

    def block(count: int) -> None:
        for i in range(count):
            op()
            if i % SINK_EVERY == 0:
                sink.seek(0)
                sink.truncate()

    block(WARMUP)
    provider.force_flush()
    gc.collect()
    written = traced = 0
    sink.seek(0)
    sink.truncate()
    for i in range(n):
        op()
        if i % SINK_EVERY == SINK_EVERY - 1:
            text = sink.getvalue()
            written += text.count("\n")
            traced += text.count('"trace_id": ')
            sink.seek(0)
            sink.truncate()
    text = sink.getvalue()
    written += text.count("\n")
    traced += text.count('"trace_id": ')
    provider.force_flush()
    provider.shutdown()
    cleanup()
    exemplars = 0
    if sentry is not None:
        exemplars = sum(
            1
            for metric in sentry.metrics.metric(catalog.RESERVATION_DURATION).collect()
            for sample in metric.samples
            if sample.exemplar is not None
        )
    return {
        "mode": mode,
        "n": n,
        "code": str(Path(next(iter(instrumentation.__path__))).resolve()),
        "log_lines": written,
        "traced_lines": traced,
        "spans": exporter.exported,
        "exemplars": exemplars,
    }


# --- the parent: every mode twice under callgrind ---------------------------------------------


def package_path(code: Path, into: Path) -> Path:
    """A directory holding ``stocksentry/{instrumentation,exporter}`` as links into ``code``."""
    package = into / "stocksentry"
    package.mkdir(parents=True)
    for part in ("instrumentation", "exporter"):
        (package / part).symlink_to(code / part, target_is_directory=True)
    return into


def count(mode: str, n: int, env: dict[str, str], out_dir: Path) -> tuple[int, dict[str, Any]]:
    """Total instructions of one child run and what the child says it did."""
    out_file = out_dir / f"callgrind.{mode}.{n}"
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out_file}",
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        mode,
        "--n",
        str(n),
    ]
    done = subprocess.run(  # noqa: S603 - valgrind from PATH on this very script
        command, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{mode} n={n}: exit {done.returncode}\n{done.stderr[-2000:]}")
    match = _TOTALS.search(out_file.read_text(encoding="utf-8", errors="replace"))
    if match is None:
        raise RuntimeError(f"{mode} n={n}: no totals in {out_file}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return int(match.group(1)), report


def check(report: dict[str, Any], mode: str, n: int, code: Path) -> None:
    """Fail unless the child ran the code asked for and did what its mode says."""
    if not Path(report["code"]).is_relative_to(code.resolve()):
        raise RuntimeError(f"{mode}: ran {report['code']}, not the code of {code}")
    lines = 2 * n if mode in ("metrics_log", "metrics_log_span") else 0
    spans = WARMUP + n if mode in ("metrics_log_span", "sdk_span") else 0
    if report["log_lines"] != lines or report["spans"] != spans:
        raise RuntimeError(f"{mode} n={n}: {report['log_lines']} lines, {report['spans']} spans")
    # Traced: every line carries the trace ids and the duration histogram an exemplar.
    traced = mode == "metrics_log_span"
    if report["traced_lines"] != (lines if traced else 0) or (report["exemplars"] > 0) != traced:
        raise RuntimeError(
            f"{mode} n={n}: {report['traced_lines']} traced lines, {report['exemplars']} exemplars"
        )


def parent(args: argparse.Namespace) -> int:
    if shutil.which("valgrind") is None:
        print("callgrind_reservation: valgrind is not installed", file=sys.stderr)
        return 2
    code = Path(args.code).resolve() if args.code else Path(__file__).resolve().parents[1]
    if not (code / "instrumentation" / "reservation.py").is_file():
        print(f"callgrind_reservation: {code} has no instrumentation/", file=sys.stderr)
        return 2
    modes = args.modes or list(MODES)
    with tempfile.TemporaryDirectory(prefix="stocksentry-callgrind-") as tmp:
        env = dict(os.environ, PYTHONHASHSEED="0")
        if args.code:
            shim = package_path(code, Path(tmp) / "path")
            env["PYTHONPATH"] = os.pathsep.join(
                [str(shim), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
        per_op: dict[str, float] = {}
        for mode in modes:
            base, report0 = count(mode, 0, env, Path(tmp))
            total, report = count(mode, args.n, env, Path(tmp))
            check(report0, mode, 0, code)
            check(report, mode, args.n, code)
            per_op[mode] = (total - base) / args.n
            print(
                f"# {mode}: {base} instructions with n=0, {total} with n={args.n}",
                file=sys.stderr,
            )
    result: dict[str, Any] = {"n": args.n, "code": str(code), "modes": {}}
    print(f"callgrind n={args.n} code={code} PYTHONHASHSEED=0")
    for mode in modes:
        against = MODES[mode]
        statements = 2 if mode in PER_STATEMENT else 1
        entry: dict[str, Any] = {"instructions_per_op": per_op[mode]}
        line = f"callgrind {mode} instr_per_reservation={per_op[mode]:.0f}"
        if against is not None and against in per_op:
            overhead = (per_op[mode] - per_op[against]) / statements
            entry["overhead_instructions"] = overhead
            entry["per"] = "statement" if statements == 2 else "reservation"
            line += f" overhead_instr={overhead:.0f} per={entry['per']} (over {against})"
        result["modes"][mode] = entry
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="reservations counted (2000)")
    parser.add_argument(
        "--code", metavar="DIR", help="a checkout whose instrumentation/ to count instead"
    )
    parser.add_argument("--modes", nargs="+", choices=list(MODES), help="a subset of the modes")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--child", metavar="MODE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.n < 1 and args.child is None:
        parser.error("--n must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.n)))
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
