"""The lab's containment run (``stocksentry demo --contain``): unsafe again, with the chain on.

The first unsafe run shows what a flash sale oversells while people read the page. The
second sells another SKU (:data:`CONTAINED_SKU`) the same way, through the whole chain the
product ships: the app's metrics and the exporter's oversold probe, Prometheus evaluating
the shipped rules every second, Alertmanager routing the oversell alerts to the exporter's
freeze webhook (``mode: enforce``), the freeze in Redis, and the lab's checkout refusing
the SKU as soon as its freeze view hears of it. Both runs are paced (``--pace``): a real
sale lasts minutes, the lab's unsafe burst about three seconds, shorter than the chain.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from stocksentry.instrumentation.freezeview import FreezeSettings, FreezeView, read_frozen

from .config import LabError, StrategyResult, sku_for
from .driver import delete_redis_keys, run_strategy
from .shop import LabRun

#: The SKU the contained run sells (the first run sells ``LAB-UNSAFE``).
CONTAINED_SKU: Final = "LAB-UNSAFE-CONTAINED"
#: The strategy name the contained run reports under.
CONTAINED: Final = "unsafe+contain"
#: The lab's freeze keys and channel (deleted at the end).
KEY_PREFIX: Final = "stocksentry-lab:freeze:"
KEY_TEMPLATE: Final = KEY_PREFIX + "{sku}"
CHANNEL: Final = "stocksentry-lab:freeze-changes"
#: Seconds each unsafe sale lasts with ``--contain`` unless ``--pace`` says otherwise.
DEFAULT_PACE_S: Final = 40.0
#: How long an automatic freeze holds in the lab (the run is shorter).
EXPIRY: Final = "10m"


def exporter_section(redis_url: str) -> dict[str, Any]:
    """The exporter's ``containment`` section in the lab: enforce, the lab's keys."""
    return {
        "url": redis_url,
        "key_template": KEY_TEMPLATE,
        "channel": CHANNEL,
        "mode": "enforce",
        "expiry": EXPIRY,
        # Every strategy of a full run may oversell: none is refused by the limit.
        "max_auto_frozen": 50,
        "resync_interval": "1s",
    }


def alertmanager_config(webhook_url: str) -> dict[str, Any]:
    """Alertmanager routing the oversell alerts of :data:`CONTAINED_SKU` to the freeze
    webhook at once: the example's route (alert_rules/alertmanager.example.yml), with
    nothing else."""
    return {
        "route": {
            "receiver": "null",
            "routes": [
                {
                    # Only the contained run's SKU: the first run is the sale without
                    # containment, nothing of it frozen.
                    "matchers": [
                        'alertname=~"StockOversold|StockNegativeInventory|StockNegativeWrite"',
                        f'sku="{CONTAINED_SKU}"',
                    ],
                    "receiver": "stocksentry-freeze",
                    "group_by": ["alertname", "sku"],
                    "group_wait": "0s",
                    "group_interval": "1s",
                    "repeat_interval": "10m",
                }
            ],
        },
        "receivers": [
            {"name": "null"},
            {
                "name": "stocksentry-freeze",
                "webhook_configs": [{"url": webhook_url, "send_resolved": True}],
            },
        ],
    }


def clear_freezes(client: Any) -> None:
    """Delete the lab's freeze keys (before the runs and after them)."""
    delete_redis_keys(client, KEY_PREFIX)


def run_contained(lab: LabRun) -> StrategyResult:
    """Sell :data:`CONTAINED_SKU` with the unsafe strategy while the lab's checkout honours
    freezes; the result reports as :data:`CONTAINED`."""
    config = lab.config
    if config.redis_url is None:
        raise LabError("--contain needs Redis (the freezes live there)")
    sentry = lab.sentry
    view = FreezeView(
        FreezeSettings(config.redis_url, key_template=KEY_TEMPLATE, channel=CHANNEL),
        on_error=lambda exc: sentry.internal_error("freeze", exc),
    )
    view.start()
    try:
        if not view.wait_synced(10.0):
            raise LabError("the freeze view could not read Redis within 10 s")
        sentry.freeze_view = view
        result = run_strategy(lab, "unsafe", sku=CONTAINED_SKU)
    finally:
        sentry.freeze_view = None
        view.stop()
    frozen = read_frozen(lab.redis, KEY_TEMPLATE).get(CONTAINED_SKU) if lab.redis else None
    note = (
        f"frozen by {frozen.by or frozen.source} ({frozen.source})"
        if frozen is not None
        else "never frozen"
    )
    return dataclasses.replace(result, strategy=CONTAINED, notes=(*result.notes, note))


def containment(results: list[StrategyResult]) -> dict[str, Any] | None:
    """``{"oversold_without", "oversold_with", "seconds_to_freeze"}`` from the two unsafe
    runs, or ``None`` when either did not run. ``seconds_to_freeze``: from the contained
    run's first oversold unit to its first refusal (``None`` when it never oversold or was
    never refused)."""
    without = next((r for r in results if r.sku == sku_for("unsafe") and not r.skipped), None)
    within = next((r for r in results if r.strategy == CONTAINED and not r.skipped), None)
    if without is None or within is None:
        return None
    seconds = None
    if within.first_oversell_at is not None and within.first_refused_at is not None:
        seconds = round(max(0.0, within.first_refused_at - within.first_oversell_at), 2)
    return {
        "oversold_without": without.oversold,
        "oversold_with": within.oversold,
        "seconds_to_freeze": seconds,
    }


def containment_lines(figures: dict[str, Any], pace_s: float) -> list[str]:
    """The report's lines on the two unsafe runs."""
    without, within = figures["oversold_without"], figures["oversold_with"]
    saved = without - within
    share = f" ({100 * saved / without:.0f} % fewer)" if without > 0 else ""
    seconds = figures["seconds_to_freeze"]
    timing = (
        f"{seconds:g} s from the first oversold unit to the checkout refusing the SKU"
        if seconds is not None
        else "the SKU was never refused (no freeze reached the checkout)"
    )
    return [
        f"containment: unsafe oversold {without} units without containment, {within} with it:"
        f" {saved} units saved{share}; {timing}. Both sales paced over {pace_s:g} s: the"
        " app's metrics, the exporter's probe, Prometheus on the shipped rules, Alertmanager,"
        " the exporter's freeze webhook, Redis, the checkout's freeze view.",
    ]
