"""The payment callback handle: a span linked to the checkout, and the paid-order count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from . import catalog
from .events import PAYMENT_CALLBACK
from .handle import BlockHandle
from .tracing import link_from_carrier

if TYPE_CHECKING:
    from .sentry import Sentry


class PaymentCallback(BlockHandle):
    """A payment callback: a span linked to the checkout, and the paid-order count (one
    for a block that ends without an exception and without another mark)."""

    def __init__(
        self,
        sentry: Sentry,
        sku: str,
        qty: int,
        ids: dict[str, object],
        checkout: Mapping[str, str] | None,
    ) -> None:
        super().__init__(sentry, sku, qty, ids)
        self.checkout = checkout
        self._mark: Literal["paid", "replay", "refund", "failed"] = "paid"

    def replay(self) -> None:
        """This callback repeats one already processed: count a replay, not a payment."""
        self._mark = "replay"

    def refund_due_to_oversell(self) -> None:
        """The payment went through but the stock was oversold: count paid and refund."""
        self._mark = "refund"

    def failed(self) -> None:
        """The payment did not go through: count nothing."""
        self._mark = "failed"

    def _enter(self) -> None:
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
                self._use_span(span)
        except Exception as exc:
            sentry.internal_error("tracing", exc)

    def _exit(self, exc: BaseException | None) -> None:
        sentry = self._sentry
        mark = self._mark if exc is None else "failed"
        if self._misuse is not None:
            sentry.internal_error("api", TypeError(self._misuse))
        else:
            try:
                if mark in ("paid", "refund"):
                    sentry.metrics.count(catalog.ORDERS_PAID, self.sku)
                if mark == "refund":
                    sentry.metrics.count(catalog.REFUND_DUE_TO_OVERSELL, self.sku)
                elif mark == "replay":
                    sentry.metrics.count(catalog.IDEMPOTENCY_REPLAY, "payment_callback")
            except Exception as err:
                sentry.internal_error("metrics", err)
        sentry.log_event(PAYMENT_CALLBACK, sku=self.sku, result=mark, **self.ids)
        span = self._span
        if span is not None:
            self._end_span(span, "stock.payment_result", mark, exc is not None, exc)
