"""Run-time state of the detector: remembered reads, per-connection locks, scopes, keys."""

from __future__ import annotations

import contextlib
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, NamedTuple, TypeAlias, TypeVar

from ..heldlocks import HeldLock
from .model import MAX_KEY_CHARS, READS_PER_SCOPE, StatementInfo

if TYPE_CHECKING:
    from sqlalchemy.engine.base import RootTransaction

Key: TypeAlias = tuple[str, str, object]  # table label, key column, normalised value
K = TypeVar("K")
V = TypeVar("V")
# In a reservation's store, (table, ANY_ROW, key column) holds the table's latest read.
ANY_ROW = "\x00any"


class Read(NamedTuple):
    """One remembered read of a stock value, with the distributed locks held at the time."""

    locked: bool
    txn: weakref.ref[RootTransaction] | None
    at: float
    held: tuple[HeldLock, ...]


@dataclass(slots=True, eq=False)
class ConnState:
    """Per SQLAlchemy ``Connection`` (one checkout): its reads, its transaction's locks."""

    reads: dict[Key, Read] = field(default_factory=dict)
    txn: weakref.ref[RootTransaction] | None = None
    locks: set[Key] = field(default_factory=set)
    lock_all: set[str] = field(default_factory=set)
    isolation: str | None = None
    begun: bool = False
    # A BEGIN seen inside SQLAlchemy's "begin" event, before its transaction object
    # exists; it belongs to the transaction seen next.
    pending: StatementInfo | None = None
    last_table: str | None = None

    def sync(self, txn: RootTransaction | None) -> None:
        """Forget the locks of a transaction that has ended."""
        current = self.txn
        if current is not None and txn is not None and current() is txn:
            return
        if current is None and txn is None:
            return
        self.locks.clear()
        self.lock_all.clear()
        self.isolation = None
        self.begun = False
        self.txn = weakref.ref(txn) if txn is not None else None
        pending = self.pending
        if pending is not None and txn is not None:
            self.pending = None
            self.apply_begin(pending)

    def apply_begin(self, info: StatementInfo) -> None:
        if info.kind == "begin":
            self.begun = True
            if info.table_lock:
                self.lock_all.add("*")
        if info.isolation is not None:
            self.isolation = info.isolation


def remember(store: dict[K, V], key: K, value: V, limit: int = READS_PER_SCOPE) -> None:
    """Set ``store[key]``, forgetting the oldest entry past ``limit`` entries."""
    store.pop(key, None)  # re-insert at the end: the oldest entry is first
    store[key] = value
    if len(store) > limit:
        # Another thread may have changed the store meanwhile: then it is small enough.
        with contextlib.suppress(StopIteration, KeyError, RuntimeError):
            del store[next(iter(store))]


# Reads remembered for the active reservation and for the bound request_id. The var holds
# (owner, store): a store belongs to one reservation / request, a new owner starts afresh,
# so the reads of an ended reservation are never seen again.
reservation_reads: ContextVar[tuple[object, dict[Key, Read]] | None] = ContextVar(
    "stocksentry_sqlalchemy_reservation_reads", default=None
)
request_reads: ContextVar[tuple[object, dict[Key, Read]] | None] = ContextVar(
    "stocksentry_sqlalchemy_request_reads", default=None
)


def scope(
    var: ContextVar[tuple[object, dict[Key, Read]] | None], owner: object, create: bool
) -> dict[Key, Read] | None:
    held = var.get()
    if held is not None and (held[0] is owner or held[0] == owner):
        return held[1]
    if not create:
        return None
    store: dict[Key, Read] = {}
    var.set((owner, store))
    return store


def key_fields(key: Key) -> dict[str, str]:
    """The log fields naming the row of ``key``."""
    return {"table": key[0], "key_column": key[1], "key": str(key[2])}


_CUT = (str, bytes)


def normalise(value: object) -> object:
    """A comparable form of a key value: 5, 5.0 and Decimal(5) meet; long strings are cut."""
    if isinstance(value, _CUT):
        return value[:MAX_KEY_CHARS]
    if isinstance(value, int):  # bool too
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    return str(value)[:MAX_KEY_CHARS]  # a UUID as its text
