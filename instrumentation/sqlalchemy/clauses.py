"""Token helpers of the classifier: names, groups, top-level clauses, keys and targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .model import StockTable, ValueRef, WriteKind
from .tokens import _N, _O, _P, _Q, _S, _W, _Tok

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
