"""Stopping the servers the tests start (Prometheus, Redis, the lab, the exporter…)."""

from __future__ import annotations

import subprocess
from typing import Any


def stop(process: subprocess.Popen[Any] | None, timeout: float = 10) -> None:
    """Terminate ``process`` if it still runs, and kill it if it is not gone in ``timeout``
    seconds."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
