"""The drill's scenarios: each sets the drill SKU's stock, sends its requests, then judges
by what the database holds, not by what the responses say (a checkout that answered 200
but wrote nothing, or 500 after it sold, counts as the database says)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .config import DrillConfig, RequestSpec
from .truth import Shop, Snapshot, Unverifiable
from .wire import Request, Response, WaveResult, send_one, send_wave

__all__ = ["Drill", "Engine", "ScenarioResult", "is_success", "sold_nothing", "success_of"]


@dataclass(slots=True)
class ScenarioResult:
    """One scenario's verdict (``passed`` ``None``: could not verify), its figures, and
    one line per failure naming it."""

    name: str
    passed: bool | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    unverified: str | None = None
    #: Seconds from release to response, of every request sent.
    latencies: list[float] = field(default_factory=list)
    #: ``(seconds from the start, succeeded)`` of every response, for the timeline.
    timeline: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``pass``, ``fail`` or ``unverified``."""
        return "unverified" if self.passed is None else "pass" if self.passed else "fail"

    def judge(self, *checks: tuple[bool, str]) -> None:
        """Keep the failure of each ``(failed, failure)`` check; pass when none failed."""
        self.failures = [failure for failed, failure in checks if failed]
        self.passed = not self.failures

    @property
    def notes(self) -> list[str]:
        """The failures, and why the scenario could not be verified."""
        unverified = [] if self.unverified is None else [f"not verified: {self.unverified}"]
        return [*self.failures, *unverified]

    def to_dict(self) -> dict[str, Any]:
        """The scenario in the JSON report."""
        data: dict[str, Any] = {"name": self.name, "passed": self.passed is True}
        data["verdict"] = self.verdict
        data.update(self.figures)
        data["failures"] = list(self.failures)
        if self.unverified is not None:
            data["unverified"] = self.unverified
        return data


def success_of(
    status: int, body: bytes, statuses: tuple[int, ...], json_field: str | None
) -> bool:
    """Whether a response of ``status`` and ``body`` is a sale: a status of ``statuses``
    and, when ``json_field`` is given, that field of the JSON body true or non-empty."""
    if status not in statuses:
        return False
    if json_field is None:
        return True
    try:
        value = json.loads(body)
    except ValueError:
        return False
    for part in json_field.split("."):
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return value is not None and value not in ("", 0, [], {})


def is_success(config: DrillConfig, response: Response) -> bool:
    """Whether a checkout response is a sale as ``target.success`` says."""
    if response.sale is not None:
        return response.sale
    if response.error is not None:
        return False
    rule = config.target.success
    return success_of(response.status, response.body, rule.status, rule.json_field)


def intent_values(
    run: str, scenario: str, n: int, sku: str, qty: int, copy: int = 0
) -> dict[str, str]:
    """The placeholders of intent ``n`` of ``scenario`` in drill ``run``."""
    intent = f"{run}-{scenario}-{n}"
    return {
        "sku": sku,
        "qty": str(qty),
        "n": str(n),
        "request_id": f"req-{intent}-{copy}",
        "idempotency_key": f"idem-{intent}",
        "payment_reference": f"pay-{intent}",
    }


def inconsistent(after: Snapshot, sold: int, stock: int, why: str = "") -> tuple[bool, str]:
    """The check that the final stock and the units sold add up to the ``stock`` set."""
    return (
        after.stock + sold != stock,
        f"stock inconsistent: final stock {after.stock} + {sold} units sold"
        f" = {after.stock + sold}, not {stock}{why}",
    )


def sold_nothing(
    config: DrillConfig, result: ScenarioResult, sold: int, responses: list[Response], what: str
) -> None:
    """Turn a pass into "not verified" when ``what`` sold nothing: no request succeeded and
    no unit was paid is a drill that never reached the shop's sale (a wrong URL or port, a
    shop that is down or refuses every request), not a safe checkout."""
    if not result.passed or sold > 0 or any(is_success(config, r) for r in responses):
        return
    first = responses[0] if responses else None
    answer = "no request sent" if first is None else first.error or f"status {first.status}"
    result.passed = None
    result.unverified = (
        f"{what} sold nothing ({len(responses)} requests, none succeeded; the first: {answer})"
    )


