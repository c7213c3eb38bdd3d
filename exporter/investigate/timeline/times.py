"""Timestamps of log lines: ISO-8601 date-times, epoch numbers, times of day.

Parsing is :meth:`datetime.datetime.fromisoformat`'s (Python 3.11 reads ``Z``, offsets
with or without a colon, ``,`` or ``.`` before up to any number of fraction digits, and a
space or ``T`` between date and time), after a cheap check that the text has the shape of
a date and a time with seconds, so that a word or a number is never taken for a date.
A date-time without an offset is UTC. Times of day (``10:00:00.101``) are seconds since
midnight of an unknown day.

Example::

    >>> parse_time_text("2026-11-29T13:41:14.262Z")
    (1795959674.262, True)
    >>> parse_time_text("2026-11-29 20:41:14,262+07:00")
    (1795959674.262, True)
    >>> parse_time_text("10:00:00.101")
    (36000.101, False)
    >>> parse_time_value(1795959674262)   # epoch milliseconds
    (1795959674.262, True)
"""

from __future__ import annotations

import functools
import math
import re
import time
from datetime import UTC, datetime
from datetime import time as clock_time
from typing import Final

#: Seconds, and whether they are since the epoch (True) or since midnight (False).
Stamp = tuple[float, bool]

_DATE_AND_TIME: Final = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d")
_TIME_OF_DAY: Final = re.compile(r"\d\d?:\d\d:\d\d(?:[.,]\d+)?\Z")
#: A time written as a number, in text: epoch seconds (or ms, us, ns).
NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?\Z")


@functools.lru_cache(maxsize=1024)
def parse_time_text(text: str) -> Stamp | None:
    """An ISO-8601 date-time (UTC unless it says otherwise) or a bare time of day."""
    # Cached: a busy log writes the same millisecond on several lines.
    if _DATE_AND_TIME.match(text):
        if text[-1] == "z":
            # Some loggers write the zone in lower case; fromisoformat wants "Z".
            text = text[:-1] + "Z"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp(), True
    if _TIME_OF_DAY.match(text):
        try:
            clock = clock_time.fromisoformat(text if text[2] == ":" else "0" + text)
        except ValueError:
            return None
        seconds = clock.hour * 3600 + clock.minute * 60 + clock.second
        return seconds + clock.microsecond / 1_000_000, False
    return None


def parse_time_value(value: object) -> Stamp | None:
    """A JSON time value: text as :func:`parse_time_text`, or epoch s / ms / us / ns;
    ``None`` for anything else, a number that is no time (negative, NaN, 10**400) too."""
    if isinstance(value, str):
        text = value.strip()
        parsed = parse_time_text(text)
        if parsed is not None or not NUMBER.match(text):
            return parsed
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None  # an integer beyond any float (10**400)
    if not math.isfinite(seconds) or seconds < 0:
        return None
    if seconds > 1e17:
        seconds /= 1e9
    elif seconds > 1e14:
        seconds /= 1e6
    elif seconds > 1e11:
        seconds /= 1e3
    return seconds, True


def format_time(ts: float, dated: bool, *, with_date: bool = True) -> str:
    """Render a timestamp: ISO-8601 UTC with milliseconds, or ``HH:MM:SS.mmm``.

    Example::

        >>> format_time(1795959674.262, True)
        '2026-11-29T13:41:14.262Z'
        >>> format_time(1795959674.262, True, with_date=False)
        '13:41:14.262'
        >>> format_time(36000.101, False)
        '10:00:00.101'
    """
    millis = round(ts * 1000)
    seconds, millis = divmod(millis, 1000)
    if dated:
        pattern = "%Y-%m-%dT%H:%M:%S" if with_date else "%H:%M:%S"
        text = time.strftime(pattern, time.gmtime(seconds)) + f".{millis:03d}"
        return text + "Z" if with_date else text
    day, seconds = divmod(seconds, 86400)
    hours, rest = divmod(seconds, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{millis:03d}"
    return f"{text} (+{day}d)" if day else text
