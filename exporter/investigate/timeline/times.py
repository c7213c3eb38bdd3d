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

import math
import re
import time
from datetime import UTC, datetime
from datetime import time as clock_time
from typing import Final

__all__ = ["Stamp", "format_time", "parse_time_text", "parse_time_value"]

#: Seconds, and whether they are since the epoch (True) or since midnight (False).
Stamp = tuple[float, bool]

_DATE_AND_TIME: Final = re.compile(r"\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d")
_TIME_OF_DAY: Final = re.compile(r"\d\d?:\d\d:\d\d(?:[.,]\d+)?\Z")
_NUMBER: Final = re.compile(r"-?\d+(?:\.\d+)?\Z")
#: The shape most logs write (stocksentry's own: ``2026-11-29T13:41:14.262Z``), read by
#: :func:`utc_millis` without fromisoformat: the date's start in microseconds is cached,
#: the rest is arithmetic.
UTC_MILLIS: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z"
)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_DAY_CACHE: dict[str, int | None] = {}
_DAY_CACHE_SIZE: Final = 4096


def _day_micros(date: str) -> int | None:
    """Microseconds from the epoch to midnight UTC of ``date`` (``None``: no date)."""
    try:
        day = datetime.fromisoformat(date).replace(tzinfo=UTC)
    except ValueError:
        micros = None
    else:
        delta = day - _EPOCH
        micros = (delta.days * 86400 + delta.seconds) * 1_000_000
    if len(_DAY_CACHE) >= _DAY_CACHE_SIZE:
        _DAY_CACHE.clear()
    _DAY_CACHE[date] = micros
    return micros


def utc_millis(text: str) -> Stamp | None:
    """:func:`parse_time_text` of a :data:`UTC_MILLIS` text, to the same float."""
    date = text[:10]
    day = _DAY_CACHE[date] if date in _DAY_CACHE else _day_micros(date)
    hour, minute, second = int(text[11:13]), int(text[14:16]), int(text[17:19])
    if day is None or hour > 23 or minute > 59 or second > 59:
        return None
    # Integer microseconds divided once: what datetime.timestamp() computes, bit for bit.
    millis = ((hour * 60 + minute) * 60 + second) * 1000 + int(text[20:23])
    return (day + millis * 1000) / 1_000_000, True


def parse_time_text(text: str) -> Stamp | None:
    """An ISO-8601 date-time (UTC unless it says otherwise) or a bare time of day."""
    if len(text) == 24 and UTC_MILLIS.match(text):
        return utc_millis(text)
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
    """A JSON time value: text as :func:`parse_time_text`, or epoch s / ms / us / ns."""
    if isinstance(value, str):
        text = value.strip()
        parsed = parse_time_text(text)
        if parsed is not None or not _NUMBER.match(text):
            return parsed
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        # An integer beyond any float (10**400): no time.
        return None
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
