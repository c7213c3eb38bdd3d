"""``helm lint`` and ``helm template`` without a helm binary, through the Helm v4 SDK.

The machines this project builds on have no helm binary (no registry they reach packages
one for Linux); ``helm/install-helm.sh`` installs helm-python-sdk, Helm's Go SDK with
Python bindings, into the venv. This wrapper gives it the two commands a chart author
needs, with helm's flags and exit status:

    .venv/bin/python helm/helmsdk.py lint --strict helm/stocksentry \
        -f helm/stocksentry/ci/sidecar-values.yaml
    .venv/bin/python helm/helmsdk.py template demo helm/stocksentry --namespace shop \
        --set-json 'serviceMonitor={"enabled":true}'

With a real helm at hand, use it instead: the chart is plain Helm (3.7 or later, or 4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

try:
    import helm_python
except ImportError:  # pragma: no cover - said once, plainly
    sys.exit("helmsdk: helm-python-sdk is not installed; run `bash helm/install-helm.sh`")

SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base`` (maps merge, the rest replaces)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def user_values(files: list[str], set_json: list[str]) -> dict[str, Any]:
    """Values from ``-f`` files, then ``--set-json key.path=JSON`` pairs, in order."""
    values: dict[str, Any] = {}
    for name in files:
        loaded = yaml.safe_load(Path(name).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            sys.exit(f"helmsdk: {name}: a values file must be a mapping")
        values = merge(values, loaded)
    for pair in set_json:
        path, sep, raw = pair.partition("=")
        if not sep:
            sys.exit(f"helmsdk: --set-json {pair!r}: expected key.path=JSON")
        leaf: Any = json.loads(raw)
        for key in reversed(path.split(".")):
            leaf = {key: leaf}
        values = merge(values, leaf)
    return values


def lint(args: argparse.Namespace) -> int:
    """Print helm lint's findings; 1 on errors (or warnings with --strict)."""
    values = user_values(args.values, args.set_json)
    report = helm_python.lint(args.chart, values, strict=args.strict, namespace=args.namespace)
    for message in report["messages"]:
        severity = SEVERITY.get(message["severity"], "UNKNOWN")
        print(f"[{severity}] {message['path']}: {message['error'].strip()}")
    worst = max((m["severity"] for m in report["messages"]), default=0)
    failed = bool(report["errors"]) or worst >= (2 if args.strict else 3)
    print(f"{report['total_charts_linted']} chart(s) linted, {'failed' if failed else 'ok'}")
    return 1 if failed else 0


def template(args: argparse.Namespace) -> int:
    """Print the rendered manifests, like helm template."""
    values = user_values(args.values, args.set_json)
    try:
        with helm_python.Chart.load(args.chart) as chart:
            rendered = chart.render(values, name=args.name, namespace=args.namespace)
    except helm_python.HelmError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt") or not text.strip():
            continue
        print(f"---\n# Source: {path}\n{text.strip()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``lint`` or ``template``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="helmsdk", description=(__doc__ or "").splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lint_parser = commands.add_parser("lint", help="helm lint")
    lint_parser.add_argument("chart")
    lint_parser.add_argument("--strict", action="store_true", help="fail on warnings too")
    template_parser = commands.add_parser("template", help="helm template")
    template_parser.add_argument("name", help="release name")
    template_parser.add_argument("chart")
    for sub in (lint_parser, template_parser):
        sub.add_argument("-f", "--values", action="append", default=[], metavar="FILE")
        sub.add_argument("--set-json", action="append", default=[], metavar="KEY=JSON")
        sub.add_argument("-n", "--namespace", default="default")
    lint_parser.set_defaults(handler=lint)
    template_parser.set_defaults(handler=template)
    args = parser.parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
