"""The ``stocksentry`` command line as the end-to-end tests run it: the lab's ``demo`` and
the exporter's config file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "stocksentry.exporter"]

#: The schema section most tests map: the allocation is ``products.initial_stock``.
ALLOCATION = "  products:\n    allocation: initial_stock\n"


def run_cli(
    *argv: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``stocksentry *argv``, run to its end, its output captured as text."""
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, env=env, timeout=timeout)


def run_demo(*options: str) -> subprocess.CompletedProcess[str]:
    """``stocksentry demo *options --quiet --format json``, which must succeed."""
    done = run_cli("demo", *options, "--quiet", "--format", "json", timeout=300)
    assert done.returncode == 0, done.stderr
    return done


def write_exporter_config(
    tmp_path: Path, port: int, schema: str = ALLOCATION, more: str = ""
) -> Path:
    """An exporter config serving on 127.0.0.1:``port``, the database's URL in
    ``STOCKSENTRY_DATABASE_URL``, ``schema`` (indented YAML) as its schema section, the
    probes every 500 ms, and the sections of ``more`` (YAML)."""
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f"""
server:
  listen_address: 127.0.0.1
  port: {port}
database:
  url_env: STOCKSENTRY_DATABASE_URL
  leader_election: false
schema:
{schema}
probes:
  defaults:
    interval: 500ms
    timeout: 2s
"""
        + more,
        encoding="utf-8",
    )
    return config
