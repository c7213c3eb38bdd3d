"""The bounds of timeline: what it shows by default, and what keeps its memory flat.

Standard library only, and nothing else of the package, so that building the
``stocksentry`` parser stays light (see :mod:`.command`).
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_REORDER_WINDOW",
    "FINDING_PARTICIPANTS",
    "MAX_GROUPS",
    "MAX_KEYS",
    "OPEN_CHECKS",
    "RECENT_FROMS",
    "REORDER_BUFFER",
    "SKIPPED_EXAMPLES",
]

#: Events shown per SKU and per order unless ``--limit`` says otherwise (0: all).
DEFAULT_LIMIT: Final = 50
#: Seconds of timestamp disorder inside one input that are put back in order.
DEFAULT_REORDER_WINDOW: Final = 60.0
#: Events held per input while reordering, whatever the window says.
REORDER_BUFFER: Final = 20_000
#: SKUs and orders that get a timeline of their own; the events of later ones are counted.
MAX_GROUPS: Final = 1_000
#: Distinct recent ``from`` values remembered per SKU for the same-old-value rule.
RECENT_FROMS: Final = 64
#: Requests with a ``stock_check`` and no ``stock_update`` yet, over all SKUs.
OPEN_CHECKS: Final = 100_000
#: Idempotency keys and payment references remembered (first use of each); the oldest are
#: forgotten beyond this, so a duplicate further apart than that many keys goes unseen.
MAX_KEYS: Final = 500_000
#: Requests named in one finding; more are counted, not listed.
FINDING_PARTICIPANTS: Final = 1_000
#: Unparsable lines whose position is reported.
SKIPPED_EXAMPLES: Final = 5
