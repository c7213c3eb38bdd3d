"""Edge paths of the exporter no other test drove: check-metrics over HTTP, stdin and
OpenMetrics; multiprocess files that are big, corrupt or vanish mid-merge; exemplar files;
timeline inputs that cannot be read or a reader that leaves."""

from __future__ import annotations

import argparse
import io
import math
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import BinaryIO

import pytest
from localhttp import serve_http
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics.exposition import generate_latest
from stocksentry.exporter.cli import main
from stocksentry.exporter.investigate.timeline.command import run_timeline
from stocksentry.exporter.multiproc import MultiprocessDirCollector, files
from stocksentry.exporter.multiproc.files import INT, write_entries
from stocksentry.instrumentation.mpexemplars import HEADER, HEADER_SIZE, MAGIC, VERSION

TIMELINE_DATA = Path(__file__).resolve().parent.parent / "data" / "timeline"

# A small exposition: one contract counter, and one histogram whose bucket carries an
# OpenMetrics exemplar.
OPENMETRICS = (
    "# TYPE stock_orders_paid counter\n"
    'stock_orders_paid_total{sku="A"} 3.0 # {trace_id="4bf92f35"} 1.0 1700000000.0\n'
    "# TYPE stock_reservation_duration_seconds histogram\n"
    'stock_reservation_duration_seconds_bucket{le="0.1",outcome="success"} 1.0'
    ' # {trace_id="4bf92f35", span_id="00f067aa"} 0.05 1700000000.0\n'
    "# EOF\n"
)
PLAIN = OPENMETRICS.replace(' # {trace_id="4bf92f35"} 1.0 1700000000.0', "").replace(
    ' # {trace_id="4bf92f35", span_id="00f067aa"} 0.05 1700000000.0', ""
)


def check_metrics(
    capsys: pytest.CaptureFixture[str], target: str, *extra: str
) -> tuple[int, str, str]:
    code = main(["check-metrics", target, *extra])
    out, err = capsys.readouterr()
    return code, out, err


# --- check-metrics -----------------------------------------------------------------------


def test_an_openmetrics_exposition_with_exemplars_reads_like_one_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exemplar after a sample's value is OpenMetrics, not a malformed line (exit 2)."""
    with_exemplars, without = tmp_path / "om.txt", tmp_path / "plain.txt"
    with_exemplars.write_text(OPENMETRICS)
    without.write_text(PLAIN)
    code, out, err = check_metrics(capsys, str(with_exemplars), "--format", "json")
    plain_code, plain_out, _ = check_metrics(capsys, str(without), "--format", "json")
    assert err == ""
    assert code == plain_code
    assert out.replace(str(with_exemplars), "X") == plain_out.replace(str(without), "X")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = PLAIN.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_url() -> Iterator[str]:
    with serve_http(_Handler) as url:
        yield url


def test_a_url_reads_like_the_same_text_in_a_file(
    http_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.txt"
    path.write_text(PLAIN)
    file_code, file_out, _ = check_metrics(capsys, str(path))
    code, out, err = check_metrics(capsys, f"{http_url}/metrics")
    assert err == ""
    assert (code, out.replace(f"{http_url}/metrics", "X")) == (
        file_code,
        file_out.replace(str(path), "X"),
    )


def test_stdin_reads_like_the_same_text_in_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "plain.txt"
    path.write_text(PLAIN)
    file_code, file_out, _ = check_metrics(capsys, str(path))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(PLAIN.encode())))
    code, out, err = check_metrics(capsys, "-")
    assert err == ""
    assert (code, out.replace("-:", "X:", 1)) == (file_code, file_out.replace(str(path), "X"))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (lambda url: f"{url}/nope", "HTTP 404 Not Found"),
        (lambda url: f"http://127.0.0.1:{_closed_port()}/metrics", "Connection refused"),
    ],
)
def test_an_http_error_or_a_dead_port_is_one_line_and_exit_2(
    http_url: str,
    capsys: pytest.CaptureFixture[str],
    target: Callable[[str], str],
    message: str,
) -> None:
    url = target(http_url)
    code, out, err = check_metrics(capsys, url)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert err.startswith(f"stocksentry check-metrics: error: {url}: ")
    assert message in err


