"""A small SQL tokenizer (standard library only): words, quoted names, literals, parameters
and operators, in the quoting and parameter styles of PostgreSQL, SQLite and MySQL.
"""

from __future__ import annotations

import re
from typing import Any, TypeAlias

# Token kinds.
WORD = 0  # word (keyword or unquoted identifier), lower-cased
QUOTED = 1  # quoted identifier, lower-cased for matching
STRING = 2  # string literal (its value)
NUMBER = 3  # number literal (its value)
PARAM = 4  # bound parameter (name or position)
OP = 5  # operator or punctuation

Tok: TypeAlias = tuple[int, Any, int]  # kind, value, parenthesis depth

_SCAN = re.compile(
    r"""
    (?P<sp>\s+)
  | (?P<lc>--[^\n]*)
  | (?P<bc>/\*)
  | (?P<es>[eE]'(?P<esb>(?:[^'\\]|\\.|'')*)(?:'|\Z))
  | (?P<s>(?:[nNbBxX]|[uU]&)?'(?P<sb>(?:[^']|'')*)(?:'|\Z))
  | (?P<q>(?:[uU]&)?"(?P<qb>(?:[^"]|"")*)(?:"|\Z))
  | (?P<bt>`(?P<btb>(?:[^`]|``)*)(?:`|\Z))
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
# MySQL's rules first, then the common ones: ``#`` starts a comment; a backslash escapes
# the next character in a string; "..." is a string too (unless the server runs with
# ANSI_QUOTES, where it is a quoted name: a key written so is then missed, never invented).
_SCAN_MYSQL = re.compile(
    r"""
    (?P<hash>\#[^\n]*)
  | (?P<ms>(?:[nNbBxX]|_\w+)?'(?P<msb>(?:[^'\\]|\\.|'')*)(?:'|\Z))
  | (?P<md>"(?P<mdb>(?:[^"\\]|\\.|"")*)(?:"|\Z))
    """,
    re.VERBOSE | re.DOTALL,
)
# What a backslash escape in a MySQL string stands for (others are the character itself).
_MYSQL_ESCAPES = {"0": "\0", "n": "\n", "r": "\r", "t": "\t", "b": "\b", "Z": "\x1a"}
_MYSQL_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


def _mysql_string(body: str, quote: str) -> str:
    """The value of a MySQL string literal whose text between the quotes is ``body``."""
    body = _MYSQL_ESCAPE.sub(lambda m: _MYSQL_ESCAPES.get(m.group(1), m.group(1)), body)
    return body.replace(quote * 2, quote)


def tokenize(sql: str, paramstyle: str, mysql: bool = False) -> list[Tok]:
    """Tokens of ``sql`` without whitespace and comments; never raises on odd input.

    ``mysql``: the text is MySQL's / MariaDB's (``#`` comments, backslash escapes, "..."
    strings).
    """
    out: list[Tok] = []
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
    mysql_scan = _SCAN_MYSQL.match if mysql else None
    while pos < end:
        if mysql_scan is not None:
            special = mysql_scan(sql, pos)
            if special is not None:
                pos = special.end()
                kind = special.lastgroup
                if kind == "ms":
                    out.append((STRING, _mysql_string(special.group("msb"), "'"), depth))
                elif kind == "md":
                    out.append((STRING, _mysql_string(special.group("mdb"), '"'), depth))
                continue  # a # comment
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
        if group == "es":
            out.append((STRING, m.group("esb").replace("\\'", "'").replace("''", "'"), depth))
        elif group == "s":
            out.append((STRING, m.group("sb").replace("''", "'"), depth))
        elif group == "q":
            out.append((QUOTED, m.group("qb").replace('""', '"').lower(), depth))
        elif group == "bt":
            out.append((QUOTED, m.group("btb").replace("``", "`").lower(), depth))
        elif group == "dollar":
            number = m.group("num")
            if number is not None:
                if dollar:
                    out.append((PARAM, int(number) - 1, depth))
                else:
                    out.append((OP, "$", depth))
                    out.append((NUMBER, int(number), depth))
                continue
            # A dollar-quoted string: the body runs to the same tag.
            close = sql.find(text, pos)
            body = sql[pos:close] if close >= 0 else sql[pos:]
            pos = close + len(text) if close >= 0 else end
            out.append((STRING, body, depth))
        elif fmt and group == "pyf":
            out.append((PARAM, m.group("pyname"), depth))
        elif fmt and group == "fmt":
            out.append((PARAM, position, depth))
            position += 1
        elif group == "pyf" or group == "fmt" or group == "pct":
            out.append((OP, "%", depth))  # %% in a format style, else a modulo
            if not fmt:
                pos = m.start() + 1
        elif group == "cast":
            out.append((OP, "::", depth))
        elif group == "colon":
            if numeric and m.group("cnum") is not None:
                out.append((PARAM, int(m.group("cnum")) - 1, depth))
            elif named and m.group("cname") is not None:
                out.append((PARAM, m.group("cname"), depth))
            else:
                out.append((OP, ":", depth))
                pos = m.start() + 1
        elif group == "n":
            # Digits alone are an int; a point, an exponent, or more digits than int() takes
            # (4,300 since Python 3.11) make a float.
            try:
                literal: int | float = int(text)
            except ValueError:
                literal = float(text)
            out.append((NUMBER, literal, depth))
        elif group == "w":
            out.append((WORD, text.lower(), depth))
        elif text == "?" and qmark:
            out.append((PARAM, position, depth))
            position += 1
        elif text == "(":
            out.append((OP, "(", depth))
            depth += 1
        elif text == ")":
            depth = max(0, depth - 1)
            out.append((OP, ")", depth))
        else:
            out.append((OP, text, depth))
    return out
