"""A strict, bounded reader of the Prometheus text exposition format (and OpenMetrics text).

Only what the conformance check needs: each ``# TYPE`` declaration and every sample's
name and labels, with their line numbers, kept exactly as exposed (prometheus_client's
parser renames a counter ``x`` to ``x_total``, which would hide a misnamed metric).

Example::

    >>> e = parse('# TYPE stock_orders_paid_total counter\\nstock_orders_paid_total{sku="A"} 3')
    >>> e.types, [(s.name, s.labels) for s in e.samples]
    ({'stock_orders_paid_total': 'counter'}, [('stock_orders_paid_total', {'sku': 'A'})])
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final

_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TYPES: Final = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset",
     "gaugehistogram"}
)  # fmt: skip
_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}


class ExpositionError(ValueError):
    """The text is not a valid exposition; the message names the line."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    line: int


@dataclass(slots=True)
class Exposition:
    #: Family name -> declared type.
    types: dict[str, str] = field(default_factory=dict)
    #: Family name -> line of its ``# TYPE``.
    type_lines: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)


def parse(text: str, *, max_samples: int = 200_000) -> Exposition:
    """Parse ``text``; :class:`ExpositionError` names the first bad line."""
    exposition = Exposition()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "TYPE":
                if len(parts) < 4 or not _NAME.fullmatch(parts[2]):
                    raise ExpositionError(f"line {number}: malformed # TYPE line")
                kind = parts[3].strip().lower()
                if kind not in _TYPES:
                    raise ExpositionError(f"line {number}: unknown metric type {parts[3]!r}")
                if parts[2] in exposition.types:
                    raise ExpositionError(f"line {number}: second # TYPE for {parts[2]}")
                exposition.types[parts[2]] = kind
                exposition.type_lines[parts[2]] = number
            continue
        if len(exposition.samples) >= max_samples:
            raise ExpositionError(f"more than {max_samples} samples")
        exposition.samples.append(_sample(line, number))
    return exposition


def _sample(line: str, number: int) -> Sample:
    match = _NAME.match(line)
    if match is None:
        raise ExpositionError(f"line {number}: expected a metric name")
    name, pos = match.group(), match.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos = _labels(line, pos + 1, labels, number)
    # An OpenMetrics exemplar (`<value> [<timestamp>] # {trace_id="..."} 0.5`) follows the
    # value: not part of the sample, and its labels may hold spaces.
    rest = line[pos:].partition(" # ")[0].split()
    if not rest or len(rest) > 3:
        raise ExpositionError(f"line {number}: expected a value after {name}")
    try:
        value = float(rest[0])
    except ValueError:
        raise ExpositionError(f"line {number}: {rest[0][:40]!r} is not a number") from None
    if math.isnan(value) and rest[0].lower() not in ("nan",):
        raise ExpositionError(f"line {number}: {rest[0][:40]!r} is not a number")
    return Sample(name, labels, value, number)


def _labels(line: str, pos: int, labels: dict[str, str], number: int) -> int:
    while True:
        while pos < len(line) and line[pos] == " ":
            pos += 1
        if pos < len(line) and line[pos] == "}":
            return pos + 1
        match = _LABEL_NAME.match(line, pos)
        if match is None or line[match.end() : match.end() + 2] != '="':
            raise ExpositionError(f"line {number}: malformed label at column {pos + 1}")
        label, pos = match.group(), match.end() + 2
        value: list[str] = []
        while True:
            if pos >= len(line):
                raise ExpositionError(f"line {number}: unterminated label value of {label}")
            char = line[pos]
            if char == "\\":
                escaped = _ESCAPES.get(line[pos + 1 : pos + 2])
                if escaped is None:
                    raise ExpositionError(f"line {number}: bad escape in label {label}")
                value.append(escaped)
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                value.append(char)
                pos += 1
        if label in labels:
            raise ExpositionError(f"line {number}: label {label} given twice")
        labels[label] = "".join(value)
        if pos < len(line) and line[pos] == ",":
            pos += 1
        elif pos < len(line) and line[pos] == "}":
            return pos + 1
        else:
            raise ExpositionError(f"line {number}: expected , or }} after label {label}")
