"""Real negative stock writes: the value an ``UPDATE`` left in the row (from its
``RETURNING`` rows, or read back by key), counted when below zero. See docs/sqlalchemy.md,
"Real negative writes".
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from .. import catalog, events
from ..reservation import current_reservation, note_negative_write
from .model import COMPONENT, StatementInfo, StockTable
from .state import Key

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.engine.interfaces import DBAPICursor

    from ..sentry import Sentry

# A name the read-back SELECT may use as written: plain or schema-qualified identifiers.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*(?:\.[A-Za-z_][A-Za-z0-9_$]*)?\Z")
# One bound parameter in each DBAPI style, and whether its parameters are a mapping.
_PARAM = {
    "pyformat": ("%(k)s", True),
    "named": (":k", True),
    "format": ("%s", False),
    "qmark": ("?", False),
    "numeric": (":1", False),
    "numeric_dollar": ("$1", False),
}


def as_int(value: object) -> int | None:
    """A column or parameter value as an ``int`` (driver text, ``Decimal``), ``None`` when
    it is not a whole number.

    Example::

        >>> as_int(b"-38"), as_int("7"), as_int(None)
        (-38, 7, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        # A driver's text cell: int() takes it as it is, the common case, without Decimal.
        with contextlib.suppress(ValueError):
            return int(value)
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("ascii", "replace")
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        return None
    if not number.is_finite() or number != number.to_integral_value():
        return None
    return int(number)


def key_selects(
    columns: Mapping[str, str], tables: Mapping[str, StockTable], paramstyle: str
) -> dict[tuple[str, str], tuple[str, bool] | None]:
    """For each table of ``columns`` (table -> column) and each of its key columns, the
    ``SELECT`` of that column by key in ``paramstyle`` and whether its parameter is passed
    by name; ``None`` when a name is not a plain identifier.

    Example::

        >>> key_selects({"products": "stock"}, {"products": StockTable(key_columns=("sku",))},
        ...             "pyformat")
        {('products', 'sku'): ('SELECT stock FROM products WHERE sku = %(k)s', True)}
    """
    selects: dict[tuple[str, str], tuple[str, bool] | None] = {}
    for table, column in columns.items():
        param = _PARAM.get(paramstyle)
        for key_column in tables[table].key_columns:
            names = (table, column, key_column)
            if param is None or not all(_PLAIN_NAME.match(name) for name in names):
                selects[(table, key_column)] = None
                continue
            # Names from the set-up config, checked to be plain identifiers; the value is bound.
            sql = f"SELECT {column} FROM {table} WHERE {key_column} = {param[0]}"  # noqa: S608
            selects[(table, key_column)] = sql, param[1]
    return selects


def read_column(conn: Connection, query: tuple[str, bool], key: object) -> list[object]:
    """Run a :func:`key_selects` query for ``key`` on a second cursor of ``conn``'s
    DBAPI connection: the same transaction, the app's cursor (its rowcount, read later by
    SQLAlchemy) untouched, and no SQLAlchemy event (so no listener of ours) on the way."""
    sql, by_name = query
    dbapi_conn: Any = conn.connection.dbapi_connection
    reader = dbapi_conn.cursor()
    try:
        reader.execute(sql, {"k": key} if by_name else (key,))
        rows = reader.fetchall()
    finally:
        reader.close()
    return [row[0] for row in rows]


def returned_column(cursor: Any, column: str) -> list[object] | None:
    """The values of ``column`` in the rows the driver holds for ``cursor``, read without
    consuming them; ``None`` when this cursor's rows cannot be read that way."""
    wanted = column.lower()
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(cursor, psycopg.Cursor):
        # psycopg 3 keeps the whole result: read its cells in place, no row is built (and
        # no description either, which costs more than the rest).
        result = cursor.pgresult
        if result is None:
            return None
        encoded = wanted.encode()
        for field in range(result.nfields):
            name = result.fname(field)
            if name is not None and bytes(name).lower() == encoded:
                if result.fformat(field) != 0:
                    return None  # a binary-format result: not parsed here
                return [result.get_value(row, field) for row in range(result.ntuples)]
        return None
    description = getattr(cursor, "description", None)
    if not description:
        return None
    index = next((i for i, col in enumerate(description) if str(col[0]).lower() == wanted), None)
    if index is None:
        return None
    rows = getattr(cursor, "_rows", None)
    if rows is not None and type(rows).__name__ == "deque":
        # SQLAlchemy's asyncio adapters (asyncpg, psycopg async, aiosqlite) fetch every row
        # at execute into this private buffer; they document no way to read their rows
        # without consuming them. A server-side adapter leaves it empty.
        return [row[index] for row in rows]
    psycopg2 = sys.modules.get("psycopg2.extensions")
    if psycopg2 is not None and isinstance(cursor, psycopg2.cursor) and not cursor.name:
        # A client-side psycopg 2 cursor holds every row and scrolls back.
        position = cursor.rownumber
        fetched = cursor.fetchall()
        cursor.scroll(position, mode="absolute")
        return [row[index] for row in fetched]
    return None


class NegativeWrites:
    """The per-engine checker of :mod:`negative`: what it looks at and how it reads back."""

    __slots__ = ("metrics", "read_back", "returning", "selects", "sentry", "specs")

    def __init__(
        self,
        sentry: Sentry,
        tables: Mapping[str, StockTable],
        *,
        returning: bool,
        read_back: bool | Iterable[str],
        paramstyle: str,
    ) -> None:
        names = set(tables) if read_back is True else set(read_back or ())
        unknown = names - set(tables)
        if unknown:
            raise ValueError(
                f"read_back_stock names tables not in stock_tables: {sorted(unknown)}"
            )
        self.sentry = sentry
        self.metrics = sentry.metrics
        self.specs = dict(tables)
        self.returning = returning
        self.read_back = frozenset(names)
        # (table, key column) -> the read-back SELECT and its parameter style, built once;
        # for every table when RETURNING is looked at, as a RETURNING that leaves the stock
        # column out is read back.
        self.selects = key_selects(
            {
                table: spec.stock_column
                for table, spec in self.specs.items()
                if returning or table in self.read_back
            },
            self.specs,
            paramstyle,
        )

    def applies(self, plan: StatementInfo) -> bool:
        """Whether an UPDATE of ``plan`` is looked at (cheap; checked on every UPDATE)."""
        if plan.stock_guard or plan.write == "none":
            return False
        if plan.returning and plan.reads_stock:
            return self.returning
        if plan.write == "blind":
            return False
        # `RETURNING id` says nothing of the stock: read back like a statement without one.
        return plan.table in self.read_back or (plan.returning and self.returning)

    def after_update(
        self,
        conn: Connection,
        cursor: DBAPICursor,
        plan: StatementInfo,
        keys: list[Key],
        rowcount: int,
    ) -> None:
        """Look at the stock the UPDATE of ``plan`` naming rows ``keys`` left (called after
        it ran)."""
        spec = self.specs.get(plan.table or "unknown")
        if spec is None or rowcount == 0:
            return
        values = None
        if plan.returning and plan.reads_stock:
            values = returned_column(cursor, spec.stock_column)
        # No RETURNING of the stock, or one whose rows do not carry it under its own name
        # (`RETURNING stock AS left`, an expression) or cannot be read here: read back. Not
        # when the row count is unknown (pysqlite's RETURNING): a row the UPDATE did not
        # match would be read too.
        if values is None and (not plan.returning or not plan.reads_stock or rowcount > 0):
            # Read back by the first key; no key in the WHERE: which rows it touched is not
            # known here.
            query = self.selects.get((keys[0][0], keys[0][1])) if keys else None
            values = read_column(conn, query, keys[0][2]) if query is not None else None
        for raw in values or ():
            stock = as_int(raw)
            if stock is not None and stock < 0:
                self._record(keys, stock)

    def _record(self, keys: list[Key], stock: int) -> None:
        reservation = current_reservation()
        # The reservation's SKU when there is one; outside, the row's key value (the guard
        # bounds the label either way).
        sku = reservation.sku if reservation is not None else (str(keys[0][2]) if keys else "")
        if reservation is not None:
            # Counted here: the same write's new_stock, should the app pass it to success()
            # (from this RETURNING), is not counted twice.
            note_negative_write(reservation)
        try:
            self.metrics.count(catalog.INVENTORY_NEGATIVE, sku)
        except Exception as exc:
            self.sentry.internal_error(COMPONENT, exc)
        self.sentry.log_event(events.INVENTORY_NEGATIVE, sku=sku, stock=stock)
