"""The reservation handle: a sync and async context manager timing one reservation."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

import structlog

from . import catalog
from .catalog import ConflictReason, Outcome
from .events import (
    INVENTORY_NEGATIVE,
    RESERVATION_ERROR,
    RESERVATION_FROZEN,
    STOCK_CHECK,
    STOCK_UPDATE,
    LogEvent,
)
from .freeze import FreezeState
from .handle import BlockHandle, misuse
from .outcomes import SkuFrozen, classify_exception, is_answer
from .tracing import carrier_for, exemplar_for

if TYPE_CHECKING:
    from .sentry import Sentry

_current: ContextVar[Reservation | None] = ContextVar("stocksentry_reservation", default=None)


def current_reservation() -> Reservation | None:
    """The reservation whose block (or decorated function) is running, if any."""
    return _current.get()


class Reservation(BlockHandle):
    """One stock reservation, timed from enter to exit; a sync and async context manager.

    Mark the outcome with :meth:`success` or :meth:`conflict`; a block that ends without
    a mark and without an exception counts as a success. An exception ends it as
    :func:`classify_exception` says and propagates unchanged; one it calls an ``error``
    still ends a conflict an integration inferred (a guarded UPDATE that matched no row),
    and an answer to the buyer (:func:`~.outcomes.is_answer`: a ``conflict_on`` type, an
    HTTP 4xx exception of a web framework) ends it as ``out_of_stock``.
    """

    def __init__(
        self,
        sentry: Sentry,
        sku: str,
        strategy: str,
        qty: int,
        ids: dict[str, object],
        conflict_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        super().__init__(sentry, sku, qty, ids, strategy=strategy)
        self.strategy = strategy
        # Exception types the app raises as an answer (sold out), not as a failure.
        self._answers = conflict_on
        self._outcome: Outcome | None = None
        self._implied: ConflictReason | None = None
        self._old_stock: int | None = None
        self._new_stock: int | None = None
        self._sql_negative = False  # see note_negative_write()
        # The stock a cache answered with, when the decision was taken from a cache.
        self._cached: int | None = None
        self._cache_name = ""
        self._log = sentry.log_enabled  # read once, for all of its lines
        # The logger of this reservation's lines, resolved once: bind() with no values
        # gives structlog's logger behind its lazy proxy, not one more lookup per line.
        self._logger: Any = sentry.logger
        if self._log and callable(getattr(self._logger, "bind", None)):
            try:
                self._logger = self._logger.bind()
            except Exception as exc:
                sentry.internal_error("logging", exc)
        self._log_tokens: Mapping[str, Token[Any]] | None = None
        self._cv_token: Token[Reservation | None] | None = None
        self._start = 0.0

    def _check(self, **values: object) -> None:
        if self._misuse is None:
            self._misuse = misuse(**values)

    # --- marks -----------------------------------------------------------------------------

    def stock_check(self, available: int, *, source: str = "db", cache: str | None = None) -> None:
        """Record the stock the reservation saw before deciding (logs ``stock_check``).

        ``source="cache"`` says the figure came from a cache (``cache`` names it; default
        ``"stock"``): a ``success(old_stock=…)`` that differs, or an ``out_of_stock``
        refusal of a quantity it said was there, then counts a stale-cache decision.
        """
        self._check(available=available)
        self._old_stock = available
        if source == "cache":
            self._cached = available
            self._cache_name = cache if cache is not None else "stock"
        elif source != "db" and self._misuse is None:
            self._misuse = f"source must be 'db' or 'cache', got {source!r:.80}"
        if self._log:
            fields: dict[str, Any] = {
                "sku": self.sku,
                "strategy": self.strategy,
                "available": available,
            }
            if source == "cache":
                fields.update(source="cache", cache=self._cache_name)
            self._line(STOCK_CHECK, fields)

    def success(self, *, old_stock: int | None = None, new_stock: int | None = None) -> None:
        """Mark the reservation successful; ``new_stock`` below zero counts a negative write."""
        self._outcome = "success"
        self._check(old_stock=old_stock, new_stock=new_stock)
        if old_stock is not None:
            self._old_stock = old_stock
        self._new_stock = new_stock
        cached = self._cached
        if cached is not None and old_stock is not None and old_stock != cached:
            # The database's figure, read after the cache's: the cache was behind.
            self._cached = None  # one count per reservation
            self._stale_cache(cached, old_stock)

    def _stale_cache(self, cached: int, actual: int | None) -> None:
        # record_stale_cache_hit never raises: it counts its own failures.
        if self._misuse is None:
            self._sentry.record_stale_cache_hit(
                self._cache_name, sku=self.sku, cached=cached, actual=actual
            )

    def conflict(self, reason: ConflictReason) -> None:
        """Mark the reservation refused for ``reason`` (one of the catalog's conflict reasons)."""
        if reason in catalog.CONFLICT_REASONS:
            self._outcome = reason
        else:
            self._sentry.internal_error("api", ValueError(f"unknown conflict reason {reason!r}"))
            self._outcome = "error"

    @property
    def outcome(self) -> Outcome | None:
        """The outcome marked (or implied by an integration) so far; ``None`` before any."""
        return self._outcome or self._implied

    def trace_context(self) -> dict[str, str]:
        """A W3C ``traceparent`` carrier of this reservation's span, to store with the order
        for :meth:`Sentry.payment_callback`'s link (empty without tracing)."""
        if self._span is None:
            return {}
        try:
            return carrier_for(self._span)
        except Exception as exc:
            self._sentry.internal_error("tracing", exc)
            return {}

    # --- lifecycle -----------------------------------------------------------------------

    def _enter(self) -> None:
        sentry = self._sentry
        view = sentry.freeze_view
        if view is not None and self._misuse is None:
            state = view.frozen(self.sku)
            if state is not None:
                self._refuse_frozen(state)
        # Each step on its own, as in _exit: a span processor that raises must not keep the
        # reservation from being current (the SQLAlchemy integration's implied conflicts
        # and read-modify-write checks find it there) or its log lines from their SKU.
        tracer = sentry.tracer
        if tracer is not None:
            try:
                # Cut: an attribute value is kept by the span processor until export.
                attributes: dict[str, str | int] = {
                    "stock.sku": str(self.sku)[:256],
                    "stock.strategy": str(self.strategy)[:256],
                }
                if self._misuse is None:
                    attributes["stock.qty"] = self.qty
                self._use_span(tracer.start_span("stock.reserve", attributes=attributes))
            except Exception as exc:
                sentry.internal_error("tracing", exc)
        if self._log:
            try:
                self._log_tokens = structlog.contextvars.bind_contextvars(sku=self.sku, **self.ids)
            except Exception as exc:
                sentry.internal_error("logging", exc)
        self._cv_token = _current.set(self)
        self._start = time.perf_counter()

    def _exit(self, exc: BaseException | None) -> None:
        elapsed = time.perf_counter() - self._start
        sentry = self._sentry
        outcome = self._outcome
        # An exception after a success mark (a failed COMMIT, say) means the stock was not
        # taken; a conflict mark stays, as the app raising its own 409 after it is normal.
        if exc is not None and outcome in (None, "success"):
            try:
                outcome = classify_exception(exc)
                if outcome == "error" and self._outcome is None:
                    # Raising after a refusal is how web apps answer "sold out" (FastAPI's
                    # HTTPException(409)): the inferred conflict stays, as a mark would,
                    # and an exception the app answers the buyer with is no failure.
                    if self._implied is not None:
                        outcome = self._implied
                    elif is_answer(exc, self._answers):
                        outcome = "out_of_stock"
            except Exception as err:
                sentry.internal_error("api", err)
                outcome = "error"
        elif outcome is None:
            outcome = self._implied or "success"
        cached = self._cached
        if cached is not None and outcome == "out_of_stock" and cached >= self.qty:
            # The cache said the units were there; the database said they were not.
            self._cached = None
            self._stale_cache(cached, None)
        if self._misuse is not None:
            # Validated before any series is touched: nothing of this reservation is
            # recorded, rather than a success without its duration.
            sentry.internal_error("api", TypeError(self._misuse))
        else:
            try:
                span = self._span
                exemplar = exemplar_for(span) if span is not None else None
                sentry.metrics.reservation_finished(
                    self.sku, self.strategy, outcome, elapsed, exemplar
                )
                if outcome == "success" and self._negative_write():
                    sentry.metrics.count(catalog.INVENTORY_NEGATIVE, self.sku)
            except Exception as err:
                sentry.internal_error("metrics", err)
        if self._log:
            self._log_end(outcome, exc)
        # Each step on its own: one failing (a context entered in another task, a span
        # processor that raises) must not leave the others' context behind.
        if self._cv_token is not None:
            try:
                _current.reset(self._cv_token)
            except Exception as err:
                sentry.internal_error("api", err)
            self._cv_token = None
        if self._log_tokens is not None:
            try:
                structlog.contextvars.reset_contextvars(**self._log_tokens)
            except Exception as err:
                sentry.internal_error("logging", err)
            self._log_tokens = None
        span = self._span
        if span is not None:
            self._end_span(span, "stock.outcome", outcome, outcome == "error", exc)

    def _refuse_frozen(self, state: FreezeState) -> None:
        """Count, log and raise the refusal of a frozen SKU (the block and ``__exit__`` do
        not run); only called without a misuse."""
        sentry = self._sentry
        try:
            sentry.metrics.reservation_finished(self.sku, self.strategy, "frozen", 0.0)
        except Exception as err:
            sentry.internal_error("metrics", err)
        if self._log:
            fields: dict[str, Any] = {
                "sku": self.sku,
                "strategy": self.strategy,
                "qty": self.qty,
                "freeze_reason": state.reason,
                "freeze_source": state.source,
                **self.ids,
            }
            self._line(RESERVATION_FROZEN, fields)
        raise SkuFrozen(self.sku, state.reason, state.source, state.at)

    def _negative_write(self) -> bool:
        """Whether ``success(new_stock=...)`` reported a negative write of its own (not one
        an integration already counted from the SQL)."""
        new_stock = self._new_stock
        return new_stock is not None and new_stock < 0 and not self._sql_negative

    def _line(self, event: LogEvent, fields: dict[str, Any]) -> None:
        try:
            getattr(self._logger, event.level)(event.name, **fields)
        except Exception as exc:
            self._sentry.internal_error("logging", exc)

    def _log_end(self, outcome: Outcome, exc: BaseException | None) -> None:
        fields: dict[str, Any] = {"sku": self.sku, "strategy": self.strategy}
        if outcome == "error":
            fields["error"] = type(exc).__name__ if exc is not None else "unknown"
            self._line(RESERVATION_ERROR, fields)
            return
        fields.update(qty=self.qty, success=outcome == "success")
        if outcome != "success":
            fields["reason"] = outcome
        if self._old_stock is not None and outcome == "success":
            fields["from"] = self._old_stock
        if self._new_stock is not None and outcome == "success":
            fields["to"] = self._new_stock
        self._line(STOCK_UPDATE, fields)
        if outcome == "success" and self._misuse is None and self._negative_write():
            fields = {"sku": self.sku, "stock": self._new_stock, **self.ids}
            self._line(INVENTORY_NEGATIVE, fields)


# --- for the integrations (instrumentation/sqlalchemy), not on the user's handle ----------


def note_negative_write(reservation: Reservation) -> None:
    """An integration counted a negative stock write of ``reservation`` from the SQL itself:
    the ``new_stock`` given to :meth:`Reservation.success` is then not counted again."""
    reservation._sql_negative = True


def imply_outcome(reservation: Reservation, reason: ConflictReason | None) -> None:
    """What an integration inferred for ``reservation`` (a conditional update that matched
    no row); ``None`` clears it, as when a retried update then matched.

    Weaker than a mark and than an exception: it decides the outcome only of a block that
    ends with none of those.
    """
    reservation._implied = reason
