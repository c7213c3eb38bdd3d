"""A sentry whose metrics backend breaks on one counter: :func:`failing`, for the tests of
failures inside the instrumentation (unit and integration alike)."""

from __future__ import annotations

from typing import Any

import pytest
from stocksentry.instrumentation import MetricSpec, Sentry


def failing(sentry: Sentry, monkeypatch: pytest.MonkeyPatch, spec: MetricSpec) -> None:
    """Make ``sentry``'s counter ``spec`` raise; the others (the errors' own) keep working."""
    count = sentry.metrics.count

    def broken(which: MetricSpec, *labels: str, **kwargs: Any) -> None:
        if which == spec:
            raise RuntimeError("metrics backend on fire")
        count(which, *labels, **kwargs)

    monkeypatch.setattr(sentry.metrics, "count", broken)
