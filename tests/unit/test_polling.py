"""tests/polling.py, on an injected clock: no test here waits."""

from __future__ import annotations

import doctest
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import polling
import pytest
from localhttp import serve_http
from polling import FakeClock, WaitTimeout, async_wait_until, http_ok, wait_until


def test_returns_the_first_accepted_value() -> None:
    clock = FakeClock()
    values = iter([0, 0, 7, 9])
    got = wait_until(lambda: next(values), timeout=10, interval=1, clock=clock, sleep=clock.sleep)
    assert got == 7
    assert clock.sleeps == [1, 1]


def test_accept_decides() -> None:
    clock = FakeClock()
    values = iter([[1], [1, 2], [1, 2, 3]])
    got = wait_until(
        lambda: next(values),
        accept=lambda v: len(v) == 3,
        timeout=10,
        clock=clock,
        sleep=clock.sleep,
    )
    assert got == [1, 2, 3]


def test_times_out_with_the_last_value() -> None:
    clock = FakeClock()
    with pytest.raises(WaitTimeout, match=r"not within 2 s: ready; last value 'no'") as info:
        wait_until(
            lambda: "no",
            accept=lambda v: v == "yes",
            timeout=2,
            interval=0.5,
            message="ready",
            clock=clock,
            sleep=clock.sleep,
        )
    assert info.value.last == "no"
    assert clock.sleeps == [0.5, 0.5, 0.5, 0.5]
    assert isinstance(info.value, AssertionError)  # pytest shows it as a failed assertion


def test_callable_message_sees_the_last_value() -> None:
    clock = FakeClock()
    with pytest.raises(WaitTimeout, match=r"targets down: \['a'\]"):
        wait_until(
            lambda: ["a"],
            accept=lambda v: not v,
            timeout=1,
            interval=1,
            message=lambda last: f"targets down: {last}",
            clock=clock,
            sleep=clock.sleep,
        )


def test_probes_once_even_with_no_time() -> None:
    clock = FakeClock()
    assert wait_until(lambda: 1, timeout=0, clock=clock, sleep=clock.sleep) == 1
    assert clock.sleeps == []


def test_a_probe_that_raises_stops_the_wait() -> None:
    def probe() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until(probe, timeout=60)


async def test_async_wait_until_takes_sync_and_async_probes() -> None:
    values = iter([False, True])
    assert await async_wait_until(lambda: next(values), timeout=30, interval=0) is True

    calls: list[int] = []

    async def probe() -> int:
        calls.append(1)
        return len(calls)

    assert await async_wait_until(probe, accept=lambda n: n == 3, timeout=30, interval=0) == 3


async def test_async_wait_until_times_out() -> None:
    with pytest.raises(WaitTimeout, match="never; last value 0"):
        await async_wait_until(lambda: 0, timeout=0, message="never")


@pytest.fixture
def http_server() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    with serve_http(Handler) as url:
        yield url


def test_http_ok(http_server: str) -> None:
    assert http_ok(f"{http_server}/ok") is True
    assert http_ok(f"{http_server}/busy") is False
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]  # bound, not listening: refused
        assert http_ok(f"http://127.0.0.1:{closed}/") is False


def test_doctest() -> None:
    assert doctest.testmod(polling).failed == 0
