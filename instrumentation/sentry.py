"""The :class:`Sentry`: metrics, SKU guard, logger and tracer, and every recording method."""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar, cast

import structlog
from opentelemetry import trace as otel_trace
from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from prometheus_client.registry import REGISTRY

from . import catalog, events
from .catalog import UNKNOWN_SKU, MetricSpec, Outcome
from .events import LogEvent
from .freezeview import FreezeSettings, FreezeView, as_settings
from .handle import misuse
from .metrics import StockMetrics
from .payment import PaymentCallback
from .reservation import Reservation
from .tracing import TRACER_NAME

P = ParamSpec("P")
R = TypeVar("R")

_stdlib_log = logging.getLogger("stocksentry")


def _ids(**ids: object) -> dict[str, object]:
    return {key: value for key, value in ids.items() if value is not None}


class Sentry:
    """stocksentry's recording state: metrics, SKU guard, logger and tracer.

    ``registry`` takes a prometheus_client ``CollectorRegistry`` (``None`` registers
    nowhere); ``promo_skus`` always get their own series and ``max_skus`` bounds the others;
    ``log`` and ``trace`` switch the log lines and spans; ``tracer_provider`` defaults to the
    global OpenTelemetry one; ``conflict_on`` lists the exception types the app raises to
    answer a buyer "sold out" (a reservation they end is ``out_of_stock``, not ``error``,
    as with the web frameworks' HTTP 4xx exceptions). ``freeze`` (a Redis URL or client,
    or :class:`~stocksentry.instrumentation.freezeview.FreezeSettings`) makes
    :meth:`reservation` refuse a frozen SKU (docs/containment.md).

    Log lines go to the ``logger`` given, else to structlog once the application
    configured it: a library must not print, and structlog's unconfigured default prints
    every line to stdout.
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
        freeze: FreezeSettings | str | Any = None,
        conflict_on: Iterable[type[BaseException]] = (),
    ) -> None:
        promo_skus = _checked_settings(promo_skus, max_skus, max_label_length, error_log_interval)
        self.conflict_on = _answer_types(conflict_on)
        freeze_settings = as_settings(freeze)
        self.metrics = StockMetrics(
            registry,
            promo_skus=promo_skus,
            max_skus=max_skus,
            max_label_length=max_label_length,
        )
        self._log_wanted = log
        self._own_logger = logger is not None
        self.logger: Any = logger if logger is not None else structlog.get_logger("stocksentry")
        self.tracer = (
            otel_trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider) if trace else None
        )
        self.error_log_interval = error_log_interval
        self._error_lock = threading.Lock()
        self._error_last: dict[str, float] = {}
        self._error_suppressed: dict[str, int] = {}
        #: The local view of frozen SKUs that :meth:`reservation` checks; ``None`` without
        #: ``freeze``.
        self.freeze_view: FreezeView | None = None
        if freeze_settings is not None:
            self.freeze_view = FreezeView(
                freeze_settings, on_error=lambda exc: self.internal_error("freeze", exc)
            )
            self.freeze_view.start()

    @property
    def log_enabled(self) -> bool:
        """Whether log lines are written now: ``log`` is on, and a ``logger`` was given or
        structlog is configured (looked up at each line, so configuring later applies)."""
        return self._log_wanted and (self._own_logger or structlog.is_configured())

    @log_enabled.setter
    def log_enabled(self, value: bool) -> None:
        self._log_wanted = value

    def close(self) -> None:
        """Unregister this instance's metrics from its registry; stop following freezes."""
        self.metrics.unregister()
        if self.freeze_view is not None:
            self.freeze_view.stop()

    def reopen(self) -> None:
        """Register this instance's metrics again after :meth:`close`."""
        self.metrics.register()
        if self.freeze_view is not None:
            self.freeze_view.start()

    # --- failures inside stocksentry -----------------------------------------------------

    def internal_error(self, component: str, exc: BaseException) -> None:
        """Count and (rate-limited) log a failure inside the instrumentation. Never raises."""
        # The counter is the last resort: if it fails too there is nothing left to tell.
        with contextlib.suppress(Exception):
            self.metrics.count(catalog.INSTRUMENTATION_ERRORS, component)
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
            # The catalogued fields ride along as extras: the JSON bridge of
            # configure_logging() puts them in the line.
            _stdlib_log.warning(
                "stocksentry instrumentation error in %s: %s: %s (%d similar suppressed)",
                component,
                type(exc).__name__,
                exc,
                suppressed,
                extra={"component": component, "error": type(exc).__name__},
            )
        except Exception:  # noqa: S110 - logging failed too; the counter already has it
            pass

    def sku(self, value: object) -> Any:
        """The SKU the app gave, as the label the series use: an ``int`` (a product id, as
        many shops pass it) as its decimal string, UTF-8 ``bytes`` decoded. ``None`` and
        undecodable bytes become :data:`~.catalog.UNKNOWN_SKU`, counted as an ``api``
        error. Any other type is returned as it is, for the type check to refuse."""
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, (bytes, bytearray)):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                pass
        elif value is not None:
            return value
        self.internal_error("api", ValueError(f"no usable SKU: recorded as {UNKNOWN_SKU}"))
        return UNKNOWN_SKU

    def _misused(self, **values: object) -> bool:
        """Whether an app-provided value has the wrong type; if so, counted as an ``api``
        error, so the caller records nothing (all of an event's series or none)."""
        problem = misuse(**values)
        if problem is None:
            return False
        self.internal_error("api", TypeError(problem))
        return True

    def log_event(self, event: LogEvent, **fields: Any) -> None:
        """Write one line of ``event`` when logging is on; a failure is counted, not raised."""
        if not self.log_enabled:
            return
        try:
            getattr(self.logger, event.level)(event.name, **fields)
        except Exception as exc:
            self.internal_error("logging", exc)

    # --- reservations --------------------------------------------------------------------

    def reservation(
        self,
        sku: str | int,
        *,
        strategy: str = "default",
        qty: int = 1,
        request_id: str | None = None,
        idempotency_key: str | None = None,
        order_id: str | None = None,
        conflict_on: Iterable[type[BaseException]] = (),
    ) -> Reservation:
        """A context manager (``with`` or ``async with``) recording one reservation;
        ``conflict_on`` adds answer types to the instance's for this one.

        With ``freeze`` configured, entering it raises
        :class:`~stocksentry.instrumentation.outcomes.SkuFrozen` when the SKU is frozen.
        """
        ids = _ids(request_id=request_id, idempotency_key=idempotency_key, order_id=order_id)
        answers = self.conflict_on
        if conflict_on:
            try:
                answers = answers + _answer_types(conflict_on)
            except (TypeError, ValueError) as exc:
                self.internal_error("api", exc)
        return Reservation(self, self.sku(sku), strategy, qty, ids, answers)

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
        """
        return reserving(lambda: self, strategy=strategy, sku=sku, sku_arg=sku_arg)

    def record_reservation(
        self,
        sku: str | int,
        outcome: Outcome,
        *,
        strategy: str = "default",
        duration: float | None = None,
        new_stock: int | None = None,
    ) -> None:
        """Record a reservation the app timed itself (the plain-function form)."""
        label: str = self.sku(sku)  # a wrong type is refused by _misused below
        # Everything checked before the first series is touched: all or nothing.
        if self._misused(
            sku=label, outcome=outcome, strategy=strategy, duration=duration, new_stock=new_stock
        ):
            return
        if outcome not in catalog.OUTCOMES:
            self.internal_error("api", ValueError(f"unknown outcome {outcome[:64]!r}"))
            return
        try:
            self.metrics.reservation_finished(label, strategy, outcome, duration)
            if outcome == "success" and new_stock is not None and new_stock < 0:
                self.metrics.count(catalog.INVENTORY_NEGATIVE, label)
        except Exception as exc:
            # The values were checked above: what fails here is the metrics backend.
            self.internal_error("metrics", exc)

    # --- orders, payments, refunds ---------------------------------------------------------

    def payment_callback(
        self,
        sku: str | int,
        *,
        qty: int = 1,
        order_id: str | None = None,
        payment_reference: str | None = None,
        checkout_context: Mapping[str, str] | None = None,
    ) -> PaymentCallback:
        """A context manager for one payment callback, linked to its checkout's span."""
        return PaymentCallback(
            self,
            self.sku(sku),
            qty,
            _ids(order_id=order_id, payment_reference=payment_reference),
            checkout_context,
        )

    def record_paid_order(
        self,
        sku: str | int,
        *,
        order_id: str | None = None,
        payment_reference: str | None = None,
    ) -> None:
        """Count one paid order."""
        ids = {"order_id": order_id, "payment_reference": payment_reference}
        self._event(catalog.ORDERS_PAID, events.ORDER_PAID, {"sku": self.sku(sku)}, **ids)

    def record_refund_due_to_oversell(
        self, sku: str | int, *, order_id: str | None = None
    ) -> None:
        """Count one refund issued because the stock had been oversold."""
        fields = {"sku": self.sku(sku)}
        self._event(
            catalog.REFUND_DUE_TO_OVERSELL,
            events.REFUND_DUE_TO_OVERSELL,
            fields,
            order_id=order_id,
        )

    def record_negative_inventory(self, sku: str | int, *, stock: int) -> None:
        """Count one stock write that left ``sku`` at ``stock`` below zero."""
        fields = {"sku": self.sku(sku), "stock": stock}
        self._event(catalog.INVENTORY_NEGATIVE, events.INVENTORY_NEGATIVE, fields)

    # --- idempotency and cache -------------------------------------------------------------

    def record_idempotency_replay(self, operation: str, *, key: str | None = None) -> None:
        """Count one request answered from its stored result (same key, same payload)."""
        fields = {"operation": operation}
        self._event(
            catalog.IDEMPOTENCY_REPLAY, events.IDEMPOTENCY_REPLAY, fields, idempotency_key=key
        )

    def record_idempotency_conflict(self, operation: str, *, key: str | None = None) -> None:
        """Count one reuse of an idempotency key with a different payload."""
        fields = {"operation": operation}
        self._event(
            catalog.IDEMPOTENCY_CONFLICT, events.IDEMPOTENCY_CONFLICT, fields, idempotency_key=key
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
        if not self._misused(cache=cache, cached=cached, actual=actual):
            ids = {"sku": sku, "cached": cached, "actual": actual}
            self._event(catalog.CACHE_STALE_HIT, events.CACHE_STALE_HIT, {"cache": cache}, **ids)

    def _event(
        self, spec: MetricSpec, event: LogEvent, checked: dict[str, Any], **ids: object
    ) -> None:
        """Count ``spec`` under the first ``checked`` value, then log ``event`` with the
        ``checked`` values and the ``ids`` that are not ``None``. Nothing when a ``checked``
        value has the wrong type (counted as an ``api`` error); a metrics failure is counted
        as a ``metrics`` error, not raised."""
        if self._misused(**checked):
            return
        try:
            self.metrics.count(spec, next(iter(checked.values())))
        except Exception as exc:
            self.internal_error("metrics", exc)
        self.log_event(event, **checked, **_ids(**ids))


def _checked_settings(
    promo_skus: object, max_skus: object, max_label_length: object, error_log_interval: object
) -> tuple[str, ...]:
    """The promo SKUs as labels, once every setting is checked: set-up code raises one
    clear error naming the argument, so a wrong type fails at ``configure()``, not at the
    first reservation (and a string is never taken for a list of one-letter SKUs)."""
    if isinstance(promo_skus, (str, bytes)) or not isinstance(promo_skus, Iterable):
        raise TypeError(
            f"promo_skus must be a list of SKUs (promo_skus=['EGG-01']), got "
            f"{type(promo_skus).__name__}"
        )
    skus = tuple(promo_skus)
    for sku in skus:
        if isinstance(sku, bool) or not isinstance(sku, (str, int)):
            raise TypeError(
                f"promo_skus: each SKU must be a str or an int, got {type(sku).__name__}"
            )
    for name, value in (("max_skus", max_skus), ("max_label_length", max_label_length)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if isinstance(max_skus, int) and max_skus < 0:
        raise ValueError(f"max_skus must be >= 0, got {max_skus}")
    interval = error_log_interval
    if isinstance(interval, bool) or not isinstance(interval, (int, float)):
        raise TypeError(f"error_log_interval must be seconds, got {type(interval).__name__}")
    return tuple(str(sku) for sku in skus)


def _answer_types(types: object) -> tuple[type[BaseException], ...]:
    """``conflict_on`` as a tuple for ``isinstance``; anything but exception classes is
    refused with one error naming the argument."""
    if isinstance(types, type):
        types = (types,)
    if not isinstance(types, Iterable) or isinstance(types, (str, bytes)):
        raise TypeError(f"conflict_on must be exception classes, got {type(types).__name__}")
    found = tuple(types)
    for kind in found:
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise TypeError(f"conflict_on must be exception classes, got {kind!r:.80}")
    return found


def reserving(
    resolve: Callable[[], Sentry], *, strategy: str, sku: str | None, sku_arg: str
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The decorator of :meth:`Sentry.reserves`, recording on ``resolve()``'s instance."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(func)
        if sku is None and sku_arg not in signature.parameters:
            raise TypeError(f"{func.__qualname__} has no argument {sku_arg!r} for the SKU")

        def sku_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if sku is not None:
                return sku
            try:
                bound = signature.bind_partial(*args, **kwargs)
            except TypeError:  # the call itself fails, inside the reservation
                return "unknown"
            bound.apply_defaults()
            value = bound.arguments.get(sku_arg)
            if value is None or isinstance(value, (str, int, bytes, bytearray)):
                return value  # reservation() makes it a label (Sentry.sku)
            return str(value)  # another type (a UUID, say): labelled by its text

        if inspect.iscoroutinefunction(func):
            async_func = cast(Callable[..., Awaitable[Any]], func)

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                handle = resolve().reservation(sku_of(args, kwargs), strategy=strategy)
                async with handle:
                    result = await async_func(*args, **kwargs)
                    if result is False and handle.outcome is None:
                        handle.conflict("out_of_stock")
                    return result

            return cast(Callable[P, R], async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with resolve().reservation(sku_of(args, kwargs), strategy=strategy) as handle:
                result = func(*args, **kwargs)
                if result is False and handle.outcome is None:
                    handle.conflict("out_of_stock")
                return result

        return wrapper

    return decorate
