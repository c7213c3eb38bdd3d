"""The process-wide :class:`Sentry` (:func:`configure`) and the module functions that
record on it; like the Sentry's methods, they never raise into the application at run
time (:meth:`Sentry.internal_error`)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from .sentry import Sentry, reserving

P = ParamSpec("P")
R = TypeVar("R")

_default: Sentry | None = None
_default_lock = threading.Lock()


def _installing(build: Callable[P, Sentry]) -> Callable[P, Sentry]:
    def configure(*args: P.args, **kwargs: P.kwargs) -> Sentry:
        """Install the process-wide :class:`Sentry` the module functions use, and return
        it; the arguments are :class:`Sentry`'s.

        Calling it again replaces the previous instance and unregisters its metrics.
        Set-up code: it raises on bad arguments (for example ``max_skus < 0``).
        """
        global _default
        with _default_lock:
            # The old instance's metrics go first (the new one registers the same names),
            # and come back if the new settings are refused: a bad call changes nothing.
            old = _default
            if old is not None:
                old.close()
            try:
                _default = build(*args, **kwargs)
            except Exception:
                if old is not None:
                    old.reopen()
                raise
            return _default

    return configure


configure = _installing(Sentry)


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


def _forward(method: Callable[Concatenate[Sentry, P], R]) -> Callable[P, R]:
    """``method`` of :class:`Sentry`, called on the process-wide instance."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return method(get_sentry(), *args, **kwargs)

    return call


reservation = _forward(Sentry.reservation)
payment_callback = _forward(Sentry.payment_callback)
record_reservation = _forward(Sentry.record_reservation)
record_paid_order = _forward(Sentry.record_paid_order)
record_refund_due_to_oversell = _forward(Sentry.record_refund_due_to_oversell)
record_negative_inventory = _forward(Sentry.record_negative_inventory)
record_idempotency_replay = _forward(Sentry.record_idempotency_replay)
record_idempotency_conflict = _forward(Sentry.record_idempotency_conflict)
record_stale_cache_hit = _forward(Sentry.record_stale_cache_hit)


def reserves(
    *, strategy: str = "default", sku: str | None = None, sku_arg: str = "sku"
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """:meth:`Sentry.reserves` on the process-wide instance (looked up at each call, so
    :func:`configure` after decoration still applies)."""
    return reserving(get_sentry, strategy=strategy, sku=sku, sku_arg=sku_arg)
