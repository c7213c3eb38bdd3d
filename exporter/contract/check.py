"""The conformance check: an app's exposition against the metric contract (the kinds of
problem: docs/other-languages.md).

Example::

    >>> from stocksentry.exporter.contract.exposition import parse
    >>> text = "# TYPE stock_orders_paid counter\\nstock_orders_paid 1\\n"
    >>> [p.message for p in check(parse(text)) if p.metric == "stock_orders_paid_total"]
    ['sample stock_orders_paid (line 2) lacks _total', 'lacks label(s) sku']
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from .exposition import Exposition, Sample
from .spec import LABEL_CHARSET, LABEL_MAX_LENGTH, contract

Kind = Literal["missing", "misnamed", "mistyped", "unbounded"]
_SUFFIXES: Final = ("_bucket", "_sum", "_count", "_total", "_created", "_info")
_SAFE: Final = re.compile(f"{LABEL_CHARSET}{{1,{LABEL_MAX_LENGTH}}}")
_OURS: Final = ("stock_", "stocksentry_")
#: Label values quoted in one message at most.
_SHOWN: Final = 3


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: its kind, the contract metric (or exposed name) and what is wrong."""

    kind: Kind
    metric: str
    message: str


def _families(exposition: Exposition) -> dict[str, tuple[str, list[Sample]]]:
    """Exposed family name -> (declared type, its samples)."""
    families: dict[str, tuple[str, list[Sample]]] = {
        name: (kind, []) for name, kind in exposition.types.items()
    }
    for sample in exposition.samples:
        name = sample.name
        if name not in families:
            bases = (name.removesuffix(s) for s in _SUFFIXES if name.endswith(s))
            name = next((base for base in bases if base in exposition.types), name)
        families.setdefault(name, ("untyped", []))[1].append(sample)
    # prometheus_client (and OpenMetrics) add a `<name>_created` gauge beside each counter
    # and histogram: part of the family, not a metric of its own.
    for name in [n for n in families if n.endswith("_created")]:
        base = name.removesuffix("_created")
        if base in exposition.types or f"{base}_total" in exposition.types:
            del families[name]
    return families


def _normal(name: str) -> str:
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    return snake.removesuffix("_total")


def _find(metric: dict[str, Any], families: dict[str, tuple[str, list[Sample]]]) -> str | None:
    name: str = metric["name"]
    if name in families:
        return name
    # OpenMetrics declares a counter without its _total suffix.
    if metric["type"] == "counter" and name.endswith("_total"):
        base = name.removesuffix("_total")
        if families.get(base, ("", []))[0] == "counter":
            return base
    return None


def exposed_metrics(exposition: Exposition) -> list[str]:
    """The contract metrics ``exposition`` exposes under their own names."""
    families = _families(exposition)
    return [m["name"] for m in contract()["metrics"] if _find(m, families) is not None]


def check(
    exposition: Exposition,
    *,
    require: Iterable[str] = (),
    max_values: int | None = None,
) -> list[Problem]:
    """Every problem of ``exposition`` against the contract, in contract order."""
    spec = contract()
    required = set(require)
    known = {m["name"] for m in spec["metrics"]}
    unknown_required = required - known
    if unknown_required:
        raise ValueError(
            f"--require: not a contract metric: {', '.join(sorted(unknown_required))}"
        )
    families = _families(exposition)
    claimed: set[str] = set()
    problems: list[Problem] = []
    metrics: list[dict[str, Any]] = spec["metrics"]
    catalog_bases = {_normal(m["name"]) for m in metrics}
    for metric in metrics:
        name = metric["name"]
        found = _find(metric, families)
        if found is None:
            candidates = [
                f
                for f in families
                if f not in claimed
                and f not in known
                and _normal(f) not in catalog_bases - {_normal(name)}
            ]
            found = _close(name, candidates)
            if found is None:
                if metric["required"] or name in required:
                    problems.append(Problem("missing", name, "required, not exposed"))
                continue
            problems.append(
                Problem("misnamed", name, f"exposed as {found}; the contract names it {name}")
            )
        claimed.add(found)
        kind, samples = families[found]
        problems.extend(
            Problem(what, name, message)
            for what, message in _check_metric(metric, found, kind, samples, max_values)
        )
    for family, (_, samples) in families.items():
        if family in claimed or not family.startswith(_OURS):
            continue
        line = samples[0].line if samples else exposition.type_lines.get(family, 0)
        problems.append(Problem("misnamed", family, f"not a contract metric (line {line})"))
    return problems


