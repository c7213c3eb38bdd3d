"""One way for a test to wait until something is true: :func:`wait_until`.

Tests wait for things that take a while (a server to answer, Prometheus to scrape, an
alert to arrive). Every such loop is a call to :func:`wait_until` (or
:func:`async_wait_until` inside a coroutine): poll, return what satisfied the condition,
or fail with a message that shows the last value seen. Timeouts are generous (seconds to
tens of seconds) because a loaded two-core machine is slow; a test that passes waits only
as long as the thing takes.

To stop early (a child process that exited), let the probe raise.

>>> import itertools
>>> counter = itertools.count()
>>> wait_until(lambda: next(counter), accept=lambda n: n >= 3, timeout=5, interval=0)
3
"""

from __future__ import annotations

import asyncio
import inspect
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

Message = str | Callable[[Any], str]


class WaitTimeout(AssertionError):
    """The condition did not hold within the timeout; ``last`` is the last value seen."""

    def __init__(self, text: str, last: object) -> None:
        super().__init__(text)
        self.last = last


def _fail(message: Message, timeout: float, last: object) -> WaitTimeout:
    what = message(last) if callable(message) else f"{message}; last value {last!r}"
    return WaitTimeout(f"not within {timeout} s: {what}", last)


def wait_until(
    probe: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.05,
    accept: Callable[[T], object] = bool,
    message: Message = "the condition",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``probe`` until ``accept(value)`` holds; return that value.

    The probe runs at least once, even with ``timeout=0``. After ``timeout`` seconds (by
    ``clock``), raises :class:`WaitTimeout` whose text is ``message`` (or
    ``message(last_value)`` when it is callable). ``clock`` and ``sleep`` are there so
    the helper itself is tested without waiting.
    """
    deadline = clock() + timeout
    while True:
        value = probe()
        if accept(value):
            return value
        if clock() >= deadline:
            raise _fail(message, timeout, value)
        sleep(interval)


async def async_wait_until(
    probe: Callable[[], T | Awaitable[T]],
    *,
    timeout: float,  # noqa: ASYNC109 - checked between probes; asyncio.timeout would cancel one mid-call
    interval: float = 0.05,
    accept: Callable[[T], object] = bool,
    message: Message = "the condition",
) -> T:
    """:func:`wait_until` for coroutines: the probe may be async; sleeps with asyncio."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = probe()
        value: T = await result if inspect.isawaitable(result) else result  # type: ignore[assignment]
        if accept(value):
            return value
        if loop.time() >= deadline:
            raise _fail(message, timeout, value)
        await asyncio.sleep(interval)


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """Whether ``url`` answers 200 now (a refused or failed connection is ``False``)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except OSError:  # refused, reset, timed out, or an HTTP error status
        return False


class FakeClock:
    """A clock for the ``clock=`` of the code under test: it moves only when told
    (``now``) or when the code sleeps through :meth:`sleep`."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
