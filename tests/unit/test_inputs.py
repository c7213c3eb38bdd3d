"""The one bounded reader of file inputs (stocksentry.exporter.inputs), and how error
lines echo file text.

Hostile inputs: a FIFO without a writer (must not block), a device that never ends
(/dev/zero), a directory, a socket, a file over the limit or growing past it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stocksentry.exporter.inputs import (
    CONFIG_LIMIT,
    ECHO_LIMIT,
    TLS_FILE_LIMIT,
    URL_FILE_LIMIT,
    WEB_CONFIG_LIMIT,
    InputFileError,
    check_regular_file,
    escape,
    format_size,
    open_log_input,
    read_bytes_bounded,
    read_text_bounded,
    shorten,
)


def test_a_regular_file_within_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"x" * 100)
    assert read_bytes_bounded(path, limit=100, what="the config") == b"x" * 100
    assert read_text_bounded(path, limit=100, what="the config") == "x" * 100


def test_a_file_one_byte_over_the_limit_is_refused_with_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"x" * 1025)
    with pytest.raises(InputFileError) as caught:
        read_bytes_bounded(path, limit=1024, what="the config")
    assert caught.value.problem == "it is larger than the limit of 1 KiB (1025 bytes)"
    assert str(caught.value) == (
        f"cannot read the config {path}: it is larger than the limit of 1 KiB (1025 bytes)"
    )


def test_a_file_that_claims_less_than_it_holds_is_cut_at_the_limit() -> None:
    # /proc files claim a size of 0 and hold more: the bound is on what is read too.
    path = Path("/proc/self/status")
    assert path.stat().st_size == 0
    with pytest.raises(InputFileError) as caught:
        read_bytes_bounded(path, limit=16, what="the config")
    assert caught.value.problem == "it is larger than the limit of 16 bytes (17 bytes)"
    assert read_bytes_bounded(path, limit=CONFIG_LIMIT, what="the config").startswith(b"Name:")


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "url"
    os.mkfifo(fifo)
    # Opened without O_NONBLOCK, this open would wait for a writer forever.
    with pytest.raises(InputFileError) as caught:
        read_text_bounded(fifo, limit=URL_FILE_LIMIT, what="url_file")
    assert caught.value.problem == "it is a FIFO (named pipe), not a regular file"
    with pytest.raises(InputFileError):
        check_regular_file(fifo, limit=TLS_FILE_LIMIT, what="the certificate")


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/dev/zero", "a character device"),
        ("/dev/null", "a character device"),
        ("/", "a directory"),
    ],
)
def test_devices_and_directories_are_refused(path: str, kind: str) -> None:
    with pytest.raises(InputFileError) as caught:
        read_bytes_bounded(path, limit=CONFIG_LIMIT, what="the config")
    assert caught.value.problem == f"it is {kind}, not a regular file"
    with pytest.raises(InputFileError):
        check_regular_file(path, limit=CONFIG_LIMIT, what="the config")


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        with pytest.raises(InputFileError) as caught:
            read_bytes_bounded(path, limit=CONFIG_LIMIT, what="the config")
        # A socket cannot be opened as a file at all: the OS says so.
        assert caught.value.problem
    finally:
        server.close()


def test_missing_file_and_nul_in_path_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputFileError) as caught:
        read_bytes_bounded(tmp_path / "missing", limit=10, what="the config")
    assert caught.value.problem == "No such file or directory"
    with pytest.raises(InputFileError) as caught:
        read_bytes_bounded("a\0b", limit=10, what="the config")
    assert caught.value.problem == "the path contains a NUL character"


def test_text_that_is_not_utf8_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(b"ok\n\xff\n")
    with pytest.raises(InputFileError) as caught:
        read_text_bounded(path, limit=10, what="the config")
    assert caught.value.problem == "it is not UTF-8 text (line 2)"


def test_check_regular_file_refuses_a_file_over_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "ca.crt"
    path.write_bytes(b"x" * 11)
    check_regular_file(path, limit=11, what="the client CA file")
    with pytest.raises(InputFileError):
        check_regular_file(path, limit=10, what="the client CA file")


def test_a_log_fifo_without_a_writer_opens_at_once_and_reads_empty(tmp_path: Path) -> None:
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    with open_log_input(str(fifo)) as stream:
        assert stream.read() == b""


def test_a_log_fifo_with_a_writer_is_read_in_blocking_mode(tmp_path: Path) -> None:
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    with open_log_input(str(fifo)) as stream:
        writer = os.open(fifo, os.O_WRONLY)
        os.write(writer, b"line\n")
        os.close(writer)
        assert stream.read() == b"line\n"


@pytest.mark.parametrize("path", ["/dev/zero", "/"])
def test_log_inputs_refuse_devices_and_directories(path: str) -> None:
    with pytest.raises(InputFileError) as caught:
        open_log_input(path)
    assert caught.value.problem.endswith("not a log file or a pipe")


def test_the_documented_limits() -> None:
    assert [format_size(x) for x in (CONFIG_LIMIT, URL_FILE_LIMIT, WEB_CONFIG_LIMIT)] == [
        "4 MiB",
        "64 KiB",
        "1 MiB",
    ]
    assert format_size(TLS_FILE_LIMIT) == "1 MiB"


def test_shorten_cuts_and_escapes() -> None:
    assert shorten("k" * 100_000) == "k" * ECHO_LIMIT + "…"
    assert shorten("a\0b\x1b[2Jc\nd\u2028e\x85") == "a\\x00b\\x1b[2Jc\\x0ad\\u2028e\\x85"
    assert shorten("EGG-01") == "EGG-01"
    assert escape("plain text") == "plain text"


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=1, max_value=200))
def test_shorten_is_always_one_bounded_printable_line(text: str, limit: int) -> None:
    shown = shorten(text, limit)
    assert len(shown) <= limit + 1
    assert shown.isprintable()
    if len(text) <= limit and text.isprintable():
        assert shown == text
