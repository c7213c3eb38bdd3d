"""Freezes in Redis, read and written: the local view a checkout checks, and the operations.

:class:`FreezeView` keeps the set of frozen SKUs in memory, so checking one costs a dict
lookup, never a Redis round trip: a background thread subscribes to the freeze channel
(a change reaches the view as soon as Redis publishes it) and re-reads every key each
``resync_interval`` seconds (a message lost to a reconnect is caught then). Expiries are
applied locally from the value's ``expires_at``. When Redis cannot be reached the view
fails *open*: it keeps what it knew for ``stale_after`` seconds, then forgets it, so
checkout goes on; each failure goes to ``on_error`` (counted and logged by the
:class:`~stocksentry.instrumentation.Sentry`).

:func:`freeze_sku`, :func:`unfreeze_sku` and :func:`read_frozen` are the operations of the
``stocksentry freeze / unfreeze / frozen`` commands and of the sidecar's webhook, on a
redis-py client. This module imports redis only when it connects by URL.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .freeze import (
    DEFAULT_CHANNEL,
    DEFAULT_KEY_TEMPLATE,
    FreezeCall,
    FreezeContractError,
    FreezeSource,
    FreezeState,
    check_template,
    decoded,
    freeze_call,
    parse_message,
    scan_pattern,
    sku_of_key,
    unfreeze_call,
)

#: What :class:`FreezeView` tells its ``on_change`` callback: a freeze appeared, was lifted,
#: or ran out (its expiry passed).
ChangeAction = Literal["freeze", "unfreeze", "expire"]
#: Keys read per ``MGET`` while re-reading the whole set.
_BATCH = 500


@dataclass(frozen=True, slots=True)
class FreezeSettings:
    """Where the freezes live and how fresh the local view is kept.

    ``redis`` is a URL (``redis://host:6379/0``) or a redis-py (sync) client;
    ``key_template`` and ``channel`` are the contract's; ``resync_interval`` bounds how long
    a lost change message can leave the view behind; ``stale_after`` is how long the view
    keeps its freezes once Redis is unreachable before it fails open.

    Example::

        configure(freeze=FreezeSettings("redis://localhost:6379/0", resync_interval=2.0))
    """

    redis: Any
    key_template: str = DEFAULT_KEY_TEMPLATE
    channel: str = DEFAULT_CHANNEL
    resync_interval: float = 5.0
    stale_after: float = 30.0

    def __post_init__(self) -> None:
        target = self.redis
        if isinstance(target, str):
            if not target.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError("freeze: redis must be a redis://, rediss:// or unix:// URL")
            if importlib.util.find_spec("redis") is None:
                raise ImportError("freeze needs redis-py: pip install 'stocksentry[redis]'")
        elif not callable(getattr(target, "pubsub", None)) or not callable(
            getattr(target, "scan_iter", None)
        ):
            raise TypeError(
                f"freeze: redis must be a URL or a redis-py client, got {type(target).__name__}"
            )
        elif inspect.iscoroutinefunction(
            getattr(target, "get", None)
        ) or inspect.isasyncgenfunction(getattr(target, "scan_iter", None)):
            # redis.asyncio's commands are plain functions returning coroutines: only its
            # scan_iter (an async generator) tells it apart from the sync client.
            raise TypeError("freeze: redis must be a sync redis-py client (or a URL)")
        check_template(self.key_template)
        if not isinstance(self.channel, str) or not self.channel:
            raise TypeError("freeze: channel must be a non-empty str")
        for name in ("resync_interval", "stale_after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"freeze: {name} must be seconds, got {type(value).__name__}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"freeze: {name} must be > 0 seconds, got {value}")

    def client(self) -> Any:
        """A redis-py client: the one given, or a new one for the URL."""
        if not isinstance(self.redis, str):
            return self.redis
        import redis  # the optional extra, checked at construction

        return redis.Redis.from_url(self.redis, socket_connect_timeout=2.0, socket_timeout=5.0)


def as_settings(freeze: object) -> FreezeSettings | None:
    """``configure(freeze=...)``'s value as settings: ``None``, a URL or a client, or
    :class:`FreezeSettings`."""
    if freeze is None or isinstance(freeze, FreezeSettings):
        return freeze
    return FreezeSettings(freeze)


# --- operations ---------------------------------------------------------------------------


def _run(client: Any, call: FreezeCall) -> str:
    return decoded(client.eval(call.script, len(call.keys), *call.keys, *call.args))


def freeze_sku(
    client: Any,
    sku: str,
    *,
    reason: str,
    source: FreezeSource,
    ttl: float | None = None,
    by: str = "",
    key_template: str = DEFAULT_KEY_TEMPLATE,
    channel: str = DEFAULT_CHANNEL,
) -> tuple[str, FreezeState]:
    """Freeze ``sku``: ``("frozen" | "refreshed" | "kept", state)``; ``kept`` when an alert
    met a person's freeze, which it never replaces."""
    call, state = freeze_call(
        key_template, channel, sku, reason=reason, source=source, ttl=ttl, by=by
    )
    return _run(client, call), state


def unfreeze_sku(
    client: Any,
    sku: str,
    *,
    source: FreezeSource,
    key_template: str = DEFAULT_KEY_TEMPLATE,
    channel: str = DEFAULT_CHANNEL,
) -> str:
    """Lift the freeze of ``sku``: ``"unfrozen"``, ``"absent"``, or ``"kept"`` when an
    alert met a freeze it did not make."""
    return _run(client, unfreeze_call(key_template, channel, sku, source=source))


def read_frozen(client: Any, key_template: str = DEFAULT_KEY_TEMPLATE) -> dict[str, FreezeState]:
    """Every frozen SKU and its state (``SCAN`` then ``MGET``, never ``KEYS``).

    A key whose value is not the contract's JSON still freezes its SKU (a checkout that
    checks ``EXISTS`` sees it frozen): it comes back with reason ``unreadable freeze value``.
    """
    keys = [decoded(k) for k in client.scan_iter(match=scan_pattern(key_template), count=1000)]
    states: dict[str, FreezeState] = {}
    now = time.time()
    for start in range(0, len(keys), _BATCH):
        batch = keys[start : start + _BATCH]
        for key, raw in zip(batch, client.mget(batch), strict=True):
            sku = sku_of_key(key_template, key)
            if sku is None or raw is None:  # gone between SCAN and MGET
                continue
            try:
                state = FreezeState.from_json(raw)
            except FreezeContractError:
                state = FreezeState(sku, "unreadable freeze value", "person", now)
            if state.sku != sku:
                state = FreezeState(sku, state.reason, state.source, state.at, state.expires_at)
            states[sku] = state
    return states


# --- the local view -------------------------------------------------------------------------


class FreezeView:
    """The frozen SKUs, kept in memory by a background thread; :meth:`frozen` is O(1).

    ``on_error(exc)`` hears every failure to reach or read Redis; ``on_change(action, sku,
    source)`` every change seen after the first full read (``source``: who froze, who
    lifted, or whose freeze ran out).
    Neither may raise (an exception from one is dropped).

    Example::

        view = FreezeView(FreezeSettings("redis://localhost:6379/0"))
        view.start()
        if view.frozen("EGG-01") is not None:
            ...  # refuse the checkout
        view.stop()
    """

    def __init__(
        self,
        settings: FreezeSettings,
        *,
        on_error: Callable[[BaseException], None] | None = None,
        on_change: Callable[[ChangeAction, str, str], None] | None = None,
    ) -> None:
        self.settings = settings
        self._on_error = on_error
        self._on_change = on_change
        # Replaced whole, never mutated: a reader on another thread sees one dict or the next.
        self._states: dict[str, FreezeState] = {}
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_contact = time.monotonic()
        self._dropped = False
        #: Full reads done, and changes applied from the channel (for tests and the docs'
        #: staleness figure).
        self.resyncs = 0
        self.messages = 0

    def frozen(self, sku: str) -> FreezeState | None:
        """The freeze of ``sku`` when it holds now, else ``None``."""
        state = self._states.get(sku)
        if state is None or (state.expires_at is not None and state.expires_at <= time.time()):
            return None
        return state

    def snapshot(self) -> dict[str, FreezeState]:
        """Every freeze holding now."""
        now = time.time()
        return {sku: s for sku, s in self._states.items() if s.active(now)}

    @property
    def synced(self) -> bool:
        """Whether the view read the whole set at least once since it started."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first full read; whether it happened."""
        return self._synced.wait(timeout)

    def start(self) -> None:
        """Start the background thread (again after :meth:`stop`)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._synced.clear()
        self._last_contact = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="stocksentry-freeze", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the background thread; the view keeps its last freezes."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # --- the thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                self._follow()
            except Exception as exc:
                self._failed(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            else:
                backoff = 0.2

    def _follow(self) -> None:
        settings = self.settings
        client = settings.client()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            # Subscribed before the full read: a change made during the read is not lost.
            pubsub.subscribe(settings.channel)
            self._resync(client)
            due = time.monotonic() + settings.resync_interval
            while not self._stop.is_set():
                wait = max(0.0, min(0.25, due - time.monotonic()))
                msg = pubsub.get_message(timeout=wait)
                if msg is not None and msg.get("type") == "message":
                    self._apply(msg["data"])
                if time.monotonic() >= due:
                    self._resync(client)
                    due = time.monotonic() + settings.resync_interval
        finally:
            try:
                pubsub.close()
            finally:
                if isinstance(settings.redis, str):
                    client.close()

    def _resync(self, client: Any) -> None:
        states = read_frozen(client, self.settings.key_template)
        old, self._states = self._states, states
        self._last_contact = time.monotonic()
        self._dropped = False
        self.resyncs += 1
        if self._synced.is_set():
            now = time.time()
            for sku, state in states.items():
                if sku not in old:
                    self._changed("freeze", sku, state.source)
            for sku, state in old.items():
                if sku not in states:
                    expired = state.expires_at is not None and state.expires_at <= now + 0.5
                    self._changed("expire" if expired else "unfreeze", sku, state.source)
        self._synced.set()

    def _apply(self, raw: bytes | str) -> None:
        self._last_contact = time.monotonic()
        try:
            _, sku, state, source = parse_message(raw)
        except FreezeContractError as exc:
            self._report(exc)
            return
        states = dict(self._states)
        if state is None:
            changed = states.pop(sku, None) is not None
        else:
            # A freeze renewed (an alert firing again) is not a new one.
            changed = sku not in states
            states[sku] = state
        self._states = states
        self.messages += 1
        if changed:
            self._changed("freeze" if state is not None else "unfreeze", sku, source)

    def _failed(self, exc: BaseException) -> None:
        self._report(exc)
        if not self._dropped and time.monotonic() - self._last_contact > self.settings.stale_after:
            # Fail open: a view this old may hold freezes long lifted; checkout goes on.
            self._dropped = True
            self._states = {}
            self._report(
                ConnectionError(
                    f"freeze view dropped: Redis unreachable for over "
                    f"{self.settings.stale_after:g} s, no SKU is refused until it is back"
                )
            )

    def _report(self, exc: BaseException) -> None:
        if self._on_error is not None:
            # The callback's own failure has nowhere left to go.
            with contextlib.suppress(Exception):
                self._on_error(exc)

    def _changed(self, action: ChangeAction, sku: str, source: str) -> None:
        if self._on_change is not None:
            try:
                self._on_change(action, sku, source)
            except Exception as exc:
                self._report(exc)
