"""The sidecar's Alertmanager webhook and freeze gauge, on the real Redis and aiohttp."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

import bcrypt
import pytest
import redis
from aiohttp import web
from aiohttp.test_utils import TestClient
from polling import async_wait_until
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient
from services import REDIS_URL
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.config.containment import WEBHOOK_PATH
from stocksentry.exporter.containment.webhook import Containment
from stocksentry.exporter.server import ServerSettings, create_app
from stocksentry.exporter.webconfig import parse_web_config
from stocksentry.instrumentation.freezeview import freeze_sku, read_frozen

pytestmark = pytest.mark.integration
Factory = Callable[..., Any]


def notification(*alerts: tuple[str, str | None, str]) -> dict[str, Any]:
    """An Alertmanager webhook body: (alertname, sku, status) per alert."""
    items = []
    for name, sku, status in alerts:
        labels = {"alertname": name, "severity": "critical"}
        if sku is not None:
            labels["sku"] = sku
        items.append(
            {"status": status, "labels": labels, "annotations": {"summary": f"{sku} oversold"}}
        )
    return {"version": "4", "status": "firing", "receiver": "freeze", "alerts": items}


@pytest.fixture
def template(redis_prefix: str) -> str:
    return redis_prefix + "freeze:{sku}"


@pytest.fixture
def store() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def sidecar_app(containment: Containment, web_config: Any = None) -> web.Application:
    """The sidecar's app serving ``containment``'s webhook and metrics, as the exporter
    builds it."""
    return create_app(
        ServerSettings(listen_address="127.0.0.1", port=0, web_config=web_config),
        collectors=[containment],
        background=[containment.cleanup_ctx],
        routes=containment.routes(),
    )


@pytest.fixture
def webhook(aiohttp_client: AiohttpClient, redis_prefix: str, template: str) -> Factory:
    """Builds the sidecar app with a containment section of the given keys."""

    async def build(
        web_config: Any = None, **keys: Any
    ) -> tuple[TestClient[Any, Any], Containment]:
        lines = [
            f"  url: {REDIS_URL}",
            f"  key_template: '{template}'",
            f"  channel: {redis_prefix}chan",
        ]
        lines += [f"  {name}: {json.dumps(value)}" for name, value in keys.items()]
        config = parse_config("containment:\n" + "\n".join(lines) + "\n")
        assert config.containment is not None
        containment = Containment(config.containment)
        client = await aiohttp_client(sidecar_app(containment, web_config))
        await async_wait_until(lambda: containment.view.synced, timeout=10)
        return client, containment

    return build


def metric(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                values[tuple(sorted(sample.labels.items()))] = sample.value
    return values


async def test_dry_run_freezes_nothing_and_says_what_it_would_do(
    webhook: Factory, store: redis.Redis, template: str, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = await webhook()
    with caplog.at_level(logging.INFO, "stocksentry.exporter.containment"):
        response = await client.post(
            WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing"))
        )
    assert response.status == 200
    assert (await response.json())["results"] == [
        {"alert": "StockOversold", "sku": "EGG-01", "action": "dry_run"}
    ]
    assert read_frozen(store, template) == {}
    assert any("would freeze EGG-01" in r.getMessage() for r in caplog.records)
    text = await (await client.get("/metrics")).text()
    actions = metric(text, "stocksentry_freeze_actions_total")
    assert actions[(("action", "dry_run"), ("source", "alert"))] == 1
    assert actions[(("action", "freeze"), ("source", "alert"))] == 0


async def test_enforce_freezes_with_expiry_and_the_gauge_shows_it(
    webhook: Factory, store: redis.Redis, template: str
) -> None:
    client, containment = await webhook(mode="enforce", expiry="2s")
    response = await client.post(
        WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing"))
    )
    assert (await response.json())["results"][0]["action"] == "frozen"
    state = read_frozen(store, template)["EGG-01"]
    assert (state.source, state.by) == ("alert", "StockOversold")
    assert state.reason == "StockOversold: EGG-01 oversold"
    assert state.expires_at is not None
    assert round(state.expires_at - state.at) == 2
    await async_wait_until(lambda: containment.view.frozen("EGG-01"), timeout=10)
    text = await (await client.get("/metrics")).text()
    assert metric(text, "stocksentry_sku_frozen") == {(("sku", "EGG-01"),): 1.0}
    assert (
        metric(text, "stocksentry_freeze_actions_total")[
            (("action", "freeze"), ("source", "alert"))
        ]
        == 1
    )
    # Firing again renews it; expiry then lifts it by itself.
    again = await client.post(
        WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing"))
    )
    assert (await again.json())["results"][0]["action"] == "refreshed"
    await async_wait_until(lambda: read_frozen(store, template) == {}, timeout=10)

    async def gauge() -> dict[Any, float]:
        return metric(await (await client.get("/metrics")).text(), "stocksentry_sku_frozen")

    await async_wait_until(gauge, accept=lambda g: g == {}, timeout=10)
    await async_wait_until(
        lambda: containment.actions[("alert", "expire")], accept=lambda n: n == 1, timeout=10
    )


async def test_blast_radius_limit_freezes_no_more_and_counts(
    webhook: Factory, store: redis.Redis, template: str, caplog: pytest.LogCaptureFixture
) -> None:
    client, containment = await webhook(mode="enforce", max_auto_frozen=2)
    body = notification(*((("StockOversold", f"EGG-0{i}", "firing")) for i in range(1, 5)))
    with caplog.at_level(logging.WARNING, "stocksentry.exporter.containment"):
        response = await client.post(WEBHOOK_PATH, json=body)
    actions = [r["action"] for r in (await response.json())["results"]]
    assert actions == ["frozen", "frozen", "over_limit", "over_limit"]
    assert sorted(read_frozen(store, template)) == ["EGG-01", "EGG-02"]
    assert containment.actions[("alert", "over_limit")] == 2
    assert sum("max_auto_frozen" in r.getMessage() for r in caplog.records) == 2
    # A person's freeze does not count against the alerts' limit, and an already frozen
    # SKU is renewed, not refused.
    again = await client.post(
        WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing"))
    )
    assert (await again.json())["results"][0]["action"] == "refreshed"


async def test_a_persons_freeze_is_never_replaced_nor_lifted_by_an_alert(
    webhook: Factory, store: redis.Redis, template: str
) -> None:
    _, person = freeze_sku(store, "EGG-01", reason="hand", source="person", key_template=template)
    client, _ = await webhook(mode="enforce", unfreeze_on_resolved=True)
    firing = await client.post(
        WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing"))
    )
    assert (await firing.json())["results"][0]["action"] == "kept"
    resolved = await client.post(
        WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "resolved"))
    )
    assert (await resolved.json())["results"][0]["action"] == "kept"
    assert read_frozen(store, template) == {"EGG-01": person}
    # An alert's own freeze is lifted by its resolution when the config says so.
    await client.post(WEBHOOK_PATH, json=notification(("StockNegativeWrite", "EGG-02", "firing")))
    assert read_frozen(store, template)["EGG-02"].source == "alert"
    lifted = await client.post(
        WEBHOOK_PATH, json=notification(("StockNegativeWrite", "EGG-02", "resolved"))
    )
    assert (await lifted.json())["results"][0]["action"] == "unfrozen"
    assert sorted(read_frozen(store, template)) == ["EGG-01"]


async def test_resolved_alerts_lift_nothing_by_default(
    webhook: Factory, store: redis.Redis, template: str
) -> None:
    client, _ = await webhook(mode="enforce")
    await client.post(WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing")))
    resolved = await client.post(
        WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "resolved"))
    )
    assert (await resolved.json())["results"][0]["action"] == "none"
    assert list(read_frozen(store, template)) == ["EGG-01"]


HOSTILE: list[tuple[str, bytes, int]] = [
    ("huge", b'{"alerts": [' + b" " * (2 << 20) + b"]}", 413),
    ("not json", b'{"alerts": [', 400),
    ("not an object", b"[1, 2]", 400),
    ("no alerts list", b'{"alerts": "StockOversold"}', 400),
    ("alert without labels", b'{"alerts": [{"status": "firing"}]}', 400),
    (
        "unknown alert",
        json.dumps(notification(("RmRfEverything", "EGG-01", "firing"))).encode(),
        422,
    ),
    (
        "control characters",
        json.dumps(notification(("StockOversold", "EGG\x1b[2J", "firing"))).encode(),
        400,
    ),
    (
        "newline in sku",
        json.dumps(notification(("StockOversold", "EGG\n01", "firing"))).encode(),
        400,
    ),
    (
        "sku too long",
        json.dumps(notification(("StockOversold", "E" * 500, "firing"))).encode(),
        400,
    ),
    (
        "bad status",
        json.dumps(
            {"alerts": [{"status": "maybe", "labels": {"alertname": "StockOversold", "sku": "A"}}]}
        ).encode(),
        400,
    ),
]


@pytest.mark.parametrize(("case", "body", "status"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_hostile_bodies_get_a_4xx_one_quiet_line_and_freeze_nothing(
    webhook: Factory,
    store: redis.Redis,
    template: str,
    caplog: pytest.LogCaptureFixture,
    case: str,
    body: bytes,
    status: int,
) -> None:
    client, _ = await webhook(mode="enforce")
    with caplog.at_level(logging.DEBUG, "stocksentry.exporter.containment"):
        caplog.clear()
        response = await client.post(
            WEBHOOK_PATH, data=body, headers={"Content-Type": "application/json"}
        )
    assert response.status == status, case
    assert read_frozen(store, template) == {}
    lines = [r for r in caplog.records if "webhook" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].levelno == logging.INFO
    assert len(lines[0].getMessage()) < 300
    assert "\x1b" not in lines[0].getMessage()


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def test_the_webhook_sits_behind_the_metrics_basic_auth(
    webhook: Factory, store: redis.Redis, template: str
) -> None:
    hashed = bcrypt.hashpw(b"s3cret!", bcrypt.gensalt(rounds=4)).decode()
    web_config = parse_web_config(f"basic_auth_users:\n  alertmanager: '{hashed}'\n")
    client, _ = await webhook(web_config=web_config, mode="enforce")
    body = notification(("StockOversold", "EGG-01", "firing"))
    for headers in ({}, basic("alertmanager", "wrong")):
        refused = await client.post(WEBHOOK_PATH, json=body, headers=headers)
        assert refused.status == 401
    assert read_frozen(store, template) == {}
    accepted = await client.post(WEBHOOK_PATH, json=body, headers=basic("alertmanager", "s3cret!"))
    assert accepted.status == 200
    assert list(read_frozen(store, template)) == ["EGG-01"]


async def test_person_freezes_from_the_command_line_are_counted_by_the_sidecar(
    webhook: Factory, store: redis.Redis, template: str, redis_prefix: str
) -> None:
    client, containment = await webhook()
    freeze_sku(
        store,
        "EGG-07",
        reason="r",
        source="person",
        key_template=template,
        channel=redis_prefix + "chan",
    )
    await async_wait_until(
        lambda: containment.actions[("person", "freeze")], accept=lambda n: n == 1, timeout=10
    )
    text = await (await client.get("/metrics")).text()
    assert metric(text, "stocksentry_sku_frozen") == {(("sku", "EGG-07"),): 1.0}


async def test_redis_down_is_a_503_alertmanager_retries(
    aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config("containment:\n  url: redis://127.0.0.1:1/0\n  mode: enforce\n")
    assert config.containment is not None
    containment = Containment(config.containment)
    client = await aiohttp_client(sidecar_app(containment))
    with caplog.at_level(logging.WARNING, "stocksentry.exporter.containment"):
        response = await client.post(
            WEBHOOK_PATH, json=notification(("StockOversold", "EGG-01", "firing"))
        )
    assert response.status == 503
    assert any("Redis failed" in r.getMessage() for r in caplog.records)
    # /metrics still answers: no SKU frozen as far as the sidecar knows.
    text = await (await client.get("/metrics")).text()
    assert metric(text, "stocksentry_sku_frozen") == {}
