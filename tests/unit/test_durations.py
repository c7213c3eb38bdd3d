"""The one duration grammar (Prometheus's), used by the config, the CLI and the chart."""

from __future__ import annotations

import re

import pytest
from stocksentry.exporter.durations import DURATION_PATTERN, format_duration, parse_duration


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("500ms", 0.5),
        ("5s", 5.0),
        ("1m", 60.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("2w", 14 * 86400.0),
        ("1y", 365 * 86400.0),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4 + 0.005),
        ("0", 0.0),
        ("0s", 0.0),
        (" 5s ", 5.0),
        (2, 2.0),
        (0.25, 0.25),
    ],
)
def test_durations(value, seconds):
    assert parse_duration(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "fast",
        "5",
        "-1s",
        "1.5s",  # Prometheus refuses fractions inside a string
        "30s1m",  # units out of order
        "1m1m",
        "",
        "5 s",
        "s",
        "1" * 30 + "s",
        "x" * 10_000,
        True,
        -1,
        float("nan"),
        float("inf"),
    ],
)
def test_not_durations(value):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(value)


def test_error_message_is_bounded():
    with pytest.raises(ValueError, match="not a duration") as info:
        parse_duration("y" * 100_000)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "200ms"),
        (5, "5s"),
        (90, "1m30s"),
        (3600, "1h"),
        (2000, "33m20s"),
        (0, "0"),
        (86400, "1d"),
        (90061.5, "1d1h1m1s500ms"),
    ],
)
def test_format_duration_round_trips(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds)


def test_format_keeps_a_sub_millisecond_fraction_as_seconds():
    assert format_duration(0.0001) == "0.0001"
    assert parse_duration(float(format_duration(0.0001))) == 0.0001


@pytest.mark.parametrize("text", ["0", "5s", "1m30s", "1d2h", "500ms", "1y2w3d4h5m6s7ms"])
def test_pattern_accepts_what_the_parser_accepts(text):
    assert re.fullmatch(DURATION_PATTERN, text)


@pytest.mark.parametrize("text", ["1.5s", "30s1m", "5", "", "-1s"])
def test_pattern_refuses_what_the_parser_refuses(text):
    assert not re.fullmatch(DURATION_PATTERN, text)
