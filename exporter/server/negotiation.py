"""Content negotiation for ``/metrics``: which format (``Accept``), whether gzip.

Prometheus text 0.0.4 is the default; OpenMetrics 1.0.0, the only format that carries
exemplars, when ``Accept`` prefers it; gzip when ``Accept-Encoding`` allows it.

Example::

    >>> wants_openmetrics("application/openmetrics-text;version=1.0.0,*/*;q=0.1")
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

__all__ = ["CONTENT_TYPE_OPENMETRICS", "CONTENT_TYPE_TEXT", "wants_gzip", "wants_openmetrics"]

#: Prometheus text format, the default.
CONTENT_TYPE_TEXT: Final = "text/plain; version=0.0.4; charset=utf-8"
#: OpenMetrics 1.0.0, chosen by ``Accept``; the only format that carries exemplars.
CONTENT_TYPE_OPENMETRICS: Final = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def _media_ranges(header: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """``a/b;version=1;q=0.5, c/d`` -> (media type, params, q) per range."""
    for part in header.split(","):
        media, *raw_params = part.split(";")
        params: dict[str, str] = {}
        for raw in raw_params:
            name, _, value = raw.partition("=")
            params[name.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        yield media.strip().lower(), params, q


def wants_openmetrics(accept: str) -> bool:
    """True when ``Accept`` prefers OpenMetrics 1.x over the Prometheus text format.

    OpenMetrics is chosen when an ``application/openmetrics-text`` range without a
    version, or with a 1.x version, has a q above 0 and at least that of ``text/plain``
    and ``*/*``. Prometheus itself sends exactly such a header.

    Example::

        >>> wants_openmetrics("application/openmetrics-text;version=1.0.0;q=0.6,*/*;q=0.2")
        True
        >>> wants_openmetrics("text/plain;version=0.0.4")
        False
    """
    best_om = 0.0
    best_other = 0.0
    for media, params, q in _media_ranges(accept):
        if media == "application/openmetrics-text":
            version = params.get("version", "1.0.0")
            if version.split(".")[0] == "1":
                best_om = max(best_om, q)
        elif media in ("text/plain", "*/*", "text/*"):
            best_other = max(best_other, q)
    return best_om > 0 and best_om >= best_other


def wants_gzip(accept_encoding: str) -> bool:
    """True when ``Accept-Encoding`` allows gzip (explicitly or through ``*``).

    Example::

        >>> wants_gzip("gzip, deflate"), wants_gzip("gzip;q=0, *"), wants_gzip("")
        (True, False, False)
    """
    gzip_q: float | None = None
    star_q: float | None = None
    for coding, _, q in _media_ranges(accept_encoding):
        if coding in ("gzip", "x-gzip"):
            gzip_q = q
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0
