"""Fencing tokens checked at the write: a stale token, refused by the ``WHERE`` or
below one seen for the row, is counted. See docs/sqlalchemy.md, "Fencing tokens".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import catalog, events
from ..heldlocks import held_locks
from .clauses import assigned, is_op, read_name, tok_at, top_level, value_ref, where_clause
from .model import COMPONENT, MISSING, StockTable, ValueRef, bound_value
from .negative import as_int, key_selects, read_column
from .state import Key, key_fields, remember
from .tokens import PARAM, QUOTED, WORD, Tok

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from ..sentry import Sentry

# Rows whose highest token is remembered; the oldest is forgotten first.
_MAX_ROWS = 4096


class FencePlan(NamedTuple):
    """Where one UPDATE text carries its token, and how its WHERE compares it."""

    #: ``(True, parameter name or index)`` or ``(False, literal)``.
    token: ValueRef
    #: ``"<"`` or ``"<="`` for ``WHERE … column < token``, else ``None``.
    guard: str | None


def fence_plan(toks: Sequence[Tok], column: str) -> FencePlan | None:
    """How the UPDATE of tokens ``toks`` writes the token ``column``; ``None`` when it
    does not.

    Example::

        >>> from stocksentry.instrumentation.sqlalchemy.tokens import tokenize
        >>> sql = "UPDATE p SET s = :v, fence = :t WHERE sku = :s AND fence < :t"
        >>> plan = fence_plan(tokenize(sql, "named"), "fence")
        >>> plan.token, plan.guard
        ((True, 't'), '<')
    """
    column = column.lower()
    set_at = top_level(toks, 0, frozenset({"set"}))
    value = assigned(toks, set_at, column) if set_at < len(toks) else None
    token = value_ref(value) if value is not None else None
    if token is None:
        return None
    guard: str | None = None
    where, _ = where_clause(toks, set_at)
    i = 0
    while i < len(where) and guard is None:
        if where[i][0] not in (WORD, QUOTED):
            i += 1
            continue
        parts, i = read_name(where, i)
        op, nxt = tok_at(where, i), tok_at(where, i + 1)
        if (
            parts[-1] == column
            and op is not None
            and (is_op(op, "<") or is_op(op, "<="))
            and nxt is not None
            and (nxt[0] == PARAM or (token[0] is False and nxt[1] == token[1]))
        ):
            guard = op[1]
    return FencePlan(token, guard)


class Fencing:
    """The per-engine fencing check: the configured token columns, the highest token seen
    per row."""

    __slots__ = ("columns", "highest", "metrics", "selects", "sentry")

    def __init__(
        self,
        sentry: Sentry,
        columns: Mapping[str, str],
        tables: Mapping[str, StockTable],
        paramstyle: str,
    ) -> None:
        unknown = set(columns) - set(tables)
        if unknown:
            raise ValueError(f"fencing names tables not in stock_tables: {sorted(unknown)}")
        for table, column in columns.items():
            if not isinstance(column, str) or not column:
                raise ValueError(f"fencing[{table!r}] must be a column name")
        self.sentry = sentry
        self.metrics = sentry.metrics
        self.columns = dict(columns)
        self.highest: dict[Key, int] = {}
        self.selects = key_selects(columns, tables, paramstyle)

    def after_update(
        self, conn: Connection, fence: FencePlan, parameters: Any, row: Key, rowcount: int
    ) -> None:
        """Check the token an UPDATE of row ``row`` carried as ``fence`` says (called after
        it ran)."""
        raw = bound_value(fence.token, parameters)
        token = as_int(raw) if raw is not MISSING else None
        if token is None:
            return
        if rowcount == 0:
            if fence.guard is None:
                return
            query = self.selects.get((row[0], row[1]))
            if query is None:
                return
            stored = [
                v for v in (as_int(s) for s in read_column(conn, query, row[2])) if v is not None
            ]
            if not stored:
                return  # no such row: not a token matter
            top = max(stored)
            remember(self.highest, row, max(top, self.highest.get(row, top)), _MAX_ROWS)
            if token < top or (token == top and fence.guard == "<"):
                self._stale(row, token, top, refused=True)
            return
        # Applied, or (rowcount unknown: pysqlite before RETURNING rows are read) perhaps
        # refused; either way a token below one seen is a stale holder's, and remembering
        # it is safe: a refused token is never above the one stored.
        seen = self.highest.get(row)
        if seen is not None and token < seen:
            self._stale(row, token, seen, refused=False)
            return
        remember(self.highest, row, token, _MAX_ROWS)

    def _stale(self, row: Key, token: int, highest: int, *, refused: bool) -> None:
        lock = next(
            (h.name for h in held_locks() if getattr(h, "fencing_token", None) == token),
            "unknown",
        )
        try:
            self.metrics.count(catalog.LOCK_STALE_FENCING_TOKEN, lock, row[0])
        except Exception as exc:
            self.sentry.internal_error(COMPONENT, exc)
        self.sentry.log_event(
            events.STALE_FENCING_TOKEN,
            lock=lock,
            **key_fields(row),
            token=token,
            highest=highest,
            refused=refused,
        )
