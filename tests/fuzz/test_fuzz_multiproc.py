"""The multiprocess reader on torn, truncated and garbage files: collect() always returns.

The seed files are real: a worker process writes them through prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` in its environment only). Each example
puts a few of them, mutated (cut, bytes overwritten, a lying header, garbage keys), next
to files of random bytes and odd names in a fresh directory. ``collect()`` must return,
count each bad file at most once, and what it yields must be exposed as text that
prometheus_client's own parser reads back.
"""

from __future__ import annotations

import functools
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from fuzzing import examples
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from stocksentry.exporter.multiproc import MultiprocessDirCollector

_WORKER = textwrap.dedent(
    """
    from prometheus_client import Counter, Gauge, Histogram, Summary

    reserved = Counter("fz_reserved", "Reserved units.", ["sku"])
    latency = Histogram("fz_latency_seconds", "Latency.", ["sku"], buckets=(0.25, 1.0))
    batch = Summary("fz_batch_size", "Batch sizes.")
    modes = ("all", "liveall", "max", "livesum", "mostrecent")
    gauges = [Gauge(f"fz_g_{m}", f"Gauge {m}.", ["sku"], multiprocess_mode=m) for m in modes]
    for j, sku in enumerate(("A", "B\\n\\"}", "\\u00e9\\u2028")):
        reserved.labels(sku).inc(j + 0.5)
        latency.labels(sku).observe(0.125 * j)
        batch.observe(j)
        for gauge in gauges:
            gauge.labels(sku).set(j)
    """
)


@functools.cache
def _seed_files() -> dict[str, bytes]:
    """The files one real worker wrote, by name (made once per run)."""
    with tempfile.TemporaryDirectory(prefix="stocksentry-fuzz-mp-") as directory:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": directory}
        subprocess.run([sys.executable, "-c", _WORKER], env=env, check=True, timeout=120)
        return {p.name: p.read_bytes() for p in Path(directory).iterdir()}


_NAMES = [
    "counter_1.db",
    "counter_2.db",
    "histogram_3.db",
    "summary_4.db",
    "gauge_all_5.db",
    "gauge_liveall_6.db",
    "gauge_max_7.db",
    "gauge_livesum_8.db",
    "gauge_mostrecent_9.db",
    "gauge_bogus_1.db",
    "gauge__1.db",
    "counter_.db",
    "backup.db",
    "counter_x.db",
    ".db",
]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    seeds = _seed_files()
    data = bytearray(seeds[draw(st.sampled_from(sorted(seeds)))])
    for _ in range(draw(st.integers(0, 4))):
        action = draw(st.integers(0, 4))
        if action == 0 and data:
            del data[draw(st.integers(0, len(data))) :]
        elif action == 1 and data:
            at = draw(st.integers(0, len(data) - 1))
            chunk = draw(st.binary(min_size=1, max_size=16))
            data[at : at + len(chunk)] = chunk
        elif action == 2 and len(data) >= 4:
            struct.pack_into("i", data, 0, draw(st.integers(-(2**31), 2**31 - 1)))
        elif action == 3 and len(data) >= 12:
            # A key length that lies.
            struct.pack_into("i", data, 8, draw(st.integers(-(2**31), 2**31 - 1)))
        else:
            at = draw(st.integers(0, len(data)))
            data[at:at] = draw(st.binary(max_size=64))
    return bytes(data)


@st.composite
def _key_file(draw: st.DrawFn) -> bytes:
    """A well-formed file whose one key is hostile JSON (odd names, labels, help)."""
    text = st.text(max_size=30)
    key = draw(
        st.one_of(
            st.tuples(text, text, st.dictionaries(text, text, max_size=3), text).map(
                lambda t: __import__("json").dumps([t[0], t[0] + t[1], t[2], t[3]])
            ),
            st.text(max_size=60),
        )
    ).encode("utf-8", "surrogatepass")
    padded = key + b" " * (8 - (len(key) + 4) % 8)
    body = struct.pack("i", len(key)) + padded + struct.pack("dd", draw(st.floats()), 0.0)
    return struct.pack("ii", 8 + len(body), 0) + body


_contents = st.one_of(_mutated(), _key_file(), st.binary(max_size=256))


@examples(400)
@given(
    st.lists(st.tuples(st.sampled_from(_NAMES), _contents), max_size=6, unique_by=lambda f: f[0]),
    st.booleans(),
)
def test_collect_returns_counts_bad_files_and_exposes_parsable_text(
    files: list[tuple[str, bytes]], check_pids: bool
) -> None:
    with tempfile.TemporaryDirectory(prefix="stocksentry-fuzz-mp-") as directory:
        for name, content in files:
            Path(directory, name).write_bytes(content)
        collector = MultiprocessDirCollector(directory, check_pids=check_pids)
        registry = CollectorRegistry()
        registry.register(collector)
        text = generate_latest(registry).decode("utf-8")
        assert sum(collector.skipped.values()) <= len(files)
        names = {family.name for family in text_string_to_metric_families(text)}
        assert "stocksentry_multiprocess_files" in names
