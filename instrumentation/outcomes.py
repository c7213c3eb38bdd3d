"""How a reservation ended: the outcome names and the classification of exceptions.

``ConflictReason`` and ``Outcome`` are the catalog's (:mod:`.catalog`), defined there once.
"""

from __future__ import annotations

from . import catalog
from .catalog import ConflictReason, Outcome

# SQLSTATEs that mean the database refused the reservation rather than failed: a deadlock,
# a serialization failure, a lock that could not be had in time.
_SQLSTATE_REASONS: dict[str, ConflictReason] = {
    "40P01": "deadlock",
    "40001": "serialization_failure",
    "55P03": "lock_timeout",
}


class ReservationConflict(Exception):
    """Raise inside a reservation to end it as a conflict; it is re-raised unchanged.

    Example::

        with reservation("EGG-01", strategy="atomic"):
            if rows == 0:
                raise ReservationConflict("out_of_stock")
    """

    def __init__(self, reason: ConflictReason, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason: ConflictReason = reason


def classify_exception(exc: BaseException) -> Outcome:
    """The outcome a reservation ended by ``exc`` gets.

    :class:`ReservationConflict` gives its reason; a driver error carrying SQLSTATE 40P01,
    40001 or 55P03 (psycopg, asyncpg, psycopg2, also wrapped by SQLAlchemy) gives
    ``deadlock``, ``serialization_failure`` or ``lock_timeout``; SQLite's "database is
    locked" gives ``lock_timeout``; anything else is ``error``.
    """
    if isinstance(exc, ReservationConflict):
        return exc.reason if exc.reason in catalog.CONFLICT_REASONS else "error"
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__):
        if candidate is None:
            continue
        state = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(state, str) and state in _SQLSTATE_REASONS:
            return _SQLSTATE_REASONS[state]
        if type(candidate).__name__ == "OperationalError" and "database is locked" in str(
            candidate
        ):
            return "lock_timeout"
    return "error"
