"""The incremental oversold count's bookkeeping: per-product paid units kept between runs.

No SQL here: :func:`incremental_run` takes its statements from
:class:`~stocksentry.exporter.invariants.InvariantSql` and their rows from the probe's
``fetch``. Paid units are split at a **boundary** of the orders' creation time: **settled**
(kept here) and **recent** (read again every run); a **rolling recount** corrects the
settled totals a chunk per run: docs/exporter-config.md, "How ``oversold`` counts".

Example::

    totals = SoldTotals(max_products=200_000)
    await incremental_run(totals, fetch, builder, horizon=horizon, chunk=500, recount_batch=2000)
    worst = [(s.sku, s.oversold_units) for s in totals.oversold()]
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from .base import LOGGER
from .dialects import number

if TYPE_CHECKING:
    from ..invariants import InvariantSql, Query

ProductId = Hashable


@dataclass(slots=True)
class _Settled:
    sku: str
    allocation: float
    units: float
    #: The run that last saw the product with recent items (for eviction).
    seen: int


@dataclass(frozen=True, slots=True)
class OversoldSku:
    """One oversold SKU: its allocation, its paid units and the units beyond."""

    sku: str
    allocation: float
    sold_units: float

    @property
    def oversold_units(self) -> float:
        return self.sold_units - self.allocation


class SoldTotals:
    """Settled paid units per product, the recent ones of the last run, the recount cursor.
    Beyond ``max_products`` settled totals, the least recently active products not
    oversold are dropped (and counted again from their history when active again)."""

    def __init__(self, *, max_products: int = 200_000) -> None:
        self.max_products = max_products
        #: Orders created before it are settled; ``None`` until the first run.
        self.boundary: datetime | None = None
        self._settled: dict[ProductId, _Settled] = {}
        #: Products whose settled units alone exceed their allocation.
        self._over: set[ProductId] = set()
        self._recent: dict[ProductId, tuple[str, float, float]] = {}
        #: The last product id the rolling recount covered; ``None``: start a new pass.
        self.cursor: ProductId | None = None
        #: Complete passes of the rolling recount since the totals were empty.
        self.passes = 0
        self._run = 0

    # --- the boundary ------------------------------------------------------------------

    def settle_range(self, horizon: datetime) -> tuple[tuple[datetime, datetime] | None, datetime]:
        """The range ``[old, new)`` whose orders :meth:`settle` must get when the boundary
        moves to ``horizon`` (``None``: nothing to settle), and the boundary after it
        (never moved back)."""
        old = self.boundary
        if old is None:
            return None, horizon
        if horizon <= old:
            return None, old
        return (old, horizon), horizon

    def advance(self, horizon: datetime) -> tuple[datetime, datetime] | None:
        """Move the boundary to ``horizon``; returns :meth:`settle_range`'s range."""
        self._run += 1
        settle, self.boundary = self.settle_range(horizon)
        return settle

    def settle(self, rows: Iterable[tuple[Any, Any]]) -> None:
        """Add ``(product_id, sold_units)`` of the settle range to the kept totals (those
        without one are counted from their history when needed)."""
        for product_id, units in rows:
            entry = self._settled.get(product_id)
            if entry is not None:
                entry.units += number(units)
                self._mark(product_id, entry)

    # --- the recent part ---------------------------------------------------------------

    def set_recent(self, rows: Iterable[tuple[Any, Any, Any, Any]]) -> None:
        """``(product_id, sku, allocation, sold_units)`` of the orders created at or after
        the boundary: replaces the last run's."""
        recent: dict[ProductId, tuple[str, float, float]] = {}
        for product_id, sku, allocation, units in rows:
            recent[product_id] = (str(sku), number(allocation), number(units))
            entry = self._settled.get(product_id)
            if entry is not None:
                entry.seen = self._run
                if entry.allocation != number(allocation):
                    entry.allocation = number(allocation)
                    self._mark(product_id, entry)
        self._recent = recent

    def uncounted(self, limit: int) -> list[ProductId]:
        """Up to ``limit`` products with recent items and no settled total yet, those
        nearest to (or beyond) their allocation first."""
        missing = [pid for pid in self._recent if pid not in self._settled]
        if len(missing) > limit:
            missing.sort(key=lambda pid: self._recent[pid][2] - self._recent[pid][1], reverse=True)
            missing = missing[:limit]
        return missing

    @property
    def pending(self) -> int:
        """Products with recent items whose settled total is not counted yet."""
        return sum(1 for pid in self._recent if pid not in self._settled)

    def counted(self, product_ids: Iterable[ProductId], rows: Iterable[tuple[Any, Any]]) -> None:
        """The settled totals of ``product_ids`` counted from their history, as rows
        ``(product_id, sold_units)`` (products without paid items have no row: 0)."""
        sold = {product_id: number(units) for product_id, units in rows}
        for product_id in product_ids:
            sku, allocation, _units = self._recent[product_id]
            entry = _Settled(sku, allocation, sold.get(product_id, 0.0), self._run)
            self._settled[product_id] = entry
            self._mark(product_id, entry)
        self._evict()

    # --- the rolling recount -----------------------------------------------------------

    def recounted(self, rows: Iterable[tuple[Any, Any, Any, Any]], *, limit: int) -> None:
        """One chunk of the rolling recount: rows ``(product_id, sku, allocation,
        sold_units)`` of up to ``limit`` products after :attr:`cursor` by id, their units
        before the boundary. Replaces their kept totals (keeps the oversold ones), moves
        the cursor; fewer rows than ``limit`` end the pass."""
        count = 0
        last: ProductId | None = None
        for product_id, sku, allocation, units in rows:
            count += 1
            last = product_id
            entry = self._settled.get(product_id)
            if entry is None and (
                product_id in self._recent or number(units) > number(allocation)
            ):
                entry = _Settled(str(sku), number(allocation), 0.0, self._run)
                self._settled[product_id] = entry
            if entry is not None:
                entry.sku, entry.allocation, entry.units = (
                    str(sku),
                    number(allocation),
                    number(units),
                )
                self._mark(product_id, entry)
        if count < limit:
            self.cursor = None
            self.passes += 1
        else:
            self.cursor = last
        self._evict()

    # --- the answer --------------------------------------------------------------------

    def oversold(self) -> list[OversoldSku]:
        """The SKUs whose settled plus recent paid units exceed their allocation, worst
        first (then by SKU); :attr:`pending` products are not among them."""
        found: list[OversoldSku] = []
        for product_id in self._over | self._recent.keys():
            entry = self._settled.get(product_id)
            if entry is None:
                continue
            recent = self._recent.get(product_id)
            units = entry.units + (recent[2] if recent is not None else 0.0)
            if units > entry.allocation:
                found.append(OversoldSku(entry.sku, entry.allocation, units))
        found.sort(key=lambda s: (-s.oversold_units, s.sku))
        return found

    def sold_units(self, product_id: ProductId) -> float | None:
        """The product's paid units, settled plus recent; ``None`` when not kept."""
        entry = self._settled.get(product_id)
        if entry is None:
            return None
        recent = self._recent.get(product_id)
        return entry.units + (recent[2] if recent is not None else 0.0)

    def __len__(self) -> int:
        return len(self._settled)

    # --- housekeeping ------------------------------------------------------------------

    def _mark(self, product_id: ProductId, entry: _Settled) -> None:
        if entry.units > entry.allocation:
            self._over.add(product_id)
        else:
            self._over.discard(product_id)

    def _evict(self) -> None:
        if len(self._settled) <= self.max_products:
            return
        # Down to 90 %, so eviction is a rare batch rather than a cost on every run.
        keep = self.max_products * 9 // 10
        candidates = sorted(
            (
                (entry.seen, pid)
                for pid, entry in self._settled.items()
                if pid not in self._over and pid not in self._recent
            ),
            key=lambda item: item[0],
        )
        for _seen, pid in candidates[: max(0, len(self._settled) - keep)]:
            del self._settled[pid]


