"""``stocksentry demo --serve``: the lab's checkout strategies as an HTTP shop.

Each strategy is a checkout endpoint, ``POST /checkout/<strategy>`` with a JSON body
``{"sku": ..., "qty": ..., "request_id": ..., "idempotency_key": ...,
"payment_reference": ...}``, on one product row (``LAB-DRILL``, stock 0 until a drill
sets it), so ``stocksentry drill`` has a shop to run against out of the box: ``unsafe``
oversells under a burst, ``atomic`` does not; ``retry_no_key`` orders a retried intent
twice, ``retry_idempotent`` once (it claims the key in the order's transaction, so two
copies at once are one order too). With Redis (``--redis``, or the embedded one) the lock
strategies too: ``naive_lock`` (its TTL runs out under the work) oversells, ``redlock``
does not. ``GET /availability/<strategy>?sku=`` says whether the
SKU is on sale (``stale_cache``: from a copy refreshed every ``--cache-refresh-ms``);
``PUT /stock`` (``{"sku", "stock"}``) is the shop's own reset; ``GET /metrics`` its
instrumentation.

200 ``{"ok": true}`` is a sale, 409 ``{"ok": false, "outcome": ...}`` a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import socket
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from .config import IDEMPOTENT_OPERATION, LabConfig, LabError
from .driver import delete_redis_keys
from .run import connect_redis, instrument_lab_engine, prime_counters
from .shop import (
    Buyer,
    Shop,
    connect_and_prepare,
    create_engine,
    idempotency_keys,
    normalize_url,
    orders,
    prepare_product,
    products,
    select_stock,
    update_returning,
)
from .strategies import STRATEGIES, Strategy, atomic

__all__ = ["DRILL_SKU", "SERVED", "ServedShop", "serve_shop"]

#: The product row the HTTP shop sells (any other SKU in a request is a 404).
DRILL_SKU: Final = "LAB-DRILL"
#: The strategies served: the ones that need no Redis lock and one product row.
SERVED: Final = (
    "unsafe",
    "check_then_decrement",
    "atomic",
    "for_update",
    "retry_no_key",
    "retry_idempotent",
    "stale_cache",
)
#: Served besides when the shop has Redis (``--redis``, or the embedded one).
SERVED_WITH_REDIS: Final = ("naive_lock", "redlock")


class Replayed(Exception):
    """The intent's key was already claimed: answer with its stored outcome."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


def idempotent_checkout(shop: Shop, r: Any, buyer: Buyer) -> None:
    """The atomic update behind an idempotency claim in the same transaction: the key's
    row is inserted first, so a second copy of the intent waits on it and then finds it
    taken (:class:`Replayed`), whether it came after the first or at the same moment."""
    shop.work()
    try:
        with shop.engine.begin() as conn:
            conn.execute(
                idempotency_keys.insert().values(
                    idempotency_key=buyer.idempotency_key,
                    sku=shop.sku,
                    outcome="pending",
                    created_at=datetime.now(UTC),
                )
            )
            written = shop.decrement_if_available(conn)
            outcome = "success" if written is not None else "out_of_stock"
            if written is not None:
                shop.insert_order(conn, buyer, written)
            conn.execute(
                idempotency_keys.update()
                .where(idempotency_keys.c.idempotency_key == buyer.idempotency_key)
                .values(outcome=outcome)
            )
    except sa.exc.IntegrityError:
        with shop.engine.connect() as conn:
            stored = conn.execute(
                sa.select(idempotency_keys.c.outcome).where(
                    idempotency_keys.c.idempotency_key == buyer.idempotency_key
                )
            ).scalar_one_or_none()
        shop.sentry.record_idempotency_replay(IDEMPOTENT_OPERATION, key=buyer.idempotency_key)
        raise Replayed(str(stored or "pending")) from None
    if written is None:
        r.conflict("out_of_stock")
    else:
        r.success(old_stock=written + shop.config.quantity, new_stock=written)


def callback_check_then_insert(shop: Shop, r: Any, buyer: Buyer) -> None:
    """The payment callback as it is often written: look for the payment's order, and
    without one take the stock and write it. Two deliveries at once both look first."""
    with shop.engine.connect() as conn:
        known = conn.execute(
            sa.select(sa.func.count())
            .select_from(orders)
            .where(orders.c.external_ref == buyer.external_ref)
        ).scalar_one()
    if known:
        raise Replayed("success")
    atomic(shop, r, buyer)


