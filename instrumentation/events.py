"""The log event catalog: every structured log line stocksentry writes, by name.

What the metric catalog (:mod:`.catalog`) is for counts, this is for log lines: the
integrations write these events and ``stocksentry timeline`` reads them back through
these constants, so a renamed event or field breaks the build. The fields listed are the
event's own; the correlation keys (:func:`.logs.bind_correlation`) come on every line.

Example::

    >>> STOCK_UPDATE.name, STOCK_UPDATE.fields[:3]
    ('stock_update', ('sku', 'strategy', 'qty'))
    >>> by_name("payment_callback") is PAYMENT_CALLBACK
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Level = Literal["debug", "info", "warning", "error"]


@dataclass(frozen=True, slots=True)
class LogEvent:
    """One kind of log line: its ``event`` name, level, own fields and meaning."""

    name: str
    level: Level
    fields: tuple[str, ...]
    doc: str


STOCK_CHECK: Final = LogEvent(
    "stock_check",
    "info",
    ("sku", "strategy", "available", "source", "cache"),
    "The stock the checkout read before deciding (``Reservation.stock_check``); "
    '``source`` "cache" and the ``cache`` name when it came from a cache.',
)
STOCK_UPDATE: Final = LogEvent(
    "stock_update",
    "info",
    ("sku", "strategy", "qty", "success", "from", "to", "reason"),
    "A reservation ended: ``success`` true with ``from``/``to`` when the app reported the "
    "stock it wrote; false with the conflict ``reason``.",
)
RESERVATION_ERROR: Final = LogEvent(
    "reservation_error",
    "info",
    ("sku", "strategy", "error"),
    "A reservation ended in an exception of the app's (its class name in ``error``).",
)
RESERVATION_FROZEN: Final = LogEvent(
    "reservation_frozen",
    "warning",
    ("sku", "strategy", "qty", "freeze_reason", "freeze_source"),
    "A reservation was refused before it began: its SKU is frozen (``freeze_reason`` and "
    "``freeze_source``, person or alert, from the freeze).",
)
INVENTORY_NEGATIVE: Final = LogEvent(
    "inventory_negative", "warning", ("sku", "stock"), "A write left the stock below zero."
)
PAYMENT_CALLBACK: Final = LogEvent(
    "payment_callback",
    "info",
    ("sku", "result"),
    "A payment callback ended; ``result`` is paid, replay, failed or error.",
)
ORDER_PAID: Final = LogEvent(
    "order_paid", "info", ("sku",), "An order was paid (``record_paid_order``)."
)
REFUND_DUE_TO_OVERSELL: Final = LogEvent(
    "refund_due_to_oversell", "warning", ("sku",), "A paid order was refunded: it was oversold."
)
IDEMPOTENCY_REPLAY: Final = LogEvent(
    "idempotency_replay",
    "info",
    ("operation",),
    "A retry with a known idempotency key was answered from the first result.",
)
IDEMPOTENCY_CONFLICT: Final = LogEvent(
    "idempotency_conflict",
    "warning",
    ("operation",),
    "A known idempotency key came back with another payload.",
)
CACHE_STALE_HIT: Final = LogEvent(
    "cache_stale_hit",
    "warning",
    ("cache", "sku", "cached", "actual"),
    "A decision was taken from a cached stock that the database contradicted.",
)
LOCK_ACQUIRED: Final = LogEvent(
    "lock_acquired",
    "info",
    ("lock", "holder", "wait_ms", "retries", "ttl_s"),
    "A lock was acquired; ``holder`` is a short hash of the holder's token, never the token.",
)
LOCK_ACQUIRE_TIMEOUT: Final = LogEvent(
    "lock_acquire_timeout",
    "info",
    ("lock", "wait_ms", "retries"),
    "A lock was not acquired in time.",
)
LOCK_ACQUIRE_ERROR: Final = LogEvent(
    "lock_acquire_error", "warning", ("lock", "wait_ms", "error"), "Acquiring a lock raised."
)
LOCK_EXTEND_FAILED: Final = LogEvent(
    "lock_extend_failed", "warning", ("lock", "holder", "error"), "Extending a held lock failed."
)
LOCK_EXPIRED_WHILE_HELD: Final = LogEvent(
    "lock_expired_while_held",
    "warning",
    ("lock", "holder", "held_s", "ttl_s"),
    "The holder outlived its lease: another holder may have entered.",
)
LOCK_RELEASE_NOT_OWNED: Final = LogEvent(
    "lock_release_not_owned",
    "warning",
    ("lock", "holder", "current_holder", "deleted_other_holder", "reason"),
    "A release found the lock gone or held by another owner (``current_holder``, hashed); "
    "``reason`` is ``not_held`` or ``lost_before_ttl`` when the lease had not run out.",
)
UNSAFE_READ_MODIFY_WRITE: Final = LogEvent(
    "unsafe_read_modify_write",
    "warning",
    (
        "table",
        "key_column",
        "key",
        "code",
        "function",
        "read_scope",
        "read_age_s",
        "read_locked",
        "same_transaction",
        "lock",
        "reason",
    ),
    "An unlocked read of a stock column followed by an UPDATE writing a value computed in "
    "the app, for the same row; ``code`` is the app's file and line, ``function`` its "
    "function. A read made under a distributed lock whose lease ran out before the write "
    'names the ``lock`` and gives ``reason`` "lock expired before the write".',
)
STALE_FENCING_TOKEN: Final = LogEvent(
    "stale_fencing_token",
    "warning",
    ("lock", "table", "key_column", "key", "token", "highest", "refused"),
    "An UPDATE carried a fencing token below the ``highest`` already written for the row: "
    "its holder's lock had run out and another holder had written since. ``refused`` when "
    "the statement's own ``WHERE … < token`` made the database refuse it.",
)
STOCK_UPDATE_MATCHED_NO_ROW: Final = LogEvent(
    "stock_update_matched_no_row",
    "debug",
    ("table", "reason", "key"),
    "A conditional stock update matched no row outside a reservation (inside one, it is the "
    "reservation's conflict).",
)
DB_DEADLOCK: Final = LogEvent(
    "db_deadlock",
    "warning",
    ("table", "sqlstate"),
    "The database aborted a statement as a deadlock (SQLSTATE 40P01).",
)
DB_SERIALIZATION_FAILURE: Final = LogEvent(
    "db_serialization_failure",
    "warning",
    ("table", "sqlstate"),
    "The database aborted a statement or COMMIT as a serialization failure (SQLSTATE 40001).",
)
DB_LOCK_TIMEOUT: Final = LogEvent(
    "db_lock_timeout",
    "warning",
    ("table", "sqlstate"),
    "A statement gave up waiting for a lock (SQLSTATE 55P03).",
)
INSTRUMENTATION_ERROR: Final = LogEvent(
    "stocksentry_instrumentation_error",
    "warning",
    ("component", "error"),
    "stocksentry itself failed (rate-limited, once a minute per component).",
)

#: Every event, in documentation order (the order of definition above).
EVENTS: Final[tuple[LogEvent, ...]] = tuple(
    v for v in list(globals().values()) if isinstance(v, LogEvent)
)
_BY_NAME: Final = {event.name: event for event in EVENTS}


def by_name(name: str) -> LogEvent | None:
    """The event called ``name``, or ``None`` for a line stocksentry does not write."""
    return _BY_NAME.get(name)