async def incremental_run(
    totals: SoldTotals,
    fetch: Callable[[Query], Awaitable[Sequence[tuple[Any, ...]]]],
    builder: InvariantSql,
    *,
    horizon: datetime,
    chunk: int,
    recount_batch: int,
) -> None:
    """One run of the incremental oversold count up to ``horizon``: settle the orders
    created since the boundary, read the recent ones, one recount chunk, then the new
    products' histories. The totals change only once the statements they need have
    answered: a run that fails leaves them consistent, and the next repeats it.
    """
    settle_range, new_boundary = totals.settle_range(horizon)
    settled = (
        await fetch(builder.paid_units_created(start=settle_range[0], end=settle_range[1]))
        if settle_range is not None
        else []
    )
    recent = await fetch(builder.paid_units_created(start=new_boundary))
    rows = await fetch(
        builder.paid_units_chunk(after=totals.cursor, limit=chunk, end=new_boundary)
    )
    totals.advance(new_boundary)
    totals.settle((row[0], row[3]) for row in settled)
    totals.set_recent(recent)
    missing = totals.uncounted(recount_batch)
    counts = (
        await fetch(builder.paid_units_of_products(missing, end=new_boundary)) if missing else []
    )
    totals.counted(missing, counts)
    totals.recounted(rows, limit=chunk)


#: Seconds between two warnings that products wait for their first count.
PENDING_LOG_INTERVAL: Final = 600.0


#: The smallest chunk of the rolling recount: a shop of a few thousand products finishes
#: a pass in minutes, whatever ``recount_period`` says.
MIN_CHUNK: Final = 50


def chunk_size(estimate: float, recount_period: float, interval: float) -> int:
    """Products per chunk of the rolling recount: one pass over ``estimate`` products
    takes ``recount_period`` at one chunk a run every ``interval`` seconds.

    >>> chunk_size(1_000_000, recount_period=3600, interval=15)
    4167
    """
    runs = max(1.0, recount_period / interval)
    return max(MIN_CHUNK, math.ceil(estimate / runs))


class RunLog:
    """The incremental oversold probe's progress lines: a warning while products with
    recent sales wait for their first count (at most every :data:`PENDING_LOG_INTERVAL`),
    one line when the whole paid history is counted."""

    def __init__(self, probe: str) -> None:
        self.probe = probe
        self._history_logged = False
        self._pending_logged = -PENDING_LOG_INTERVAL

    def reset(self) -> None:
        """The totals were emptied: the history line is due again once they are rebuilt."""
        self._history_logged = False

    def after_run(self, totals: SoldTotals, *, passes_before: int, recount_batch: int) -> None:
        """Log what :func:`incremental_run` left in ``totals`` (``passes_before``: its
        completed recount passes before the run)."""
        pending = totals.pending
        now = time.monotonic()
        if pending and totals.passes and now - self._pending_logged >= PENDING_LOG_INTERVAL:
            self._pending_logged = now
            LOGGER.warning(
                "probe oversold: %d products with recent sales wait for their first count"
                " (%d a run); raise probes.oversold.recount_batch",
                pending,
                recount_batch,
                extra={"probe": self.probe},
            )
        if passes_before == 0 and totals.passes == 1 and not self._history_logged:
            self._history_logged = True
            LOGGER.info(
                "probe oversold: the whole paid history is counted; %d products tracked",
                len(totals),
                extra={"probe": self.probe},
            )
