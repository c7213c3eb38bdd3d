"""Write the dashboards' JSON (``make generate``); ``--check`` exits 1 when one is stale.

Usage::

    python dashboards/build.py            # writes dashboards/<uid>.json
    python dashboards/build.py --check    # exit 1 if a committed file differs or is extra
    python dashboards/build.py --location-labels region,cluster,namespace \\
        --runbook-url-base https://git.shop.example/sre/runbooks --output-dir my-dashboards
    python dashboards/build.py --single-cluster --output-dir my-dashboards

``--location-labels`` (default ``cluster,namespace``, as the alert rules): the labels
every aggregation keeps and every selector matches against a dashboard variable of that
name. ``--single-cluster``: the ``cluster`` variable hidden, at All (one Prometheus per
cluster), as kubernetes-mixin's ``showMultiCluster: false``. ``--runbook-url-base``:
where the panels' runbook links point (``<base>/<Alert>.md``); the Helm chart replaces
the default base with its ``links.runbookBaseUrl``.

The JSON is what Grafana provisioning and the Helm chart's ConfigMap load; it is
committed, and ``tests/unit/test_dashboards.py`` fails when it is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: make the repository root importable so `dashboards` is a package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards import exporter, overview, panels, promql, sku, variables

#: Where the JSON goes: beside the builder code.
OUT_DIR = Path(__file__).resolve().parent

#: Every dashboard, by file name; the file name is the dashboard's uid.
BUILDERS: dict[str, Callable[[], Dashboard]] = {
    "stocksentry-overview.json": overview.build,
    "stocksentry-sku.json": sku.build,
    "stocksentry-exporter.json": exporter.build,
}


def render(dashboard: Dashboard) -> str:
    """The dashboard as stable JSON text: sorted keys, two-space indent, final newline."""
    return json.dumps(dashboard, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def artefacts(out_dir: Path | None = None) -> dict[Path, str]:
    """Every dashboard file and the text it must hold (in ``out_dir``, default OUT_DIR)."""
    folder = OUT_DIR if out_dir is None else out_dir
    return {folder / name: render(build()) for name, build in BUILDERS.items()}


def stale(expected: dict[Path, str]) -> list[Path]:
    """Files that differ from ``expected``, are missing, or are JSON no builder makes."""
    wrong = [path for path, text in expected.items() if not _holds(path, text)]
    extra = sorted(set(OUT_DIR.glob("*.json")) - set(expected))
    return wrong + extra


def _holds(path: Path, text: str) -> bool:
    return path.exists() and path.read_text(encoding="utf-8") == text


def main(argv: list[str] | None = None) -> int:
    """Build (or ``--check``) the dashboards; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    parser.add_argument(
        "--location-labels",
        default=",".join(promql.LOCATION_LABELS),
        help="comma-separated labels every aggregation keeps (default: %(default)s)",
    )
    parser.add_argument(
        "--runbook-url-base",
        default=panels.DEFAULT_RUNBOOK_BASE,
        help="where runbook links point, <base>/<Alert>.md (default: %(default)s)",
    )
    parser.add_argument(
        "--single-cluster",
        action="store_true",
        help="hide the cluster variable (a Prometheus that sees one cluster)",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="write the JSON there instead of dashboards/ (for non-default options)",
    )
    args = parser.parse_args(argv)
    labels = [x.strip() for x in args.location_labels.split(",") if x.strip()]
    custom = (
        labels != list(promql.LOCATION_LABELS)
        or args.runbook_url_base.rstrip("/") != panels.DEFAULT_RUNBOOK_BASE.rstrip("/")
        or args.single_cluster
    )
    try:
        promql.set_location_labels(labels)
        panels.set_runbook_base(args.runbook_url_base)
        variables.set_single_cluster(args.single_cluster)
    except ValueError as exc:
        print(f"dashboards: {exc}", file=sys.stderr)
        return 2
    if args.output_dir is not None:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for path, text in artefacts(args.output_dir).items():
            path.write_text(text, encoding="utf-8")
            print(f"dashboards: wrote {path}")
        return 0
    if custom:
        print("dashboards: non-default options need --output-dir", file=sys.stderr)
        return 2
    expected = artefacts()
    if args.check:
        out_of_date = stale(expected)
        if out_of_date:
            names = ", ".join(str(p.relative_to(OUT_DIR.parent)) for p in out_of_date)
            print(f"dashboards: stale, run `python dashboards/build.py`: {names}")
            return 1
        return 0
    for path, text in expected.items():
        if not _holds(path, text):
            path.write_text(text, encoding="utf-8")
            print(f"dashboards: wrote {path.relative_to(OUT_DIR.parent)}")
    for path in sorted(set(OUT_DIR.glob("*.json")) - set(expected)):
        # Never delete what might be someone's work; say so instead.
        print(f"dashboards: {path.relative_to(OUT_DIR.parent)} is built by nothing; remove it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
