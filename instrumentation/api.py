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

The module is the facade of the recording API; the parts live by role in
:mod:`.outcomes`, :mod:`.reservation`, :mod:`.payment` and :mod:`.sentry`.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ParamSpec, TypeVar, cast

from opentelemetry.trace import TracerProvider
from prometheus_client import CollectorRegistry
from prometheus_client.registry import REGISTRY

from .catalog import ConflictReason, Outcome
from .outcomes import ReservationConflict, classify_exception
from .payment import PaymentCallback
from .reservation import Reservation, current_reservation
from .sentry import Sentry

__all__ = [
    "ConflictReason",
    "Outcome",
    "PaymentCallback",
    "Reservation",
    "ReservationConflict",
    "Sentry",
    "classify_exception",
    "configure",
    "current_reservation",
    "get_sentry",
    "payment_callback",
    "record_idempotency_conflict",
    "record_idempotency_replay",
    "record_negative_inventory",
    "record_paid_order",
    "record_refund_due_to_oversell",
    "record_reservation",
    "record_stale_cache_hit",
    "reservation",
    "reserves",
]

P = ParamSpec("P")
R = TypeVar("R")

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
