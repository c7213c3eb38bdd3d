"""SQLAlchemy integration: lock waits, deadlocks, conflicts and unsafe read-modify-writes.

:func:`instrument_sqlalchemy` adds engine event listeners that watch the SQL the
application really runs (sync ``Engine`` or ``AsyncEngine``; PostgreSQL through psycopg 3
or asyncpg, SQLite through pysqlite or aiosqlite) and record:

- ``stock_db_lock_wait_duration_seconds{table}``: the duration of every locking statement
  (``SELECT … FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE`` and ``LOCK TABLE`` on any
  table, ``UPDATE`` and ``DELETE`` on the configured stock tables), with the trace id as
  exemplar;
- ``stock_db_deadlock_total{table}`` and ``stock_db_serialization_failure_total{table}``
  from the driver's SQLSTATE (40P01, 40001), one per failed statement; a lock timeout
  (55P03) is observed as a lock wait and logged, the reservation's ``lock_timeout`` comes
  from :func:`~stocksentry.instrumentation.classify_exception`;
- a conditional stock update that matched no row (``SET s = s - :q WHERE … AND s >= :q``)
  marks the active reservation ``out_of_stock`` (``lost_race`` for a compare-and-set);
- ``stock_unsafe_read_modify_write_total{table}`` and one ``unsafe_read_modify_write``
  warning line with the code location, when a stock value read without a lock is written
  back as a value computed in the application.

Every statement is classified once per distinct SQL text by a small tokenizer (no
dependency), so the per-statement cost is a dictionary lookup. The rules are in
``docs/sqlalchemy.md``.

Example::

    import sqlalchemy as sa
    from stocksentry.instrumentation import configure
    from stocksentry.instrumentation.sqlalchemy import StockTable, instrument_sqlalchemy

    sentry = configure()
    engine = sa.create_engine("postgresql+psycopg://shop@db/shop")
    instrument_sqlalchemy(
        engine, sentry=sentry, stock_tables={"products": StockTable()}, spans="locking"
    )
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias
from uuid import UUID

import sqlalchemy
import structlog
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, StatusCode, TracerProvider

from .api import Sentry, current_reservation, get_sentry
from .tracing import TRACER_NAME, exemplar_for

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine, ExceptionContext
    from sqlalchemy.engine.base import RootTransaction
    from sqlalchemy.engine.interfaces import DBAPICursor, ExecutionContext
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "SpanMode",
    "StatementInfo",
    "StockTable",
    "classify_statement",
    "instrument_sqlalchemy",
    "is_instrumented",
    "uninstrument_sqlalchemy",
]

SpanMode = Literal["off", "locking", "all"]
WriteKind = Literal["none", "self", "sql", "blind"]

#: How long a read of a stock value is remembered (seconds), by default.
DEFAULT_READ_WINDOW = 30.0
# Distinct SQL texts classified before the cache starts over. An application has a few
# hundred; one that renders literals into its SQL would otherwise grow it without end.
_PLAN_CACHE_SIZE = 2048
# Keys remembered per scope (connection, reservation, request): a checkout touches a few.
_READS_PER_SCOPE = 64
# Longest key value kept (and compared); a longer one is cut.
_MAX_KEY_CHARS = 256
_COMPONENT = "sqlalchemy"


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
    #: ``lock table``, ``update`` or ``delete``.
    lock_clause: str | None = None
    #: Takes row locks that keep other transactions from writing the stock rows it names.
    protects_rows: bool = False
    #: ``LOCK TABLE`` in a mode that blocks writers (or SQLite ``BEGIN IMMEDIATE``).
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


_IGNORED = StatementInfo("other")


# --- tokenizer -------------------------------------------------------------------------------

# Token kinds.
_W = 0  # word (keyword or unquoted identifier), lower-cased
_Q = 1  # quoted identifier, lower-cased for matching
_S = 2  # string literal (its value)
_N = 3  # number literal (its value)
_P = 4  # bound parameter (name or position)
_O = 5  # operator or punctuation

_Tok: TypeAlias = tuple[int, Any, int]  # kind, value, parenthesis depth

_SCAN = re.compile(
    r"""
    (?P<sp>\s+)
  | (?P<lc>--[^\n]*)
  | (?P<bc>/\*)
  | (?P<es>[eE]'(?:[^'\\]|\\.|'')*(?:'|\Z))
  | (?P<s>(?:[nNbBxX]|[uU]&)?'(?:[^']|'')*(?:'|\Z))
  | (?P<q>(?:[uU]&)?"(?:[^"]|"")*(?:"|\Z))
  | (?P<bt>`(?:[^`]|``)*(?:`|\Z))
  | (?P<dollar>\$(?:(?P<num>\d+)|(?P<tag>[A-Za-z_]\w*)?\$))
  | (?P<pyf>%\((?P<pyname>[^)]*)\)s)
  | (?P<fmt>%s)
  | (?P<pct>%%)
  | (?P<cast>::)
  | (?P<colon>:(?:(?P<cnum>\d+)|(?P<cname>[A-Za-z_]\w*)))
  | (?P<n>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<w>[^\W\d]\w*)
  | (?P<o><=|>=|<>|!=|\|\||.)
    """,
    re.VERBOSE | re.DOTALL,
)


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _tokenize(sql: str, paramstyle: str) -> list[_Tok]:
    """Tokens of ``sql`` without whitespace and comments; never raises on odd input."""
    out: list[_Tok] = []
    depth = 0
    position = 0  # for positional parameter styles
    pos = 0
    end = len(sql)
    qmark = paramstyle == "qmark"
    fmt = paramstyle in ("format", "pyformat")
    dollar = paramstyle == "numeric_dollar"
    numeric = paramstyle == "numeric"
    named = paramstyle == "named"
    scan = _SCAN.match
    while pos < end:
        m = scan(sql, pos)
        if m is None:  # pragma: no cover - the last alternative matches any character
            break
        group = m.lastgroup
        text = m.group()
        pos = m.end()
        if group == "sp" or group == "lc":
            continue
        if group == "bc":
            # PostgreSQL nests block comments.
            level = 1
            while level and pos < end:
                nxt_open = sql.find("/*", pos)
                nxt_close = sql.find("*/", pos)
                if nxt_close < 0:
                    pos = end
                    break
                if 0 <= nxt_open < nxt_close:
                    level += 1
                    pos = nxt_open + 2
                else:
                    level -= 1
                    pos = nxt_close + 2
            continue
        if group == "es" or group == "s":
            body = text[text.index("'") + 1 :]
            if body.endswith("'"):
                body = body[:-1]
            if group == "es":
                body = body.replace("\\'", "'")
            out.append((_S, body.replace("''", "'"), depth))
        elif group == "q" or group == "bt":
            quote = '"' if group == "q" else "`"
            body = text[text.index(quote) + 1 :]
            if body.endswith(quote):
                body = body[:-1]
            out.append((_Q, body.replace(quote * 2, quote).lower(), depth))
        elif group == "dollar":
            number = m.group("num")
            if number is not None:
                if dollar:
                    out.append((_P, int(number) - 1, depth))
                else:
                    out.append((_O, "$", depth))
                    out.append((_N, int(number), depth))
                continue
            # A dollar-quoted string: the body runs to the same tag.
            close = sql.find(text, pos)
            body = sql[pos:close] if close >= 0 else sql[pos:]
            pos = close + len(text) if close >= 0 else end
            out.append((_S, body, depth))
        elif group == "pyf":
            if fmt:
                out.append((_P, m.group("pyname"), depth))
            else:
                out.append((_O, "%", depth))
                pos = m.start() + 1
        elif group == "fmt":
            if fmt:
                out.append((_P, position, depth))
                position += 1
            else:
                out.append((_O, "%", depth))
                pos = m.start() + 1
        elif group == "pct":
            out.append((_O, "%", depth))
            if not fmt:
                pos = m.start() + 1
        elif group == "cast":
            out.append((_O, "::", depth))
        elif group == "colon":
            if numeric and m.group("cnum") is not None:
                out.append((_P, int(m.group("cnum")) - 1, depth))
            elif named and m.group("cname") is not None:
                out.append((_P, m.group("cname"), depth))
            else:
                out.append((_O, ":", depth))
                pos = m.start() + 1
        elif group == "n":
            out.append((_N, _number(text), depth))
        elif group == "w":
            out.append((_W, text.lower(), depth))
        elif text == "?" and qmark:
            out.append((_P, position, depth))
            position += 1
        elif text == "(":
            out.append((_O, "(", depth))
            depth += 1
        elif text == ")":
            depth = max(0, depth - 1)
            out.append((_O, ")", depth))
        else:
            out.append((_O, text, depth))
    return out


# --- statement classifier --------------------------------------------------------------------

_CLAUSE_END = frozenset(
    {
        "where",
        "group",
        "having",
        "order",
        "limit",
        "offset",
        "fetch",
        "for",
        "union",
        "intersect",
        "except",
        "window",
        "returning",
    }
)
_NOT_ALIAS = frozenset(
    {
        "on",
        "using",
        "join",
        "inner",
        "left",
        "right",
        "full",
        "outer",
        "cross",
        "natural",
        "lateral",
        "set",
        "where",
        "returning",
        "tablesample",
        "with",
    }
    | _CLAUSE_END
)
# Words that may appear in a value expression without naming a column.
_EXPR_WORDS = frozenset(
    {
        "null",
        "true",
        "false",
        "and",
        "or",
        "not",
        "is",
        "case",
        "when",
        "then",
        "else",
        "end",
        "in",
        "between",
        "like",
        "ilike",
        "similar",
        "escape",
        "distinct",
        "from",
        "interval",
        "current_date",
        "current_time",
        "current_timestamp",
        "localtime",
        "localtimestamp",
        "default",
        "array",
        "collate",
        "unknown",
        "as",
    }
)
_ISOLATION_LEVELS = {
    ("serializable",): "SERIALIZABLE",
    ("repeatable", "read"): "REPEATABLE READ",
    ("read", "committed"): "READ COMMITTED",
    ("read", "uncommitted"): "READ UNCOMMITTED",
}
# LOCK TABLE modes that keep other transactions from updating rows.
_BLOCKING_LOCK_MODES = frozenset({"share", "share row exclusive", "exclusive", "access exclusive"})


def _is_word(tok: _Tok | None, *words: str) -> bool:
    return tok is not None and tok[0] == _W and tok[1] in words


def _is_op(tok: _Tok | None, op: str) -> bool:
    return tok is not None and tok[0] == _O and tok[1] == op


def _at(toks: Sequence[_Tok], i: int) -> _Tok | None:
    return toks[i] if 0 <= i < len(toks) else None


def _read_name(toks: Sequence[_Tok], i: int) -> tuple[tuple[str, ...], int]:
    """A dotted name at ``i`` (``a``, ``s.t``, ``"S"."t"``, ``t.*``) and the index after it."""
    parts = [toks[i][1]]
    j = i + 1
    while _is_op(_at(toks, j), "."):
        nxt = _at(toks, j + 1)
        if nxt is None:
            break
        if nxt[0] in (_W, _Q):
            parts.append(nxt[1])
        elif _is_op(nxt, "*"):
            parts.append("*")
        else:
            break
        j += 2
    return tuple(parts), j


def _skip_group(toks: Sequence[_Tok], i: int) -> int:
    """Index after the parenthesised group opening at ``i``."""
    depth = toks[i][2]
    j = i + 1
    while j < len(toks) and not (_is_op(toks[j], ")") and toks[j][2] == depth):
        j += 1
    return j + 1


def _top(toks: Sequence[_Tok], start: int, stop_words: frozenset[str], depth: int = 0) -> int:
    """The first index from ``start`` of a word in ``stop_words`` at ``depth`` (or the end)."""
    for j in range(start, len(toks)):
        tok = toks[j]
        if tok[2] == depth and (
            (tok[0] == _W and tok[1] in stop_words) or (tok[0] == _O and tok[1] == ";")
        ):
            return j
    return len(toks)


def _split(toks: Sequence[_Tok], sep: str, depth: int) -> list[list[_Tok]]:
    """Split at ``sep`` (an operator like ``,`` or the word ``and``) at ``depth``."""
    parts: list[list[_Tok]] = [[]]
    for tok in toks:
        if tok[2] == depth and tok[1] == sep and tok[0] in (_O, _W):
            parts.append([])
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


class _Tables:
    """The configured stock tables, matched case-insensitively by name or schema.name."""

    __slots__ = ("by_name",)

    def __init__(self, tables: Mapping[str, StockTable]) -> None:
        self.by_name: dict[str, tuple[str, StockTable]] = {}
        for name, spec in tables.items():
            if not isinstance(spec, StockTable):
                raise TypeError(f"stock_tables[{name!r}] must be a StockTable")
            self.by_name[name.lower()] = (name, spec)

    def find(self, parts: tuple[str, ...]) -> tuple[str, StockTable] | None:
        return self.by_name.get(".".join(parts)) or self.by_name.get(parts[-1])


class _Target:
    """The stock table a statement works on, and the names that qualify its columns."""

    __slots__ = ("label", "qualifiers", "spec")

    def __init__(self, label: str, spec: StockTable, qualifiers: set[str]) -> None:
        self.label = label
        self.spec = spec
        self.qualifiers = qualifiers


def _column_ref(parts: tuple[str, ...], column: str, target: _Target) -> bool:
    if parts[-1] != column:
        return False
    return len(parts) == 1 or parts[-2] in target.qualifiers


def _mentions(toks: Sequence[_Tok], column: str, target: _Target) -> bool:
    i = 0
    while i < len(toks):
        if toks[i][0] in (_W, _Q):
            parts, j = _read_name(toks, i)
            if _column_ref(parts, column, target):
                return True
            i = j
        else:
            i += 1
    return False


def _reads_column(items: Sequence[Sequence[_Tok]], column: str, target: _Target) -> bool:
    """Whether a select or returning list (split at commas) includes ``column`` or ``*``."""
    for item in items:
        if len(item) == 1 and _is_op(item[0], "*"):
            return True
        if item[0][0] in (_W, _Q):
            parts, j = _read_name(item, 0)
            if parts[-1] == "*" and j == len(item) and parts[-2] in target.qualifiers:
                return True
        if _mentions(item, column, target):
            return True
    return False


def _write_kind(expr: Sequence[_Tok], target: _Target) -> WriteKind:
    """How a SET expression computes the stock: from itself, other columns, or outside SQL."""
    column = target.spec.stock_column
    other = False
    i = 0
    while i < len(expr):
        tok = expr[i]
        if tok[0] not in (_W, _Q):
            i += 1
            continue
        prev = expr[i - 1] if i else None
        if _is_op(prev, "::") or _is_word(prev, "as"):
            # A type name (possibly several words: double precision, character varying).
            while i < len(expr) and expr[i][0] == _W:
                i += 1
            continue
        parts, j = _read_name(expr, i)
        if _is_op(_at(expr, j), "("):  # a function call
            i = j
            continue
        if tok[0] == _W and len(parts) == 1 and tok[1] in _EXPR_WORDS:
            i = j
            continue
        if _column_ref(parts, column, target):
            return "self"
        other = True
        i = j
    return "sql" if other else "blind"


def _value(toks: Sequence[_Tok]) -> ValueRef | None:
    """A literal or parameter, possibly cast (``$1::VARCHAR``, ``CAST(:x AS INT)``, ``-5``)."""
    if not toks:
        return None
    if _is_word(toks[0], "cast") and len(toks) > 3 and _is_op(toks[1], "("):
        inner = _top(toks, 2, frozenset({"as"}), toks[1][2] + 1)
        if inner >= len(toks):
            return None
        return _value(toks[2:inner])
    if (
        len(toks) >= 3
        and _is_op(toks[0], "(")
        and _is_op(toks[-1], ")")
        and _skip_group(toks, 0) == len(toks)
    ):
        return _value(toks[1:-1])
    first = toks[0]
    i = 1
    ref: ValueRef
    if first[0] == _P:
        ref = (True, first[1])
    elif first[0] in (_S, _N):
        ref = (False, first[1])
    elif _is_op(first, "-") and len(toks) > 1 and toks[1][0] == _N:
        ref = (False, -toks[1][1])
        i = 2
    else:
        return None
    # Only casts may follow: ::type, ::type(n), ::type[].
    while i < len(toks):
        if not _is_op(toks[i], "::"):
            return None
        i += 1
        while i < len(toks) and (toks[i][0] in (_W, _Q) or toks[i][2] > first[2]):
            i += 1
        while i < len(toks) and (
            _is_op(toks[i], "(") or _is_op(toks[i], "[") or _is_op(toks[i], "]")
        ):
            i = _skip_group(toks, i) if _is_op(toks[i], "(") else i + 1
    return ref


def _where_keys(
    where: Sequence[_Tok], target: _Target, depth: int
) -> tuple[tuple[str, ValueRef], ...]:
    """``column = value`` equalities on key columns, ANDed at the top of a WHERE."""
    if any(t[2] == depth and _is_word(t, "or") for t in where):
        return ()  # either row may be meant: no key
    conjuncts: list[list[_Tok]] = [[]]
    between = False
    for tok in where:
        if tok[2] == depth and _is_word(tok, "between"):
            between = True
        if tok[2] == depth and _is_word(tok, "and"):
            if between:  # BETWEEN a AND b
                between = False
            else:
                conjuncts.append([])
                continue
        conjuncts[-1].append(tok)
    keys: list[tuple[str, ValueRef]] = []
    key_columns = target.spec.key_columns
    for conj in conjuncts:
        while (
            len(conj) >= 3
            and _is_op(conj[0], "(")
            and _is_op(conj[-1], ")")
            and _skip_group(conj, 0) == len(conj)
        ):
            conj = conj[1:-1]
        eq = next(
            (k for k, t in enumerate(conj) if _is_op(t, "=") and t[2] == conj[0][2]),
            None,
        )
        if eq is None or eq == 0:
            continue
        left, right = conj[:eq], conj[eq + 1 :]
        for name_side, value_side in ((left, right), (right, left)):
            if not name_side or name_side[0][0] not in (_W, _Q):
                continue
            parts, j = _read_name(name_side, 0)
            if j != len(name_side) or parts[-1] not in key_columns:
                continue
            if len(parts) > 1 and parts[-2] not in target.qualifiers:
                continue
            ref = _value(value_side)
            if ref is not None:
                keys.append((parts[-1], ref))
                break
    return tuple(keys)


def _from_items(toks: Sequence[_Tok], depth: int) -> list[tuple[tuple[str, ...], str | None]]:
    """``(name, alias)`` of the tables in a FROM/USING list (subqueries skipped)."""
    items: list[tuple[tuple[str, ...], str | None]] = []
    i = 0
    expect = True
    while i < len(toks):
        tok = toks[i]
        if tok[2] != depth:
            i += 1
            continue
        if _is_op(tok, ","):
            expect = True
            i += 1
            continue
        if _is_word(tok, "join"):
            expect = True
            i += 1
            continue
        if not expect:
            i += 1
            continue
        if _is_word(tok, "only", "lateral"):
            i += 1
            continue
        if _is_op(tok, "("):
            i = _skip_group(toks, i)
            expect = False
            continue
        if tok[0] in (_W, _Q):
            parts, i = _read_name(toks, i)
            alias = None
            if _is_op(_at(toks, i), "*"):  # ONLY-less inheritance marker: t *
                i += 1
            nxt = _at(toks, i)
            if _is_word(nxt, "as"):
                nxt = _at(toks, i + 1)
                i += 1
            if nxt is not None and (nxt[0] == _Q or (nxt[0] == _W and nxt[1] not in _NOT_ALIAS)):
                alias = nxt[1]
                i += 1
            items.append((parts, alias))
            expect = False
            continue
        i += 1
    return items


def _target(
    items: Sequence[tuple[tuple[str, ...], str | None]], tables: _Tables
) -> tuple[_Target | None, str | None]:
    """The first configured stock table among ``items``, and the label to use."""
    for parts, alias in items:
        found = tables.find(parts)
        if found is not None:
            label, spec = found
            qualifiers = {parts[-1], ".".join(parts)}
            if alias is not None:
                qualifiers.add(alias)
            return _Target(label, spec, qualifiers), label
    if items:
        return None, items[0][0][-1]
    return None, None


def _isolation(toks: Sequence[_Tok], i: int) -> str | None:
    """The level after ``isolation level`` at ``i`` (or ``None``)."""
    for words, level in _ISOLATION_LEVELS.items():
        if all(_is_word(_at(toks, i + k), w) for k, w in enumerate(words)):
            return level
    return None


def _classify_select(toks: Sequence[_Tok], start: int, tables: _Tables) -> StatementInfo:
    frm = _top(toks, start + 1, frozenset({"from"}))
    if frm >= len(toks) or not _is_word(toks[frm], "from"):
        return _IGNORED
    end_from = _top(toks, frm + 1, _CLAUSE_END)
    target, label = _target(_from_items(toks[frm + 1 : end_from], 0), tables)
    # FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE [OF t, ...] [NOWAIT | SKIP LOCKED]
    lock_clause = None
    lock_of: set[str] | None = None
    j = end_from
    while j < len(toks):
        tok = toks[j]
        if tok[2] == 0 and _is_word(tok, "for"):
            words = []
            k = j + 1
            while k < len(toks) and _is_word(toks[k], "update", "no", "key", "share"):
                words.append(toks[k][1])
                k += 1
                if words[-1] in ("update", "share"):
                    break
            if words and words[-1] in ("update", "share"):
                lock_clause = "for " + " ".join(words)
                if _is_word(_at(toks, k), "of"):
                    lock_of = set()
                    k += 1
                    while k < len(toks) and toks[k][0] in (_W, _Q):
                        parts, k = _read_name(toks, k)
                        lock_of.add(parts[-1])
                        if not _is_op(_at(toks, k), ","):
                            break
                        k += 1
                break
        j += 1
    locking = lock_clause is not None
    if target is None:
        if locking:
            return StatementInfo("select", label, locking=True, lock_clause=lock_clause)
        return StatementInfo("select", label) if label else _IGNORED
    where_at = _top(toks, frm + 1, frozenset({"where"}))
    keys: tuple[tuple[str, ValueRef], ...] = ()
    if where_at < len(toks) and _is_word(toks[where_at], "where"):
        where_end = _top(toks, where_at + 1, _CLAUSE_END)
        keys = _where_keys(toks[where_at + 1 : where_end], target, 0)
    compound = any(t[2] == 0 and _is_word(t, "union", "intersect", "except") for t in toks)
    reads = not compound and _reads_column(
        _split(toks[start + 1 : frm], ",", 0), target.spec.stock_column, target
    )
    covers = lock_of is None or bool(lock_of & target.qualifiers)
    return StatementInfo(
        "select",
        target.label,
        stock=True,
        locking=locking,
        lock_clause=lock_clause,
        # FOR KEY SHARE does not keep others from updating the stock column.
        protects_rows=locking and covers and lock_clause != "for key share",
        reads_stock=reads,
        keys=keys if not compound else (),
    )


def _classify_update(toks: Sequence[_Tok], start: int, tables: _Tables) -> StatementInfo:
    i = start + 1
    if _is_word(_at(toks, i), "only"):
        i += 1
    if i >= len(toks) or toks[i][0] not in (_W, _Q):
        return _IGNORED
    items = _from_items(toks[i : _top(toks, i, frozenset({"set"}))], 0)
    target, label = _target(items[:1], tables)
    if target is None:
        return StatementInfo("update", label) if label else _IGNORED
    set_at = _top(toks, i, frozenset({"set"}))
    if set_at >= len(toks):
        return _IGNORED
    set_end = _top(toks, set_at + 1, frozenset({"from", "where", "returning"}))
    write: WriteKind = "none"
    column = target.spec.stock_column
    for assignment in _split(toks[set_at + 1 : set_end], ",", 0):
        eq = next((k for k, t in enumerate(assignment) if _is_op(t, "=") and t[2] == 0), None)
        if eq is None:
            continue
        left = assignment[:eq]
        if any(t[0] in (_W, _Q) and t[1] == column for t in left):
            write = _write_kind(assignment[eq + 1 :], target)
            break
    where_at = _top(toks, set_end, frozenset({"where"}))
    ret_at = _top(toks, set_end, frozenset({"returning"}))
    where = toks[where_at + 1 : ret_at] if where_at < ret_at else []
    spec = target.spec
    return StatementInfo(
        "update",
        target.label,
        stock=True,
        locking=True,
        lock_clause="update",
        protects_rows=True,
        write=write,
        stock_guard=_mentions(where, column, target),
        version_guard=spec.version_column is not None
        and _mentions(where, spec.version_column, target),
        keys=_where_keys(where, target, 0),
        returning=ret_at < len(toks),
        reads_stock=ret_at < len(toks)
        and _reads_column(_split(toks[ret_at + 1 :], ",", 0), column, target),
    )


def _classify_delete(toks: Sequence[_Tok], start: int, tables: _Tables) -> StatementInfo:
    i = start + 1
    if not _is_word(_at(toks, i), "from"):
        return _IGNORED
    end = _top(toks, i + 1, frozenset({"using", "where", "returning"}))
    items = _from_items(toks[i + 1 : end], 0)
    target, label = _target(items[:1], tables)
    if target is None:
        return StatementInfo("delete", label) if label else _IGNORED
    where_at = _top(toks, i + 1, frozenset({"where"}))
    ret_at = _top(toks, i + 1, frozenset({"returning"}))
    where = toks[where_at + 1 : ret_at] if where_at < ret_at else []
    return StatementInfo(
        "delete",
        target.label,
        stock=True,
        locking=True,
        lock_clause="delete",
        protects_rows=True,
        keys=_where_keys(where, target, 0),
        returning=ret_at < len(toks),
    )


def _classify_lock(toks: Sequence[_Tok], start: int, tables: _Tables) -> StatementInfo:
    i = start + 1
    if _is_word(_at(toks, i), "table"):
        i += 1
    end = _top(toks, i, frozenset({"in", "nowait"}))
    items = _from_items(toks[i:end], 0)
    target, label = _target(items, tables)
    mode = "access exclusive"
    if end < len(toks) and _is_word(toks[end], "in"):
        words = []
        k = end + 1
        while k < len(toks) and toks[k][0] == _W and toks[k][1] != "mode":
            words.append(toks[k][1])
            k += 1
        mode = " ".join(words)
    return StatementInfo(
        "lock",
        target.label if target else label,
        stock=target is not None,
        locking=True,
        lock_clause="lock table",
        table_lock=target is not None and mode in _BLOCKING_LOCK_MODES,
    )


def _classify_tokens(toks: Sequence[_Tok], tables: _Tables) -> StatementInfo:
    start = 0
    first = _at(toks, start)
    if first is None or first[0] != _W:
        return _IGNORED
    word = first[1]
    if word == "with":
        # Skip the CTEs: name [(cols)] AS [[NOT] MATERIALIZED] (...), ...; classify the rest.
        j = start + 1
        while j < len(toks) and not (
            toks[j][2] == 0 and _is_word(toks[j], "select", "update", "delete", "insert")
        ):
            j = _skip_group(toks, j) if _is_op(toks[j], "(") else j + 1
        if j >= len(toks):
            return _IGNORED
        start, word = j, toks[j][1]
    if word == "select":
        return _classify_select(toks, start, tables)
    if word == "update":
        return _classify_update(toks, start, tables)
    if word == "delete":
        return _classify_delete(toks, start, tables)
    if word == "lock":
        return _classify_lock(toks, start, tables)
    if word == "insert":
        if _is_word(_at(toks, start + 1), "into") and _at(toks, start + 2) is not None:
            nxt = toks[start + 2]
            if nxt[0] in (_W, _Q):
                parts, _ = _read_name(toks, start + 2)
                found = tables.find(parts)
                return StatementInfo("insert", found[0] if found else parts[-1])
        return _IGNORED
    if word in ("begin", "start"):
        # BEGIN [DEFERRED | IMMEDIATE | EXCLUSIVE] [TRANSACTION] [ISOLATION LEVEL ...]
        level = None
        immediate = False
        for k in range(start + 1, len(toks)):
            if _is_word(toks[k], "immediate", "exclusive"):
                immediate = True
            if _is_word(toks[k], "level"):
                level = _isolation(toks, k + 1)
        if word == "start" and not _is_word(_at(toks, start + 1), "transaction"):
            return _IGNORED
        return StatementInfo("begin", table_lock=immediate, isolation=level)
    if word == "set" and _is_word(_at(toks, start + 1), "transaction"):
        for k in range(start + 2, len(toks)):
            if _is_word(toks[k], "level"):
                return StatementInfo("isolation", isolation=_isolation(toks, k + 1))
    return _IGNORED


def classify_statement(
    sql: str,
    *,
    paramstyle: str = "pyformat",
    stock_tables: Mapping[str, StockTable] | None = None,
) -> StatementInfo:
    """Classify one SQL text the way the listeners do (for tests and for "why?" questions).

    ``paramstyle`` is the DBAPI style of the text (``pyformat`` for psycopg, ``numeric_dollar``
    for SQLAlchemy's asyncpg dialect, ``qmark`` for SQLite, ``named``, ``numeric``,
    ``format``); ``stock_tables`` defaults to ``{"products": StockTable()}``. Never raises on
    unusual SQL: what it does not understand is ``kind="other"``.

    Example::

        >>> info = classify_statement(
        ...     "UPDATE products SET available_stock = %(v)s WHERE sku = %(sku)s"
        ... )
        >>> info.write, info.keys
        ('blind', (('sku', (True, 'sku')),))
    """
    tables = _Tables(stock_tables if stock_tables is not None else {"products": StockTable()})
    return _classify_tokens(_tokenize(sql, paramstyle), tables)


# --- run-time state --------------------------------------------------------------------------

_Key: TypeAlias = tuple[str, str, object]  # table label, key column, normalised value
# In a reservation's store, (table, _ANY_ROW, key column) holds the table's latest read.
_ANY_ROW = "\x00any"


class _Read:
    """One remembered read of a stock value."""

    __slots__ = ("at", "locked", "txn")

    def __init__(self, locked: bool, txn: weakref.ref[RootTransaction] | None, at: float) -> None:
        self.locked = locked
        self.txn = txn
        self.at = at


class _ConnState:
    """Per SQLAlchemy ``Connection`` (one checkout): its reads, its transaction's locks."""

    __slots__ = (
        "begun",
        "isolation",
        "last_table",
        "lock_all",
        "locks",
        "pending",
        "reads",
        "txn",
    )

    def __init__(self) -> None:
        self.reads: dict[_Key, _Read] = {}
        self.txn: weakref.ref[RootTransaction] | None = None
        self.locks: set[_Key] = set()
        self.lock_all: set[str] = set()
        self.isolation: str | None = None
        self.begun = False
        # A BEGIN seen inside SQLAlchemy's "begin" event, before its transaction object
        # exists; it belongs to the transaction seen next.
        self.pending: StatementInfo | None = None
        self.last_table: str | None = None

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


def _remember(store: dict[_Key, _Read], key: _Key, read: _Read) -> None:
    store.pop(key, None)  # re-insert at the end: the oldest entry is first
    store[key] = read
    if len(store) > _READS_PER_SCOPE:
        # Another thread may have changed the store meanwhile: then it is small enough.
        with contextlib.suppress(StopIteration, KeyError, RuntimeError):
            del store[next(iter(store))]


# Reads remembered for the active reservation and for the bound request_id. The var holds
# (owner, store): a store belongs to one reservation / request, a new owner starts afresh,
# so the reads of an ended reservation are never seen again.
_reservation_reads: ContextVar[tuple[object, dict[_Key, _Read]] | None] = ContextVar(
    "stocksentry_sqlalchemy_reservation_reads", default=None
)
_request_reads: ContextVar[tuple[object, dict[_Key, _Read]] | None] = ContextVar(
    "stocksentry_sqlalchemy_request_reads", default=None
)


def _scope(
    var: ContextVar[tuple[object, dict[_Key, _Read]] | None], owner: object, create: bool
) -> dict[_Key, _Read] | None:
    held = var.get()
    if held is not None and (held[0] is owner or held[0] == owner):
        return held[1]
    if not create:
        return None
    store: dict[_Key, _Read] = {}
    var.set((owner, store))
    return store


def _normalise(value: object) -> object:
    """A comparable form of a key value: 5, 5.0 and Decimal(5) meet; long strings are cut."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return value[:_MAX_KEY_CHARS]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Decimal) and value == value.to_integral_value():
        return int(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes):
        return value[:_MAX_KEY_CHARS]
    return str(value)[:_MAX_KEY_CHARS]


def _sqlstate(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a driver error, also through SQLAlchemy's and the adapters' wrapping."""
    seen = 0
    while exc is not None and seen < 4:
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        if isinstance(state, str):
            return state
        exc = getattr(exc, "orig", None) or exc.__cause__
        seen += 1
    return None


# --- the code location of a detection --------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))
_DRIVER_PACKAGES = (
    "sqlalchemy",
    "psycopg",
    "psycopg2",
    "psycopg_pool",
    "asyncpg",
    "aiosqlite",
    "greenlet",
    "pymysql",
    "opentelemetry",
    "wrapt",
    "structlog",
)


_LIBRARIES: list[tuple[tuple[bool, ...], _Libraries]] = []


def _libraries() -> _Libraries:
    # sysconfig.get_paths() costs ~0.2 ms: build once, again only when a driver loads.
    loaded = tuple(name in sys.modules for name in _DRIVER_PACKAGES)
    if _LIBRARIES and _LIBRARIES[0][0] == loaded:
        return _LIBRARIES[0][1]
    libraries = _Libraries()
    _LIBRARIES[:] = [(loaded, libraries)]
    return libraries


class _Libraries:
    """Folders whose frames are not application code: drivers, SQLAlchemy, us, the stdlib.

    The stdlib folder may contain site-packages (Python installed without a venv), where
    the application itself can live, so site-packages is carved out of it.
    """

    __slots__ = ("drivers", "site", "stdlib")

    def __init__(self) -> None:
        paths = sysconfig.get_paths()

        def folders(*names: str) -> tuple[str, ...]:
            return tuple({os.path.abspath(paths[n]) + os.sep for n in names if n in paths})

        self.stdlib = folders("stdlib", "platstdlib")
        self.site = folders("purelib", "platlib")
        drivers = {_HERE + os.sep}
        for name in _DRIVER_PACKAGES:
            file = getattr(sys.modules.get(name), "__file__", None)
            if file:
                drivers.add(os.path.dirname(os.path.abspath(file)) + os.sep)
        self.drivers = tuple(drivers)

    def __contains__(self, filename: str) -> bool:
        if filename.startswith("<"):  # <frozen ...>, <string>: generated or bootstrap code
            return True
        path = os.path.abspath(filename)
        if path.startswith(self.drivers):
            return True
        if path.startswith(self.site):
            return False
        return path.startswith(self.stdlib)


def _first_app_frame(frame: FrameType | None, libraries: _Libraries) -> FrameType | None:
    while frame is not None:
        if frame.f_code.co_filename not in libraries:
            return frame
        frame = frame.f_back
    return None


def _app_location() -> tuple[str, str]:
    """``(file:line, function)`` of the first frame outside SQLAlchemy, drivers and stocksentry.

    Under an ``AsyncEngine`` the listener runs in a greenlet whose stack ends in SQLAlchemy;
    the application's coroutine is suspended in the parent greenlet, so its frames are
    searched next.
    """
    libraries = _libraries()
    frame = _first_app_frame(sys._getframe(1), libraries)
    if frame is None:
        greenlet = sys.modules.get("greenlet")
        parent = greenlet.getcurrent().parent if greenlet is not None else None
        while frame is None and parent is not None:
            frame = _first_app_frame(parent.gr_frame, libraries)
            parent = parent.parent
    if frame is None:
        return "unknown", "unknown"
    filename = frame.f_code.co_filename
    try:
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    except ValueError:  # another drive (Windows)
        pass
    return f"{filename}:{frame.f_lineno}", frame.f_code.co_name


# --- the listeners ---------------------------------------------------------------------------

_T0 = "_stocksentry_t0"
_SPAN = "_stocksentry_span"
_STATE = "_stocksentry_state"
_SQLSTATE_COUNTERS = {"40P01": "deadlock", "40001": "serialization_failure"}


class _Instrumentation:
    """The listeners of one engine. Holds no reference to the engine itself."""

    def __init__(
        self,
        sentry: Sentry,
        tables: _Tables,
        dialect_name: str,
        paramstyle: str,
        span_mode: SpanMode,
        tracer_provider: TracerProvider | None,
        read_window: float,
    ) -> None:
        self.sentry = sentry
        self.metrics = sentry.metrics
        self.tables = tables
        self.dialect_name = dialect_name
        self.paramstyle = paramstyle
        self.span_mode = span_mode
        self.read_window = read_window
        self.plans: dict[str, StatementInfo] = {}
        # Per-Connection state lives in the Connection's own __dict__ (it goes with the
        # Connection, one checkout); this map is the fallback for a Connection class
        # without a __dict__.
        self.conns: weakref.WeakKeyDictionary[Connection, _ConnState] = weakref.WeakKeyDictionary()
        self.lock_tracer: Any = None
        if span_mode == "locking":
            if tracer_provider is None and sentry.tracer is not None:
                self.lock_tracer = sentry.tracer
            else:
                self.lock_tracer = otel_trace.get_tracer(
                    TRACER_NAME, tracer_provider=tracer_provider
                )
        # (event name, listener) of everything listen()ed on the engine, for uninstrument;
        # never the engine itself, which holds this object through its listeners.
        self.listeners: list[tuple[str, Callable[..., Any]]] = []
        self.otel_entries: list[Any] = []

    # --- classification --------------------------------------------------------------------

    def plan(self, statement: str) -> StatementInfo:
        plan = self.plans.get(statement)
        if plan is None:
            plan = _classify_tokens(_tokenize(statement, self.paramstyle), self.tables)
            if len(self.plans) >= _PLAN_CACHE_SIZE:
                self.plans.clear()
            self.plans[statement] = plan
        return plan

    def state(self, conn: Connection) -> _ConnState:
        try:
            attrs = conn.__dict__
        except AttributeError:  # pragma: no cover - SQLAlchemy 2.0's Connection has one
            state = self.conns.get(conn)
            if state is None:
                state = self.conns[conn] = _ConnState()
            return state
        state = attrs.get(_STATE)
        if state is None:
            state = attrs[_STATE] = _ConnState()
        return state

    def existing_state(self, conn: Connection) -> _ConnState | None:
        state = getattr(conn, _STATE, None)
        return state if isinstance(state, _ConnState) else self.conns.get(conn)

    # --- events ----------------------------------------------------------------------------

    def before_cursor_execute(
        self,
        conn: Connection,
        cursor: DBAPICursor,
        statement: str,
        parameters: Any,
        context: ExecutionContext | None,
        executemany: bool,
    ) -> tuple[str, Any]:
        # Registered with retval=True (the statement goes back unchanged): SQLAlchemy
        # would otherwise wrap the listener in one more call per statement.
        try:
            plan = self.plans.get(statement) or self.plan(statement)
            if plan.kind in ("begin", "isolation"):
                self._begin(conn, plan)
                return statement, parameters
            if not plan.locking or context is None:
                return statement, parameters
            if self.lock_tracer is not None:
                span = self.lock_tracer.start_span(
                    "stock.db.lock",
                    kind=SpanKind.CLIENT,
                    attributes={
                        "db.system.name": self.dialect_name,
                        "stock.table": plan.table or "unknown",
                        "stock.lock": plan.lock_clause or "",
                    },
                )
                context.__dict__[_SPAN] = span
            # Last, so the figure is the statement's own time.
            context.__dict__[_T0] = time.perf_counter()
        except Exception as exc:
            self.sentry.internal_error(_COMPONENT, exc)
        return statement, parameters

    def after_cursor_execute(
        self,
        conn: Connection,
        cursor: DBAPICursor,
        statement: str,
        parameters: Any,
        context: ExecutionContext | None,
        executemany: bool,
    ) -> None:
        try:
            plan = self.plans.get(statement) or self.plan(statement)
            if plan.locking and context is not None:
                self._lock_done(plan, context, None)
        except Exception as exc:
            self.sentry.internal_error(_COMPONENT, exc)
            plan = self.plans.get(statement, _IGNORED)
        # Apart, so that a failure in one part does not switch off the other.
        try:
            if plan.stock and not executemany:
                self._stock_statement(conn, cursor, plan, parameters)
        except Exception as exc:
            self.sentry.internal_error(_COMPONENT, exc)

    def handle_error(self, ctx: ExceptionContext) -> None:
        try:
            statement = ctx.statement
            plan = self.plan(statement) if isinstance(statement, str) else None
            context = ctx.execution_context
            state = _sqlstate(ctx.original_exception) or _sqlstate(ctx.sqlalchemy_exception)
            if plan is not None and plan.locking and context is not None:
                self._lock_done(plan, context, state)
            if state not in ("40P01", "40001", "55P03"):
                return
            table = plan.table if plan is not None else None
            if table is None and ctx.connection is not None:
                # A failure at COMMIT (SERIALIZABLE) names no statement: use the last stock
                # table this connection worked on.
                held = self.existing_state(ctx.connection)
                table = held.last_table if held is not None else None
            table = table or "unknown"
            if state == "40P01":
                self.metrics.db_deadlock(table)
            elif state == "40001":
                self.metrics.db_serialization_failure(table)
            if self.sentry.log_enabled:
                event = {"40P01": "db_deadlock", "40001": "db_serialization_failure"}.get(
                    state, "db_lock_timeout"
                )
                self.sentry.logger.warning(event, table=table, sqlstate=state)
        except Exception as exc:
            self.sentry.internal_error(_COMPONENT, exc)

    # --- pieces ----------------------------------------------------------------------------

    def _begin(self, conn: Connection, plan: StatementInfo) -> None:
        state = self.state(conn)
        txn = conn.get_transaction()
        if txn is None:
            state.pending = plan
        else:
            state.sync(txn)
            state.apply_begin(plan)

    def _lock_done(self, plan: StatementInfo, context: Any, sqlstate: str | None) -> None:
        t0 = context.__dict__.pop(_T0, None)
        if t0 is None:
            return
        elapsed = time.perf_counter() - t0
        span = context.__dict__.pop(_SPAN, None) if self.lock_tracer is not None else None
        exemplar = exemplar_for(span if span is not None else otel_trace.get_current_span())
        self.metrics.db_lock_wait(plan.table or "unknown", elapsed, exemplar)
        if span is not None:
            if sqlstate is not None and span.is_recording():
                span.set_attribute("db.response.status_code", sqlstate)
                span.set_status(StatusCode.ERROR)
            span.end()

    def _resolve(self, plan: StatementInfo, parameters: Any) -> list[_Key]:
        keys: list[_Key] = []
        label = plan.table or "unknown"
        for column, (is_param, ref) in plan.keys:
            if is_param:
                try:
                    value = parameters[ref]
                except (KeyError, IndexError, TypeError):
                    continue
            else:
                value = ref
            # Most keys are plain str or int: skip the call for them.
            kind = type(value)
            if kind is not int and (kind is not str or len(value) > _MAX_KEY_CHARS):
                value = _normalise(value)
            keys.append((label, column, value))
        return keys

    def _stock_statement(
        self, conn: Connection, cursor: DBAPICursor, plan: StatementInfo, parameters: Any
    ) -> None:
        kind = plan.kind
        if kind == "lock":
            if plan.table_lock:
                locker = self.state(conn)
                locker.sync(conn.get_transaction())
                locker.lock_all.add(plan.table or "unknown")
            return
        keys = self._resolve(plan, parameters) if plan.keys else []
        if kind == "select":
            if keys and (plan.reads_stock or plan.protects_rows):
                self._read(conn, plan, keys)
            return
        if kind not in ("update", "delete"):
            return
        rowcount = getattr(cursor, "rowcount", -1)
        if plan.returning and self.dialect_name == "sqlite":
            # pysqlite counts RETURNING rows only as they are fetched: unknown here.
            rowcount = -1
        state = self.state(conn) if keys or kind == "update" else None
        if state is not None:
            state.sync(conn.get_transaction())
            state.last_table = plan.table
        if plan.write == "blind" and not plan.conditional and keys and rowcount != 0:
            self._check_write(conn, plan, keys, state)
        if plan.conditional and rowcount == 0:
            self._no_row(plan, keys)
        elif plan.conditional and rowcount > 0:
            # A retry that now matched undoes the conflict an earlier attempt implied.
            reservation = current_reservation()
            if reservation is not None:
                reservation.implied_outcome(None)
        if keys and state is not None and rowcount != 0:
            state.locks.update(keys)

    def _read(self, conn: Connection, plan: StatementInfo, keys: list[_Key]) -> None:
        """A SELECT naming stock rows: remember the read, and the row locks it took."""
        state = self.state(conn)
        state.sync(conn.get_transaction())
        if self._autocommit(conn):
            locked = False  # each statement is its own transaction: no lock outlives it
        elif plan.protects_rows:
            state.locks.update(keys)
            locked = True
        else:
            table = plan.table or "unknown"
            locked = (
                "*" in state.lock_all
                or table in state.lock_all
                or any(k in state.locks for k in keys)
            )
        if not plan.reads_stock:
            return
        read = _Read(locked, state.txn, time.monotonic())
        reservation = current_reservation()
        res_store = _scope(_reservation_reads, reservation, True) if reservation else None
        request_id = structlog.contextvars.get_contextvars().get("request_id")
        req_store = _scope(_request_reads, request_id, True) if request_id is not None else None
        for key in keys:
            _remember(state.reads, key, read)
            if res_store is not None:
                _remember(res_store, key, read)
                # A reservation is for one SKU: a later write keyed by another column (the
                # ORM reads by sku and flushes by id) is taken to be about the same row.
                _remember(res_store, (key[0], _ANY_ROW, key[1]), read)
            if req_store is not None:
                _remember(req_store, key, read)

    def _check_write(
        self,
        conn: Connection,
        plan: StatementInfo,
        keys: list[_Key],
        state: _ConnState | None,
    ) -> None:
        if state is None:
            return
        now = time.monotonic()
        oldest = now - self.read_window
        reservation = current_reservation()
        request_id = structlog.contextvars.get_contextvars().get("request_id")
        stores: list[tuple[str, dict[_Key, _Read]]] = [("connection", state.reads)]
        res_store = _scope(_reservation_reads, reservation, False) if reservation else None
        if res_store is not None:
            stores.append(("reservation", res_store))
        if request_id is not None:
            store = _scope(_request_reads, request_id, False)
            if store is not None:
                stores.append(("request", store))
        latest: _Read | None = None
        latest_scope = ""
        latest_key: _Key | None = None
        for key in keys:
            for scope_name, store in stores:
                read = store.pop(key, None)  # a write uses up the read it was computed from
                if read is None or read.at < oldest:
                    continue
                if latest is None or read.at > latest.at:
                    latest, latest_scope, latest_key = read, scope_name, key
        if res_store is not None:
            # Within a reservation, a read keyed by another column of the same table (read
            # by sku, written by id, as the ORM does) is taken to be about this row, when
            # no read of this very key decided. Used up by the write either way.
            table = keys[0][0]
            written = {key[1] for key in keys}
            exact = latest is not None
            for any_key in [k for k in list(res_store) if k[0] == table and k[1] == _ANY_ROW]:
                read = res_store.pop(any_key, None)
                if exact or read is None or read.at < oldest or any_key[2] in written:
                    continue  # same key column, other value: another row
                if latest is None or read.at > latest.at:
                    latest, latest_scope, latest_key = read, "reservation", keys[0]
        if latest is None or latest_key is None:
            return  # a blind write without a read we saw (a restock, an admin fix)
        txn = conn.get_transaction()
        same_txn = txn is not None and latest.txn is not None and latest.txn() is txn
        if same_txn and (latest.locked or self._serializable(conn, state)):
            return
        table = plan.table or "unknown"
        self.metrics.unsafe_read_modify_write(table)
        if self.sentry.log_enabled:
            code, function = _app_location()
            self.sentry.logger.warning(
                "unsafe_read_modify_write",
                table=table,
                key_column=latest_key[1],
                key=str(latest_key[2]),
                code=code,
                function=function,
                read_scope=latest_scope,
                read_age_s=round(now - latest.at, 3),
                read_locked=latest.locked,
                same_transaction=same_txn,
            )

    def _no_row(self, plan: StatementInfo, keys: list[_Key]) -> None:
        reason: Literal["out_of_stock", "lost_race"] = (
            "out_of_stock" if plan.write == "self" else "lost_race"
        )
        reservation = current_reservation()
        if reservation is not None:
            reservation.implied_outcome(reason)
            return
        # Outside a reservation there is no SKU label or outcome to attach it to: a debug
        # line only, so a batch job's guarded updates do not count as checkout conflicts.
        if self.sentry.log_enabled:
            self.sentry.logger.debug(
                "stock_update_matched_no_row",
                table=plan.table,
                reason=reason,
                key=str(keys[0][2]) if keys else None,
            )

    def _autocommit(self, conn: Connection) -> bool:
        level = conn.get_execution_options().get("isolation_level")
        if level is None:
            # create_engine(isolation_level=...) is kept by the dialect; SQLAlchemy has no
            # public accessor for it that avoids a round trip.
            level = getattr(conn.dialect, "_on_connect_isolation_level", None)
        return level == "AUTOCOMMIT"

    def _serializable(self, conn: Connection, state: _ConnState) -> bool:
        """Whether a plain read and a write in one transaction cannot lose an update."""
        if self.dialect_name == "sqlite":
            # Only a BEGIN the application sends makes pysqlite read inside the transaction
            # (by default it begins before the first write); then SQLite is serializable.
            return state.begun
        if self.dialect_name != "postgresql":
            return False  # e.g. MySQL's REPEATABLE READ does lose updates
        level = (
            state.isolation
            or conn.get_execution_options().get("isolation_level")
            or getattr(conn.dialect, "_on_connect_isolation_level", None)
            or conn.default_isolation_level
        )
        # PostgreSQL aborts the write with 40001 if the row changed since the snapshot.
        return level in ("REPEATABLE READ", "SERIALIZABLE")


# --- public API ------------------------------------------------------------------------------

_instrumented: weakref.WeakKeyDictionary[Engine, _Instrumentation] = weakref.WeakKeyDictionary()


def _sync_engine(engine: Engine | AsyncEngine) -> Engine:
    sync = getattr(engine, "sync_engine", engine)
    if not isinstance(sync, sqlalchemy.engine.Engine):
        raise TypeError(f"expected a SQLAlchemy Engine or AsyncEngine, got {type(engine)!r}")
    return sync


def _otel_engine_tracer(
    engine: Engine, instrumentation: _Instrumentation, tracer_provider: TracerProvider | None
) -> None:
    """Attach opentelemetry-instrumentation-sqlalchemy's per-engine tracer to ``engine``.

    ``SQLAlchemyInstrumentor().instrument(engine=...)`` would also patch ``create_engine``
    and ``Engine.connect`` process-wide, and as a singleton it ignores a second engine; its
    ``EngineTracer`` is the per-engine part. The version check it would do is done here.
    """
    from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
    from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer
    from opentelemetry.instrumentation.sqlalchemy.version import __version__
    from opentelemetry.metrics import get_meter
    from opentelemetry.semconv.metrics import MetricInstruments

    conflict = get_dependency_conflicts(SQLAlchemyInstrumentor().instrumentation_dependencies())
    if conflict is not None:
        # As the instrumentor itself would: no spans rather than wrong ones.
        instrumentation.sentry.internal_error(_COMPONENT, RuntimeError(str(conflict)))
        return
    scope = "opentelemetry.instrumentation.sqlalchemy"
    tracer = otel_trace.get_tracer(scope, __version__, tracer_provider)
    usage = get_meter(scope, __version__).create_up_down_counter(
        name=MetricInstruments.DB_CLIENT_CONNECTIONS_USAGE,
        unit="connections",
        description="The number of connections that are currently in state described by "
        "the state attribute.",
    )
    registered: list[Any] = EngineTracer._remove_event_listener_params
    before = len(registered)
    EngineTracer(tracer, engine, usage)  # type: ignore[no-untyped-call]  # untyped library
    instrumentation.otel_entries = registered[before:]


def instrument_sqlalchemy(
    engine: Engine | AsyncEngine,
    *,
    sentry: Sentry | None = None,
    stock_tables: Mapping[str, StockTable] | None = None,
    spans: SpanMode | bool = "off",
    tracer_provider: TracerProvider | None = None,
    read_window: float = DEFAULT_READ_WINDOW,
) -> None:
    """Watch ``engine``'s SQL for lock waits, deadlocks, conflicts and unsafe writes.

    ``sentry`` defaults to the process-wide one (:func:`get_sentry`, looked up now: call
    this after :func:`configure`). ``stock_tables`` maps table names to
    :class:`StockTable` (default ``{"products": StockTable()}``). ``spans``: ``"off"``
    (``False``), ``"locking"`` (a ``stock.db.lock`` span around each locking statement) or
    ``"all"`` (``True``: opentelemetry-instrumentation-sqlalchemy's span for every
    statement); ``tracer_provider`` defaults to the Sentry's tracer for ``"locking"`` and
    the global provider for ``"all"``. ``read_window`` is how long (seconds) a read of a
    stock value is remembered by the unsafe read-modify-write detector.

    Calling it again for the same engine does nothing. Listeners never raise into the
    application: their failures count ``stocksentry_instrumentation_errors_total
    {component="sqlalchemy"}``. Bad arguments raise (set-up code).

    Example::

        engine = create_async_engine("postgresql+asyncpg://shop@db/shop")
        instrument_sqlalchemy(engine, stock_tables={"products": StockTable()})
        ...
        uninstrument_sqlalchemy(engine)
    """
    sync = _sync_engine(engine)
    if sync in _instrumented:
        return
    mode: SpanMode
    if spans is True:
        mode = "all"
    elif spans is False:
        mode = "off"
    elif spans in ("off", "locking", "all"):
        mode = spans
    else:
        raise ValueError(f"spans must be 'off', 'locking' or 'all', got {spans!r}")
    if not read_window > 0:
        raise ValueError("read_window must be positive")
    tables = _Tables(stock_tables if stock_tables is not None else {"products": StockTable()})
    instrumentation = _Instrumentation(
        sentry if sentry is not None else get_sentry(),
        tables,
        sync.dialect.name,
        sync.dialect.paramstyle,
        mode,
        tracer_provider,
        read_window,
    )
    for name in ("before_cursor_execute", "after_cursor_execute", "handle_error"):
        listener = getattr(instrumentation, name)
        if name == "before_cursor_execute":
            sqlalchemy.event.listen(sync, name, listener, retval=True)
        else:
            sqlalchemy.event.listen(sync, name, listener)
        instrumentation.listeners.append((name, listener))
    _instrumented[sync] = instrumentation
    if mode == "all":
        try:
            _otel_engine_tracer(sync, instrumentation, tracer_provider)
        except Exception:
            uninstrument_sqlalchemy(sync)
            raise


def uninstrument_sqlalchemy(engine: Engine | AsyncEngine) -> None:
    """Remove every listener :func:`instrument_sqlalchemy` added to ``engine`` (if any).

    Example::

        uninstrument_sqlalchemy(engine)
        assert not is_instrumented(engine)
    """
    sync = _sync_engine(engine)
    instrumentation = _instrumented.pop(sync, None)
    if instrumentation is None:
        return
    for name, listener in instrumentation.listeners:
        if sqlalchemy.event.contains(sync, name, listener):
            sqlalchemy.event.remove(sync, name, listener)
    if instrumentation.otel_entries:
        from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

        for entry in instrumentation.otel_entries:
            target_ref, name, listener = entry
            target = target_ref()
            if target is not None and sqlalchemy.event.contains(target, name, listener):
                sqlalchemy.event.remove(target, name, listener)
            EngineTracer._dispose_of_event_listener(entry)  # type: ignore[no-untyped-call]  # untyped library
    instrumentation.listeners.clear()
    instrumentation.otel_entries = []


def is_instrumented(engine: Engine | AsyncEngine) -> bool:
    """Whether :func:`instrument_sqlalchemy` is in effect on ``engine``.

    Example::

        instrument_sqlalchemy(engine)
        assert is_instrumented(engine)
    """
    return _sync_engine(engine) in _instrumented
