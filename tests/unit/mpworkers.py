"""Real worker processes writing a prometheus_client multiprocess directory (test helper).

Each worker runs ``script`` with ``PROMETHEUS_MULTIPROC_DIR`` set in its environment only,
its arguments being ``k``, ``stay``/``exit`` and the gauge modes, and prints ``ready``
once it has written; ``stay`` ones then block until closed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

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
