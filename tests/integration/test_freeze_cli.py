"""``stocksentry freeze / unfreeze / frozen`` on the real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis
from services import REDIS_URL
from stocksentry.exporter.cli import main
from stocksentry.instrumentation.freeze import FreezeState, key_for
from stocksentry.instrumentation.freezeview import freeze_sku, read_frozen

pytestmark = pytest.mark.integration


@pytest.fixture
def target(redis_prefix: str) -> list[str]:
    return ["--redis-url", REDIS_URL, "--key-template", redis_prefix + "f:{sku}"]


def test_freeze_list_and_unfreeze(
    target: list[str], redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "freeze",
                "EGG-01",
                "--reason",
                "oversold at 12:00",
                "--ttl",
                "30m",
                "--by",
                "ana",
                *target,
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == "EGG-01: frozen for 30m: oversold at 12:00\n"
    client = redis.Redis.from_url(REDIS_URL)
    template = redis_prefix + "f:{sku}"
    state = read_frozen(client, template)["EGG-01"]
    assert (state.source, state.by, state.reason) == ("person", "ana", "oversold at 12:00")
    assert state.expires_at is not None
    assert round(state.expires_at - state.at) == 1800
    assert 1_790_000 < client.pttl(key_for(template, "EGG-01")) <= 1_800_000
    freeze_sku(
        client, "EGG-02", reason="StockOversold", source="alert", ttl=60, key_template=template
    )

    assert main(["frozen", *target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["SKU", "SOURCE", "AGE", "LIFTS", "IN", "BY", "REASON"]
    assert lines[1].split()[:2] == ["EGG-01", "person"]
    assert lines[1].endswith("oversold at 12:00")
    assert lines[2].split()[:2] == ["EGG-02", "alert"]
    assert lines[2].endswith("StockOversold")

    assert main(["frozen", "--format", "json", *target]) == 0
    listed = json.loads(capsys.readouterr().out)["frozen"]
    assert [(f["sku"], f["source"]) for f in listed] == [("EGG-01", "person"), ("EGG-02", "alert")]

    assert main(["unfreeze", "EGG-02", *target]) == 0  # a person lifts an alert's freeze too
    assert main(["unfreeze", "EGG-01", *target]) == 0
    assert main(["unfreeze", "EGG-01", *target]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "EGG-02: unfrozen: checkout resumes",
        "EGG-01: unfrozen: checkout resumes",
        "EGG-01: was not frozen",
    ]
    assert main(["frozen", *target]) == 0
    assert capsys.readouterr().out == "no SKU is frozen\n"
    client.close()


def test_a_persons_freeze_replaces_an_alerts(
    target: list[str], redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    template = redis_prefix + "f:{sku}"
    freeze_sku(client, "EGG-01", reason="auto", source="alert", ttl=60, key_template=template)
    assert main(["freeze", "EGG-01", "--reason", "mine now", *target]) == 0
    assert "frozen again" in capsys.readouterr().out
    assert read_frozen(client, template)["EGG-01"].source == "person"
    assert client.pttl(key_for(template, "EGG-01")) == -1
    client.close()


def test_the_config_names_the_redis_and_keys(
    tmp_path: Path, redis_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "exporter.yaml"
    config.write_text(
        f"containment:\n  url: {REDIS_URL}\n  key_template: '{redis_prefix}cfg:{{sku}}'\n"
    )
    assert main(["freeze", "EGG-09", "--reason", "r", "--config", str(config)]) == 0
    client = redis.Redis.from_url(REDIS_URL)
    raw = client.get(f"{redis_prefix}cfg:EGG-09")
    assert raw is not None
    assert FreezeState.from_json(raw).sku == "EGG-09"
    client.close()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["freeze", "EG\x1bG", "--reason", "r"], "SKU: SKU holds control characters"),
        (["freeze", "EGG", "--reason", "r", "--key-template", "no-field"], "--key-template"),
        (["unfreeze", "EGG", "--redis-url", "http://x"], "--redis-url"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if "--redis-url" not in argv:
        argv = [*argv, "--redis-url", REDIS_URL]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err


def test_no_target_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STOCKSENTRY_FREEZE_REDIS_URL", raising=False)
    assert main(["frozen"]) == 2
    assert "give --redis-url" in capsys.readouterr().err
    config = tmp_path / "c.yaml"
    config.write_text("log:\n  level: info\n")
    assert main(["frozen", "--config", str(config)]) == 2
    assert "has no containment section" in capsys.readouterr().err


def test_unreachable_redis_is_never_an_empty_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frozen", "--redis-url", "redis://127.0.0.1:1/0"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "cannot read the freezes" in captured.err
    assert main(["freeze", "EGG", "--reason", "r", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