def test_the_timeout_bounds_a_server_that_dribbles(capsys: pytest.CaptureFixture[str]) -> None:
    """--timeout is for the whole read: a byte every 50 ms for a minute must not hold it
    (it did, until the server stopped: a 64 KiB read waits for the whole chunk)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def dribble() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            for _ in range(1200):  # a minute of dribble
                if stop.is_set():
                    return
                try:
                    conn.sendall(b"#\n")
                except OSError:
                    return
                time.sleep(0.05)

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/metrics"
    started = time.monotonic()
    try:
        code, out, err = check_metrics(capsys, url, "--timeout", "1s")
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    took = time.monotonic() - started
    assert (code, out) == (2, "")
    assert err == f"stocksentry check-metrics: error: {url}: not read within --timeout\n"
    # Far from the minute the server would go on: no tight timing on a loaded machine.
    assert took < 20.0, f"took {took:.1f}s with --timeout 1s"


# --- the multiprocess directory ----------------------------------------------------------


def _key(metric: str, sample: str, labels: dict[str, str], help_text: str = "Help.") -> bytes:
    import json

    return json.dumps([metric, sample, labels, help_text]).encode()


def _values(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        if not family.name.startswith("stocksentry_")
        for s in family.samples
    }


def _ours(directory: Path) -> tuple[MultiprocessDirCollector, CollectorRegistry]:
    collector = MultiprocessDirCollector(directory, check_pids=False)
    registry = CollectorRegistry()
    registry.register(collector)
    return collector, registry


def _truth(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return _values(registry)


def test_a_file_bigger_than_the_first_read_merges_to_the_exact_totals(tmp_path: Path) -> None:
    """A worker with thousands of series writes more than 64 KiB: all of it is merged."""
    entries = [
        (_key("shop_sold", "shop_sold_total", {"sku": f"SKU-{n:05d}"}), float(n), 0.0)
        for n in range(2000)
    ]
    write_entries(str(tmp_path / "counter_101.db"), entries)
    write_entries(str(tmp_path / "counter_102.db"), entries[:10])
    assert (tmp_path / "counter_101.db").stat().st_size > 64 * 1024
    collector, registry = _ours(tmp_path)
    ours = _values(registry)
    assert ours == _truth(tmp_path)
    assert ours[("shop_sold_total", (("sku", "SKU-01999"),))] == 1999.0
    assert ours[("shop_sold_total", (("sku", "SKU-00009"),))] == 18.0
    assert sum(collector.skipped.values()) == 0


def test_a_worker_file_removed_mid_merge_is_passed_over_not_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mark_process_dead deletes a file between the listing and its read: the scrape goes
    on with the others, and nothing is counted as a bad file."""
    key = _key("shop_sold", "shop_sold_total", {"sku": "A"})
    write_entries(str(tmp_path / "counter_201.db"), [(key, 5.0, 0.0)])
    write_entries(str(tmp_path / "counter_202.db"), [(key, 7.0, 0.0)])
    real_open = files.open_regular

    def removed_first(path: str) -> AbstractContextManager[tuple[BinaryIO, int, int]]:
        if path.endswith("counter_201.db"):
            os.unlink(path)  # the worker's file, deleted by mark_process_dead just now
        return real_open(path)

    monkeypatch.setattr(files, "open_regular", removed_first)
    collector, registry = _ours(tmp_path)
    assert _values(registry)[("shop_sold_total", (("sku", "A"),))] == 7.0
    assert registry.get_sample_value("stocksentry_multiprocess_files") == 1.0
    assert sum(collector.skipped.values()) == 0


def _unaligned_used(path: Path) -> None:
    data = bytearray(path.read_bytes())
    used = INT.unpack_from(data, 0)[0]
    INT.pack_into(data, 0, used + 2)  # two bytes of a next entry header
    path.write_bytes(bytes(data) + b"\0" * 8)


@pytest.mark.parametrize(
    ("entries", "damage"),
    [
        ([(b'["shop_sold", "shop_sold_total", {"sku": 1}, "Help."]', 1.0, 0.0)], None),
        (
            [(_key("shop_wait", "shop_wait_bucket", {"le": "soon"}), 1.0, 0.0)],
            None,
        ),
        ([(_key("shop_sold", "shop_sold_total", {"sku": "B"}), 1.0, 0.0)], _unaligned_used),
    ],
    ids=["label-value-not-a-string", "bucket-bound-not-a-number", "entry-past-used"],
)
def test_a_corrupt_file_is_skipped_counted_and_the_others_still_merge(
    tmp_path: Path,
    entries: list[tuple[bytes, float, float]],
    damage: Callable[[Path], None] | None,
) -> None:
    good = _key("shop_sold", "shop_sold_total", {"sku": "A"})
    write_entries(str(tmp_path / "counter_301.db"), [(good, 4.0, 0.0)])
    bad = tmp_path / ("histogram_302.db" if "bucket" in str(entries[0][0]) else "counter_302.db")
    write_entries(str(bad), entries)
    if damage is not None:
        damage(bad)
    collector, registry = _ours(tmp_path)
    assert _values(registry) == {("shop_sold_total", (("sku", "A"),)): 4.0}
    assert collector.skipped["corrupt"] == 1


