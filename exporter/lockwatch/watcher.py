"""The lock watcher: a keyspace-notification subscription feeding a :class:`LeaseTracker`.

One asyncio task in the sidecar's loop, with one pipelined ``PTTL`` per batch for the
deadlines ``expire`` set; flags, disconnects and the health check: docs/lockwatch.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

import redis.asyncio as aioredis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.guard import LabelGuard

from ..config import LockWatchConfig, SkuGuardConfig
from .patterns import LockPatterns, missing_flags, refused_hint
from .tracker import LeaseTracker

LOGGER: Final = logging.getLogger("stocksentry.exporter.lockwatch")
#: Notifications applied in one batch (one ``PTTL`` pipeline) at most.
BATCH: Final = 512
_SWEEP_EVERY: Final = 5.0


class LockWatcher:
    """Follows the lock keys of ``config`` and exports what it saw (a collector)."""

    def __init__(self, config: LockWatchConfig, sku_guard: SkuGuardConfig | None = None) -> None:
        self.config = config
        guard_config = sku_guard or SkuGuardConfig()
        guard = LabelGuard(guard_config.max_skus, always=guard_config.promo_skus)
        self.patterns = LockPatterns(config.patterns, guard)
        self.tracker = LeaseTracker(
            self.patterns,
            max_tracked=config.max_tracked_locks,
            reacquire_window=config.reacquire_window,
            foreign_release_ratio=config.foreign_release_ratio,
        )
        self._task: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self.connected = False
        #: True/False once ``notify-keyspace-events`` was read; None when refused.
        self.notifications: bool | None = None
        self.reconnects = 0
        self._ever_connected = False
        self._down_since: float | None = None
        self._down_seconds = 0.0
        self._last_problem = ""

    async def start(self) -> None:
        """Start following (returns at once; connection errors are retried, logged)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="stocksentry-lockwatch")

    async def stop(self) -> None:
        """Stop following and close the connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_subscribed(self) -> None:
        """Return once the watcher is subscribed (bound it with ``asyncio.timeout``)."""
        await self._subscribed.wait()

    async def cleanup_ctx(self, app: object) -> AsyncIterator[None]:
        """For ``app.cleanup_ctx``: start before ``yield``, stop after."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await self._session()  # reports its own loss (see _session)
            await asyncio.sleep(self.config.reconnect_interval)

    def _lost(self, exc: BaseException) -> None:
        problem = f"{type(exc).__name__}: {exc}"
        if self.connected:
            self.connected = False
            self._subscribed.clear()
            self._down_since = time.monotonic()
            dropped = self.tracker.forget()
            LOGGER.warning(
                "lock_watch: lost the Redis subscription (%s); keyspace notifications are "
                "lost until it is back, %d followed lease(s) dropped",
                problem,
                dropped,
            )
        elif problem != self._last_problem:
            LOGGER.warning("lock_watch: cannot subscribe to Redis (%s); retrying", problem)
        self._last_problem = problem

    async def _session(self) -> None:
        config = self.config
        # redis-py's own health check sends PING but never waits for the answer: the
        # watcher checks with a deadline itself (_follow).
        client: aioredis.Redis = aioredis.Redis.from_url(
            config.url.reveal(),
            socket_connect_timeout=config.connect_timeout,
            socket_timeout=config.connect_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        pubsub: Any = None
        try:
            await client.ping()
            await self._check_notifications(client)
            database = int(client.connection_pool.connection_kwargs.get("db", 0) or 0)
            prefix = f"__keyspace@{database}__:"
            pubsub = client.pubsub()
            await pubsub.psubscribe(*(prefix + glob for glob in self.patterns.globs))
            await self._confirm(pubsub)
            self._on_subscribed()
            await self._follow(client, pubsub, len(prefix))
        except (RedisError, OSError, TimeoutError) as exc:
            # Reported before the connection is closed: closing may wait on a silent peer.
            self._lost(exc)
            raise
        finally:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                async with asyncio.timeout(config.connect_timeout):
                    if pubsub is not None:
                        await pubsub.aclose()
                    await client.aclose()

    async def _confirm(self, pubsub: Any) -> None:
        """Read Redis's replies to ``PSUBSCRIBE``: from then on no notification is missed."""
        wanted = len(self.patterns.globs)
        deadline = time.monotonic() + self.config.connect_timeout
        confirmed = 0
        while confirmed < wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Redis did not confirm PSUBSCRIBE")
            message = await pubsub.get_message(timeout=left)
            if message is not None and message.get("type") == "psubscribe":
                confirmed += 1

    def _on_subscribed(self) -> None:
        now = time.monotonic()
        if self._ever_connected:
            self.reconnects += 1
            if self._down_since is not None:
                self._down_seconds += now - self._down_since
            LOGGER.info("lock_watch: subscribed again")
        else:
            LOGGER.info(
                "lock_watch: following %s through keyspace notifications",
                ", ".join(self.config.patterns),
            )
        self._down_since = None
        self._ever_connected = True
        self.connected = True
        self._last_problem = ""
        self._subscribed.set()

    async def _check_notifications(self, client: aioredis.Redis) -> None:
        name = "notify-keyspace-events"
        try:
            reply = await client.config_get(name)
        except ResponseError as exc:
            # Managed Redis and ACL users without +config: the flags cannot be checked.
            if self.notifications is not False:
                LOGGER.warning(
                    "lock_watch: cannot read %s (%s); %s", name, exc, refused_hint(None)
                )
            self.notifications = None
            return
        current = _text(next(iter(reply.values()), b"")) if reply else ""
        missing = missing_flags(current)
        if missing and not self.config.configure_notifications:
            LOGGER.warning(
                "lock_watch: %s is %r and lacks %r, so lock events are not seen; %s",
                name,
                current,
                missing,
                refused_hint(missing),
            )
        elif missing:
            try:
                await client.config_set(name, current + missing)
            except ResponseError as exc:
                LOGGER.warning(
                    "lock_watch: CONFIG SET %s refused (%s); %s", name, exc, refused_hint(missing)
                )
            else:
                LOGGER.info(
                    "lock_watch: %s was %r, set it to %r (lock_watch.configure_notifications: "
                    "true)",
                    name,
                    current,
                    current + missing,
                )
                missing = ""
        elif self.notifications is not True:
            LOGGER.info("lock_watch: %s is %r, which has the flags it needs", name, current)
        self.notifications = not missing

    async def _follow(self, client: aioredis.Redis, pubsub: Any, prefix: int) -> None:
        tracker = self.tracker
        clock = time.monotonic
        quiet_for = self.config.health_check_interval
        deadline = self.config.connect_timeout
        last_sweep = last_heard = clock()
        ping_sent: float | None = None
        while True:
            due = last_heard + quiet_for if ping_sent is None else ping_sent + deadline
            message = await pubsub.get_message(timeout=max(0.0, min(1.0, due - clock())))
            now = clock()
            if now - last_sweep >= _SWEEP_EVERY:
                tracker.sweep(now)
                last_sweep = now
            if message is None:
                if ping_sent is not None and now - ping_sent >= deadline:
                    raise TimeoutError(f"no answer to PING within {deadline:g}s (health check)")
                if ping_sent is None and now - last_heard >= quiet_for:
                    async with asyncio.timeout(deadline):
                        await pubsub.ping()
                    ping_sent = now
                continue
            # Anything from Redis (a notification, the answer to PING) says the link works.
            last_heard, ping_sent = now, None
            batch: list[tuple[str, str, float]] = []
            while message is not None:
                if message.get("type") == "pmessage":
                    channel = _text(message["channel"])[prefix:]
                    batch.append((channel, _text(message["data"]), clock()))
                if len(batch) >= BATCH:
                    break
                message = await pubsub.get_message(timeout=0.0)
            await self._apply(client, batch)

    async def _apply(self, client: aioredis.Redis, batch: list[tuple[str, str, float]]) -> None:
        expiring = [key for key, event, _ in batch if event == "expire"]
        deadlines: dict[str, float | None] = {}
        if expiring:
            pipe = client.pipeline(transaction=False)
            for key in expiring:
                pipe.pttl(key)
            replies = await pipe.execute()
            read_at = time.monotonic()
            for key, pttl in zip(expiring, replies, strict=True):
                deadlines[key] = read_at + int(pttl) / 1000.0 if int(pttl) >= 0 else None
        apply = self.tracker.apply
        for key, event, when in batch:
            apply(key, event, when, deadlines.get(key) if event == "expire" else None)

    def collect(self) -> Iterator[Metric]:
        """The counts so far (no I/O)."""
        yield from self.tracker.families()
        spec = catalog.LOCKWATCH_CONNECTED
        yield GaugeMetricFamily(spec.name, spec.help, value=float(self.connected))
        if self.notifications is not None:
            spec = catalog.LOCKWATCH_NOTIFICATIONS
            yield GaugeMetricFamily(spec.name, spec.help, value=float(self.notifications))
        spec = catalog.LOCKWATCH_RECONNECTS
        yield CounterMetricFamily(spec.name, spec.help, value=float(self.reconnects))
        down = self._down_seconds
        if self._down_since is not None:
            down += time.monotonic() - self._down_since
        spec = catalog.LOCKWATCH_DISCONNECTED_SECONDS
        yield CounterMetricFamily(spec.name, spec.help, value=down)

    def describe(self) -> Iterator[Metric]:
        """Every family :meth:`collect` may yield (for registry name checks)."""
        return self.collect()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
