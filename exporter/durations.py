"""The one duration grammar of stocksentry: Prometheus's (``model.ParseDuration``).

A number is seconds and may have a fraction; a string is whole numbers with units, largest
first (docs/exporter-config.md, "Durations"); a day is 24 h, a year 365 d.

Example::

    >>> parse_duration("1m30s"), format_duration(90)
    (90.0, '1m30s')
"""

from __future__ import annotations

import math
import re
from typing import Final

#: Seconds per unit, largest first: the order the grammar requires.
UNIT_SECONDS: Final[dict[str, float]] = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}


def _pattern() -> str:
    # One alternative per leading unit, so that the empty string is refused without a
    # lookahead: Helm checks values.schema.json with Go's RE2, which has none.
    units = list(UNIT_SECONDS)
    alternatives = [
        f"[0-9]+{unit}" + "".join(f"([0-9]+{later})?" for later in units[index + 1 :])
        for index, unit in enumerate(units)
    ]
    return "^(0|" + "|".join(alternatives) + ")$"


#: The grammar as a regular expression (anchored), for ``values.schema.json`` and friends;
#: plain RE2 (no lookaround), so Go's JSON-schema validators (Helm's) take it too.
DURATION_PATTERN: Final = _pattern()
_GRAMMAR: Final = re.compile("".join(f"(?:(?P<{unit}>[0-9]+){unit})?" for unit in UNIT_SECONDS))
# Digits in one part: far beyond any sensible duration, short enough to parse in no time.
_MAX_DIGITS: Final = 18


def parse_duration(value: str | int | float) -> float:
    """Seconds from a non-negative number of seconds or a Prometheus duration string;
    :class:`ValueError` (quoting at most 40 characters) for any other int, float or str."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("not a duration: too large") from None
    else:
        seconds = _parse_text(value.strip())
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a duration: {_shown(value)}")
    return seconds


def _parse_text(text: str) -> float:
    if text == "0":
        return 0.0
    match = _GRAMMAR.fullmatch(text) if text and len(text) <= 200 else None
    if match is None or not any(match.groupdict().values()):
        raise ValueError(
            f"not a duration: {_shown(text)} (use whole numbers with ms, s, m, h, d, w or y, "
            "largest first, like 1m30s)"
        )
    seconds = 0.0
    for unit, digits in match.groupdict().items():
        if digits is None:
            continue
        if len(digits) > _MAX_DIGITS:
            raise ValueError(f"not a duration: {_shown(text)} is too large")
        seconds += int(digits) * UNIT_SECONDS[unit]
    return seconds


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_duration(seconds: float) -> str:
    """The shortest spelling of ``seconds`` that :func:`parse_duration` reads back (a
    fraction finer than a millisecond stays a number of seconds: ``"0.0001"``)."""
    if seconds == 0:
        return "0"
    millis = round(seconds * 1000)
    if not math.isfinite(seconds) or seconds < 0 or abs(millis - seconds * 1000) > 1e-6:
        return f"{seconds:g}"
    parts: list[str] = []
    for unit, size in UNIT_SECONDS.items():
        size_ms = round(size * 1000)
        if millis >= size_ms:
            count, millis = divmod(millis, size_ms)
            parts.append(f"{count}{unit}")
    return "".join(parts)
