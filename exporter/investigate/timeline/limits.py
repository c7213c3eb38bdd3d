"""The bounds of timeline: what it shows by default, and what keeps its memory flat.

Standard library only, and nothing else of the package, so that building the
``stocksentry`` parser stays light (see :mod:`.command`).
"""

from __future__ import annotations

from typing import Final

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
#: Characters of one log line that are parsed; a longer line is skipped and counted (only
#: this much of it is ever held in memory, however long it is).
MAX_LINE: Final = 1024 * 1024
#: Characters of one line read (and dropped) while looking for its end: an input with no
#: line break in that much text is not a log (``/dev/zero`` on stdin), and stops the run.
MAX_LINE_SCAN: Final = 64 * 1024 * 1024
#: Nesting of JSON objects and lists kept in an event's fields; a line nested deeper is
#: skipped and counted (rendering it would recurse as deep).
MAX_DEPTH: Final = 32
#: The largest magnitude of a stock number (``from``, ``to``, ``available``, ...); a line
#: with a larger one, or with NaN or an infinity, is skipped and counted.
MAX_NUMBER: Final = 2**63
#: Characters of one id (``sku``, ``request_id``, ``order_id``, ...); a line with a longer
#: one is skipped and counted: cutting it could make two ids one, and keeping it whole
#: would let one line hold megabytes in every table the analysis keeps.
MAX_ID: Final = 512
