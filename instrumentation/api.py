"""The public recording API: reservations, payments, refunds, idempotency, cache.

One :class:`Sentry` holds the metrics (in an injectable registry), the SKU guard, the
logger and the tracer. :func:`configure` installs the process-wide one that the module
functions use; tests build their own ``Sentry(registry=CollectorRegistry())``.

Every method is safe to call from threads and asyncio tasks and never raises into the
application at run time: a failure inside stocksentry is counted in
``stocksentry_instrumentation_errors_total{component}`` and logged at most once per
``error_log_interval`` seconds per component. Exceptions raised by the application inside
a ``with`` block pass through unchanged.

Example::

    from stocksentry.instrumentation import configure, reservation

    configure(promo_skus=["EGG-01"])
    with reservation("EGG-01", strategy="atomic") as r:
        r.stock_check(available=1)
        if update_matched_a_row():
            r.success(old_stock=1, new_stock=0)
        else:
            r.conflict("out_of_stock")
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, cast

import structlog
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import Span, StatusCode, TracerProvider
from prometheus_client import CollectorRegistry
from prometheus_client.registry import REGISTRY

from . import catalog
from .metrics import StockMetrics
from .tracing import TRACER_NAME, carrier_for, exemplar_for, link_from_carrier

ConflictReason = Literal[
    "out_of_stock",
    "lost_race",
    "lock_timeout",
    "lock_not_acquired",
    "deadlock",
    "serialization_failure",
]
Outcome = Literal[
    "success",
    "out_of_stock",
    "lost_race",
    "lock_timeout",
    "lock_not_acquired",
    "deadlock",
    "serialization_failure",
    "error",
]

P = ParamSpec("P")
R = TypeVar("R")

# SQLSTATEs that mean the database refused the reservation rather than failed: a deadlock,
# a serialization failure, a lock that could not be had in time.
_SQLSTATE_REASONS: dict[str, ConflictReason] = {
    "40P01": "deadlock",
    "40001": "serialization_failure",
    "55P03": "lock_timeout",
}

_stdlib_log = logging.getLogger("stocksentry")


class ReservationConflict(Exception):
    """Raise inside a reservation to end it as a conflict; it is re-raised unchanged.

    Example::

        with reservation("EGG-01", strategy="atomic"):
            if rows == 0:
                raise ReservationConflict("out_of_stock")
    """

    def __init__(self, reason: ConflictReason, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason: ConflictReason = reason


def classify_exception(exc: BaseException) -> Outcome:
    """The outcome a reservation ended by ``exc`` gets.

    :class:`ReservationConflict` gives its reason; a driver error carrying SQLSTATE 40P01,
    40001 or 55P03 (psycopg, asyncpg, psycopg2, also wrapped by SQLAlchemy) gives
    ``deadlock``, ``serialization_failure`` or ``lock_timeout``; SQLite's "database is
    locked" gives ``lock_timeout``; anything else is ``error``.
    """
    if isinstance(exc, ReservationConflict):
        return exc.reason if exc.reason in catalog.CONFLICT_REASONS else "error"
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__):
        if candidate is None:
            continue
        state = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(state, str) and state in _SQLSTATE_REASONS:
            return _SQLSTATE_REASONS[state]
        if type(candidate).__name__ == "OperationalError" and "database is locked" in str(
            candidate
        ):
            return "lock_timeout"
    return "error"


_current: ContextVar[Reservation | None] = ContextVar("stocksentry_reservation", default=None)


def current_reservation() -> Reservation | None:
    """The reservation whose block (or decorated function) is running, if any."""
    return _current.get()


class Reservation:
    """One stock reservation, timed from enter to exit; a sync and async context manager.

    Mark the outcome with :meth:`success` or :meth:`conflict`; a block that ends without
    a mark and without an exception counts as a success. An exception ends it as
    :func:`classify_exception` says and propagates unchanged.
    """

    __slots__ = (
        "_ctx_token",
        "_cv_token",
        "_implied",
        "_log_tokens",
        "_new_stock",
        "_old_stock",
        "_outcome",
        "_sentry",
        "_span",
        "_start",
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
        self._span: Span | None = None
        self._ctx_token: object | None = None
        self._log_tokens: Mapping[str, Token[Any]] | None = None
        self._cv_token: Token[Reservation | None] | None = None
        self._start = 0.0

    # --- marks -----------------------------------------------------------------------------

    def stock_check(self, available: int) -> None:
        """Record the stock the reservation saw before deciding (logs ``stock_check``)."""
        self._old_stock = available
        sentry = self._sentry
        if sentry.log_enabled:
            try:
                sentry.logger.info(
                    "stock_check", sku=self.sku, strategy=self.strategy, available=available
                )
            except Exception as exc:
                sentry.internal_error("logging", exc)

    def success(self, *, old_stock: int | None = None, new_stock: int | None = None) -> None:
        """Mark the reservation successful; ``new_stock`` below zero counts a negative write."""
        self._outcome = "success"
        if old_stock is not None:
            self._old_stock = old_stock
        self._new_stock = new_stock

    def conflict(self, reason: ConflictReason) -> None:
        """Mark the reservation refused for ``reason`` (one of the catalog's conflict reasons)."""
        if reason in catalog.CONFLICT_REASONS:
            self._outcome = reason
        else:
            self._sentry.internal_error("api", ValueError(f"unknown conflict reason {reason!r}"))
            self._outcome = "error"

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

    def _enter(self) -> Reservation:
        sentry = self._sentry
        try:
            tracer = sentry.tracer
            if tracer is not None:
                span = tracer.start_span(
                    "stock.reserve",
                    attributes={
                        "stock.sku": str(self.sku)[:256],
                        "stock.strategy": self.strategy,
                        "stock.qty": self.qty,
                    },
                )
                self._span = span
                self._ctx_token = otel_context.attach(otel_trace.set_span_in_context(span))
            if sentry.log_enabled:
                self._log_tokens = structlog.contextvars.bind_contextvars(sku=self.sku, **self.ids)
            self._cv_token = _current.set(self)
        except Exception as exc:
            sentry.internal_error("api", exc)
        self._start = time.perf_counter()
        return self

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
        try:
            metrics = sentry.metrics
            span = self._span
            if outcome == "success":
                metrics.reservation_success(self.sku, self.strategy)
                if self._new_stock is not None and self._new_stock < 0:
                    metrics.inventory_negative(self.sku)
            elif outcome != "error":
                metrics.reservation_conflict(self.sku, outcome)
            metrics.reservation_duration(
                outcome, elapsed, exemplar_for(span) if span is not None else None
            )
        except Exception as err:
            sentry.internal_error("metrics", err)
        if sentry.log_enabled:
            self._log_end(outcome, exc)
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
            try:
                if span.is_recording():
                    span.set_attribute("stock.outcome", outcome)
                    if outcome == "error":
                        if exc is not None:
                            span.record_exception(exc)
                        span.set_status(StatusCode.ERROR)
                span.end()
            except Exception as err:
                sentry.internal_error("tracing", err)
            finally:
                _detach(sentry, self._ctx_token)
                self._ctx_token = None

    def _log_end(self, outcome: Outcome, exc: BaseException | None) -> None:
        sentry = self._sentry
        try:
            log = sentry.logger
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
                log.info("stock_update", **fields)
                if self._new_stock is not None and self._new_stock < 0:
                    log.warning(
                        "inventory_negative", sku=self.sku, stock=self._new_stock, **self.ids
                    )
            elif outcome == "error":
                log.info(
                    "reservation_error",
                    sku=self.sku,
                    strategy=self.strategy,
                    error=type(exc).__name__ if exc is not None else "unknown",
                )
            else:
                log.info(
                    "stock_update",
                    sku=self.sku,
                    strategy=self.strategy,
                    qty=self.qty,
                    success=False,
                    reason=outcome,
                )
        except Exception as err:
            sentry.internal_error("logging", err)

    def __enter__(self) -> Reservation:
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self._exit(exc)
        return False

    async def __aenter__(self) -> Reservation:
        return self._enter()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self._exit(exc)
        return False


class PaymentCallback:
    """A payment callback: a span linked to the checkout, and the paid-order count.

    A block that ends without an exception and without another mark counts one paid
    order. :meth:`replay` marks a duplicate callback (counted as an idempotency replay of
    ``payment_callback``, not as a second paid order); :meth:`refund_due_to_oversell`
    marks a payment that must be refunded because the stock was not there.
    """

    __slots__ = ("_ctx_token", "_mark", "_sentry", "_span", "checkout", "ids", "qty", "sku")

    def __init__(
        self,
        sentry: Sentry,
        sku: str,
        qty: int,
        ids: dict[str, object],
        checkout: Mapping[str, str] | None,
    ) -> None:
        self._sentry = sentry
        self.sku = sku
        self.qty = qty
        self.ids = ids
        self.checkout = checkout
        self._mark: Literal["paid", "replay", "refund", "failed"] = "paid"
        self._span: Span | None = None
        self._ctx_token: object | None = None

    def replay(self) -> None:
        """This callback repeats one already processed: count a replay, not a payment."""
        self._mark = "replay"

    def refund_due_to_oversell(self) -> None:
        """The payment went through but the stock was oversold: count paid and refund."""
        self._mark = "refund"

    def failed(self) -> None:
        """The payment did not go through: count nothing."""
        self._mark = "failed"

    def _enter(self) -> PaymentCallback:
        sentry = self._sentry
        try:
            if sentry.tracer is not None:
                link = link_from_carrier(self.checkout)
                span = sentry.tracer.start_span(
                    "stock.payment_callback",
                    links=[link] if link is not None else None,
                    attributes={"stock.sku": str(self.sku)[:256]},
                )
                for key in ("order_id", "payment_reference"):
                    value = self.ids.get(key)
                    if value is not None and span.is_recording():
                        span.set_attribute(f"stock.{key}", str(value)[:256])
                self._span = span
                self._ctx_token = otel_context.attach(otel_trace.set_span_in_context(span))
        except Exception as exc:
            sentry.internal_error("tracing", exc)
        return self

    def _exit(self, exc: BaseException | None) -> None:
        sentry = self._sentry
        mark = self._mark if exc is None else "failed"
        try:
            if mark in ("paid", "refund"):
                sentry.metrics.order_paid(self.sku)
            if mark == "refund":
                sentry.metrics.refund_due_to_oversell(self.sku)
            elif mark == "replay":
                sentry.metrics.idempotency_replay("payment_callback")
        except Exception as err:
            sentry.internal_error("metrics", err)
        if sentry.log_enabled:
            try:
                sentry.logger.info("payment_callback", sku=self.sku, result=mark, **self.ids)
            except Exception as err:
                sentry.internal_error("logging", err)
        span = self._span
        if span is not None:
            try:
                if span.is_recording():
                    span.set_attribute("stock.payment_result", mark)
                    if exc is not None:
                        span.record_exception(exc)
                        span.set_status(StatusCode.ERROR)
                span.end()
            except Exception as err:
                sentry.internal_error("tracing", err)
            finally:
                _detach(sentry, self._ctx_token)
                self._ctx_token = None

    def __enter__(self) -> PaymentCallback:
        return self._enter()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self._exit(exc)
        return False

    async def __aenter__(self) -> PaymentCallback:
        return self._enter()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Literal[False]:
        self._exit(exc)
        return False


_NO_IDS: dict[str, object] = {}


def _detach(sentry: Sentry, token: object | None) -> None:
    if token is None:
        return
    try:
        otel_context.detach(cast(Any, token))
    except Exception as err:
        sentry.internal_error("tracing", err)


def _ids(**ids: object) -> dict[str, object]:
    # Most reservations carry no IDs of their own (they are bound by the middleware):
    # share one empty dict instead of building one per call. Never mutated.
    if not any(value is not None for value in ids.values()):
        return _NO_IDS
    return {key: value for key, value in ids.items() if value is not None}


class Sentry:
    """stocksentry's recording state: metrics, SKU guard, logger and tracer.

    ``registry`` takes a prometheus_client ``CollectorRegistry`` (``None`` registers
    nowhere); ``promo_skus`` always get their own series and ``max_skus`` bounds the others;
    ``log`` and ``trace`` switch the log lines and spans; ``tracer_provider`` defaults to the
    global OpenTelemetry one.

    Example::

        sentry = Sentry(registry=CollectorRegistry(), promo_skus=["EGG-01"])
        with sentry.reservation("EGG-01", strategy="for_update") as r:
            r.success(old_stock=3, new_stock=2)
    """

    def __init__(
        self,
        *,
        registry: CollectorRegistry | None = REGISTRY,
        promo_skus: Iterable[str] = (),
        max_skus: int = 100,
        max_label_length: int = 64,
        log: bool = True,
        trace: bool = True,
        tracer_provider: TracerProvider | None = None,
        logger: Any = None,
        error_log_interval: float = 60.0,
    ) -> None:
        self.metrics = StockMetrics(
            registry,
            promo_skus=promo_skus,
            max_skus=max_skus,
            max_label_length=max_label_length,
        )
        self.log_enabled = log
        self.logger: Any = logger if logger is not None else structlog.get_logger("stocksentry")
        self.tracer = (
            otel_trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider) if trace else None
        )
        self.error_log_interval = error_log_interval
        self._error_lock = threading.Lock()
        self._error_last: dict[str, float] = {}
        self._error_suppressed: dict[str, int] = {}

    def close(self) -> None:
        """Unregister this instance's metrics from its registry."""
        self.metrics.unregister()

    # --- failures inside stocksentry -----------------------------------------------------

    def internal_error(self, component: str, exc: BaseException) -> None:
        """Count and (rate-limited) log a failure inside the instrumentation. Never raises."""
        # The counter is the last resort: if it fails too there is nothing left to tell.
        with contextlib.suppress(Exception):
            self.metrics.instrumentation_error(component)
        try:
            now = time.monotonic()
            with self._error_lock:
                last = self._error_last.get(component)
                if last is not None and now - last < self.error_log_interval:
                    self._error_suppressed[component] = (
                        self._error_suppressed.get(component, 0) + 1
                    )
                    return
                self._error_last[component] = now
                suppressed = self._error_suppressed.pop(component, 0)
            # stdlib logging, not structlog: the failure may be in the structlog chain itself.
            _stdlib_log.warning(
                "stocksentry instrumentation error in %s: %s: %s (%d similar suppressed)",
                component,
                type(exc).__name__,
                exc,
                suppressed,
            )
        except Exception:  # noqa: S110 - logging failed too; the counter already has it
            pass

    def _log(self, level: str, event: str, **fields: Any) -> None:
        if not self.log_enabled:
            return
        try:
            getattr(self.logger, level)(event, **fields)
        except Exception as exc:
            self.internal_error("logging", exc)

    # --- reservations --------------------------------------------------------------------

    def reservation(
        self,
        sku: str,
        *,
        strategy: str = "default",
        qty: int = 1,
        request_id: str | None = None,
        idempotency_key: str | None = None,
        order_id: str | None = None,
    ) -> Reservation:
        """A context manager (``with`` or ``async with``) recording one reservation."""
        return Reservation(
            self,
            sku,
            strategy,
            qty,
            _ids(request_id=request_id, idempotency_key=idempotency_key, order_id=order_id),
        )

    def reserves(
        self,
        *,
        strategy: str = "default",
        sku: str | None = None,
        sku_arg: str = "sku",
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Decorator form of :meth:`reservation` for sync and ``async`` functions.

        The SKU is ``sku`` when given, else the decorated function's ``sku_arg`` argument.
        Inside, :func:`current_reservation` returns the handle for marks; a function that
        returns ``False`` without a mark ends as ``out_of_stock``.

        Example::

            @sentry.reserves(strategy="atomic")
            def reserve(sku: str, qty: int) -> bool:
                return conditional_update(sku, qty) == 1
        """

        def decorate(func: Callable[P, R]) -> Callable[P, R]:
            signature = inspect.signature(func)
            if sku is None and sku_arg not in signature.parameters:
                raise TypeError(f"{func.__qualname__} has no argument {sku_arg!r} for the SKU")

            # Where the SKU sits among positional arguments, decided once here.
            names = list(signature.parameters)
            position = names.index(sku_arg) if sku is None else -1
            default = (
                signature.parameters[sku_arg].default if sku is None else inspect.Parameter.empty
            )

            def sku_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
                if sku is not None:
                    return sku
                if sku_arg in kwargs:
                    return str(kwargs[sku_arg])
                if 0 <= position < len(args):
                    return str(args[position])
                if default is not inspect.Parameter.empty:
                    return str(default)
                return "unknown"

            if inspect.iscoroutinefunction(func):
                async_func = cast(Callable[..., Awaitable[Any]], func)

                @functools.wraps(func)
                async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                    async with self.reservation(sku_of(args, kwargs), strategy=strategy) as handle:
                        result = await async_func(*args, **kwargs)
                        if result is False and handle.outcome is None:
                            handle.conflict("out_of_stock")
                        return result

                return cast(Callable[P, R], async_wrapper)

            @functools.wraps(func)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                with self.reservation(sku_of(args, kwargs), strategy=strategy) as handle:
                    result = func(*args, **kwargs)
                    if result is False and handle.outcome is None:
                        handle.conflict("out_of_stock")
                    return result

            return wrapper

        return decorate

    def record_reservation(
        self,
        sku: str,
        outcome: Outcome,
        *,
        strategy: str = "default",
        duration: float | None = None,
        new_stock: int | None = None,
    ) -> None:
        """Record a reservation the app timed itself (the plain-function form)."""
        try:
            if outcome == "success":
                self.metrics.reservation_success(sku, strategy)
                if new_stock is not None and new_stock < 0:
                    self.metrics.inventory_negative(sku)
            elif outcome in catalog.CONFLICT_REASONS:
                self.metrics.reservation_conflict(sku, outcome)
            elif outcome != "error":
                raise ValueError(f"unknown outcome {outcome!r}")
            if duration is not None:
                self.metrics.reservation_duration(outcome, duration)
        except Exception as exc:
            self.internal_error("api", exc)

    # --- orders, payments, refunds ---------------------------------------------------------

    def payment_callback(
        self,
        sku: str,
        *,
        qty: int = 1,
        order_id: str | None = None,
        payment_reference: str | None = None,
        checkout_context: Mapping[str, str] | None = None,
    ) -> PaymentCallback:
        """A context manager for one payment callback, linked to its checkout's span."""
        return PaymentCallback(
            self,
            sku,
            qty,
            _ids(order_id=order_id, payment_reference=payment_reference),
            checkout_context,
        )

    def record_paid_order(
        self,
        sku: str,
        *,
        order_id: str | None = None,
        payment_reference: str | None = None,
    ) -> None:
        """Count one paid order."""
        try:
            self.metrics.order_paid(sku)
        except Exception as exc:
            self.internal_error("metrics", exc)
        self._log(
            "info",
            "order_paid",
            sku=sku,
            **_ids(order_id=order_id, payment_reference=payment_reference),
        )

    def record_refund_due_to_oversell(self, sku: str, *, order_id: str | None = None) -> None:
        """Count one refund issued because the stock had been oversold."""
        try:
            self.metrics.refund_due_to_oversell(sku)
        except Exception as exc:
            self.internal_error("metrics", exc)
        self._log("warning", "refund_due_to_oversell", sku=sku, **_ids(order_id=order_id))

    def record_negative_inventory(self, sku: str, *, stock: int) -> None:
        """Count one stock write that left ``sku`` at ``stock`` below zero."""
        try:
            self.metrics.inventory_negative(sku)
        except Exception as exc:
            self.internal_error("metrics", exc)
        self._log("warning", "inventory_negative", sku=sku, stock=stock)

    # --- idempotency and cache -------------------------------------------------------------

    def record_idempotency_replay(self, operation: str, *, key: str | None = None) -> None:
        """Count one request answered from its stored result (same key, same payload)."""
        try:
            self.metrics.idempotency_replay(operation)
        except Exception as exc:
            self.internal_error("metrics", exc)
        self._log("info", "idempotency_replay", operation=operation, **_ids(idempotency_key=key))

    def record_idempotency_conflict(self, operation: str, *, key: str | None = None) -> None:
        """Count one reuse of an idempotency key with a different payload."""
        try:
            self.metrics.idempotency_conflict(operation)
        except Exception as exc:
            self.internal_error("metrics", exc)
        self._log(
            "warning", "idempotency_conflict", operation=operation, **_ids(idempotency_key=key)
        )

    def record_stale_cache_hit(
        self,
        cache: str,
        *,
        sku: str | None = None,
        cached: int | None = None,
        actual: int | None = None,
    ) -> None:
        """Count one stock decision taken on a cached value the database contradicted."""
        try:
            self.metrics.cache_stale_hit(cache)
        except Exception as exc:
            self.internal_error("metrics", exc)
        self._log(
            "warning",
            "cache_stale_hit",
            cache=cache,
            **_ids(sku=sku, cached=cached, actual=actual),
        )


# --- the process-wide instance -------------------------------------------------------------

_default: Sentry | None = None
_default_lock = threading.Lock()


def configure(
    *,
    registry: CollectorRegistry | None = REGISTRY,
    promo_skus: Iterable[str] = (),
    max_skus: int = 100,
    max_label_length: int = 64,
    log: bool = True,
    trace: bool = True,
    tracer_provider: TracerProvider | None = None,
    error_log_interval: float = 60.0,
) -> Sentry:
    """Install the process-wide :class:`Sentry` the module functions use, and return it.

    Calling it again replaces the previous instance and unregisters its metrics.
    Set-up code: it raises on bad arguments (for example ``max_skus < 0``).
    """
    global _default
    sentry = None
    with _default_lock:
        if _default is not None:
            _default.close()
        sentry = Sentry(
            registry=registry,
            promo_skus=promo_skus,
            max_skus=max_skus,
            max_label_length=max_label_length,
            log=log,
            trace=trace,
            tracer_provider=tracer_provider,
            error_log_interval=error_log_interval,
        )
        _default = sentry
    return sentry


def get_sentry() -> Sentry:
    """The process-wide :class:`Sentry`, created with defaults on first use.

    First use is run time, so it never raises: if the default registry already holds
    stocksentry's metrics (the app built its own ``Sentry()`` there), the process-wide
    instance records into no registry and the clash is counted and logged once.
    """
    global _default
    sentry = _default
    if sentry is not None:
        return sentry
    with _default_lock:
        if _default is None:
            try:
                _default = Sentry()
            except ValueError as exc:
                _default = Sentry(registry=None)
                _default.internal_error("api", exc)
        return _default


def reservation(
    sku: str,
    *,
    strategy: str = "default",
    qty: int = 1,
    request_id: str | None = None,
    idempotency_key: str | None = None,
    order_id: str | None = None,
) -> Reservation:
    """:meth:`Sentry.reservation` on the process-wide instance."""
    return get_sentry().reservation(
        sku,
        strategy=strategy,
        qty=qty,
        request_id=request_id,
        idempotency_key=idempotency_key,
        order_id=order_id,
    )


def reserves(
    *, strategy: str = "default", sku: str | None = None, sku_arg: str = "sku"
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """:meth:`Sentry.reserves` on the process-wide instance (looked up at each call)."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        # Resolve the instance per call, so configure() after decoration still applies.
        signature_check = inspect.signature(func)
        if sku is None and sku_arg not in signature_check.parameters:
            raise TypeError(f"{func.__qualname__} has no argument {sku_arg!r} for the SKU")
        wrapped_by: dict[int, Callable[P, R]] = {}

        def resolve() -> Callable[P, R]:
            sentry = get_sentry()
            key = id(sentry)
            inner = wrapped_by.get(key)
            if inner is None:
                wrapped_by.clear()
                inner = wrapped_by[key] = sentry.reserves(
                    strategy=strategy, sku=sku, sku_arg=sku_arg
                )(func)
            return inner

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await cast(Any, resolve())(*args, **kwargs)

            return cast(Callable[P, R], async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            return resolve()(*args, **kwargs)

        return wrapper

    return decorate


def payment_callback(
    sku: str,
    *,
    qty: int = 1,
    order_id: str | None = None,
    payment_reference: str | None = None,
    checkout_context: Mapping[str, str] | None = None,
) -> PaymentCallback:
    """:meth:`Sentry.payment_callback` on the process-wide instance."""
    return get_sentry().payment_callback(
        sku,
        qty=qty,
        order_id=order_id,
        payment_reference=payment_reference,
        checkout_context=checkout_context,
    )


def record_reservation(
    sku: str,
    outcome: Outcome,
    *,
    strategy: str = "default",
    duration: float | None = None,
    new_stock: int | None = None,
) -> None:
    """:meth:`Sentry.record_reservation` on the process-wide instance."""
    get_sentry().record_reservation(
        sku, outcome, strategy=strategy, duration=duration, new_stock=new_stock
    )


def record_paid_order(
    sku: str, *, order_id: str | None = None, payment_reference: str | None = None
) -> None:
    """:meth:`Sentry.record_paid_order` on the process-wide instance."""
    get_sentry().record_paid_order(sku, order_id=order_id, payment_reference=payment_reference)


def record_refund_due_to_oversell(sku: str, *, order_id: str | None = None) -> None:
    """:meth:`Sentry.record_refund_due_to_oversell` on the process-wide instance."""
    get_sentry().record_refund_due_to_oversell(sku, order_id=order_id)


def record_negative_inventory(sku: str, *, stock: int) -> None:
    """:meth:`Sentry.record_negative_inventory` on the process-wide instance."""
    get_sentry().record_negative_inventory(sku, stock=stock)


def record_idempotency_replay(operation: str, *, key: str | None = None) -> None:
    """:meth:`Sentry.record_idempotency_replay` on the process-wide instance."""
    get_sentry().record_idempotency_replay(operation, key=key)


def record_idempotency_conflict(operation: str, *, key: str | None = None) -> None:
    """:meth:`Sentry.record_idempotency_conflict` on the process-wide instance."""
    get_sentry().record_idempotency_conflict(operation, key=key)


def record_stale_cache_hit(
    cache: str, *, sku: str | None = None, cached: int | None = None, actual: int | None = None
) -> None:
    """:meth:`Sentry.record_stale_cache_hit` on the process-wide instance."""
    get_sentry().record_stale_cache_hit(cache, sku=sku, cached=cached, actual=actual)
