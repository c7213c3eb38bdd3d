"""Containment in the sidecar: the freeze gauge and Alertmanager's webhook.

:class:`Containment` follows the freezes in Redis with the instrumentation's own
:class:`~stocksentry.instrumentation.freezeview.FreezeView` (the gauge
``stocksentry_sku_frozen{sku}`` and ``stocksentry_freeze_actions_total{source,action}``
for every change it sees, whoever made it), and answers ``POST /alertmanager/freeze``:
each *firing* alert of the allowed names freezes the SKU in its ``sku`` label for
``expiry`` — in ``enforce`` mode; in ``dry_run`` it logs and counts what it would do. At
most ``max_auto_frozen`` SKUs are frozen by alerts at once; past it the webhook freezes no
more, logs and counts ``over_limit`` (an alert pages on it). A person's freeze is never
replaced nor lifted by an alert (the contract's scripts enforce it).

A hostile body (too big, not JSON, not Alertmanager's shape, a SKU with control
characters, only alerts it does not act on) gets a 4xx, one quiet log line, and changes
nothing. The route sits behind the same basic auth and TLS as ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.freeze import FREEZE_SOURCES, FreezeContractError, check_sku
from stocksentry.instrumentation.freezeview import (
    FreezeSettings,
    FreezeView,
    freeze_sku,
    read_frozen,
    unfreeze_sku,
)

from ..config.containment import WEBHOOK_PATH, ContainmentConfig
from . import scrub

LOGGER: Final = logging.getLogger("stocksentry.exporter.containment")
#: Frozen SKUs exported one series each at most; a person freezing more than this is told
#: by the log, and the gauge shows the first ones by name.
MAX_FROZEN_SERIES: Final = 1000
#: Alerts one webhook body may carry (Alertmanager's max_alerts is unbounded by default;
#: a group of this many is not a sale gone wrong but a misroute).
MAX_ALERTS: Final = 1000


class BadBody(Exception):
    """The webhook body is not one it acts on; ``status`` is the answer's."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


@dataclass(frozen=True, slots=True)
class Notice:
    """One alert of a webhook body that names a SKU: firing or resolved."""

    alertname: str
    sku: str
    firing: bool
    summary: str


