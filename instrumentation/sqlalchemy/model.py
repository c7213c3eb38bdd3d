"""What the SQLAlchemy integration knows about a table and a statement.

:class:`StockTable` says where the stock lives; :class:`StatementInfo` is what the
classifier makes of one SQL text. No SQLAlchemy import: the classifier runs without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

SpanMode = Literal["off", "locking", "all"]
WriteKind = Literal["none", "self", "sql", "blind"]

#: How long a read of a stock value is remembered (seconds), by default.
DEFAULT_READ_WINDOW = 30.0
# Distinct SQL texts classified before the cache starts over. An application has a few
# hundred; one that renders literals into its SQL would otherwise grow it without end.
PLAN_CACHE_SIZE = 2048
# And in bytes: the cached SQL texts hold at most this many characters in all (at most
# 4 bytes each), and a text longer than PLAN_CACHE_MAX_TEXT is classified every time
# instead of kept (a bulk INSERT with rendered literals runs once anyway).
PLAN_CACHE_CHARS = 1 << 21
PLAN_CACHE_MAX_TEXT = 16384
# Keys remembered per scope (connection, reservation, request): a checkout touches a few.
READS_PER_SCOPE = 64
# Longest key value kept (and compared); a longer one is cut.
MAX_KEY_CHARS = 256
COMPONENT = "sqlalchemy"


@dataclass(frozen=True, slots=True)
class StockTable:
    """Where the stock lives in one table.

    ``stock_column`` holds the available quantity; ``key_columns`` identify a row (an
    equality on any of them in a ``WHERE`` names the row for the detector);
    ``version_column``, when the table has one, marks compare-and-set writes
    (``… WHERE id = :id AND version = :v``) as safe.

    Example::

        StockTable(stock_column="qty_on_hand", key_columns=("product_id",))
    """

    stock_column: str = "available_stock"
    key_columns: tuple[str, ...] = ("id", "sku")
    version_column: str | None = None

    def __post_init__(self) -> None:
        if not self.stock_column or not self.key_columns or not all(self.key_columns):
            raise ValueError("StockTable needs a stock_column and at least one key column")


#: A value in a statement: ``(True, name_or_index)`` for a bound parameter, ``(False,
#: value)`` for a literal.
ValueRef: TypeAlias = tuple[bool, Any]
#: What :func:`bound_value` returns for a parameter the statement's parameters lack.
MISSING: Any = object()


def bound_value(ref: ValueRef, parameters: Any) -> Any:
    """The value ``ref`` stands for in a statement run with ``parameters`` (or MISSING)."""
    is_param, value = ref
    if not is_param:
        return value
    try:
        return parameters[value]
    except (KeyError, IndexError, TypeError):
        return MISSING


@dataclass(frozen=True, slots=True)
class StatementInfo:
    """What one SQL text does, as far as stock concurrency goes (see :func:`classify_statement`).

    ``table`` is the configured stock table the statement works on (its name as given in
    ``stock_tables``), else the first table it names, else ``None``.
    """

    kind: Literal["select", "update", "delete", "insert", "lock", "begin", "isolation", "other"]
    table: str | None = None
    stock: bool = False
    #: Timed as a lock wait.
    locking: bool = False
    #: ``for update``, ``for no key update``, ``for share``, ``for key share``,
    #: ``lock in share mode`` (MySQL), ``lock table``, ``lock tables`` (MySQL), ``update``
    #: or ``delete``.
    lock_clause: str | None = None
    #: Takes row locks that keep other transactions from writing the stock rows it names.
    protects_rows: bool = False
    #: ``LOCK TABLE`` in a mode that blocks writers, MySQL's ``LOCK TABLES`` (``READ`` or
    #: ``WRITE``) or SQLite's ``BEGIN IMMEDIATE``.
    table_lock: bool = False
    reads_stock: bool = False
    #: How an ``UPDATE`` sets the stock column: ``self`` from the column itself
    #: (``s = s - :q``), ``sql`` from other columns, ``blind`` from literals and
    #: parameters only (``s = :computed``), ``none`` when it does not set it.
    write: WriteKind = "none"
    stock_guard: bool = False
    version_guard: bool = False
    #: ``(column, value)`` equalities on key columns, ANDed at the top of the ``WHERE``.
    keys: tuple[tuple[str, ValueRef], ...] = ()
    returning: bool = False
    isolation: str | None = None

    @property
    def conditional(self) -> bool:
        """An update whose ``WHERE`` re-checks the stock (or version): 0 rows is a conflict."""
        return self.write in ("self", "blind") and (self.stock_guard or self.version_guard)


IGNORED = StatementInfo("other")
