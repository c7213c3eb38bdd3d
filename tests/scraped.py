"""Reading collected metric families in tests (a test helper)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric


def value(families: Iterable[Metric], name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` with exactly ``labels``; ``None`` when absent."""
    for family in families:
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None
