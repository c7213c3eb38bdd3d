"""The checklist's "is the monitor on?": did the shop's own monitoring see what the drill
caused? Each problem (oversell, negative stock, duplicate order, stale availability) must
show in one of the catalog's metrics at ``metrics_url`` (against a scrape taken before
the first scenario) or in one of the alerts at ``prometheus_url``, within
``observability.wait``."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from typing import TYPE_CHECKING, Final

from stocksentry.instrumentation import catalog

from .scenarios import ScenarioResult
from .wire import Request, send_one

if TYPE_CHECKING:
    from .scenarios import Drill

__all__ = ["SIGNALS", "Unreadable", "observability", "scrape"]

#: Per problem: the metric samples and the alerts that show it.
SIGNALS: Final[dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "oversell": (
        (
            catalog.OVERSOLD_UNITS.name,
            catalog.INVENTORY_NEGATIVE.name,
            catalog.UNSAFE_READ_MODIFY_WRITE.name,
            catalog.NEGATIVE_INVENTORY_UNITS.name,
        ),
        (
            "StockOversold",
            "StockNegativeInventory",
            "StockNegativeWrite",
            "StockUnsafeReadModifyWrite",
        ),
    ),
    "negative_stock": (
        (catalog.INVENTORY_NEGATIVE.name, catalog.NEGATIVE_INVENTORY_UNITS.name),
        ("StockNegativeInventory", "StockNegativeWrite"),
    ),
    "duplicate_orders": ((catalog.DUPLICATE_ORDER_KEYS.name,), ("StockDuplicateOrders",)),
    "stale_availability": (
        (catalog.CACHE_STALE_HIT.name, catalog.CACHE_DRIFT_SKUS.name),
        ("StockStaleCacheDecisions", "StockCacheDrift"),
    ),
}
#: The lock waits the drill caused, as a figure.
LOCK_WAITS: Final = f"{catalog.DB_LOCK_WAIT.name}_count"
#: How often the monitoring is asked again while the drill waits for it.
POLL_S: Final = 1.0


class Unreadable(Exception):
    """The monitoring could not be read; ``str()`` says what and why."""


async def _get(url: str, wait_s: float) -> bytes:
    response = await send_one(Request("GET", url), wait_s=wait_s)
    if response.error is not None or response.status != 200:
        raise Unreadable(f"{url} answered {response.error or response.status}")
    return response.body


async def scrape(url: str, wait_s: float) -> dict[str, float]:
    """The samples of ``url`` summed by name; :class:`Unreadable` when they cannot be read."""
    from prometheus_client.parser import text_string_to_metric_families

    body = await _get(url, wait_s)
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    except ValueError as exc:
        raise Unreadable(f"{url} is not a Prometheus text page: {exc}") from None
    return totals


async def _alerts(url: str, wait_s: float) -> set[str]:
    endpoint = urllib.parse.urljoin(url.rstrip("/") + "/", "api/v1/alerts")
    body = await _get(endpoint, wait_s)
    try:
        alerts = json.loads(body)["data"]["alerts"]
        return {str(a["labels"]["alertname"]) for a in alerts if a.get("state") != "inactive"}
    except (ValueError, KeyError, TypeError):
        raise Unreadable(f"{endpoint} did not answer Prometheus's alerts document") from None


def _seen(name: str, before: dict[str, float], after: dict[str, float]) -> bool:
    value = after.get(name, after.get(f"{name}_total", 0.0))
    was = before.get(name, before.get(f"{name}_total", 0.0))
    # A gauge above zero shows the problem now; a counter must have grown in the drill.
    return value > was or (not name.endswith(("_total", "_count")) and value > 0)


def caused(results: list[ScenarioResult]) -> list[str]:
    """The problems the earlier scenarios found, as :data:`SIGNALS` names them."""
    found: list[str] = []
    for result in results:
        f = result.figures
        if result.name == "burst" and result.passed is False:
            found.append("oversell")
            if f.get("final_stock", 0) < 0:
                found.append("negative_stock")
        if result.name in ("retry", "duplicate_callback") and f.get("duplicated_keys"):
            found.append("duplicate_orders")
        if result.name == "stale_availability" and result.passed is False:
            found.append("stale_availability")
    return list(dict.fromkeys(found))


async def observability(drill: Drill) -> ScenarioResult:
    """Ask the monitoring whether it saw each problem the drill caused."""
    rule = drill.config.observability
    result = drill.begin("observability")
    problems = caused(drill.results)
    wait_s = drill.config.target.timeout
    failures: list[str] = []
    seen: dict[str, list[str]] = {problem: [] for problem in problems}
    deadline = time.monotonic() + rule.wait
    after: dict[str, float] = {}
    firing: set[str] = set()
    while True:
        try:
            if rule.metrics_url is not None:
                what = "the monitor is off"
                after = await scrape(rule.metrics_url, wait_s)
            if rule.prometheus_url is not None:
                what = "the alerts cannot be read"
                firing = await _alerts(rule.prometheus_url, wait_s)
        except Unreadable as exc:
            failures.append(f"{what}: {exc}")
            break
        for problem in problems:
            metrics, alert_names = SIGNALS[problem]
            seen[problem] = [m for m in metrics if _seen(m, drill.baseline, after)]
            seen[problem] += [a for a in alert_names if a in firing]
        if all(seen.values()) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(POLL_S)
    monitored = any(name.startswith(("stock_", "stocksentry_")) for name in after)
    if rule.metrics_url is not None and not failures and not monitored:
        failures.append(f"the monitor is off: no stocksentry metrics at {rule.metrics_url}")
    if not failures:
        for problem in problems:
            if not seen[problem]:
                metrics, alert_names = SIGNALS[problem]
                shown = ", ".join((*metrics, *(alert_names if rule.prometheus_url else ())))
                failures.append(
                    f"the drill caused {problem.replace('_', ' ')} but the monitoring showed"
                    f" none of: {shown} (within {rule.wait:g} s)"
                )
    result.figures.update(
        caused=problems,
        seen=seen,
        lock_waits=int(after.get(LOCK_WAITS, 0.0) - drill.baseline.get(LOCK_WAITS, 0.0)),
        alerts=sorted(firing),
    )
    result.judge(*[(True, failure) for failure in failures])
    return result
