"""The checklist's failure scenarios beyond the burst and the retry: a payment callback
delivered twice, and availability that keeps saying "available" after the sell-out."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from .scenarios import ScenarioResult, inconsistent, sold_nothing
from .truth import Unverifiable
from .wire import Request, send_one

if TYPE_CHECKING:
    from .scenarios import Drill

__all__ = ["duplicate_callback", "stale_availability"]

#: How often availability is asked while the drill waits for it to say sold out.
POLL_INTERVAL_S = 0.01


async def duplicate_callback(drill: Drill) -> ScenarioResult:
    """Each payment's callback delivered twice at once (a gateway that retries, a queue
    that redelivers): one paid order and one stock movement per payment reference."""
    config, settings = drill.config, drill.config.drill
    callback = config.target.callback
    payments = settings.callbacks
    result = drill.begin("duplicate_callback")
    result.figures.update(payments=payments, requests=2 * payments)
    kind = drill.shop.key_kind("external_ref")
    if callback is None or kind is None:
        raise Unverifiable("needs target.callback and schema.orders.external_ref mapped")
    # Stock for every payment taken twice: the stock never decides, the references do.
    stock = 2 * payments * settings.qty
    before = await drill.reset(stock)
    done = [0, 0, 2 * payments]
    numbers = range(1, payments + 1)
    if settings.callback_after_checkout:
        # The shop knows the payment from its checkout first.
        orders = drill.requests(config.target.checkout, "duplicate_callback", numbers)
        await drill.wave("duplicate_callback", orders, [0, 0, payments])
    pairs = drill.requests(callback, "duplicate_callback", numbers, (0, 1))
    wave = await drill.wave("duplicate_callback", pairs, done)
    drill.record(result, wave.responses)
    after, sold, duplicated, extra = await drill.orders_per_key(result, kind, before)
    result.figures.update(
        accepted=sum(r.error is None and 200 <= r.status < 300 for r in wave.responses)
    )
    result.judge(
        (
            bool(duplicated),
            f"duplicate paid orders per {kind}: {len(duplicated)} of {payments} payments"
            f" made more than one order ({extra} extra)",
        ),
        (
            sold > payments * settings.qty,
            f"stock taken twice: {sold} units sold for {payments} payments of"
            f" {settings.qty} unit(s)",
        ),
        inconsistent(after, sold, stock),
    )
    sold_nothing(config, result, sold, wave.responses, "the callbacks")
    return result


async def stale_availability(drill: Drill) -> ScenarioResult:
    """Sell the stock out through the checkout, then ask availability until it says sold
    out: how long it kept saying "available" (a cache that is not invalidated)."""
    config, settings = drill.config, drill.config.drill
    rule = config.target.availability
    if rule is None:
        raise Unverifiable("needs target.availability")
    threshold = settings.stale_threshold
    result = drill.begin("stale_availability")
    stock = settings.stock
    result.figures.update(stock=stock, threshold_ms=round(1000 * threshold, 1))
    await drill.reset(stock)
    [request] = drill.requests(rule.request, "stale", [0])
    limit = max(5 * threshold, 2.0)
    # A window can only be measured from "available": a cache that still shows an
    # earlier sell-out would pass for a fresh one.
    began = time.perf_counter()
    patience = max(limit, config.target.timeout)
    while not await _ask(drill, request, rule.json_field):
        if time.perf_counter() - began > patience:
            raise Unverifiable(
                f"availability did not say available within {patience:g} s of setting the stock"
            )
        await asyncio.sleep(POLL_INTERVAL_S)
    # One checkout at a time: a sell-out, not a race (even an unsafe checkout sells out).
    needed = math.ceil(stock / settings.qty)
    done = [0, 0, needed]
    for n in range(1, 3 * needed + 1):
        sale = drill.requests(config.target.checkout, "stale", [n])
        drill.record(result, (await drill.wave("stale_availability", sale, done)).responses)
        if (await asyncio.to_thread(drill.shop.snapshot)).stock < settings.qty:
            break
    else:
        raise Unverifiable(
            f"{3 * needed} checkouts one at a time did not sell out a stock of {stock}"
        )
    sold_out = time.perf_counter()
    polls = stale = 0
    window: float | None = None
    while time.perf_counter() - sold_out < limit:
        shown = await _ask(drill, request, rule.json_field)
        polls += 1
        if not shown:
            window = time.perf_counter() - sold_out
            break
        stale += 1
        await asyncio.sleep(POLL_INTERVAL_S)
    result.figures.update(
        polls=polls,
        stale_answers=stale,
        stale_window_ms=None if window is None else round(1000 * window, 1),
    )
    result.judge(
        (
            window is None,
            f"availability still said available {limit:g} s after the sell-out"
            f" (threshold {threshold:g} s)",
        ),
        (
            window is not None and window > threshold,
            f"availability said available for {1000 * (window or 0):.0f} ms after the sell-out"
            f" (threshold {1000 * threshold:.0f} ms): buyers are sent to a sold-out checkout",
        ),
    )
    return result


async def _ask(drill: Drill, request: Request, field: str) -> bool:
    """Whether availability says available now: ``field`` true, or a number above 0;
    :class:`Unverifiable` when it cannot be read."""
    response = await send_one(request, wait_s=drill.config.target.timeout)
    ok = response.error is None and 200 <= response.status < 300
    document = response.json() if ok else None
    value = document.get(field) if isinstance(document, dict) else None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value > 0
    raise Unverifiable(
        f"the availability request answered {response.error or response.status}"
        f" without a usable {field!r} field"
    )
