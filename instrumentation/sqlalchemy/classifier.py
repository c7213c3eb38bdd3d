"""The statement classifier: what one SQL text does to the stock tables.

Each statement kind (``SELECT``, ``UPDATE``, ``DELETE``, ``LOCK``, ``BEGIN``) has its own
function over the tokens; :func:`classify_statement` is the public entry point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .clauses import (
    BLOCKING_LOCK_MODES,
    CLAUSE_END,
    Tables,
    assigned,
    find_target,
    from_items,
    is_op,
    is_word,
    isolation_level,
    mentions,
    phrase_at,
    read_name,
    reads_column,
    skip_group,
    split_at,
    tok_at,
    top_level,
    where_clause,
    where_keys,
    write_kind,
)
from .dialects import MYSQL_DIALECTS
from .model import IGNORED, StatementInfo, StockTable, ValueRef, WriteKind
from .tokens import QUOTED, WORD, Tok, tokenize

# The row-lock strengths of SELECT ... FOR.
_LOCK_STRENGTHS = (("update",), ("no", "key", "update"), ("share",), ("key", "share"))
_SHARE = ("lock", "in", "share", "mode")


def _classify_select(toks: Sequence[Tok], start: int, tables: Tables) -> StatementInfo:
    frm = top_level(toks, start + 1, frozenset({"from"}))
    if frm >= len(toks) or not is_word(toks[frm], "from"):
        return IGNORED
    end_from = top_level(toks, frm + 1, CLAUSE_END)
    target, label = find_target(from_items(toks[frm + 1 : end_from]), tables)
    # FOR UPDATE / NO KEY UPDATE / SHARE / KEY SHARE [OF t, ...] [NOWAIT | SKIP LOCKED]
    # (MySQL adds WAIT n), or MySQL's LOCK IN SHARE MODE, looked for as the whole phrase
    # (``lock`` alone may be a column's name).
    share_mode = next(
        (j for j in range(end_from, len(toks)) if toks[j][2] == 0 and phrase_at(toks, j, _SHARE)),
        len(toks),
    )
    lock_clause = "lock in share mode" if share_mode < len(toks) else None
    lock_of: set[str] | None = None
    for j in range(end_from if lock_clause is None else len(toks), len(toks)):
        if toks[j][2] != 0 or not is_word(toks[j], "for"):
            continue
        words = next((w for w in _LOCK_STRENGTHS if phrase_at(toks, j + 1, w)), None)
        if words is None:
            continue
        lock_clause = "for " + " ".join(words)
        k = j + 1 + len(words)
        if is_word(tok_at(toks, k), "of"):
            lock_of = set()
            k += 1
            while k < len(toks) and toks[k][0] in (WORD, QUOTED):
                parts, k = read_name(toks, k)
                lock_of.add(parts[-1])
                if not is_op(tok_at(toks, k), ","):
                    break
                k += 1
        break
    locking = lock_clause is not None
    if target is None:
        if locking:
            return StatementInfo("select", label, locking=True, lock_clause=lock_clause)
        return StatementInfo("select", label) if label else IGNORED
    where_at = top_level(toks, frm + 1, frozenset({"where"}))
    keys: tuple[tuple[str, ValueRef], ...] = ()
    if where_at < len(toks) and is_word(toks[where_at], "where"):
        where_end = min(top_level(toks, where_at + 1, CLAUSE_END), share_mode)
        keys = where_keys(toks[where_at + 1 : where_end], target)
    compound = any(t[2] == 0 and is_word(t, "union", "intersect", "except") for t in toks)
    reads = not compound and reads_column(
        split_at(toks[start + 1 : frm], ","), target.spec.stock_column, target
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


# MySQL's modifiers between UPDATE / DELETE and the table, and PostgreSQL's ONLY.
_UPDATE_MODIFIERS = frozenset({"only", "low_priority", "ignore"})
_DELETE_MODIFIERS = frozenset({"low_priority", "quick", "ignore"})


def _classify_update(toks: Sequence[Tok], start: int, tables: Tables) -> StatementInfo:
    i = start + 1
    while is_word(tok_at(toks, i), *_UPDATE_MODIFIERS):
        i += 1
    if i >= len(toks) or toks[i][0] not in (WORD, QUOTED):
        return IGNORED
    set_at = top_level(toks, i, frozenset({"set"}))
    target, label = find_target(from_items(toks[i:set_at])[:1], tables)
    if target is None:
        return StatementInfo("update", label) if label else IGNORED
    if set_at >= len(toks):
        return IGNORED
    spec = target.spec
    column = spec.stock_column
    value = assigned(toks, set_at, column)
    write: WriteKind = write_kind(value, target) if value is not None else "none"
    where, ret_at = where_clause(toks, set_at)
    return StatementInfo(
        "update",
        target.label,
        stock=True,
        locking=True,
        lock_clause="update",
        protects_rows=True,
        write=write,
        stock_guard=mentions(where, column, target),
        version_guard=spec.version_column is not None
        and mentions(where, spec.version_column, target),
        keys=where_keys(where, target),
        returning=ret_at < len(toks),
        reads_stock=ret_at < len(toks)
        and reads_column(split_at(toks[ret_at + 1 :], ","), column, target),
    )


def _classify_delete(toks: Sequence[Tok], start: int, tables: Tables) -> StatementInfo:
    i = start + 1
    while is_word(tok_at(toks, i), *_DELETE_MODIFIERS):
        i += 1
    if not is_word(tok_at(toks, i), "from"):
        return IGNORED
    end = top_level(toks, i + 1, frozenset({"using", "where", "returning", "order", "limit"}))
    target, label = find_target(from_items(toks[i + 1 : end])[:1], tables)
    if target is None:
        return StatementInfo("delete", label) if label else IGNORED
    where, ret_at = where_clause(toks, i + 1)
    return StatementInfo(
        "delete",
        target.label,
        stock=True,
        locking=True,
        lock_clause="delete",
        protects_rows=True,
        keys=where_keys(where, target),
        returning=ret_at < len(toks),
    )


_LOCK_TABLES_MODES = ("read", "local", "write", "low_priority")


def _classify_lock(toks: Sequence[Tok], start: int, tables: Tables) -> StatementInfo:
    i = start + 1
    if is_word(tok_at(toks, i), "tables"):
        # MySQL's LOCK TABLES t [AS a] READ [LOCAL] | [LOW_PRIORITY] WRITE, ...: both modes
        # keep other sessions from writing the table.
        names = [
            from_items([t for t in item if not is_word(t, *_LOCK_TABLES_MODES)])
            for item in split_at(toks[i + 1 :], ",")
        ]
        target, label = find_target([entry for found in names for entry in found], tables)
        clause, blocks = "lock tables", True
    else:
        if is_word(tok_at(toks, i), "table"):
            i += 1
        end = top_level(toks, i, frozenset({"in", "nowait"}))
        target, label = find_target(from_items(toks[i:end]), tables)
        mode = "access exclusive"
        if end < len(toks) and is_word(toks[end], "in"):
            words = []
            k = end + 1
            while k < len(toks) and toks[k][0] == WORD and toks[k][1] != "mode":
                words.append(toks[k][1])
                k += 1
            mode = " ".join(words)
        clause, blocks = "lock table", mode in BLOCKING_LOCK_MODES
    return StatementInfo(
        "lock",
        target.label if target else label,
        stock=target is not None,
        locking=True,
        lock_clause=clause,
        table_lock=target is not None and blocks,
    )


_CLASSIFIERS = {
    "select": _classify_select,
    "update": _classify_update,
    "delete": _classify_delete,
    "lock": _classify_lock,
}


def classify_tokens(toks: Sequence[Tok], tables: Tables) -> StatementInfo:
    start = 0
    first = tok_at(toks, start)
    if first is None or first[0] != WORD:
        return IGNORED
    word = first[1]
    if word == "with":
        # Skip the CTEs: name [(cols)] AS [[NOT] MATERIALIZED] (...), ...; classify the rest.
        j = start + 1
        while j < len(toks) and not (
            toks[j][2] == 0 and is_word(toks[j], "select", "update", "delete", "insert")
        ):
            j = skip_group(toks, j) if is_op(toks[j], "(") else j + 1
        if j >= len(toks):
            return IGNORED
        start, word = j, toks[j][1]
    classify = _CLASSIFIERS.get(word)
    if classify is not None:
        return classify(toks, start, tables)
    if word == "insert":
        if is_word(tok_at(toks, start + 1), "into") and tok_at(toks, start + 2) is not None:
            nxt = toks[start + 2]
            if nxt[0] in (WORD, QUOTED):
                parts, _ = read_name(toks, start + 2)
                found = tables.find(parts)
                return StatementInfo("insert", found[0] if found else parts[-1])
        return IGNORED
    if word in ("begin", "start"):
        # BEGIN [DEFERRED | IMMEDIATE | EXCLUSIVE] [TRANSACTION] [ISOLATION LEVEL ...]
        level = None
        immediate = False
        for k in range(start + 1, len(toks)):
            if is_word(toks[k], "immediate", "exclusive"):
                immediate = True
            if is_word(toks[k], "level"):
                level = isolation_level(toks, k + 1)
        if word == "start" and not is_word(tok_at(toks, start + 1), "transaction"):
            return IGNORED
        return StatementInfo("begin", table_lock=immediate, isolation=level)
    if word == "set" and is_word(tok_at(toks, start + 1), "transaction"):
        for k in range(start + 2, len(toks)):
            if is_word(toks[k], "level"):
                return StatementInfo("isolation", isolation=isolation_level(toks, k + 1))
    return IGNORED


def classify_statement(
    sql: str,
    *,
    paramstyle: str = "pyformat",
    stock_tables: Mapping[str, StockTable] | None = None,
    dialect: str | None = None,
) -> StatementInfo:
    """Classify one SQL text the way the listeners do (for tests and for "why?" questions).

    ``paramstyle`` is the DBAPI style of the text (``pyformat`` for psycopg, ``numeric_dollar``
    for SQLAlchemy's asyncpg dialect, ``qmark`` for SQLite, ``named``, ``numeric``,
    ``format``); ``stock_tables`` defaults to ``{"products": StockTable()}``; ``dialect``
    is SQLAlchemy's name of the database (``"mysql"`` and ``"mariadb"`` switch on MySQL's
    lexical rules: ``#`` comments, backslash escapes, double-quoted strings). Never raises
    on unusual SQL: what it does not understand is ``kind="other"``.

    Example::

        >>> info = classify_statement(
        ...     "UPDATE products SET available_stock = %(v)s WHERE sku = %(sku)s"
        ... )
        >>> info.write, info.keys
        ('blind', (('sku', (True, 'sku')),))
    """
    tables = Tables(stock_tables if stock_tables is not None else {"products": StockTable()})
    return classify_tokens(tokenize(sql, paramstyle, dialect in MYSQL_DIALECTS), tables)
