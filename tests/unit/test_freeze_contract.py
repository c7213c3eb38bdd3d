"""The freeze contract's pure parts: keys, values, messages, settings (no Redis)."""

from __future__ import annotations

import json

import pytest
from stocksentry.instrumentation import FreezeSettings, Sentry, SkuFrozen, catalog
from stocksentry.instrumentation.freeze import (
    DEFAULT_KEY_TEMPLATE,
    FreezeContractError,
    FreezeState,
    check_sku,
    freeze_call,
    key_for,
    message,
    parse_message,
    scan_pattern,
    sku_of_key,
    unfreeze_call,
)
from stocksentry.instrumentation.outcomes import ReservationConflict, classify_exception


def test_keys_round_trip_through_the_template() -> None:
    template = "shop:{sku}:frozen"
    assert key_for(template, "EGG-01") == "shop:EGG-01:frozen"
    assert sku_of_key(template, "shop:EGG-01:frozen") == "EGG-01"
    assert sku_of_key(template, "shop::frozen") is None
    assert sku_of_key(template, "other:EGG-01:frozen") is None
    assert sku_of_key(DEFAULT_KEY_TEMPLATE, "stocksentry:freeze:a:b") == "a:b"


def test_scan_pattern_escapes_the_templates_glob_characters() -> None:
    assert scan_pattern("stocksentry:freeze:{sku}") == "stocksentry:freeze:*"
    assert scan_pattern("s[1]*:{sku}?") == "s\\[1\\]\\*:*\\?"


@pytest.mark.parametrize("sku", ["", " EGG", "EGG\n", "EG\x00G", "E\x1b[31mG", "x" * 201, 7])
def test_check_sku_refuses_what_a_freeze_may_not_name(sku: object) -> None:
    with pytest.raises(FreezeContractError):
        check_sku(sku)


def test_check_sku_takes_ordinary_skus() -> None:
    assert check_sku("EGG 01/ä") == "EGG 01/ä"


def test_state_round_trips_and_refuses_other_values() -> None:
    state = FreezeState("EGG-01", "oversold", "alert", 1000.0, 1600.0, "StockOversold")
    assert FreezeState.from_json(state.to_json()) == state
    assert state.active(now=1599.0)
    assert not state.active(now=1600.0)
    for raw in ("[]", "{", '{"sku": "A", "source": "robot", "at": 1}', '{"sku": 1}'):
        with pytest.raises(FreezeContractError):
            FreezeState.from_json(raw)
    bad_time = json.dumps({"sku": "A", "reason": "", "source": "person", "at": -1})
    with pytest.raises(FreezeContractError):
        FreezeState.from_json(bad_time)


def test_freeze_call_carries_value_ttl_and_message() -> None:
    call, state = freeze_call(
        "k:{sku}", "chan", "EGG-01", reason="r", source="person", ttl=90, now=100.0
    )
    assert call.keys == ("k:EGG-01",)
    value, source, ttl_ms, channel, msg = call.args
    assert (
        FreezeState.from_json(value) == state == FreezeState("EGG-01", "r", "person", 100.0, 190.0)
    )
    assert (source, ttl_ms, channel) == ("person", "90000", "chan")
    assert parse_message(msg) == ("freeze", "EGG-01", state, "person")
    assert parse_message(message("unfreeze", "EGG-01", None)) == (
        "unfreeze",
        "EGG-01",
        None,
        "person",
    )
    lift = unfreeze_call("k:{sku}", "chan", "EGG-01", source="alert")
    assert lift.args[0] == "alert"
    assert parse_message(lift.args[2]) == ("unfreeze", "EGG-01", None, "alert")
    with pytest.raises(FreezeContractError):
        freeze_call("k:{sku}", "c", "EGG", reason="r", source="person", ttl=0)
    with pytest.raises(FreezeContractError):
        freeze_call("k:{sku}", "c", "EGG", reason="r", source="robot")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"redis": "http://x"}, ValueError, "redis://"),
        ({"redis": 42}, TypeError, "got int"),
        ({"redis": "redis://x", "key_template": "no-placeholder"}, ValueError, "{sku}"),
        ({"redis": "redis://x", "key_template": "{sku}{sku}"}, ValueError, "{sku}"),
        ({"redis": "redis://x", "resync_interval": 0}, ValueError, "resync_interval"),
        ({"redis": "redis://x", "stale_after": "30"}, TypeError, "stale_after"),
        ({"redis": "redis://x", "channel": ""}, TypeError, "channel"),
    ],
)
def test_settings_are_checked_at_construction(
    kwargs: dict[str, object], error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text.replace("{", r"\{").replace("}", r"\}")):
        FreezeSettings(**kwargs)


def test_sentry_refuses_bad_freeze_settings_at_the_call() -> None:
    with pytest.raises(ValueError, match="freeze"):
        Sentry(registry=None, freeze="http://localhost")


def test_sku_frozen_is_a_frozen_conflict() -> None:
    exc = SkuFrozen("EGG-01", "oversold", "alert", 100.0)
    assert isinstance(exc, ReservationConflict)
    assert exc.reason == "frozen"
    assert classify_exception(exc) == "frozen"
    assert "frozen" in catalog.CONFLICT_REASONS
    assert catalog.BY_NAME["stocksentry_sku_frozen"].labels == ("sku",)
