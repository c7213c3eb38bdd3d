"""Token helpers of the classifier: names, groups, top-level clauses, keys and targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from .model import StockTable, ValueRef, WriteKind
from .tokens import NUMBER, OP, PARAM, QUOTED, STRING, WORD, Tok

CLAUSE_END = frozenset(
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
    | CLAUSE_END
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
BLOCKING_LOCK_MODES = frozenset({"share", "share row exclusive", "exclusive", "access exclusive"})


def is_word(tok: Tok | None, *words: str) -> bool:
    return tok is not None and tok[0] == WORD and tok[1] in words


def is_op(tok: Tok | None, op: str) -> bool:
    return tok is not None and tok[0] == OP and tok[1] == op


def tok_at(toks: Sequence[Tok], i: int) -> Tok | None:
    return toks[i] if 0 <= i < len(toks) else None


def read_name(toks: Sequence[Tok], i: int) -> tuple[tuple[str, ...], int]:
    """A dotted name at ``i`` (``a``, ``s.t``, ``"S"."t"``, ``t.*``) and the index after it."""
    parts = [toks[i][1]]
    j = i + 1
    while is_op(tok_at(toks, j), "."):
        nxt = tok_at(toks, j + 1)
        if nxt is None:
            break
        if nxt[0] in (WORD, QUOTED):
            parts.append(nxt[1])
        elif is_op(nxt, "*"):
            parts.append("*")
        else:
            break
        j += 2
    return tuple(parts), j


def skip_group(toks: Sequence[Tok], i: int) -> int:
    """Index after the parenthesised group opening at ``i``."""
    depth = toks[i][2]
    j = i + 1
    while j < len(toks) and not (is_op(toks[j], ")") and toks[j][2] == depth):
        j += 1
    return j + 1


def top_level(toks: Sequence[Tok], start: int, stop_words: frozenset[str], depth: int = 0) -> int:
    """The first index from ``start`` of a word in ``stop_words`` at ``depth`` (or the end)."""
    for j in range(start, len(toks)):
        tok = toks[j]
        if tok[2] == depth and (
            (tok[0] == WORD and tok[1] in stop_words) or (tok[0] == OP and tok[1] == ";")
        ):
            return j
    return len(toks)


def split_at(toks: Sequence[Tok], sep: str) -> list[list[Tok]]:
    """Split at ``sep`` (an operator like ``,`` or the word ``and``) at the top level."""
    parts: list[list[Tok]] = [[]]
    for tok in toks:
        if tok[2] == 0 and tok[1] == sep and tok[0] in (OP, WORD):
            parts.append([])
        else:
            parts[-1].append(tok)
    return [p for p in parts if p]


class Tables:
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


class Target(NamedTuple):
    """The stock table a statement works on, and the names that qualify its columns."""

    label: str
    spec: StockTable
    qualifiers: set[str]


def _column_ref(parts: tuple[str, ...], column: str, target: Target) -> bool:
    if parts[-1] != column:
        return False
    return len(parts) == 1 or parts[-2] in target.qualifiers


def mentions(toks: Sequence[Tok], column: str, target: Target) -> bool:
    i = 0
    while i < len(toks):
        if toks[i][0] in (WORD, QUOTED):
            parts, j = read_name(toks, i)
            if _column_ref(parts, column, target):
                return True
            i = j
        else:
            i += 1
    return False


def reads_column(items: Sequence[Sequence[Tok]], column: str, target: Target) -> bool:
    """Whether a select or returning list (split at commas) includes ``column`` or ``*``."""
    for item in items:
        if len(item) == 1 and is_op(item[0], "*"):
            return True
        if item[0][0] in (WORD, QUOTED):
            parts, j = read_name(item, 0)
            if parts[-1] == "*" and j == len(item) and parts[-2] in target.qualifiers:
                return True
        if mentions(item, column, target):
            return True
    return False


def write_kind(expr: Sequence[Tok], target: Target) -> WriteKind:
    """How a SET expression computes the stock: from itself, other columns, or outside SQL."""
    column = target.spec.stock_column
    other = False
    i = 0
    while i < len(expr):
        tok = expr[i]
        if tok[0] not in (WORD, QUOTED):
            i += 1
            continue
        prev = expr[i - 1] if i else None
        if is_op(prev, "::") or is_word(prev, "as"):
            # A type name (possibly several words: double precision, character varying).
            while i < len(expr) and expr[i][0] == WORD:
                i += 1
            continue
        parts, j = read_name(expr, i)
        if is_op(tok_at(expr, j), "("):  # a function call
            i = j
            continue
        if tok[0] == WORD and len(parts) == 1 and tok[1] in _EXPR_WORDS:
            i = j
            continue
        if _column_ref(parts, column, target):
            return "self"
        other = True
        i = j
    return "sql" if other else "blind"


def unwrap(toks: Sequence[Tok]) -> Sequence[Tok]:
    """``toks`` without the parentheses that enclose all of it (``((x))`` is ``x``)."""
    while (
        len(toks) >= 3
        and is_op(toks[0], "(")
        and is_op(toks[-1], ")")
        and skip_group(toks, 0) == len(toks)
    ):
        toks = toks[1:-1]
    return toks


def value_ref(toks: Sequence[Tok]) -> ValueRef | None:
    """A literal or parameter, possibly cast (``$1::VARCHAR``, ``CAST(:x AS INT)``, ``-5``)."""
    if not toks:
        return None
    toks = unwrap(toks)
    first = toks[0]
    i = 1
    ref: ValueRef
    if is_word(first, "cast") and len(toks) > 3 and is_op(toks[1], "("):
        close = skip_group(toks, 1)
        inner = top_level(toks, 2, frozenset({"as"}), toks[1][2] + 1)
        if inner >= close:
            return None
        cast = value_ref(toks[2:inner])
        if cast is None:
            return None
        # What follows the CAST(...) is checked like what follows a plain value: in
        # `CAST(:id AS INT) + 1` the parameter is not the value.
        ref, i = cast, close
    elif first[0] == PARAM:
        ref = (True, first[1])
    elif first[0] in (STRING, NUMBER):
        ref = (False, first[1])
    elif is_op(first, "-") and len(toks) > 1 and toks[1][0] == NUMBER:
        ref = (False, -toks[1][1])
        i = 2
    else:
        return None
    # Only casts may follow: ::type, ::type(n), ::type[].
    while i < len(toks):
        if not is_op(toks[i], "::"):
            return None
        i += 1
        while i < len(toks) and (toks[i][0] in (WORD, QUOTED) or toks[i][2] > first[2]):
            i += 1
        while i < len(toks) and (
            is_op(toks[i], "(") or is_op(toks[i], "[") or is_op(toks[i], "]")
        ):
            i = skip_group(toks, i) if is_op(toks[i], "(") else i + 1
    return ref


def where_keys(where: Sequence[Tok], target: Target) -> tuple[tuple[str, ValueRef], ...]:
    """``column = value`` equalities on key columns, ANDed at the top of a WHERE."""
    if any(t[2] == 0 and is_word(t, "or") for t in where):
        return ()  # either row may be meant: no key
    conjuncts: list[list[Tok]] = [[]]
    between = False
    for tok in where:
        if tok[2] == 0 and is_word(tok, "between"):
            between = True
        if tok[2] == 0 and is_word(tok, "and"):
            if between:  # BETWEEN a AND b
                between = False
            else:
                conjuncts.append([])
                continue
        conjuncts[-1].append(tok)
    keys: list[tuple[str, ValueRef]] = []
    key_columns = target.spec.key_columns
    for conj in map(unwrap, conjuncts):
        eq = next(
            (k for k, t in enumerate(conj) if is_op(t, "=") and t[2] == conj[0][2]),
            None,
        )
        if eq is None or eq == 0:
            continue
        left, right = conj[:eq], conj[eq + 1 :]
        for name_side, value_side in ((left, right), (right, left)):
            if not name_side or name_side[0][0] not in (WORD, QUOTED):
                continue
            parts, j = read_name(name_side, 0)
            if j != len(name_side) or parts[-1] not in key_columns:
                continue
            if len(parts) > 1 and parts[-2] not in target.qualifiers:
                continue
            ref = value_ref(value_side)
            if ref is not None:
                keys.append((parts[-1], ref))
                break
    return tuple(keys)


def from_items(toks: Sequence[Tok]) -> list[tuple[tuple[str, ...], str | None]]:
    """``(name, alias)`` of the tables in a FROM/USING list (subqueries skipped)."""
    items: list[tuple[tuple[str, ...], str | None]] = []
    i = 0
    expect = True
    while i < len(toks):
        tok = toks[i]
        # A table is expected after FROM, a comma or JOIN, at the top level.
        expecting = expect and tok[2] == 0 and not is_word(tok, "only", "lateral")
        if tok[2] == 0 and (is_op(tok, ",") or is_word(tok, "join")):
            expect = True
        elif expecting and is_op(tok, "("):
            i = skip_group(toks, i)
            expect = False
            continue
        elif expecting and tok[0] in (WORD, QUOTED):
            parts, i = read_name(toks, i)
            alias = None
            if is_op(tok_at(toks, i), "*"):  # ONLY-less inheritance marker: t *
                i += 1
            nxt = tok_at(toks, i)
            if is_word(nxt, "as"):
                nxt = tok_at(toks, i + 1)
                i += 1
            if nxt is not None and (
                nxt[0] == QUOTED or (nxt[0] == WORD and nxt[1] not in _NOT_ALIAS)
            ):
                alias = nxt[1]
                i += 1
            items.append((parts, alias))
            expect = False
            continue
        i += 1
    return items


def find_target(
    items: Sequence[tuple[tuple[str, ...], str | None]], tables: Tables
) -> tuple[Target | None, str | None]:
    """The first configured stock table among ``items``, and the label to use."""
    for parts, alias in items:
        found = tables.find(parts)
        if found is not None:
            label, spec = found
            qualifiers = {parts[-1], ".".join(parts)}
            if alias is not None:
                qualifiers.add(alias)
            return Target(label, spec, qualifiers), label
    if items:
        return None, items[0][0][-1]
    return None, None


def phrase_at(toks: Sequence[Tok], i: int, words: Sequence[str]) -> bool:
    """Whether the tokens from ``i`` are the words ``words``."""
    return all(is_word(tok_at(toks, i + k), w) for k, w in enumerate(words))


def isolation_level(toks: Sequence[Tok], i: int) -> str | None:
    """The level after ``isolation level`` at ``i`` (or ``None``)."""
    return next((lv for words, lv in _ISOLATION_LEVELS.items() if phrase_at(toks, i, words)), None)


# What ends an UPDATE's SET list, and an UPDATE's or DELETE's WHERE (PostgreSQL's
# RETURNING, MySQL's ORDER BY / LIMIT).
_SET_END = frozenset({"from", "where", "returning", "order", "limit"})
_WHERE_END = frozenset({"returning", "order", "limit"})


def assigned(toks: Sequence[Tok], set_at: int, column: str) -> Sequence[Tok] | None:
    """The expression the ``SET`` at ``set_at`` assigns to ``column`` (``None``: none)."""
    for item in split_at(toks[set_at + 1 : top_level(toks, set_at + 1, _SET_END)], ","):
        eq = next((k for k, t in enumerate(item) if is_op(t, "=") and t[2] == 0), None)
        if eq is not None and any(t[0] in (WORD, QUOTED) and t[1] == column for t in item[:eq]):
            return item[eq + 1 :]
    return None


def where_clause(toks: Sequence[Tok], start: int) -> tuple[Sequence[Tok], int]:
    """The top-level ``WHERE`` of an UPDATE or DELETE after ``start`` (``[]`` if none),
    and where its ``RETURNING`` starts (or the end)."""
    where_at = top_level(toks, start, frozenset({"where"}))
    where_end = top_level(toks, where_at + 1, _WHERE_END)
    where = toks[where_at + 1 : where_end] if where_at < where_end else []
    return where, top_level(toks, start, frozenset({"returning"}))
