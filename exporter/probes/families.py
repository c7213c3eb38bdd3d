"""Rows in, metric families out: what the database probes and cache_drift share, so they
export the same series with the same bounds.

Example::

    rows = [("EGG-01", 38.0), ("EGG-02", 2.0)]
    families = negative_stock_families(2, 40.0, rows, top=10, guard=guard)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.catalog import OVERFLOW_VALUE
from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value

from ..durations import format_duration
from .base import LOGGER, family

#: Duplicate keys asked about per statement when naming their SKUs: a bound on the
#: statement's size. Keys beyond it are counted in the total but name no SKU.
MAX_SKU_KEYS: Final = 1000
#: Seconds between two "outbox stuck" lines while the events stay stuck.
OUTBOX_LOG_INTERVAL: Final = 60.0


def pinned_labels(promo_skus: Iterable[str], guard: LabelGuard) -> tuple[str, ...]:
    """The promo SKUs as label values (sanitised as the guard does), in order, once each."""
    return tuple(dict.fromkeys(sanitize_label_value(s, guard.max_length) for s in promo_skus))


def worst_sku_samples(
    rows: Iterable[tuple[object, object]],
    *,
    top: int,
    guard: LabelGuard,
    pinned: Sequence[str] = (),
    rest: float = 0.0,
) -> list[tuple[tuple[str], float]]:
    """Samples ``((sku,), value)``, sorted: the ``top`` SKUs of ``rows`` ``(sku, value)``
    with the highest value above 0, by name. The rest, the SKUs the guard folds and
    ``rest`` (counted, not fetched) are summed under ``__other__`` (when above 0). Every
    ``pinned`` label appears, at 0 if need be: a promo SKU's series exists before its
    first problem."""
    positive: list[tuple[str, float]] = []
    for sku, value in rows:
        number = float(value)  # type: ignore[arg-type]
        if number > 0:
            positive.append((str(sku), number))
    # Worst first; equal values by SKU, so the same rows always name the same SKUs.
    positive.sort(key=lambda item: (-item[1], item[0]))
    by_label: dict[str, float] = dict.fromkeys(pinned, 0.0)
    other = max(0.0, rest)
    for index, (sku, number) in enumerate(positive):
        label = guard(sku) if index < top else OVERFLOW_VALUE
        if label == OVERFLOW_VALUE:
            other += number
        else:
            by_label[label] = by_label.get(label, 0.0) + number
    if other > 0:
        by_label[OVERFLOW_VALUE] = by_label.get(OVERFLOW_VALUE, 0.0) + other
    return [((label,), value) for label, value in sorted(by_label.items())]


def negative_stock_families(
    skus: float,
    units: float,
    worst: Iterable[tuple[object, object]],
    *,
    top: int,
    guard: LabelGuard,
    pinned: Sequence[str] = (),
) -> tuple[Metric, ...]:
    """The negative-stock probe's families from the totals over every SKU below zero and
    rows ``(sku, stock)`` of at least the ``top`` lowest; units of SKUs not among the rows
    go under ``__other__``, so the per-SKU series add up to ``units``."""
    rows = [(sku, -float(stock)) for sku, stock in worst]  # type: ignore[arg-type]
    listed = sum(u for _, u in rows if u > 0)
    # What the rows do not cover (SKUs beyond the fetched rows) goes to __other__ too.
    rest = max(0.0, float(units) - listed)
    return (
        family(catalog.NEGATIVE_INVENTORY_SKUS, [((), float(skus))]),
        family(catalog.NEGATIVE_INVENTORY_UNITS, [((), float(units))]),
        family(
            catalog.NEGATIVE_INVENTORY_SKU_UNITS,
            worst_sku_samples(rows, top=top, guard=guard, pinned=pinned, rest=rest),
        ),
    )


@dataclass(frozen=True, slots=True)
class OutboxStuck:
    """What one outbox probe run saw of the events beyond the publish latency."""

    #: Events unpublished for longer than the latency.
    count: int
    #: The oldest unpublished event's id (``None``: no id column mapped, or none stuck).
    oldest_id: object | None
    #: The oldest unpublished event's age, in seconds.
    oldest_age: float


class OutboxStuckLog:
    """Logs stuck outbox events: when they appear, at most once a minute while they stay,
    once when none are left.

    Example::

        log = OutboxStuckLog(max_publish_latency=30.0)
        log.observe(OutboxStuck(count=3, oldest_id=1042, oldest_age=95.0))
        # WARNING outbox stuck: 3 event(s) unpublished beyond 30s; the oldest, id 1042,
        # is 1m 35s old
    """

    def __init__(
        self,
        *,
        max_publish_latency: float,
        logger: logging.Logger = LOGGER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_publish_latency = max_publish_latency
        self.logger = logger
        self._clock = clock
        # When it last logged "stuck"; None while nothing is stuck.
        self._last: float | None = None

    def observe(self, stuck: OutboxStuck) -> bool:
        """Note one probe run; returns whether it logged."""
        now = self._clock()
        if stuck.count <= 0:
            if self._last is None:
                return False
            self._last = None
            self.logger.info(
                "outbox recovered: no event unpublished beyond %s",
                format_duration(self.max_publish_latency),
                extra={"probe": "outbox"},
            )
            return True
        if self._last is not None and now - self._last < OUTBOX_LOG_INTERVAL:
            return False
        self._last = now
        oldest = "" if stuck.oldest_id is None else f", id {stuck.oldest_id},"
        # Whole seconds (the exact age is the line's oldest_event_age_seconds), milliseconds
        # below a second.
        age = stuck.oldest_age
        age = round(age) if age >= 1 else max(0.001, round(age, 3))
        self.logger.warning(
            "outbox stuck: %d event(s) unpublished beyond %s; the oldest%s is %s old",
            stuck.count,
            format_duration(self.max_publish_latency),
            oldest,
            format_duration(age),
            extra={
                "probe": "outbox",
                "stuck_events": stuck.count,
                "oldest_event_id": None if stuck.oldest_id is None else str(stuck.oldest_id),
                "oldest_event_age_seconds": round(stuck.oldest_age, 3),
            },
        )
        return True
