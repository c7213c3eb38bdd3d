"""``stocksentry timeline``: moved to :mod:`stocksentry.exporter.investigate.timeline`.

This module keeps the old import path working: it *is* that package (an alias in
``sys.modules``), so its names load on first use as the package loads them, and
``from stocksentry.exporter.timeline import add_timeline_parser`` stays light. The names
are listed once, in the package's ``__all__``.

Example::

    >>> from stocksentry.exporter.timeline import analyse, read_events
    >>> report = analyse(read_events(["[10:00:00.101] request_id=R1 sku=A stock_check x=1"]))
    >>> report.events, report.findings
    (1, [])
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from .investigate import timeline as _package

if TYPE_CHECKING:
    from .investigate.timeline import *  # noqa: F403 - the old path offers exactly the new names
    from .investigate.timeline import __all__ as __all__
else:
    sys.modules[__name__] = _package