def callback_idempotent(shop: Shop, r: Any, buyer: Buyer) -> None:
    """The payment callback behind a claim of its payment reference (as
    :func:`idempotent_checkout` claims an intent's key)."""
    claimed = dataclasses.replace(buyer, idempotency_key=f"payment:{buyer.external_ref}")
    idempotent_checkout(shop, r, claimed)


#: The payment callback's variants, ``POST /callback/<mode>``.
CALLBACKS: Final[dict[str, Strategy]] = {
    "unsafe": callback_check_then_insert,
    "idempotent": callback_idempotent,
}


class ServedShop:
    """The shop behind the endpoints: its engine, instrumentation and stale cache."""

    def __init__(
        self, engine: Engine, config: LabConfig, sentry: Any, registry: Any, redis: Any = None
    ) -> None:
        self.engine = engine
        self.redis = redis
        #: The strategies this shop serves (the Redis locks only with Redis).
        self.served = SERVED + (SERVED_WITH_REDIS if redis is not None else ())
        self.registry = registry
        self.config = config
        self.sentry = sentry
        self.returning = update_returning(engine)
        self.product_ids: dict[str, int] = {}
        self.cached: dict[str, int] = {}
        self.pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="lab-http")

    def shop_for(self, sku: str, qty: int) -> Shop | None:
        """The strategy's view of the product ``sku`` (``None``: no such product)."""
        product_id = self.product_ids.get(sku)
        if product_id is None:
            return None
        return Shop(
            engine=self.engine,
            sku=sku,
            product_id=product_id,
            config=dataclasses.replace(self.config, quantity=qty),
            update_returning=self.returning,
            sentry=self.sentry,
            redis=self.redis,
            lock_key=f"{self.config.redis_prefix}http:{sku}:lock",
            lock_name=sku,
        )

    def checkout(
        self, name: str, shop: Shop, buyer: Buyer, strategy: Strategy | None = None
    ) -> tuple[str, bool]:
        """Run strategy ``name`` (or ``strategy`` under that name) for ``buyer``;
        ``(outcome, replayed)``."""
        if strategy is None:
            strategy = idempotent_checkout if name == "retry_idempotent" else STRATEGIES[name]
        try:
            with self.sentry.reservation(
                shop.sku,
                strategy=name,
                qty=shop.config.quantity,
                request_id=buyer.request_id,
                idempotency_key=buyer.idempotency_key,
            ) as handle:
                cached = self.cached.get(shop.sku) if name == "stale_cache" else None
                if cached is not None and cached < shop.config.quantity:
                    handle.conflict("out_of_stock")
                else:
                    strategy(shop, handle, buyer)
        except Replayed as replay:
            return replay.outcome, True
        return str(handle.outcome or "success"), False

    def available(self, name: str, sku: str) -> int:
        """The stock the shop shows: the cached copy for ``stale_cache``, else the row."""
        if name == "stale_cache" and sku in self.cached:
            return self.cached[sku]
        with self.engine.connect() as conn:
            return select_stock(conn, sku)

    def set_stock(self, sku: str, units: int) -> None:
        """Set ``sku``'s stock and allocation (``PUT /stock``)."""
        with self.engine.begin() as conn:
            conn.execute(
                products.update()
                .where(products.c.sku == sku)
                .values(available_stock=units, initial_stock=units)
            )

    def refresh(self) -> None:
        """Copy every product's stock into the cache (the late refresh)."""
        with self.engine.connect() as conn:
            for sku in self.product_ids:
                self.cached[sku] = select_stock(conn, sku)


