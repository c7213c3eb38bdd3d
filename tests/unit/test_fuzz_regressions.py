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
