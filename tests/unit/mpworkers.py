"""Real worker processes writing a prometheus_client multiprocess directory (test helper).

Each worker runs ``script`` with ``PROMETHEUS_MULTIPROC_DIR`` set in its environment only,
its arguments being ``k``, ``stay``/``exit`` and the gauge modes, and prints ``ready``
once it has written; ``stay`` ones then block until closed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.metrics_core import Metric

#: Every multiprocess mode of prometheus_client's Gauge: the workers write one gauge each.
MODES = (
    "all",
    "liveall",
    "min",
    "livemin",
    "max",
    "livemax",
    "sum",
    "livesum",
    "mostrecent",
    "livemostrecent",
)

#: (family, type, help, sample, labels, value): one sample of a scrape, sortable.
Row = tuple[str, str, str, str, tuple[tuple[str, str], ...], float]


def rows(families: Iterable[Metric]) -> list[Row]:
    """Every app sample as a sortable row (our own health series left out)."""
    return sorted(
        (f.name, f.type, f.documentation, s.name, tuple(sorted(s.labels.items())), s.value)
        for f in families
        if not f.name.startswith("stocksentry_")
        for s in f.samples
    )


def worker_script(*, exemplars: bool = False) -> str:
    """A worker writing a counter, a histogram (with exemplars through stocksentry's
    ``ExemplarHistogram`` when ``exemplars``), a summary and one gauge per mode, for the
    SKUs A, B and C, with values derived from its ``k``."""
    histogram = "ExemplarHistogram" if exemplars else "Histogram"
    observe = (
        'latency.labels(sku).observe(0.125 * n, {"trace_id": f"{k:016x}{j:08x}{n:08x}", '
        '"span_id": "0" * 16})'
        if exemplars
        else "latency.labels(sku).observe(0.125 * n)"
    )
    return textwrap.dedent(
        f"""
        import sys
        from prometheus_client import Counter, Gauge, Histogram, Summary
        from stocksentry.instrumentation.mpexemplars import ExemplarHistogram

        k, stay = int(sys.argv[1]), sys.argv[2] == "stay"
        reserved = Counter("mp_reserved", "Reserved units.", ["sku"])
        latency = {histogram}(
            "mp_latency_seconds", "Latency.", ["sku"], buckets=(0.25, 0.5, 1.0)
        )
        batch = Summary("mp_batch_size", "Batch sizes.")
        gauges = {{
            mode: Gauge(f"mp_g_{{mode}}", f"Gauge {{mode}}.", ["sku"], multiprocess_mode=mode)
            for mode in sys.argv[3].split(",")
        }}
        for j, sku in enumerate(("A", "B", "C")):
            reserved.labels(sku).inc(k + 1 + j * 0.5)
            for n in range(k + j + 1):
                {observe}
            batch.observe(k + j)
            for gauge in gauges.values():
                gauge.labels(sku).set(10 * k + j)
        print("ready", flush=True)
        if stay:
            sys.stdin.read()
        """
    )


class Workers:
    """Worker processes writing one directory; ``stay`` ones block until closed."""

    def __init__(self, path: Path, script: str, modes: Sequence[str]) -> None:
        self.path = path
        self.script = script
        self.modes = modes
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, ks: Iterable[int], *, stay: bool = False) -> list[subprocess.Popen[str]]:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.path)}
        started = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    self.script,
                    str(k),
                    "stay" if stay else "exit",
                    ",".join(self.modes),
                ],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for k in ks
        ]
        for proc in started:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
        if not stay:
            assert [proc.wait(timeout=60) for proc in started] == [0] * len(started)
        self.procs.extend(started)
        return started

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)


@contextmanager
def workers_in(tmp_path: Path, *, exemplars: bool = False) -> Iterator[Workers]:
    """Workers on a new directory below ``tmp_path`` writing every gauge mode, closed at
    the end."""
    directory = tmp_path / "prom"
    directory.mkdir()
    pool = Workers(directory, worker_script(exemplars=exemplars), MODES)
    try:
        yield pool
    finally:
        pool.close()