class Containment:
    """The freeze gauge and counters (a collector), and the webhook's handler."""

    def __init__(self, config: ContainmentConfig) -> None:
        self.config = config
        self._url = config.url.reveal()
        self.settings = FreezeSettings(
            self._url,
            key_template=config.key_template,
            channel=config.channel,
            resync_interval=config.resync_interval,
            # The sidecar reports what Redis says; it keeps nothing stale for long.
            stale_after=max(config.resync_interval * 3, 15.0),
        )
        self.view = FreezeView(self.settings, on_error=self._view_error, on_change=self._counted)
        self.actions: dict[tuple[str, str], int] = {
            (source, action): 0 for source in FREEZE_SOURCES for action in catalog.FREEZE_ACTIONS
        }
        self._client: Any = None
        self._lock = asyncio.Lock()

    # --- the collector --------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """``stocksentry_sku_frozen`` from the view's snapshot, and the action counts."""
        spec = catalog.SKU_FROZEN
        gauge = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
        for sku in sorted(self.view.snapshot())[:MAX_FROZEN_SERIES]:
            gauge.add_metric([sku], 1.0)
        yield gauge
        spec = catalog.FREEZE_ACTION_COUNT
        counter = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        for (source, action), count in sorted(self.actions.items()):
            counter.add_metric([source, action], float(count))
        yield counter

    def _count(self, source: str, action: str) -> None:
        key = (source if source in FREEZE_SOURCES else "person", action)
        self.actions[key] = self.actions.get(key, 0) + 1

    def _counted(self, action: str, sku: str, source: str) -> None:
        # Called on the view's thread; an int increment under the GIL is enough here.
        self._count(source, action)
        LOGGER.info("freeze %s: %s (%s)", action, _shown(sku), source)

    def _view_error(self, exc: BaseException) -> None:
        LOGGER.warning("freeze view: %s", scrub(exc, self._url))

    # --- lifecycle ------------------------------------------------------------------------

    async def cleanup_ctx(self, app: object) -> AsyncIterator[None]:
        """For ``app.cleanup_ctx``: follow the freezes before ``yield``, stop after."""
        self._client = self.settings.client()
        self.view.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.view.stop)
            client, self._client = self._client, None
            if client is not None:
                await asyncio.to_thread(client.close)

    def routes(self) -> list[web.RouteDef]:
        """The webhook's route, for ``create_app(routes=...)``."""
        return [web.post(WEBHOOK_PATH, self.handle)]

    # --- the webhook ----------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        """``POST /alertmanager/freeze``: act on Alertmanager's notification."""
        try:
            body = await self._read(request)
            notices = parse_notification(body, self.config.alerts)
        except BadBody as exc:
            # Quiet: one line, never the body (it may be hostile, and huge).
            LOGGER.info("freeze webhook: refused (%d): %s", exc.status, exc)
            return web.json_response({"error": str(exc)}, status=exc.status)
        async with self._lock:  # the blast-radius count and the freezes, one body at a time
            try:
                results = await self._act(notices)
            except Exception as exc:
                LOGGER.warning("freeze webhook: Redis failed: %s", scrub(exc, self._url))
                # 5xx: Alertmanager retries it.
                return web.json_response({"error": "the freezes could not be written"}, status=503)
        return web.json_response({"mode": self.config.mode, "results": results})

    async def _read(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise BadBody(413, f"body of {length} bytes over the limit of {limit}")
        body = bytearray()
        async for chunk in request.content.iter_chunked(64 * 1024):
            body += chunk
            if len(body) > limit:
                raise BadBody(413, f"body over the limit of {limit} bytes")
        return bytes(body)

    async def _act(self, notices: list[Notice]) -> list[dict[str, str]]:
        config = self.config
        results: list[dict[str, str]] = []
        enforce = config.mode == "enforce"
        frozen: dict[str, str] | None = None  # SKU -> source, read once per body
        keys = {"key_template": config.key_template, "channel": config.channel}
        for notice in notices:
            result = {"alert": notice.alertname, "sku": notice.sku}
            results.append(result)
            if not notice.firing:
                if not config.unfreeze_on_resolved:
                    result["action"] = "none"
                elif not enforce:
                    result["action"] = "dry_run"
                    LOGGER.info(
                        "freeze webhook (dry run): would lift the alert's freeze of %s (%s "
                        "resolved)",
                        _shown(notice.sku),
                        notice.alertname,
                    )
                else:
                    outcome = await asyncio.to_thread(
                        unfreeze_sku, self._client, notice.sku, source="alert", **keys
                    )
                    result["action"] = outcome  # unfrozen, absent, or kept (a person's)
                continue
            if frozen is None:
                states = await asyncio.to_thread(read_frozen, self._client, config.key_template)
                frozen = {sku: s.source for sku, s in states.items() if s.active()}
            current = frozen.get(notice.sku)
            if current == "person":
                result["action"] = "kept"  # frozen by a person already: theirs to lift
                continue
            automatic = sum(1 for source in frozen.values() if source == "alert")
            if current is None and automatic >= config.max_auto_frozen:
                result["action"] = "over_limit"
                self._count("alert", "over_limit")
                LOGGER.warning(
                    "freeze webhook: not freezing %s (%s): %d SKUs are frozen by alerts "
                    "already, the limit (containment.max_auto_frozen); page on-call instead",
                    _shown(notice.sku),
                    notice.alertname,
                    automatic,
                )
                continue
            if not enforce:
                result["action"] = "dry_run"
                self._count("alert", "dry_run")
                frozen[notice.sku] = "alert"  # so the limit applies to the dry run too
                LOGGER.info(
                    "freeze webhook (dry run): would freeze %s for %ds (%s)",
                    _shown(notice.sku),
                    round(config.expiry),
                    notice.alertname,
                )
                continue
            summary = f"{notice.alertname}: {notice.summary}" if notice.summary else ""
            outcome, _ = await asyncio.to_thread(
                freeze_sku,
                self._client,
                notice.sku,
                reason=summary or notice.alertname,
                source="alert",
                ttl=config.expiry,
                by=notice.alertname,
                **keys,
            )
            result["action"] = outcome  # frozen, refreshed, or kept (a person's, meanwhile)
            if outcome != "kept":
                frozen[notice.sku] = "alert"
            LOGGER.warning(
                "freeze webhook: %s %s for %ds (%s)",
                outcome,
                _shown(notice.sku),
                round(config.expiry),
                notice.alertname,
            )
        return results


def parse_notification(body: bytes, allowed: tuple[str, ...]) -> list[Notice]:
    """The alerts of an Alertmanager webhook ``body`` this webhook acts on (allowed names
    with a ``sku`` label), or :class:`BadBody` for a body it refuses whole."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadBody(400, "body is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("alerts"), list):
        raise BadBody(400, "body is not an Alertmanager notification (no alerts list)")
    alerts: list[Any] = data["alerts"]
    if len(alerts) > MAX_ALERTS:
        raise BadBody(413, f"{len(alerts)} alerts in one notification, over {MAX_ALERTS}")
    notices: list[Notice] = []
    names: set[str] = set()
    for alert in alerts:
        labels = alert.get("labels") if isinstance(alert, dict) else None
        if not isinstance(labels, dict) or not isinstance(labels.get("alertname"), str):
            raise BadBody(400, "an alert without labels or alertname")
        name: str = labels["alertname"]
        names.add(name)
        sku = labels.get("sku")
        if name not in allowed or sku is None:
            continue  # not acted on, or location-wide (no SKU named): nothing to freeze
        try:
            check_sku(sku)
        except FreezeContractError as exc:
            raise BadBody(400, f"alert {_shown(name)}: sku label: {exc}") from None
        status = alert.get("status", "firing")
        if status not in ("firing", "resolved"):
            raise BadBody(400, "an alert whose status is neither firing nor resolved")
        annotations = alert.get("annotations")
        summary = annotations.get("summary", "") if isinstance(annotations, dict) else ""
        notices.append(Notice(name, sku, status == "firing", str(summary)[:300]))
    if not notices and names and not names & set(allowed):
        listed = ", ".join(sorted(_shown(n) for n in names)[:5])
        raise BadBody(422, f"no alert this webhook acts on (got {listed})")
    return notices


def _shown(text: str) -> str:
    """``text`` as a log may carry it: printable, at most 80 characters."""
    return repr(text[:80]) if not text.isprintable() else text[:80]
