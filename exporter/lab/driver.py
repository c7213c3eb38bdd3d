"""The threaded sale: many buyers at once against one strategy, counted as they go."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from stocksentry.instrumentation import Reservation, classify_exception

from .config import (
    CACHE_NAME,
    IDEMPOTENT_OPERATION,
    OUTBOX_PUBLISHED_SHARE,
    PACE_WAVE,
    StrategyResult,
    cache_key_template,
    pace_offset,
    scenario_config,
    sku_for,
)
from .progress import PROGRESS_INTERVAL_S, Progress
from .readback import read_stock_by_id, strategy_result, unlabelled_totals
from .shop import (
    Buyer,
    LabRun,
    Shop,
    first_line,
    idempotency_keys,
    outbox,
    prepare_product,
    update_returning,
)
from .strategies import STRATEGIES

#: How often the stock is sampled for the report's stock-over-time chart.
SAMPLE_INTERVAL_S = 0.02
#: How often the outbox scenario's publisher looks for events to send on.
OUTBOX_PUBLISH_INTERVAL_S = 0.05


def run_strategy(lab: LabRun, name: str, sku: str | None = None) -> StrategyResult:
    """Reset the strategy's product row (``sku``, by default the strategy's own), let the
    buyers in, read the result back."""
    lab = dataclasses.replace(lab, config=scenario_config(lab.config, name))
    engine, sentry, registry, config = lab.engine, lab.sentry, lab.registry, lab.config
    progress = lab.progress
    strategy = STRATEGIES[name]
    sku = sku if sku is not None else sku_for(name)
    # The buyers' ids name the strategy, or the SKU of a second run of it (--contain).
    tag = name if sku == sku_for(name) else sku.lower()
    product_id = prepare_product(lab.side, sku, config.stock)
    second_sku = f"{sku}-B" if name == "deadlock" else ""
    second_id = prepare_product(lab.side, second_sku, config.stock) if second_sku else 0
    keys = f"{config.redis_prefix}{lab.run}:{name}"
    shop = Shop(
        engine=engine,
        sku=sku,
        product_id=product_id,
        config=config,
        update_returning=update_returning(engine),
        sentry=sentry,
        redis=lab.redis,
        lock_key=f"{keys}:lock",
        lock_name=name,
        second_sku=second_sku,
        second_product_id=second_id,
    )
    # Resubmits are answered from the idempotency store (intent key -> outcome).
    idempotent = config.retries > 0 and config.idempotency
    cache = None
    if config.stale_cache:
        cache_key = cache_key_template(config.redis_prefix).replace("{sku}", sku)
        cache = _StockCache(lambda: read_stock_by_id(lab.side, product_id), lab.redis, cache_key)
        cache.refresh()
    before = unlabelled_totals(registry, name)
    tally = Tally(stock=config.stock)
    started_at = time.time()
    gate = threading.Event()
    arrived = threading.Semaphore(0)
    stop = threading.Event()

    def reserve(buyer: Buyer) -> str:
        error: BaseException | None = None
        handle: Reservation | None = None
        reached = True
        stale = False
        start = time.perf_counter()
        try:
            with sentry.reservation(
                sku,
                strategy=name,
                qty=config.quantity,
                request_id=buyer.request_id,
                idempotency_key=buyer.idempotency_key,
            ) as handle:
                cached = cache.get() if cache is not None else None
                if cached is not None and cached < config.quantity:
                    # The cache says sold out: refused without asking the database.
                    reached = False
                    handle.conflict("out_of_stock")
                else:
                    strategy(shop, handle, buyer)
                    if cached is not None and handle.outcome == "out_of_stock":
                        # The cache said available, the database said no.
                        stale = True
                        sentry.record_stale_cache_hit(CACHE_NAME, sku=sku, cached=cached)
        except Exception as exc:
            # The reservation has recorded it (as an error or, for a lock timeout, a
            # conflict); one failed buyer must not stop the sale.
            error = exc
        elapsed = time.perf_counter() - start
        outcome = handle.outcome if handle is not None else None
        if outcome is None:
            outcome = classify_exception(error) if error is not None else "success"
        tally.add(outcome, elapsed, error, reached, stale)
        return outcome

    def submit(buyer: Buyer) -> None:
        key, table = buyer.idempotency_key, idempotency_keys
        try:
            if idempotent:
                with engine.connect() as conn:
                    stored = sa.select(table.c.outcome).where(table.c.idempotency_key == key)
                    answered = conn.execute(stored).first() is not None
                if answered:
                    sentry.record_idempotency_replay(IDEMPOTENT_OPERATION, key=key)
                    tally.bump("replays")
                    return
        except sa.exc.SQLAlchemyError as exc:
            tally.note(exc)
        outcome = reserve(buyer)
        if idempotent and outcome != "error":
            row = {"idempotency_key": key, "sku": sku, "outcome": outcome}
            try:
                with engine.begin() as conn:
                    conn.execute(table.insert().values(**row, created_at=datetime.now(UTC)))
            except sa.exc.SQLAlchemyError as exc:
                tally.note(exc)

    def buy(number: int) -> None:
        arrived.release()
        # Everyone in the first wave waits here, so they really collide.
        gate.wait()
        if config.pace_s > 0:
            # From the sale's start, set as the gate opens.
            due = started + pace_offset(number, config.buyers, config.pace_s)
            if stop.wait(max(0.0, due - time.perf_counter())):
                return
        if stop.is_set():
            return
        buyer = Buyer(
            number=number,
            request_id=f"req-{lab.run}-{tag}-{number}",
            idempotency_key=f"idem-{lab.run}-{tag}-{number}",
            external_ref=f"lab-{lab.run}-{tag}-{number}",
        )
        try:
            submit(buyer)
            if resubmits(number, config.retries):
                # The same intent again (a mobile retry, a proxy retry): new request id,
                # same idempotency key and external reference.
                tally.bump("resubmitted")
                submit(dataclasses.replace(buyer, request_id=buyer.request_id + "-retry"))
        finally:
            tally.bump("done")

    first_wave = min(config.concurrency, config.buyers)
    if config.pace_s > 0:
        first_wave = min(first_wave, PACE_WAVE)
    started = time.perf_counter()
    # The stock over time for the report's chart, in seconds from the sale's start.
    samples: list[tuple[float, int]] = []

    def snapshot(elapsed: float | None = None) -> Progress:
        with tally.lock:
            done, sold, conflicts, errors = tally.done, tally.sold, tally.conflicts, tally.errors
        elapsed = time.perf_counter() - started if elapsed is None else elapsed
        return Progress(name, done, config.buyers, sold, conflicts, errors, elapsed)

    def sample() -> None:
        stock = read_stock_by_id(lab.side, product_id)
        samples.append((round(time.perf_counter() - started, 4), stock))

    with ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="buyer") as pool:
        futures = [pool.submit(buy, n) for n in range(1, config.buyers + 1)]
        try:
            for _ in range(first_wave):
                arrived.acquire()
            started = time.perf_counter()
            samples.append((0.0, config.stock))
            gate.set()
            # What a sample or a cache refresh may meet from a busy or vanished server.
            transient: tuple[type[Exception], ...] = (sa.exc.SQLAlchemyError, OSError)
            if lab.redis is not None:
                import redis

                transient += (redis.RedisError,)
            timers = [(SAMPLE_INTERVAL_S, sample, "lab-sampler")]
            if progress is not None:
                show = progress.update
                timers.append((PROGRESS_INTERVAL_S, lambda: show(snapshot()), "lab-progress"))
            if cache is not None:
                timers.append((config.cache_refresh_ms / 1000, cache.refresh, "lab-cache"))
            if name == "outbox":
                limit = math.floor(OUTBOX_PUBLISHED_SHARE * config.stock)
                publish = _stalled_publisher(lab.side, sku, limit)
                timers.append((OUTBOX_PUBLISH_INTERVAL_S, publish, "lab-outbox"))
            with contextlib.ExitStack() as running:
                for interval, call, thread in timers:
                    running.enter_context(_every(interval, call, thread, transient))
                for future in futures:
                    future.result()
        except BaseException:
            # Ctrl-C: let the queued buyers return at once instead of running the sale out.
            stop.set()
            gate.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    wall = time.perf_counter() - started
    if cache is not None:
        # As an app's cache: stale after the sale until its next reload, not a moment less
        # (the sidecar's drift probe sees what buyers would have seen).
        time.sleep(
            max(0.0, cache.refreshed_at + config.cache_refresh_ms / 1000 - time.monotonic())
        )
        with contextlib.suppress(sa.exc.SQLAlchemyError):
            cache.refresh()
    with contextlib.suppress(sa.exc.SQLAlchemyError):
        sample()
    if progress is not None:
        progress.finish(snapshot(wall))
    if lab.redis is not None:
        delete_redis_keys(lab.redis, keys)
        if cache is not None:
            delete_redis_keys(lab.redis, cache_key)
    return strategy_result(lab, name, sku, product_id, tally, (started_at, wall), before, samples)


def delete_redis_keys(client: Any, prefix: str) -> None:
    """Delete the lab's keys under ``prefix`` (locks, pottery's, the stock cache), best
    effort: keys a vanished Redis keeps carry the run's id, the naive locks their TTL."""
    import redis

    # pottery puts "redlock:" in front of its keys.
    with contextlib.suppress(redis.RedisError, OSError):
        for pattern in (prefix + "*", "redlock:" + prefix + "*"):
            keys = list(client.scan_iter(match=pattern))
            if keys:
                client.delete(*keys)