def test_a_compacted_file_with_a_corrupt_manifest_counts_each_worker_once(
    tmp_path: Path,
) -> None:
    """The manifest says which staged files a compacted file already holds; unreadable, the
    compacted file is skipped, and the staged file it would hide is merged on its own."""
    key = _key("shop_sold", "shop_sold_total", {"sku": "A"})
    write_entries(str(tmp_path / "counter_12.staged-abc123.db"), [(key, 3.0, 0.0)])
    manifest = b"\x00stocksentry-compacted\x00" + b"[not json"
    write_entries(str(tmp_path / "counter_compacted.db"), [(manifest, 0.0, 0.0), (key, 3.0, 0.0)])
    write_entries(str(tmp_path / "counter_401.db"), [(key, 2.0, 0.0)])
    collector, registry = _ours(tmp_path)
    assert _values(registry) == {("shop_sold_total", (("sku", "A"),)): 5.0}
    assert collector.skipped["corrupt"] == 1


def test_compaction_of_a_directory_that_is_not_there_does_not_run(tmp_path: Path) -> None:
    collector = MultiprocessDirCollector(tmp_path / "gone", compact_dead=True)
    assert collector.compact().ran is False
    registry = CollectorRegistry()
    registry.register(collector)  # and a scrape of it still answers
    assert registry.get_sample_value("stocksentry_multiprocess_files") == 0.0


WORKER_WITH_INF = textwrap.dedent(
    """
    import math
    from stocksentry.instrumentation.mpexemplars import ExemplarHistogram

    wait = ExemplarHistogram("shop_wait_seconds", "Wait.", buckets=(0.5, 1.0))
    wait.observe(0.2, {"trace_id": "a" * 32, "span_id": "b" * 16})
    wait.observe(math.inf, {"trace_id": "c" * 32, "span_id": "d" * 16})
    """
)


def test_a_worker_that_observed_infinity_keeps_its_exemplars(tmp_path: Path) -> None:
    """Histogram.observe(inf) is valid (the +Inf bucket): its exemplar is the worker's, not
    corruption; skipping the file lost every exemplar of the worker, at every scrape."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", WORKER_WITH_INF], env=env, check=True, timeout=60)
    collector, registry = _ours(tmp_path)
    text = generate_latest(registry).decode()
    assert collector.skipped["corrupt"] == 0
    assert 'shop_wait_seconds_bucket{le="0.5"} 1.0 # {span_id="' in text
    assert f'trace_id="{"a" * 32}"}} 0.2' in text
    assert f'trace_id="{"c" * 32}"}} +Inf' in text
    # The merged counts are prometheus_client's.
    assert _values(registry) == _truth(tmp_path)


def test_an_exemplar_file_of_another_version_is_skipped_as_corrupt(tmp_path: Path) -> None:
    import zlib

    head = HEADER.pack(MAGIC, VERSION + 1, 256, 4, 0, 0)[:20]
    header = HEADER.pack(MAGIC, VERSION + 1, 256, 4, zlib.crc32(head), 0)
    (tmp_path / "exemplars_77.mmap").write_bytes(header.ljust(HEADER_SIZE, b"\0"))
    collector, registry = _ours(tmp_path)
    assert _values(registry) == {}
    assert collector.skipped["corrupt"] == 1


# --- timeline ----------------------------------------------------------------------------


def _timeline(*paths: str, **options: object) -> int:
    args = argparse.Namespace(logfile=list(paths), **options)
    return run_timeline(args)


def test_an_input_that_fails_to_read_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc/self/mem is a regular file whose read fails (EIO): the OS's words, one line."""
    assert _timeline("/proc/self/mem") == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "stocksentry timeline: error: cannot read /proc/self/mem: Input/output error\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"logfile": []}, "no LOGFILE given"),
        ({"format": "xml"}, "unknown --format 'xml' (choose table or json)"),
        ({"limit": True}, "--limit must be a whole number >= 0, got True"),
        ({"reorder_window": math.inf}, "--reorder-window must be a number of seconds >= 0"),
    ],
)
def test_a_hand_built_namespace_is_checked(
    capsys: pytest.CaptureFixture[str], args: dict[str, object], message: str
) -> None:
    namespace = argparse.Namespace(logfile=[str(TIMELINE_DATA / "seeds.log")])
    for name, value in args.items():
        setattr(namespace, name, value)
    assert run_timeline(namespace) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert message in err


def test_a_hand_built_namespace_may_name_one_file_and_one_sku(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seeds = str(TIMELINE_DATA / "seeds.log")
    expected = _timeline(seeds, sku=["EGG-01"])
    wanted = capsys.readouterr().out
    namespace = argparse.Namespace(logfile=seeds, sku="EGG-01")
    assert run_timeline(namespace) == expected == 1
    assert capsys.readouterr().out == wanted


def test_a_reader_that_leaves_early_is_not_an_error(tmp_path: Path) -> None:
    """`stocksentry timeline big.log | head -1`: the findings' exit status, no traceback."""
    big = tmp_path / "big.log"
    big.write_text((TIMELINE_DATA / "seeds.log").read_text() * 1000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stocksentry.exporter", "timeline", str(big), "--limit", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # the reader leaves before the report is written out
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err
    assert err == ""
