"""The one duration grammar of stocksentry: Prometheus's.

Every duration a user writes — a probe interval in the config, ``reconcile --since``, a
chart value — is spelled as Prometheus spells its own (``model.ParseDuration``): whole
numbers with the units ``ms``, ``s``, ``m``, ``h``, ``d``, ``w`` and ``y``, largest unit
first, each at most once (``1h30m``, ``500ms``, ``2d``, ``0``). A YAML or command-line
*number* is a number of seconds and may have a fraction (``0.25``); a string may not
(``1.5s`` is refused, as Prometheus refuses it), so what works in a rule file works here.
A day is 24 h, a week 7 d and a year 365 d, as in Prometheus.

:data:`DURATION_PATTERN` is the same grammar as a regular expression, for JSON schemas.

Example::

    parse_duration("1m30s")   # 90.0
    parse_duration(0.25)      # 0.25
    format_duration(90)       # '1m30s'
"""

from __future__ import annotations

import math
import re
from typing import Final

__all__ = ["DURATION_PATTERN", "UNIT_SECONDS", "format_duration", "parse_duration"]

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
_GRAMMAR: Final = re.compile(
    r"(?:(?P<y>[0-9]+)y)?(?:(?P<w>[0-9]+)w)?(?:(?P<d>[0-9]+)d)?(?:(?P<h>[0-9]+)h)?"
    r"(?:(?P<m>[0-9]+)m)?(?:(?P<s>[0-9]+)s)?(?:(?P<ms>[0-9]+)ms)?"
)
# Digits in one part: far beyond any sensible duration, short enough to parse in no time.
_MAX_DIGITS: Final = 18


def parse_duration(value: str | int | float) -> float:
    """Seconds from a non-negative number of seconds or a Prometheus duration string.

    Raises :class:`ValueError` (whose message quotes at most 40 characters of the input)
    for anything else: booleans, negative or non-finite numbers, fractions inside a
    string, units out of order, an empty string.

    Example::

        parse_duration("1h30m")  # 5400.0
        parse_duration("0")      # 0.0
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("not a duration: too large") from None
    elif isinstance(value, str):
        seconds = _parse_text(value.strip())
    else:
        raise ValueError(f"not a duration: a {type(value).__name__}")
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
    """The shortest spelling of ``seconds`` that :func:`parse_duration` reads back.

    Whole milliseconds become a Prometheus string; a finer fraction stays a number of
    seconds (``format_duration(0.0001) == "0.0001"``), since the grammar cannot hold it.

    Example::

        format_duration(90)     # '1m30s'
        format_duration(0.25)   # '250ms'
        format_duration(86400)  # '1d'
    """
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
