"""Per-SKU freezes on the real Redis: the operations, the local view, and reservation()."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from polling import wait_until
from privateredis import PrivateRedis
from prometheus_client import CollectorRegistry
from services import REDIS_URL
from stocksentry.exporter.contract.spec import CORRELATION_FIELDS
from stocksentry.instrumentation import FreezeSettings, FreezeView, Sentry, SkuFrozen
from stocksentry.instrumentation.events import RESERVATION_FROZEN
from stocksentry.instrumentation.freeze import FreezeState, key_for
from stocksentry.instrumentation.freezeview import freeze_sku, read_frozen, unfreeze_sku
from structlog.testing import capture_logs

pytestmark = pytest.mark.integration


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


@pytest.fixture
def settings(redis_prefix: str) -> FreezeSettings:
    return FreezeSettings(
        REDIS_URL,
        key_template=redis_prefix + "freeze:{sku}",
        channel=redis_prefix + "freeze-changes",
        resync_interval=0.5,
        stale_after=1.0,
    )


def ops(settings: FreezeSettings) -> dict[str, str]:
    return {"key_template": settings.key_template, "channel": settings.channel}


def test_freeze_writes_the_contracts_key_with_ttl_and_unfreeze_lifts_it(
    client: redis.Redis, settings: FreezeSettings
) -> None:
    outcome, state = freeze_sku(
        client, "EGG-01", reason="oversold", source="person", ttl=60, by="ana", **ops(settings)
    )
    key = key_for(settings.key_template, "EGG-01")
    assert outcome == "frozen"
    assert FreezeState.from_json(client.get(key) or b"") == state
    assert 55_000 < client.pttl(key) <= 60_000
    assert read_frozen(client, settings.key_template) == {"EGG-01": state}
    assert freeze_sku(client, "EGG-01", reason="again", source="person", **ops(settings))[0] == (
        "refreshed"
    )
    assert client.pttl(key) == -1  # a freeze without ttl holds until lifted
    assert unfreeze_sku(client, "EGG-01", source="person", **ops(settings)) == "unfrozen"
    assert unfreeze_sku(client, "EGG-01", source="person", **ops(settings)) == "absent"
    assert read_frozen(client, settings.key_template) == {}


def test_an_alert_never_replaces_nor_lifts_a_persons_freeze(
    client: redis.Redis, settings: FreezeSettings
) -> None:
    _, person = freeze_sku(client, "EGG-01", reason="hand", source="person", **ops(settings))
    outcome, _ = freeze_sku(
        client, "EGG-01", reason="auto", source="alert", ttl=5, **ops(settings)
    )
    assert outcome == "kept"
    assert unfreeze_sku(client, "EGG-01", source="alert", **ops(settings)) == "kept"
    assert read_frozen(client, settings.key_template) == {"EGG-01": person}
    # An alert's own freeze it may refresh and lift; a person may lift any.
    freeze_sku(client, "EGG-02", reason="auto", source="alert", ttl=5, **ops(settings))
    assert freeze_sku(client, "EGG-02", reason="auto", source="alert", ttl=5, **ops(settings))[
        0
    ] == ("refreshed")
    assert unfreeze_sku(client, "EGG-02", source="alert", **ops(settings)) == "unfrozen"


def test_an_unreadable_value_still_freezes_its_sku(
    client: redis.Redis, settings: FreezeSettings
) -> None:
    client.set(key_for(settings.key_template, "ODD"), b"\xff not json")
    states = read_frozen(client, settings.key_template)
    assert list(states) == ["ODD"]
    assert states["ODD"].reason == "unreadable freeze value"


def test_the_view_follows_changes_from_the_channel_and_the_full_reads(
    client: redis.Redis, settings: FreezeSettings
) -> None:
    freeze_sku(client, "OLD", reason="before start", source="person", **ops(settings))
    changes: list[tuple[str, str]] = []
    view = FreezeView(
        settings, on_change=lambda action, sku, source: changes.append((action, sku))
    )
    view.start()
    try:
        assert view.wait_synced(10)
        assert view.frozen("OLD") is not None
        assert view.frozen("EGG-01") is None
        freeze_sku(client, "EGG-01", reason="oversold", source="alert", ttl=1.5, **ops(settings))
        state = wait_until(
            lambda: view.frozen("EGG-01"), accept=lambda s: s is not None, timeout=10
        )
        assert state is not None
        assert state.reason == "oversold"
        assert state.source == "alert"
        # Expiry applies locally from the value, whatever Redis says meanwhile.
        wait_until(lambda: view.frozen("EGG-01"), accept=lambda s: s is None, timeout=10)
        # A key written behind the channel's back shows at the next full read.
        client.set(
            key_for(settings.key_template, "QUIET"),
            FreezeState("QUIET", "set by hand", "person", time.time()).to_json(),
        )
        wait_until(lambda: view.frozen("QUIET"), accept=lambda s: s is not None, timeout=10)
        unfreeze_sku(client, "OLD", source="person", **ops(settings))
        wait_until(lambda: view.frozen("OLD"), accept=lambda s: s is None, timeout=10)
        assert view.messages >= 2
        assert view.resyncs >= 2
        assert ("freeze", "EGG-01") in changes
        assert ("unfreeze", "OLD") in changes
        assert ("freeze", "QUIET") in changes
        assert ("expire", "EGG-01") in changes
        assert ("freeze", "OLD") not in changes  # known at start: not a change
    finally:
        view.stop()


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def test_reservation_refuses_a_frozen_sku_before_the_block_runs(
    client: redis.Redis, settings: FreezeSettings
) -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, freeze=settings, logger=None)
    sentry.log_enabled = True
    try:
        assert sentry.freeze_view is not None
        assert sentry.freeze_view.wait_synced(10)
        freeze_sku(client, "EGG-01", reason="oversold at 3 a.m.", source="person", **ops(settings))
        wait_until(
            lambda: sentry.freeze_view and sentry.freeze_view.frozen("EGG-01"),
            accept=lambda s: s is not None,
            timeout=10,
        )
        ran = []
        with (
            capture_logs() as lines,
            pytest.raises(SkuFrozen) as caught,
            sentry.reservation("EGG-01", strategy="atomic", request_id="req-7") as r,
        ):
            ran.append(r)
        assert ran == []  # the app never touched the stock
        assert caught.value.sku == "EGG-01"
        assert caught.value.source == "person"
        assert caught.value.freeze_reason == "oversold at 3 a.m."
        assert (
            value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="frozen") == 1
        )
        assert (
            value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="atomic")
            == 0
        )
        frozen_lines = [line for line in lines if line["event"] == "reservation_frozen"]
        assert len(frozen_lines) == 1
        assert len(lines) == 1
        assert frozen_lines[0]["request_id"] == "req-7"
        assert frozen_lines[0]["freeze_source"] == "person"
        own = set(frozen_lines[0]) - {"event", "log_level", *CORRELATION_FIELDS}
        assert own == set(RESERVATION_FROZEN.fields)
        # Another SKU goes on as ever.
        with sentry.reservation("EGG-02", strategy="atomic") as r:
            r.success(old_stock=2, new_stock=1)
        assert (
            value(registry, "stock_reservation_success_total", sku="EGG-02", strategy="atomic")
            == 1
        )
    finally:
        sentry.close()


async def test_async_reservation_refuses_too(
    client: redis.Redis, settings: FreezeSettings
) -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, freeze=settings, log=False)
    try:
        freeze_sku(client, "EGG-01", reason="r", source="alert", ttl=30, **ops(settings))
        view = sentry.freeze_view
        assert view is not None
        wait_until(lambda: view.frozen("EGG-01"), accept=lambda s: s is not None, timeout=10)
        with pytest.raises(SkuFrozen):
            async with sentry.reservation("EGG-01"):
                pytest.fail("the block ran")
        assert (
            value(registry, "stock_reservation_conflict_total", sku="EGG-01", reason="frozen") == 1
        )
    finally:
        sentry.close()


def test_redis_down_fails_open_counted_and_logged() -> None:
    with PrivateRedis() as server:
        client = redis.Redis.from_url(server.url)
        settings = FreezeSettings(server.url, resync_interval=0.3, stale_after=1.0)
        registry = CollectorRegistry()
        sentry = Sentry(registry=registry, freeze=settings, log=False)
        view = sentry.freeze_view
        assert view is not None
        try:
            freeze_sku(client, "EGG-01", reason="r", source="person")
            wait_until(lambda: view.frozen("EGG-01"), accept=lambda s: s is not None, timeout=10)
            server.stop()
            errors = "stocksentry_instrumentation_errors_total"
            wait_until(
                lambda: value(registry, errors, component="freeze"),
                accept=lambda n: n >= 1,
                timeout=10,
            )
            # Past stale_after the view forgets: checkout goes on.
            wait_until(lambda: view.frozen("EGG-01"), accept=lambda s: s is None, timeout=15)
            with sentry.reservation("EGG-01") as r:
                r.success()
            assert (
                value(
                    registry, "stock_reservation_success_total", sku="EGG-01", strategy="default"
                )
                == 1
            )
            # Back up: the freeze (still in Redis? no, a fresh server) is read again.
            server.start()
            freeze_sku(redis.Redis.from_url(server.url), "EGG-02", reason="r", source="person")
            wait_until(lambda: view.frozen("EGG-02"), accept=lambda s: s is not None, timeout=15)
        finally:
            sentry.close()
            client.close()


def test_unreachable_at_start_nothing_is_refused() -> None:
    registry = CollectorRegistry()
    sentry = Sentry(registry=registry, freeze="redis://127.0.0.1:1/0", log=False)
    try:
        with sentry.reservation("EGG-01") as r:
            r.success()
        wait_until(
            lambda: value(
                registry, "stocksentry_instrumentation_errors_total", component="freeze"
            ),
            accept=lambda n: n >= 1,
            timeout=10,
        )
        assert (
            value(registry, "stock_reservation_success_total", sku="EGG-01", strategy="default")
            == 1
        )
    finally:
        sentry.close()