def build_app(served: ServedShop) -> Any:
    """The aiohttp application of the HTTP shop."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def checkout(request: web.Request) -> web.Response:
        name = request.match_info["strategy"]
        if name not in served.served:
            return web.json_response({"ok": False, "error": f"no strategy {name}"}, status=404)
        return await sell(request, name, None)

    async def callback(request: web.Request) -> web.Response:
        mode = request.match_info["mode"]
        if mode not in CALLBACKS:
            return web.json_response({"ok": False, "error": f"no callback {mode}"}, status=404)
        return await sell(request, f"callback_{mode}", CALLBACKS[mode])

    async def sell(request: web.Request, name: str, strategy: Strategy | None) -> web.Response:
        try:
            body = await request.json()
            sku = str(body.get("sku", DRILL_SKU))
            qty = int(body.get("qty", 1))
        except (ValueError, TypeError, AttributeError):
            return web.json_response({"ok": False, "error": "expected a JSON object"}, status=400)
        shop = served.shop_for(sku, max(1, qty))
        if shop is None:
            return web.json_response({"ok": False, "error": f"no product {sku}"}, status=404)
        number = int(time.time_ns() % 1_000_000_000)
        request_id = str(body.get("request_id") or f"req-{number}")
        buyer = Buyer(
            number=number,
            request_id=request_id,
            idempotency_key=str(body.get("idempotency_key") or request_id),
            external_ref=str(body.get("payment_reference") or request_id),
        )
        loop = asyncio.get_running_loop()
        try:
            run = functools.partial(served.checkout, name, shop, buyer, strategy)
            outcome, replayed = await loop.run_in_executor(served.pool, run)
        except Exception as exc:
            return web.json_response({"ok": False, "error": type(exc).__name__}, status=500)
        ok = outcome == "success"
        return web.json_response(
            {"ok": ok, "outcome": outcome, "replayed": replayed}, status=200 if ok else 409
        )

    async def availability(request: web.Request) -> web.Response:
        name = request.match_info["strategy"]
        sku = request.query.get("sku", DRILL_SKU)
        if name not in served.served or sku not in served.product_ids:
            return web.json_response({"error": "unknown strategy or SKU"}, status=404)
        loop = asyncio.get_running_loop()
        stock = await loop.run_in_executor(served.pool, served.available, name, sku)
        return web.json_response({"sku": sku, "available": stock > 0, "stock": stock})

    async def stock(request: web.Request) -> web.Response:
        # The shop's own reset request: sets a product's stock (and its allocation).
        try:
            body = await request.json()
            sku, units = str(body["sku"]), int(body["stock"])
        except (ValueError, TypeError, KeyError, AttributeError):
            return web.json_response({"error": 'expected {"sku": ..., "stock": N}'}, status=400)
        if sku not in served.product_ids or units < 0:
            return web.json_response({"error": f"no product {sku}"}, status=404)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(served.pool, served.set_stock, sku, units)
        return web.json_response({"sku": sku, "stock": units})

    async def metrics(_request: web.Request) -> web.Response:
        text = generate_latest(served.registry)
        return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_post("/checkout/{strategy}", checkout)
    app.router.add_post("/callback/{mode}", callback)
    app.router.add_get("/availability/{strategy}", availability)
    app.router.add_get("/metrics", metrics)
    app.router.add_put("/stock", stock)
    return app


@contextlib.contextmanager
def serve_shop(
    database_url: str, config: LabConfig, *, host: str = "127.0.0.1", port: int = 0
) -> Iterator[tuple[int, ServedShop]]:
    """Serve the HTTP shop on ``host:port`` in a thread for the block; yields the bound
    port and the shop. Creates the lab's tables and the ``LAB-DRILL`` row (stock 0)."""
    from aiohttp import web
    from prometheus_client import CollectorRegistry
    from stocksentry.instrumentation import Sentry

    url = normalize_url(database_url)
    shown = url.render_as_string(hide_password=True)
    engine = create_engine(url, config.concurrency, config.isolation_level)
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, promo_skus=[DRILL_SKU], log=False, trace=False)
    redis_client = connect_redis(config.redis_url) if config.redis_url else None
    served = ServedShop(engine, config, sentry, registry, redis_client)
    # The SQL detector, as in the lab: the unsafe read-modify-writes show in /metrics.
    undo = instrument_lab_engine(engine, sentry)
    # Every counter at zero from the start: a series first seen at its final value has no
    # increase() to Prometheus, and a drill's burst would pass its alerts unseen.
    prime_counters(sentry, (), [DRILL_SKU])
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()
    bound: list[int] = []
    failure: list[BaseException] = []

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        runner = web.AppRunner(build_app(served), access_log=None)
        await runner.setup()
        try:
            # Our own socket: its bound port is known (port 0 picks a free one).
            sock = socket.create_server((host, port), reuse_port=False)
            await web.SockSite(runner, sock).start()
            bound.append(int(sock.getsockname()[1]))
            ready.set()
            refresh = config.cache_refresh_ms / 1000
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), refresh)
                with contextlib.suppress(sa.exc.SQLAlchemyError):
                    await loop.run_in_executor(served.pool, served.refresh)
        finally:
            await runner.cleanup()

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:
            failure.append(exc)
            ready.set()

    try:
        # Every connection opened now: the first burst races in the shop, not in connecting.
        connect_and_prepare(engine, shown, config.concurrency)
        served.product_ids[DRILL_SKU] = prepare_product(engine, DRILL_SKU, 0)
        served.refresh()
        thread = threading.Thread(target=run, name="lab-http-shop", daemon=True)
        thread.start()
        ready.wait(30)
        if failure or not bound:
            why = failure[0] if failure else "timed out"
            raise LabError(f"cannot serve the HTTP shop on {host}:{port}: {why}")
        try:
            yield bound[0], served
        finally:
            if stop is not None:
                loop.call_soon_threadsafe(stop.set)
            thread.join(30)
    finally:
        served.pool.shutdown(wait=False, cancel_futures=True)
        if undo is not None:
            undo()
        engine.dispose()
        loop.close()
        if redis_client is not None:
            delete_redis_keys(redis_client, f"{config.redis_prefix}http:")
            redis_client.close()


