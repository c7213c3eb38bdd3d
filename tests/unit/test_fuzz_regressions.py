"""What the fuzz suite (``tests/fuzz``) found, each as the minimal input it shrank to.

Each test is a plain pytest test of one finding, so it runs in every ``make test`` even
when the fuzz suite's budget would not reach that input again.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from stocksentry.exporter.multiproc import MultiprocessDirCollector


def _one_key_file(key: bytes, value: float = 1.0) -> bytes:
    """A multiprocess file as prometheus_client lays it out, holding one entry."""
    padded = key + b" " * (8 - (len(key) + 4) % 8)
    body = struct.pack("i", len(key)) + padded + struct.pack("dd", value, 0.0)
    return struct.pack("ii", 8 + len(body), 0) + body


@pytest.mark.parametrize(
    "key",
    [
        # The fuzzer's minimal inputs: label names that the text exposition escapes to
        # "__" (reserved) and to "" (no name at all).
        b'["," ,",",{"  ":""},""]',
        b'[",", ",", {"": ""}, ""]',
        b'["a", "a", {"__x": "1"}, "h"]',
        # Two label names that escape to the same one: a duplicate label in the text.
        b'["a", "a", {"x.y": "1", "x_y": "2"}, "h"]',
        # The long profile's minimal inputs: sample names no writer makes, ending in a
        # newline that prometheus_client writes as it is.
        b'[":0" ,":0\\n"  ,{},""]',
        b'[":" ,":\\n"  ,{},""]',
        b'["a", "a x", {}, ""]',
        # A newline in the metric's or a label's own name.
        b'["a\\n", "a\\n", {}, ""]',
        b'["a", "a_total", {"b\\n": "1"}, ""]',
    ],
)
def test_a_name_the_exposition_cannot_write_skips_its_file(tmp_path: Path, key: bytes) -> None:
    (tmp_path / "counter_1.db").write_bytes(_one_key_file(key))
    good = b'["ok", "ok_total", {"x.y": "1", "sku": "A"}, "fine"]'
    (tmp_path / "counter_2.db").write_bytes(_one_key_file(good, 2.0))
    collector = MultiprocessDirCollector(tmp_path, check_pids=False)
    registry = CollectorRegistry()
    registry.register(collector)

    text = generate_latest(registry).decode()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert [(s.name, s.labels, s.value) for s in families["ok"].samples] == [
        ("ok_total", {"x_y": "1", "sku": "A"}, 2.0)
    ]
    assert collector.skipped == {"bad_name": 0, "corrupt": 1, "truncated": 0, "unreadable": 0}


# --- found by the fuzz suite in the config, web-config, timeline and guard code ----------


def test_an_absurd_epoch_timestamp_is_a_skipped_line_not_a_crash() -> None:
    import json

    from stocksentry.exporter.investigate.timeline import analyse, read_events
    from stocksentry.exporter.investigate.timeline.report import format_table

    line = '{"timestamp": 1e+30, "event": "stock_check", "sku": "A", "request_id": "R1"}'
    report = analyse(read_events([line], "fuzz.log"))
    format_table(report)
    json.dumps(report.to_dict())


def test_timeline_ids_are_bounded() -> None:
    from stocksentry.exporter.investigate.timeline import parse_line

    event = parse_line('{"event": "x", "request_id": "' + "a" * 100_000 + '"}')
    assert event is None or event.request_id is None or len(event.request_id) <= 1_000
    # The same from a key=value line.
    event = parse_line("stock_check request_id=" + "b" * 100_000 + " sku=A")
    assert event is None or event.request_id is None or len(event.request_id) <= 1_000


@pytest.mark.parametrize(
    "text",
    [
        '"\\r": 1\n',
        '"a\\nb": 1\n',
        'http_server_config: {"x\\u2028y": 1}\n',
        'basic_auth_users: {"a\\nb": x}\n',
        "? " + "k" * 3000 + "\n: 1\n",
    ],
)
def test_a_web_config_error_is_one_bounded_line(text: str) -> None:
    from stocksentry.exporter.webconfig import WebConfigError, parse_web_config

    with pytest.raises(WebConfigError) as caught:
        parse_web_config(text)
    assert len(str(caught.value).splitlines()) == 1
    assert len(str(caught.value)) <= 1_000


@pytest.mark.parametrize(
    "text",
    [
        "? " + "x" * 3000 + "\n: 1\n",
        "x" * 1020 + ": 1\n",
        "server:\n  ? " + "p" * 3000 + "\n  : 1\n",
    ],
)
def test_an_unknown_config_key_is_not_echoed_whole(text: str) -> None:
    from stocksentry.exporter.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config(text, environ={})
    assert len(str(caught.value)) <= 1_000


@pytest.mark.parametrize("max_length", [1, 8])
def test_an_empty_label_value_respects_a_short_max_length(max_length: int) -> None:
    from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value

    label = sanitize_label_value("", max_length)
    assert len(label) <= max_length
    assert sanitize_label_value(label, max_length) == label
    # A guard whose overflow label would not fit refuses to be built (set-up may fail).
    with pytest.raises(ValueError, match="max_length must be >= 9"):
        LabelGuard(5, max_length=max_length)
    assert len(LabelGuard(5, max_length=9)("")) <= 9
