"""Generate the Helm chart's derived files (``make generate``).

Usage::

    python helm/sync.py            # writes the files below
    python helm/sync.py --check    # exit 1 if one is stale, missing or extra

Helm reads only files inside the chart directory, so the chart carries copies of
``alert_rules/source/stocksentry.rules.yml`` (the rules with their placeholders, which
``templates/_rules.tpl`` fills in from values) and ``dashboards/*.json``
(the dashboard ConfigMaps) under ``helm/stocksentry/files/``, byte for byte equal to
their sources. ``helm/stocksentry/values.schema.json`` is built from the exporter's
config model by ``helm/values_schema.py``. All of them are committed;
``tests/integration/test_helm.py`` fails when one is stale. Files under
``files/dashboards/`` that no source dashboard matches are removed (that folder holds
copies only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "stocksentry"
CHART_FILES = CHART / "files"
DASHBOARD_COPIES = CHART_FILES / "dashboards"
SCHEMA_FILE = CHART / "values.schema.json"

sys.path.insert(0, str(Path(__file__).resolve().parent))
from values_schema import values_schema  # noqa: E402 - needs the path above


def artefacts() -> dict[Path, bytes]:
    """Every generated file of the chart and the bytes it must hold."""
    files = {
        CHART_FILES / "stocksentry.rules.yml": (
            ROOT / "alert_rules" / "source" / "stocksentry.rules.yml"
        ).read_bytes()
    }
    for source in sorted((ROOT / "dashboards").glob("*.json")):
        files[DASHBOARD_COPIES / source.name] = source.read_bytes()
    files[SCHEMA_FILE] = (json.dumps(values_schema(), indent=2) + "\n").encode()
    return files


def stale(files: dict[Path, bytes]) -> list[Path]:
    """Files that differ or are missing, then dashboard copies without a source."""
    wrong = [path for path, data in files.items() if not _holds(path, data)]
    extra = sorted(set(DASHBOARD_COPIES.glob("*")) - set(files))
    return wrong + extra


def _holds(path: Path, data: bytes) -> bool:
    return path.is_file() and path.read_bytes() == data


def main(argv: list[str] | None = None) -> int:
    """Sync (or ``--check``) the chart's copies; returns the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a copy is stale")
    args = parser.parse_args(argv)
    files = artefacts()
    out_of_date = stale(files)
    if args.check:
        if out_of_date:
            names = ", ".join(str(p.relative_to(ROOT)) for p in out_of_date)
            print(f"helm: stale chart files, run `python helm/sync.py`: {names}")
            return 1
        return 0
    DASHBOARD_COPIES.mkdir(parents=True, exist_ok=True)
    for path in out_of_date:
        if path in files:
            path.write_bytes(files[path])
            print(f"helm: wrote {path.relative_to(ROOT)}")
        else:
            path.unlink()
            print(f"helm: removed {path.relative_to(ROOT)} (no source)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