#: The drill file ``--serve`` writes in the current folder.
DRILL_FILE: Final = "stocksentry-drill.yaml"


def drill_file(port: int, database_url: str) -> str:
    """A drill file for the HTTP shop on ``port`` (its unsafe endpoint)."""
    base = f"http://127.0.0.1:{port}"
    return f"""\
# stocksentry drill against the lab's HTTP shop (stocksentry demo --serve).
# Another endpoint: --checkout-url {base}/checkout/atomic (or for_update,
# check_then_decrement, retry_no_key, retry_idempotent, stale_cache).
target:
  checkout:
    url: {base}/checkout/unsafe
    body: |
      {{"sku": "{{sku}}", "qty": {{qty}}, "request_id": "{{request_id}}",
       "idempotency_key": "{{idempotency_key}}",
       "payment_reference": "{{payment_reference}}"}}
  success:
    status: [200]
    json_field: ok
  # The payment callback (also /callback/idempotent), and what the buyer is shown.
  callback:
    url: {base}/callback/unsafe
    body: |
      {{"sku": "{{sku}}", "qty": {{qty}}, "request_id": "{{request_id}}",
       "payment_reference": "{{payment_reference}}"}}
  availability:
    request:
      method: GET
      url: {base}/availability/stale_cache?sku={{sku}}
database:
  url: "{database_url}"
schema:
  orders:
    idempotency_key: idempotency_key
drill:
  sku: {DRILL_SKU}
  stock: 10
  requests: 50
  concurrency: 20
  scenarios: [burst, retry]
  stale_threshold: 500ms
observability:
  metrics_url: {base}/metrics
  wait: 2s
"""


def run_serve(args: Any) -> int:
    """``stocksentry demo --serve``: the HTTP shop on the embedded servers (or
    ``--database``) until Ctrl-C or SIGTERM; returns 0."""
    import sys
    import tempfile
    from pathlib import Path

    from ..commandline import say
    from .cli import start_servers

    err = sys.stderr
    with contextlib.ExitStack() as stack:
        database_url, redis_url, embedded, _ = start_servers(args, stack, lambda t: say(err, t))
        shown = embedded or "the given database"
        if database_url is None:  # --sqlite
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="stocksentry-shop-"))
            database_url = f"sqlite:///{Path(folder) / 'shop.db'}"
            shown = "a temporary SQLite file"
        config = LabConfig(
            database_url=database_url,
            redis_url=redis_url,
            concurrency=args.concurrency,
            work_ms=args.work_ms,
            cache_refresh_ms=args.cache_refresh_ms,
            isolation_level=args.isolation,
        )
        port, served = stack.enter_context(serve_shop(database_url, config, port=args.port))
        Path(DRILL_FILE).write_text(drill_file(port, database_url), encoding="utf-8")
        base = f"http://127.0.0.1:{port}"
        for line in (
            f"the lab's HTTP shop on {shown}, selling {DRILL_SKU}:",
            f"  POST {base}/checkout/<strategy>",
            *textwrap.wrap(
                ", ".join(served.served), 76, initial_indent="    ", subsequent_indent="    "
            ),
            f"  POST {base}/callback/<unsafe|idempotent>",
            f"  GET  {base}/availability/<strategy>?sku={DRILL_SKU}",
            f"  GET  {base}/metrics",
            f"  PUT  {base}/stock",
            f"wrote {DRILL_FILE}; in another terminal:",
            f"  stocksentry drill --config {DRILL_FILE} --yes",
            f"  stocksentry drill --config {DRILL_FILE} --yes \\",
            f"      --checkout-url {base}/checkout/retry_idempotent",
            "Ctrl-C stops the shop",
        ):
            say(err, line)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            say(err, "stopping the HTTP shop")
    return 0
