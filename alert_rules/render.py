"""Render the alert rules from their source (``make generate``); ``--check`` exits 1 when stale.

Usage::

    python alert_rules/render.py                 # writes alert_rules/stocksentry.rules.yml
    python alert_rules/render.py --check         # exit 1 if that file is stale
    python alert_rules/render.py --location-labels region,cluster,namespace \\
        --runbook-url-base https://git.shop.example/sre/runbooks \\
        --dashboard-url-base https://grafana.shop.example -o my.rules.yml

``alert_rules/source/stocksentry.rules.yml`` is the file rule authors edit. It holds five
placeholders, replaced as plain text (the Helm chart replaces the same five the same way,
from its values, in ``templates/prometheusrule.yaml``):

``$location``
    in expressions: the location labels joined by ", " (default ``cluster, namespace``).
    Every aggregation and every join of the shop's series keeps them:
    ``sum by ($location, sku) (...)``, ``and on($location)``,
    ``on($location, instance, job)``. Joins with the label-less settings
    (``> on() group_left() stocksentry:threshold:...``) stay ``on()``.
``$where``
    in annotations, at the end of a summary: `` in cluster a, namespace shop``, from the
    alert's labels, else from Prometheus's external labels; a label neither has is left
    out (`` in namespace shop``), and with none of them the summary says nothing more.
``$job``
    the scrape job of the exporter: ``up{job="$job"}`` (default ``stocksentry``).
``$runbook_base``
    ``runbook_url: $runbook_base/<Alert>.md``.
``$dashboard_base``
    ``dashboard_url: $dashboard_base/d/<uid>...``; when the base is empty (the default:
    no Grafana address is known) every ``dashboard_url`` annotation is left out.

The rendered file is committed; ``tests/integration/test_helm.py`` checks it is fresh and
that the chart renders the same rules from the same settings.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

RULES_DIR = Path(__file__).resolve().parent
SOURCE = RULES_DIR / "source" / "stocksentry.rules.yml"
OUTPUT = RULES_DIR / "stocksentry.rules.yml"

#: The labels that say where a series comes from, kept by every aggregation.
DEFAULT_LOCATION_LABELS: tuple[str, ...] = ("cluster", "namespace")
DEFAULT_JOB = "stocksentry"
#: The runbook base of the committed reference rendering (and the marker the chart
#: replaces in the dashboards): rules of one's own give ``--runbook-url-base``.
DEFAULT_RUNBOOK_BASE = "https://github.com/stocksentry/stocksentry/blob/main/docs/runbooks"
DEFAULT_DASHBOARD_BASE = ""

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: Labels the rules group by or join on themselves; a location label may not repeat one.
RESERVED_LABELS = frozenset({"instance", "job", "le", "sku", "table", "lock", "cache"})
PLACEHOLDERS = ("$location", "$where", "$job", "$runbook_base", "$dashboard_base")
_DASHBOARD_LINE = re.compile(r"^[ \t]*dashboard_url: \$dashboard_base.*\n", re.MULTILINE)


@dataclass(frozen=True)
class Options:
    """What a rendering fills in; the defaults give the committed file."""

    location_labels: tuple[str, ...] = DEFAULT_LOCATION_LABELS
    job: str = DEFAULT_JOB
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    dashboard_base: str = DEFAULT_DASHBOARD_BASE

    def __post_init__(self) -> None:
        labels = self.location_labels
        if not labels:
            raise ValueError("location labels: give at least one (default: cluster,namespace)")
        for label in labels:
            if not LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"location labels: {label!r} is not a Prometheus label name")
            if label in RESERVED_LABELS:
                raise ValueError(f"location labels: {label!r} is a label the rules use already")
        if len(set(labels)) != len(labels):
            raise ValueError(f"location labels: {','.join(labels)} repeats a label")
        if not self.job or '"' in self.job or "\\" in self.job:
            raise ValueError(f"job: {self.job!r} must be non-empty, without quotes or backslashes")
        for name, base in (("runbook", self.runbook_base), ("dashboard", self.dashboard_base)):
            if base and not re.match(r'^https?://[^\s"\\]+$', base):
                raise ValueError(f"{name} URL base: {base!r} is not an http(s) URL")
        if not self.runbook_base:
            raise ValueError("runbook URL base: must not be empty")


def where(labels: Sequence[str]) -> str:
    """The summary suffix naming the alert's location, as a Prometheus template."""
    parts = ['{{ $locsep := " in " }}']
    for label in labels:
        parts.append(
            f"{{{{ with or $labels.{label} $externalLabels.{label} }}}}"
            f'{{{{ $locsep }}}}{label} {{{{ . }}}}{{{{ $locsep = ", " }}}}{{{{ end }}}}'
        )
    return "".join(parts)


def render(source: str, options: Options) -> str:
    """The rules file ``source`` with its placeholders filled in from ``options``."""
    text = source
    if not options.dashboard_base:
        text = _DASHBOARD_LINE.sub("", text)
    text = (
        text.replace("$location", ", ".join(options.location_labels))
        .replace("$where", where(options.location_labels))
        .replace("$job", options.job)
        .replace("$runbook_base", options.runbook_base.rstrip("/"))
        .replace("$dashboard_base", options.dashboard_base.rstrip("/"))
    )
    yaml.safe_load(text)  # the result must still be YAML (raises with the line)
    return text


def main(argv: list[str] | None = None) -> int:
    """Render (or ``--check``) the rules; returns the exit status."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--location-labels",
        default=",".join(DEFAULT_LOCATION_LABELS),
        help="comma-separated labels every aggregation keeps (default: %(default)s)",
    )
    parser.add_argument("--job", default=DEFAULT_JOB, help="the exporter's scrape job")
    parser.add_argument(
        "--runbook-url-base",
        help="where your copy of docs/runbooks is published (runbook_url is <base>/<Alert>.md);"
        " required unless writing the committed reference file",
    )
    parser.add_argument(
        "--dashboard-url-base",
        default=DEFAULT_DASHBOARD_BASE,
        help="Grafana's address, e.g. https://grafana.shop.example; empty: no dashboard_url",
    )
    parser.add_argument("-o", "--output", default=str(OUTPUT), help="a file, or - for stdout")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output is stale")
    args = parser.parse_args(argv)
    try:
        options = Options(
            location_labels=tuple(x.strip() for x in args.location_labels.split(",") if x.strip()),
            job=args.job,
            runbook_base=args.runbook_url_base or DEFAULT_RUNBOOK_BASE,
            dashboard_base=args.dashboard_url_base,
        )
    except ValueError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    if args.runbook_url_base is None and Path(args.output).resolve() != OUTPUT:
        # Rules of one's own must link runbooks that exist: this project publishes none
        # at a fixed address, so the user says where their copy lives.
        print(
            "render: --runbook-url-base is required: the address where your copy of"
            " docs/runbooks is published (runbook_url is <base>/<Alert>.md)",
            file=sys.stderr,
        )
        return 2
    text = render(SOURCE.read_text(encoding="utf-8"), options)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    output = Path(args.output)
    current = output.read_text(encoding="utf-8") if output.is_file() else None
    if args.check:
        if current != text:
            print(f"alert_rules: stale, run `python alert_rules/render.py`: {output}")
            return 1
        return 0
    if current != text:
        output.write_text(text, encoding="utf-8")
        print(f"alert_rules: wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
