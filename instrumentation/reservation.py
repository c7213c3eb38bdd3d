"""The reservation handle: a sync and async context manager timing one reservation."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Span

from . import catalog
from .catalog import ConflictReason, Outcome
from .events import INVENTORY_NEGATIVE, RESERVATION_ERROR, STOCK_CHECK, STOCK_UPDATE
from .handle import BlockHandle, misuse
from .outcomes import classify_exception
from .tracing import CONTEXT_VAR, carrier_for, exemplar_for

if TYPE_CHECKING:
    from .sentry import Sentry

_current: ContextVar[Reservation | None] = ContextVar("stocksentry_reservation", default=None)


# The type of structlog's lazy proxy, what ``structlog.get_logger`` returns (structlog does
# not export the class).
_LAZY_PROXY: type[Any] = type(structlog.get_logger())


def _line_logger(sentry: Sentry) -> Any:
    """The logger a reservation's lines go to, resolved once for all of them.

    structlog's lazy proxy finds its logger in ``__getattr__``, after a failed attribute
    lookup, on each line; ``bind()`` with no values is that same resolution (the logger
    cached on first use, or one assembled from the configuration of now), done once here.
    Any other logger (``Sentry(logger=...)``) is used as it is.
    """
    logger = sentry.logger
    if type(logger) is _LAZY_PROXY:
        try:
            return logger.bind()
        except Exception as exc:
            sentry.internal_error("logging", exc)
    return logger


# The logs module, by name: only an app that imported it can have configure_logging's chain,
# and the core import stays without it (and its secrets module's patterns).
_LOGS_MODULE = f"{__name__.rpartition('.')[0]}.logs"


def _own_line_writer(logger: Any) -> Any:
    """``logs.own_line_writer(logger)`` once the logs module is loaded, else ``None``."""
    logs = sys.modules.get(_LOGS_MODULE)
    return None if logs is None else logs.own_line_writer(logger)


def current_reservation() -> Reservation | None:
    """The reservation whose block (or decorated function) is running, if any."""
    return _current.get()


class Reservation(BlockHandle):
    """One stock reservation, timed from enter to exit; a sync and async context manager.

    Mark the outcome with :meth:`success` or :meth:`conflict`; a block that ends without
    a mark and without an exception counts as a success. An exception ends it as
    :func:`classify_exception` says and propagates unchanged.
    """

    __slots__ = (
        "_cache_name",
        "_cached",
        "_cv_token",
        "_implied",
        "_log",
        "_log_tokens",
        "_logger",
        "_misuse",
        "_new_stock",
        "_old_stock",
        "_outcome",
        "_sql_negative",
        "_start",
        "_write_info",
        "ids",
        "qty",
        "sku",
        "strategy",
    )

    def __init__(
        self,
        sentry: Sentry,
        sku: str,
        strategy: str,
        qty: int,
        ids: dict[str, object],
    ) -> None:
        self._sentry = sentry
        self.sku = sku
        self.strategy = strategy
        self.qty = qty
        self.ids = ids
        self._outcome: Outcome | None = None
        self._implied: ConflictReason | None = None
        self._old_stock: int | None = None
        self._new_stock: int | None = None
        # Set when an integration counted a negative write of this reservation from the SQL.
        self._sql_negative = False
        # The stock a cache answered with, when the decision was taken from a cache.
        self._cached: int | None = None
        self._cache_name = ""
        self._span: Span | None = None
        self._ctx_token: object | None = None
        # Whether this reservation logs: read once, not per line (Sentry.log_enabled
        # looks at structlog's configuration each time).
        self._log = sentry.log_enabled
        self._logger: Any = _line_logger(sentry) if self._log else None
        # configure_logging's own chain, run without structlog's per-call layers (None:
        # through the logger's info()).
        self._write_info: Any = _own_line_writer(self._logger) if self._log else None
        self._log_tokens: Mapping[str, Token[Any]] | None = None
        self._cv_token: Token[Reservation | None] | None = None
        self._start = 0.0
        # A value of the wrong type from the app, described: the reservation then records
        # none of its series (all or nothing) and counts one instrumentation error. The
        # exact-type checks keep the common case to three comparisons.
        self._misuse: str | None = None
        if type(sku) is not str or type(strategy) is not str or type(qty) is not int:
            self._misuse = misuse(sku=sku, strategy=strategy, qty=qty)

    # --- marks -----------------------------------------------------------------------------

    def stock_check(self, available: int, *, source: str = "db", cache: str | None = None) -> None:
        """Record the stock the reservation saw before deciding (logs ``stock_check``).

        ``source="cache"`` says the figure came from a cache (``cache`` names it; default
        ``"stock"``): the reservation then compares it with what the database says next —
        a ``success(old_stock=…)`` that differs, or an ``out_of_stock`` refusal of a
        quantity the cache said was there — and counts a stale-cache decision
        (``stock_cache_stale_hit_total``, log ``cache_stale_hit``) when they disagree.
        """
        if type(available) is not int and self._misuse is None:
            self._misuse = misuse(available=available)
        self._old_stock = available
        sentry = self._sentry
        from_cache = source == "cache"
        if from_cache:
            self._cached = available
            self._cache_name = cache if cache is not None else "stock"
        elif source != "db" and self._misuse is None:
            self._misuse = f"source must be 'db' or 'cache', got {source!r:.80}"
        if self._log:
            try:
                fields: dict[str, Any] = {
                    "sku": self.sku,
                    "strategy": self.strategy,
                    "available": available,
                }
                if from_cache:
                    fields["source"] = "cache"
                    fields["cache"] = self._cache_name
                self._info(STOCK_CHECK.name, fields)
            except Exception as exc:
                sentry.internal_error("logging", exc)

    def success(self, *, old_stock: int | None = None, new_stock: int | None = None) -> None:
        """Mark the reservation successful; ``new_stock`` below zero counts a negative write."""
        self._outcome = "success"
        if (
            (old_stock is not None and type(old_stock) is not int)
            or (new_stock is not None and type(new_stock) is not int)
        ) and self._misuse is None:
            self._misuse = misuse(old_stock=old_stock, new_stock=new_stock)
        if old_stock is not None:
            self._old_stock = old_stock
        self._new_stock = new_stock
        cached = self._cached
        if cached is not None and old_stock is not None and old_stock != cached:
            # The database's figure, read after the cache's: the cache was behind.
            self._cached = None  # one count per reservation
            self._stale_cache(cached, old_stock)

    def _stale_cache(self, cached: int, actual: int | None) -> None:
        if self._misuse is not None:
            return
        try:
            self._sentry.record_stale_cache_hit(
                self._cache_name, sku=self.sku, cached=cached, actual=actual
            )
        except Exception as exc:
            self._sentry.internal_error("api", exc)

    def conflict(self, reason: ConflictReason) -> None:
        """Mark the reservation refused for ``reason`` (one of the catalog's conflict reasons)."""
        if reason in catalog.CONFLICT_REASONS:
            self._outcome = reason
        else:
            self._sentry.internal_error("api", ValueError(f"unknown conflict reason {reason!r}"))
            self._outcome = "error"

    def negative_write_seen(self) -> None:
        """An integration counted a negative stock write of this reservation from the SQL
        itself: the ``new_stock`` given to :meth:`success` is then not counted again."""
        self._sql_negative = True

    def implied_outcome(self, reason: ConflictReason | None) -> None:
        """What an integration inferred (a conditional update that matched no row).

        Weaker than :meth:`success`/:meth:`conflict` and than an exception: it decides the
        outcome only of a block that ends with none of those. ``None`` clears it, as when
        a retried update then matched.
        """
        self._implied = reason

    @property
    def outcome(self) -> Outcome | None:
        """The outcome marked (or implied by an integration) so far; ``None`` before any."""
        return self._outcome or self._implied

    def trace_context(self) -> dict[str, str]:
        """A W3C ``traceparent`` carrier of this reservation's span, to store with the order.

        Pass it to :meth:`Sentry.payment_callback` so the callback's span links back here.
        Empty when tracing is off or no SDK is configured.
        """
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
        try:
            tracer = sentry.tracer
            if tracer is not None:
                # Cut: an attribute value is kept by the span processor until export. All
                # of them in the one dict start_span takes (the SDK validates them once).
                attributes: dict[str, str | int]
                if self._misuse is None:
                    attributes = {
                        "stock.sku": self.sku[:256],
                        "stock.strategy": self.strategy[:256],
                        "stock.qty": self.qty,
                    }
                else:
                    attributes = {
                        "stock.sku": str(self.sku)[:256],
                        "stock.strategy": str(self.strategy)[:256],
                    }
                # The current context read once, for the parent and for the new context.
                var = CONTEXT_VAR
                parent = var.get() if var is not None else otel_context.get_current()
                span = self._span = tracer.start_span(
                    "stock.reserve", context=parent, attributes=attributes
                )
                # Current until the block ends, so log lines and child spans see it: attached
                # directly, without use_span's context-manager layers (the ContextVar's
                # token is what attach() returns and detach() takes).
                current = otel_trace.set_span_in_context(span, parent)
                self._ctx_token = (
                    var.set(current) if var is not None else otel_context.attach(current)
                )
            if self._log:
                self._log_tokens = structlog.contextvars.bind_contextvars(sku=self.sku, **self.ids)
            self._cv_token = _current.set(self)
        except Exception as exc:
            sentry.internal_error("api", exc)
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
            # The hot path, inline: every call layer here is paid on each reservation.
            try:
                metrics = sentry.metrics
                span = self._span
                metrics.reservation_finished(
                    self.sku,
                    self.strategy,
                    outcome,
                    elapsed,
                    exemplar_for(span) if span is not None else None,
                )
                new_stock = self._new_stock
                if (
                    outcome == "success"
                    and new_stock is not None
                    and new_stock < 0
                    and not self._sql_negative
                ):
                    metrics.inventory_negative(self.sku)
            except Exception as err:
                sentry.internal_error("metrics", err)
        if self._log:
            self._log_end(outcome, exc)
        if self._cv_token is not None or self._log_tokens is not None or self._span is not None:
            self._restore(outcome, exc)

    def _restore(self, outcome: Outcome, exc: BaseException | None) -> None:
        # Each step on its own: one failing (a context entered in another task, a span
        # processor that raises) must not leave the others' context behind.
        sentry = self._sentry
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

    def _info(self, event: str, fields: dict[str, Any]) -> None:
        """One ``info`` line of ``fields`` (a fresh dict: it becomes the event dict)."""
        write = self._write_info
        if write is not None:
            write(event, fields)
        else:
            self._logger.info(event, **fields)

    def _log_end(self, outcome: Outcome, exc: BaseException | None) -> None:
        sentry = self._sentry
        try:
            log = self._logger
            if outcome == "success":
                fields: dict[str, Any] = {
                    "sku": self.sku,
                    "strategy": self.strategy,
                    "qty": self.qty,
                    "success": True,
                }
                if self._old_stock is not None:
                    fields["from"] = self._old_stock
                if self._new_stock is not None:
                    fields["to"] = self._new_stock
                self._info(STOCK_UPDATE.name, fields)
                new_stock = self._new_stock
                if (
                    self._misuse is None
                    and new_stock is not None
                    and new_stock < 0
                    and not self._sql_negative
                ):
                    log.warning(INVENTORY_NEGATIVE.name, sku=self.sku, stock=new_stock, **self.ids)
            elif outcome == "error":
                self._info(
                    RESERVATION_ERROR.name,
                    {
                        "sku": self.sku,
                        "strategy": self.strategy,
                        "error": type(exc).__name__ if exc is not None else "unknown",
                    },
                )
            else:
                self._info(
                    STOCK_UPDATE.name,
                    {
                        "sku": self.sku,
                        "strategy": self.strategy,
                        "qty": self.qty,
                        "success": False,
                        "reason": outcome,
                    },
                )
        except Exception as err:
            sentry.internal_error("logging", err)
