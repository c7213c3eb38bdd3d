"""The built wheel, installed into a fresh venv, imports: no hiding behind the editable install."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import stocksentry.instrumentation as inst
import stocksentry.exporter as exp
assert "site-packages" in inst.__file__, inst.__file__
assert "site-packages" in exp.__file__, exp.__file__
heavy = sorted(
    m for m in sys.modules
    if m.split(".")[0] in {"aiohttp", "sqlalchemy", "redis", "yaml", "psycopg"}
    or m.startswith("opentelemetry.sdk")
)
print("heavy:", heavy)
assert not heavy, heavy
from stocksentry.instrumentation import Sentry
from prometheus_client import CollectorRegistry
r = CollectorRegistry()
with Sentry(registry=r, log=False).reservation("EGG-01") as h:
    h.success(old_stock=1, new_stock=0)
assert r.get_sample_value(
    "stock_reservation_success_total", {"sku": "EGG-01", "strategy": "default"}
) == 1.0
print("ok")
"""


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_wheel_installs_and_imports_with_core_dependencies_only(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", dist, ROOT)
    (wheel,) = dist.glob("stocksentry-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "stocksentry/instrumentation/__init__.py" in names
    assert "stocksentry/instrumentation/catalog.py" in names
    assert "stocksentry/instrumentation/py.typed" in names
    assert "stocksentry/exporter/__init__.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "instrumentation/")) for n in names)
    # Every tracked source file ships, subpackages included (the package list is explicit).
    sources = [
        p.relative_to(ROOT).as_posix()
        for folder in ("instrumentation", "exporter")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".yaml", ".typed") and "__pycache__" not in p.parts
    ]
    assert sources
    missing = [p for p in sources if f"stocksentry/{p}" not in names]
    assert not missing, f"not in the wheel: {missing}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert (
        "stocksentry = stocksentry.exporter.cli:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)
    # Run from a folder without the source tree, so only the installed wheel can answer.
    out = run(python, "-c", CHECK, cwd=tmp_path)
    assert out.splitlines()[-1] == "ok"
    assert (env_dir / "bin" / "stocksentry").exists()