def _close(name: str, candidates: list[str]) -> str | None:
    target = _normal(name)
    by_normal = {_normal(c): c for c in candidates}
    if target in by_normal:
        return by_normal[target]
    match = difflib.get_close_matches(target, list(by_normal), n=1, cutoff=0.85)
    return by_normal[match[0]] if match else None


def _check_metric(
    metric: dict[str, Any],
    found: str,
    kind: str,
    samples: list[Sample],
    max_values: int | None,
) -> Iterator[tuple[Kind, str]]:
    """The problems of one exposed family, as (kind, message) pairs."""
    if kind != metric["type"]:
        yield "mistyped", f"declared {kind}; the contract type is {metric['type']}"
    if metric["type"] == "counter":
        bare = [s for s in samples if s.name == found and not s.name.endswith("_total")]
        if bare:
            yield "misnamed", f"sample {bare[0].name} (line {bare[0].line}) lacks _total"
    spec_labels = [label["name"] for label in metric["labels"]]
    values: dict[str, set[str]] = defaultdict(set)
    les: set[str] = set()
    for sample in samples:
        for label, value in sample.labels.items():
            if label == "le":
                les.add(value)
            elif label != "quantile":
                values[label].add(value)
    extra = sorted(set(values) - set(spec_labels))
    if extra:
        yield (
            "misnamed",
            f"label(s) {', '.join(extra)} not in the contract (labels: "
            f"{', '.join(spec_labels) or 'none'})",
        )
    lacking = [label for label in spec_labels if label not in values]
    if samples and lacking:
        yield "misnamed", f"lacks label(s) {', '.join(lacking)}"
    if metric["type"] == "histogram" and kind == "histogram" and les:
        expected = {_le(str(bound)) for bound in metric["buckets"]} | {"+Inf"}
        if {_le(value) for value in les} != expected:
            shown = ", ".join(sorted(expected - {"+Inf"}, key=float))
            yield "mistyped", f"buckets differ from the contract's ({shown})"
    for label in metric["labels"]:
        yield from _check_values(label, values.get(label["name"], set()), max_values)


def _check_values(
    label: dict[str, Any], values: set[str], max_values: int | None
) -> Iterator[tuple[Kind, str]]:
    name = label["name"]
    allowed = label.get("allowed")
    if allowed is not None:
        outside = sorted(values - set(allowed))
        if outside:
            yield "unbounded", f"{name}={_show(outside)} not one of {', '.join(allowed)}"
        return
    bound = max_values if max_values is not None else int(label["max_values"])
    if len(values) > bound:
        yield (
            "unbounded",
            f"{len(values)} distinct {name} values, more than {bound} (fold the rest into "
            "__other__)",
        )
    unsafe = sorted(v for v in values if not _SAFE.fullmatch(v))
    if unsafe:
        yield (
            "unbounded",
            f"{name}={_show(unsafe)} not a guarded value (at most {LABEL_MAX_LENGTH} "
            f"characters of {LABEL_CHARSET})",
        )


def _show(values: list[str]) -> str:
    shown = ", ".join(repr(v[:40]) for v in values[:_SHOWN])
    return shown + (f" and {len(values) - _SHOWN} more" if len(values) > _SHOWN else "")


def _le(value: str) -> str:
    if value in ("+Inf", "Inf", "inf", "+inf"):
        return "+Inf"
    try:
        return repr(float(value))
    except ValueError:
        return value