#: Progress callback: (scenario, requests done, requests in all, successes).
Tick = Callable[[str, int, int, int], None]
#: Another load engine for the burst: sends the drill's ``requests`` checkouts and returns
#: the responses and the arrival spread of each release.
Engine = Callable[["Drill"], Awaitable[tuple[list[Response], list[float]]]]


@dataclass(slots=True)
class Drill:
    """Runs the scenarios of one drill against one shop; ``run`` names this drill's keys."""

    config: DrillConfig
    shop: Shop
    run: str
    tick: Tick | None = None
    started: float = field(default_factory=time.perf_counter)
    #: The scenario running: what it measured so far stays when the database fails.
    current: ScenarioResult | None = None
    #: The scenarios run so far, and the monitoring's samples before the first.
    results: list[ScenarioResult] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)
    #: The burst's load engine; ``None``: this process, by waves.
    engine: Engine | None = None

    def begin(self, name: str) -> ScenarioResult:
        """The result of scenario ``name``, kept as :attr:`current`."""
        self.current = ScenarioResult(name)
        return self.current

    # --- requests -----------------------------------------------------------------------

    def requests(
        self,
        spec: RequestSpec,
        scenario: str,
        numbers: Iterable[int],
        copies: Iterable[int] = (0,),
    ) -> list[Request]:
        """``spec`` for each intent of ``numbers`` of ``scenario``, once per ``copies`` (a
        resubmit of the same intent: a new request id, the same keys)."""
        sku, qty = self.config.drill.sku, self.config.drill.qty
        return [
            Request(*spec.render(intent_values(self.run, scenario, n, sku, qty, c)))
            for n in numbers
            for c in copies
        ]

    async def wave(self, name: str, requests: list[Request], done: list[int]) -> WaveResult:
        """Send ``requests`` together (last-byte synchronised); counts into ``done``."""
        result = await send_wave(requests, wait_s=self.config.target.timeout)
        done[0] += len(requests)
        done[1] += sum(is_success(self.config, r) for r in result.responses)
        if self.tick is not None:
            self.tick(name, done[0], done[2], done[1])
        return result

    def record(self, result: ScenarioResult, responses: list[Response]) -> None:
        """Keep latencies and the timeline of ``responses``."""
        for response in responses:
            if response.error is None:
                result.latencies.append(response.latency)
            result.timeline.append(
                (round(response.done_at - self.started, 6), is_success(self.config, response))
            )

    # --- the database -------------------------------------------------------------------

    async def reset(self, stock: int) -> Snapshot:
        """Set the drill SKU's stock; returns the SKU as it then is."""
        reset = self.config.target.reset
        if reset is not None:
            # The reset request's {qty} is the stock to set.
            values = intent_values(self.run, "reset", 0, self.config.drill.sku, stock)
            request = Request(*reset.render(values))
            response = await send_one(request, wait_s=self.config.target.timeout)
            if response.error is not None or not 200 <= response.status < 300:
                why = response.error or f"status {response.status}"
                raise Unverifiable(f"the shop's reset request failed: {why}")
        else:
            await asyncio.to_thread(self.shop.set_stock, stock)
        snapshot = await asyncio.to_thread(self.shop.snapshot)
        if snapshot.stock != stock:
            raise Unverifiable(f"the stock was set to {stock} but reads {snapshot.stock}")
        return snapshot

    # --- scenarios ----------------------------------------------------------------------

    async def burst(self) -> ScenarioResult:
        """N checkouts against stock S, ``concurrency`` released together at a time."""
        settings = self.config.drill
        stock, qty, total = settings.stock, settings.qty, settings.requests
        result = self.begin("burst")
        result.figures.update(
            stock=stock, qty=qty, requests=total, concurrency=settings.concurrency
        )
        before = await self.reset(stock)
        done = [0, 0, total]
        responses: list[Response] = []
        spreads: list[float] = []
        checkout = self.config.target.checkout
        if self.engine is not None:
            responses, spreads = await self.engine(self)
            result.figures["engine"] = "locust"
        for start in range(0, total if self.engine is None else 0, settings.concurrency):
            numbers = range(start + 1, min(total, start + settings.concurrency) + 1)
            requests = self.requests(checkout, "burst", numbers)
            wave = await self.wave("burst", requests, done)
            responses += wave.responses
            spreads.append(wave.spread)
        self.record(result, responses)
        successes = sum(is_success(self.config, r) for r in responses)
        errors = [r for r in responses if r.error is not None or r.status >= 500]
        result.figures.update(
            successes=successes,
            refused=total - successes - len(errors),
            errors=len(errors),
            arrival_spread_ms=round(1000 * spreads[0], 3) if spreads else None,
            worst_arrival_spread_ms=round(1000 * max(spreads), 3) if spreads else None,
        )
        after = await asyncio.to_thread(self.shop.snapshot)
        sold = after.paid_units - before.paid_units
        oversold = max(0, sold - stock, successes * qty - stock)
        result.figures.update(
            final_stock=after.stock,
            units_sold=sold,
            oversold=oversold,
            negative_stock=after.stock < 0,
        )
        result.judge(
            (
                successes * qty > stock,
                f"successes exceed the stock: {successes} checkouts of {qty} unit(s)"
                f" succeeded against a stock of {stock} (oversold by {oversold})",
            ),
            (
                sold > stock,
                f"orders beyond the stock: {sold} units paid against a stock of {stock}",
            ),
            (after.stock < 0, f"final stock is negative: {after.stock}"),
            inconsistent(after, sold, stock, " (lost updates)"),
        )
        sold_nothing(self.config, result, sold, responses, "the burst")
        return result

    async def retry(self) -> ScenarioResult:
        """Each intent sent twice with the same keys: half one after the other (a client
        retry after its answer), half both at once (a gateway retry): one order each."""
        settings = self.config.drill
        intents = settings.retry_intents
        kind = self.shop.key_kind("idempotency_key")
        result = self.begin("retry")
        result.figures.update(intents=intents, requests=2 * intents)
        if kind is None:
            result.unverified = "neither schema.orders.idempotency_key nor external_ref is mapped"
            return result
        # Stock for every intent sold twice: the stock never decides, the keys do.
        stock = 2 * intents * settings.qty
        before = await self.reset(stock)
        checkout = self.config.target.checkout
        done = [0, 0, 2 * intents]
        sequential = range(1, intents // 2 + 1)
        together = range(intents // 2 + 1, intents + 1)
        responses: list[Response] = []
        for numbers, copies in ((sequential, (0,)), (sequential, (1,)), (together, (0, 1))):
            requests = self.requests(checkout, "retry", numbers, copies)
            if requests:
                responses += (await self.wave("retry", requests, done)).responses
        self.record(result, responses)
        _, sold, duplicated, extra = await self.orders_per_key(result, kind, before)
        result.figures.update(successes=sum(is_success(self.config, r) for r in responses))
        worst = max(duplicated.items(), key=lambda item: item[1], default=("", 0))
        result.judge(
            (
                bool(duplicated),
                f"duplicate orders per {kind}: {len(duplicated)} of {intents} intents"
                f" ordered more than once ({extra} extra orders; {worst[0]} has {worst[1]})",
            ),
            (
                sold > intents * settings.qty,
                f"retries sold {sold} units for {intents} intents of {settings.qty} unit(s)",
            ),
        )
        sold_nothing(self.config, result, sold, responses, "the retries")
        return result

    async def orders_per_key(
        self, result: ScenarioResult, kind: str, before: Snapshot
    ) -> tuple[Snapshot, int, dict[str, int], int]:
        """After a scenario of intents sent twice: the shop's state, the units sold since
        ``before``, the keys (of column ``kind``) of this run's scenario ordered more than
        once with their counts, and the extra orders; put in ``result``'s figures."""
        after = await asyncio.to_thread(self.shop.snapshot)
        sold = after.paid_units - before.paid_units
        prefix = "idem-" if kind == "idempotency_key" else "pay-"
        duplicated = await asyncio.to_thread(
            self.shop.orders_per_key, kind, f"{prefix}{self.run}-{result.name}-"
        )
        extra = sum(count - 1 for count in duplicated.values())
        result.figures.update(
            key_column=kind,
            duplicated_keys=len(duplicated),
            extra_orders=extra,
            units_sold=sold,
            final_stock=after.stock,
        )
        return after, sold, duplicated, extra