@dataclass(slots=True)
class Tally:
    """Outcomes counted on the Python side, for live progress and the lab's own checks
    (``locked``: the reservations that reached the strategy, and so asked for its lock)."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    stock: int = 0
    #: When (Unix time) the first unit beyond ``stock`` was sold, and the first buyer was
    #: refused because the SKU was frozen.
    first_oversell_at: float | None = None
    first_refused_at: float | None = None
    done: int = 0
    reservations: int = 0
    locked: int = 0
    sold: int = 0
    conflicts: int = 0
    errors: int = 0
    resubmitted: int = 0
    replays: int = 0
    stale_hits: int = 0
    first_error: str | None = None
    latencies: list[float] = field(default_factory=list)

    def add(
        self, outcome: str, seconds: float, exc: BaseException | None, reached: bool, stale: bool
    ) -> None:
        with self.lock:
            self.reservations += 1
            self.locked += reached
            self.stale_hits += stale
            self.latencies.append(seconds)
            if outcome == "success":
                self.sold += 1
                if self.sold > self.stock and self.first_oversell_at is None:
                    self.first_oversell_at = round(time.time(), 3)
            elif outcome == "error":
                self.errors += 1
                self.note(exc)
            else:
                self.conflicts += 1
                if outcome == "frozen" and self.first_refused_at is None:
                    self.first_refused_at = round(time.time(), 3)

    def note(self, exc: BaseException | None) -> None:
        with self.lock:
            if self.first_error is None and exc is not None:
                self.first_error = f"{type(exc).__name__}: {first_line(exc)}"

    def bump(self, counter: str) -> None:
        with self.lock:
            setattr(self, counter, getattr(self, counter) + 1)


def resubmits(number: int, share: float) -> bool:
    """Whether buyer ``number`` (from 1) submits twice: ``floor(buyers * share)`` of them,
    spread evenly.

    >>> [n for n in range(1, 11) if resubmits(n, 0.3)]
    [4, 7, 10]
    """
    return math.floor(number * share) > math.floor((number - 1) * share)


@contextlib.contextmanager
def _every(
    interval: float, tick: Callable[[], None], name: str, skip: tuple[type[Exception], ...]
) -> Iterator[None]:
    """Call ``tick()`` every ``interval`` seconds in a thread for the block; a tick that
    raises one of ``skip`` (a server too busy for a sample) is skipped, anything else
    ends the thread loudly."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            with contextlib.suppress(*skip):
                tick()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class _StockCache:
    """The stock in a cache (a Redis key, else in memory), refreshed late: between
    refreshes it still says "available" after the last unit went."""

    def __init__(self, read: Callable[[], int], redis: Any, key: str) -> None:
        self.read, self.redis, self.key = read, redis, key
        self.value: int | None = None
        #: When it was last refreshed (``time.monotonic()``).
        self.refreshed_at = 0.0

    def refresh(self) -> None:
        self.refreshed_at = time.monotonic()
        self.value = self.read()
        if self.redis is not None:
            self.redis.set(self.key, self.value)

    def get(self) -> int | None:
        if self.redis is None:
            return self.value
        raw = self.redis.get(self.key)
        return None if raw is None else int(raw)


def _stalled_publisher(engine: Engine, sku: str, limit: int) -> Callable[[], None]:
    """The outbox's publisher: publishes up to ``limit`` events, then stalls, as one whose
    broker connection hung."""
    left = limit

    def publish() -> None:
        nonlocal left
        if left <= 0:
            return  # stalled
        with engine.begin() as conn:
            pending = outbox.c.sku == sku, outbox.c.published_at.is_(None)
            query = sa.select(outbox.c.id).where(*pending).order_by(outbox.c.id).limit(left)
            ids = conn.execute(query).scalars().all()
            if ids:
                published = outbox.update().where(outbox.c.id.in_(ids))
                conn.execute(published.values(published_at=datetime.now(UTC)))
        left -= len(ids)

    return publish
