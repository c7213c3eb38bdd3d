"""The kinds of value a config key holds: how each is read, documented and schema'd.

A kind reads one YAML node (never null: the loader handles absent and null keys) or fails
with the message the user sees; it also gives its type in the docs (:meth:`Kind.type_doc`)
and its JSON schema (draft-07, for the chart's ``values.schema.json``).

Example::

    >>> Duration(maximum=600).type_doc()
    'duration ≤ 10m'
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from yaml.nodes import Node, ScalarNode, SequenceNode

from ..durations import DURATION_PATTERN, format_duration, parse_duration
from .errors import Context, describe
from .yamlsource import (
    TAG_BOOL,
    TAG_FLOAT,
    TAG_INT,
    TAG_STR,
    scalar_value,
)

Schema = dict[str, Any]
MINUTE: Final = 60.0
HOUR: Final = 3600.0
DAY: Final = 86400.0

IDENTIFIER: Final = r"[A-Za-z_][A-Za-z0-9_$]{0,62}"
_HOST: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?")
_DURATION_EXAMPLE: Final = (
    'expected a duration like "5s", "500ms" or "1m" (or a number of seconds)'
)


class Kind:
    """One kind of value; subclasses override :meth:`read` and the documentation."""

    #: An explicit null switches the key off (``None``) instead of taking its default.
    null_clears: bool = False
    #: The type column of the docs' key reference, unless :meth:`type_doc` says more.
    doc_type: ClassVar[str] = "string"

    def read(self, ctx: Context, node: Node, path: str) -> Any:
        """The value of ``node`` (never a null node), or a :class:`ConfigError`."""
        raise NotImplementedError

    def type_doc(self) -> str:
        """The type column of the docs' key reference."""
        return self.doc_type

    def json_schema(self) -> Schema:
        """The JSON schema (draft-07) of a value of this kind."""
        return {"type": "string", "minLength": 1}

    def json_value(self, value: Any) -> Any:
        """A value of this kind as JSON (the schema's ``default``, the docs' default)."""
        return list(value) if isinstance(value, tuple) else value


def _scalar(
    ctx: Context, node: Node, path: str, tags: tuple[str, ...], expected: str
) -> bool | int | float:
    """The value of a bool, int or float scalar whose tag is one of ``tags``."""
    if not isinstance(node, ScalarNode) or node.tag not in tags:
        ctx.fail(node, path, f"{expected}, got {describe(node)}")
    try:
        return scalar_value(node)
    except ValueError:
        ctx.fail(node, path, f"{expected}, got {describe(node)}")


@dataclass(frozen=True)
class Bool(Kind):
    """``true`` or ``false`` (YAML 1.1 spellings: yes/no/on/off too)."""

    doc_type: ClassVar[str] = "bool"

    def read(self, ctx: Context, node: Node, path: str) -> bool:
        return bool(_scalar(ctx, node, path, (TAG_BOOL,), "expected true or false"))

    def json_schema(self) -> Schema:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Integer(Kind):
    """A whole number within ``minimum`` and ``maximum``."""

    minimum: int
    maximum: int
    #: The type column, when the range alone says too little or too much.
    label: str = ""

    def read(self, ctx: Context, node: Node, path: str) -> int:
        value = int(_scalar(ctx, node, path, (TAG_INT,), "expected a whole number"))
        if value < self.minimum:
            ctx.fail(node, path, f"must be at least {self.minimum}, got {node.value}")
        if value > self.maximum:
            # As written: str() of a huge YAML hex int exceeds Python's digit limit.
            ctx.fail(node, path, f"must be at most {self.maximum}, got {node.value}")
        return value

    def type_doc(self) -> str:
        return self.label or f"{self.minimum}\u2013{self.maximum}"

    def json_schema(self) -> Schema:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Duration(Kind):
    """A duration (:mod:`stocksentry.exporter.durations`), in seconds, at most
    ``maximum``; zero only when ``allow_zero``."""

    maximum: float
    allow_zero: bool = False

    def read(self, ctx: Context, node: Node, path: str) -> float:
        raw: str | float
        if isinstance(node, ScalarNode) and node.tag == TAG_STR:
            raw = str(node.value)
        else:
            # An int stays an int, compared exactly: one too large for a float is refused
            # here, not overflowed.
            raw = _scalar(ctx, node, path, (TAG_INT, TAG_FLOAT), _DURATION_EXAMPLE)
            if raw < 0:
                ctx.fail(node, path, f"must not be negative, got {node.value}")
            if raw > self.maximum:
                got = format_duration(raw) if raw < 1e300 else describe(node)
                ctx.fail(node, path, f"must be at most {format_duration(self.maximum)}, got {got}")
        try:
            seconds = parse_duration(raw)
        except ValueError:
            ctx.fail(node, path, f"{_DURATION_EXAMPLE}, got {describe(node)}")
        if seconds == 0 and not self.allow_zero:
            ctx.fail(node, path, "must be greater than zero")
        if seconds > self.maximum:
            ctx.fail(
                node,
                path,
                f"must be at most {format_duration(self.maximum)}, got {format_duration(seconds)}",
            )
        return seconds

    def type_doc(self) -> str:
        zero = ", may be 0" if self.allow_zero else ""
        return f"duration ≤ {format_duration(self.maximum)}{zero}"

    def json_schema(self) -> Schema:
        bound = "minimum" if self.allow_zero else "exclusiveMinimum"
        return {
            "type": ["number", "string"],
            bound: 0,
            "maximum": int(self.maximum) if float(self.maximum).is_integer() else self.maximum,
            "pattern": DURATION_PATTERN,
        }

    def json_value(self, value: Any) -> Any:
        return format_duration(float(value))


@dataclass(frozen=True)
class Text(Kind):
    """A non-empty string; numbers are kept as written when ``allow_numbers``."""

    allow_numbers: bool = False

    def read(self, ctx: Context, node: Node, path: str) -> str:
        tags = (TAG_STR, TAG_INT, TAG_FLOAT) if self.allow_numbers else (TAG_STR,)
        if not isinstance(node, ScalarNode) or node.tag not in tags:
            ctx.fail(node, path, f"expected a string, got {describe(node)}")
        value = str(node.value)
        if not value.strip():
            ctx.fail(node, path, "must not be empty")
        return value


#: A plain :class:`Text`, for the kinds that read a string first.
TEXT = Text()


@dataclass(frozen=True)
class Named(Kind):
    """A name that must match ``pattern`` (Python and JSON-schema regex alike) and not
    start with ``reserved``; ``what`` names it in the message: ``"x-y" is not a metric
    name``. ``null_clears``: an explicit null switches the key off."""

    pattern: str
    what: str
    type_label: str
    reserved: str = ""
    null_clears: bool = False

    def read(self, ctx: Context, node: Node, path: str) -> str:
        value = TEXT.read(ctx, node, path)
        if not re.fullmatch(self.pattern, value) or (
            self.reserved and value.startswith(self.reserved)
        ):
            ctx.fail(node, path, f"{describe(node)} is not {self.what}")
        return value

    def type_doc(self) -> str:
        return self.type_label

    def json_schema(self) -> Schema:
        return {"type": "string", "pattern": f"^{self.pattern}$"}


_PLAIN: Final = "a plain SQL identifier (letters, digits, _ and $, not starting with a digit)"
#: A Prometheus label name; ``__``-prefixed names are Prometheus's own.
LABEL_NAME: Final = Named("[a-zA-Z_][a-zA-Z0-9_]*", "a label name", "label name", "__")
#: Plain SQL identifiers: what PostgreSQL accepts unquoted, minus the case folding (names
#: are quoted when SQL is built, so they are written as stored, usually lower case).
COLUMN: Final = Named(IDENTIFIER, _PLAIN, "column name")
OPTIONAL_COLUMN: Final = Named(IDENTIFIER, _PLAIN, "column name or null", null_clears=True)
TABLE: Final = Named(
    rf"{IDENTIFIER}(\.{IDENTIFIER})?",
    "a plain SQL identifier, optionally schema-qualified (schema.table)",
    "table name",
)


@dataclass(frozen=True)
class ColumnOrOne(Kind):
    """A column name, or the whole number 1: one unit per row. A shop whose ``orders``
    row is the line (one unit of one product per order) has no quantity column to map."""

    def read(self, ctx: Context, node: Node, path: str) -> str | int:
        if isinstance(node, ScalarNode) and node.tag == TAG_INT:
            if _scalar(ctx, node, path, (TAG_INT,), "expected a whole number") != 1:
                ctx.fail(
                    node, path, f"expected a column name or 1 (one unit per row), got {node.value}"
                )
            return 1
        return COLUMN.read(ctx, node, path)

    def type_doc(self) -> str:
        return "column name or 1"

    def json_schema(self) -> Schema:
        column = COLUMN.json_schema()
        return {"type": ["string", "integer"], "oneOf": [column, {"type": "integer", "const": 1}]}


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``choices``."""

    choices: tuple[str, ...]

    def read(self, ctx: Context, node: Node, path: str) -> str:
        value = TEXT.read(ctx, node, path)
        if value not in self.choices:
            allowed = ", ".join(f'"{c}"' for c in self.choices)
            ctx.fail(node, path, f"expected one of {allowed}, got {describe(node)}")
        return value

    def type_doc(self) -> str:
        return " \\| ".join(f"`{c}`" for c in self.choices)

    def json_schema(self) -> Schema:
        return {"type": "string", "enum": list(self.choices)}


@dataclass(frozen=True)
class TextList(Kind):
    """A list of distinct strings, each read as ``item``; not empty when ``non_empty``."""

    item: Kind = TEXT
    non_empty: bool = False

    def read(self, ctx: Context, node: Node, path: str) -> tuple[str, ...]:
        if not isinstance(node, SequenceNode):
            ctx.fail(node, path, f"expected a list, got {describe(node)}")
        values: list[str] = []
        # A set beside the list: "already given?" in constant time, so a list of 100k
        # promo SKUs loads in linear time (a list lookup made it quadratic).
        seen: set[str] = set()
        for index, item in enumerate(node.value):
            item_path = f"{path}[{index}]"
            value = self.item.read(ctx, item, item_path)
            if value in seen:
                ctx.fail(item, item_path, f"duplicate value {describe(item)}")
            seen.add(value)
            values.append(value)
        if self.non_empty and not values:
            ctx.fail(node, path, "must not be empty")
        return tuple(values)

    def type_doc(self) -> str:
        numbers = (
            " (numbers are kept as written)"
            if isinstance(self.item, Text) and self.item.allow_numbers
            else ""
        )
        what = "strings" if type(self.item) is Text else f"{self.item.type_doc()}s"
        return f"list of {what}{numbers}" + (", not empty" if self.non_empty else "")

    def json_schema(self) -> Schema:
        schema: Schema = {"type": "array", "items": self.item.json_schema(), "uniqueItems": True}
        if self.non_empty:
            schema["minItems"] = 1
        return schema


@dataclass(frozen=True)
class Host(Kind):
    """An IP address or a host name."""

    doc_type: ClassVar[str] = "IP address or host name"

    def read(self, ctx: Context, node: Node, path: str) -> str:
        value = TEXT.read(ctx, node, path)
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not _HOST.fullmatch(value):
                ctx.fail(node, path, f"{describe(node)} is not an IP address or host")
        return value


def read_path(ctx: Context, node: Node, path: str) -> Path:
    """A path, ``~`` expanded, relative to the config file's folder."""
    text = TEXT.read(ctx, node, path)
    if "\0" in text:
        ctx.fail(node, path, "must not contain a NUL character")
    try:
        value = Path(text).expanduser()
    except (RuntimeError, ValueError, OSError) as exc:
        # "~nouser/x": no such user, or no home directory to expand "~" to.
        ctx.fail(node, path, f"cannot expand {describe(node)}: {exc}")
    return value if value.is_absolute() else ctx.base_dir / value


@dataclass(frozen=True)
class FilePath(Kind):
    """A path that must name a readable file (``must="file"``) or a directory."""

    must: Literal["file", "dir"]

    def read(self, ctx: Context, node: Node, path: str) -> Path:
        value = read_path(ctx, node, path)
        if self.must == "dir" and not value.is_dir():
            ctx.fail(node, path, f"{value} is not a directory")
        if self.must == "file" and not (value.is_file() and os.access(value, os.R_OK)):
            ctx.fail(node, path, f"{value} is not a readable file")
        return value

    def type_doc(self) -> str:
        return "path (must exist)" if self.must == "file" else "path (must be a directory)"


@dataclass(frozen=True)
class Template(Kind):
    """A string with the field ``{name}`` exactly once and no other ``{...}`` field."""

    name: str

    def read(self, ctx: Context, node: Node, path: str) -> str:
        value = TEXT.read(ctx, node, path)
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        except ValueError:
            fields = ["?"]
        if fields != [self.name]:
            ctx.fail(
                node,
                path,
                f'must contain "{{{self.name}}}" exactly once and no other {{...}} field, '
                f"got {describe(node)}",
            )
        return value

    def type_doc(self) -> str:
        return f"string with `{{{self.name}}}` exactly once"

    def json_schema(self) -> Schema:
        return {"type": "string", "pattern": rf"^[^{{}}]*\{{{self.name}\}}[^{{}}]*$"}


def _ends_early(sql: str, backslash: bool, hash: bool, dash_blank: bool) -> bool:
    """Whether ``sql`` read one way has a ``;`` outside quotes and comments. The ways:
    backslash escapes in strings or not; ``#`` comments or not; ``--`` a comment only
    before a blank (MySQL) or always. MySQL runs what ``/*!`` and ``/*M!`` hold."""
    at, end = 0, len(sql)
    while at < end:
        char = sql[at]
        if char == ";":
            return True
        if char in "'\"`":
            at += 1
            while at < end and sql[at] != char:
                at += 2 if backslash and char != "`" and sql[at] == "\\" else 1
        elif (hash and char == "#") or (
            sql.startswith("--", at) and not (dash_blank and sql[at + 2 : at + 3].strip())
        ):
            at = sql.find("\n", at)
        elif sql.startswith("/*", at) and not sql.startswith(("!", "M!"), at + 2):
            at = sql.find("*/", at + 2)
        if at < 0:
            return False
        at += 1
    return False


@dataclass(frozen=True)
class Sql(Kind):
    """One SQL statement; surrounding blanks and a trailing ``;`` are removed, and a ``;``
    that could end the statement under any server's reading is refused (aiomysql's
    sessions accept several statements in one query)."""

    doc_type: ClassVar[str] = "SQL"

    def read(self, ctx: Context, node: Node, path: str) -> str:
        sql = TEXT.read(ctx, node, path).strip().rstrip(";").strip()
        if not sql:
            ctx.fail(node, path, "must not be empty")
        if any(_ends_early(sql, *way) for way in itertools.product((False, True), repeat=3)):
            ctx.fail(node, path, "must be one statement: a `;` outside a string ends it")
        return sql


#: A lock key pattern: literal text with ``*`` wildcards and at most one ``{sku}``.
_LOCK_PATTERN: Final = re.compile(r"[^?\[\]\\{}\s]*(\{sku\}[^?\[\]\\{}\s]*)?")


@dataclass(frozen=True)
class LockPattern(Kind):
    """A Redis lock key pattern: ``*`` matches any text, ``{sku}`` (at most once) the SKU."""

    doc_type: ClassVar[str] = "lock key pattern"

    def read(self, ctx: Context, node: Node, path: str) -> str:
        value = TEXT.read(ctx, node, path)
        if len(value) > 256 or not _LOCK_PATTERN.fullmatch(value):
            ctx.fail(
                node,
                path,
                'expected a key pattern like "lock:product:{sku}" or "lock:cart:*" (at most '
                "256 characters; `*` and one `{sku}`, no spaces, ? [ ] or \\), got "
                + describe(node),
            )
        if "*" not in value and "{sku}" not in value:
            ctx.fail(node, path, f'needs a "*" or "{{sku}}", got {describe(node)}')
        return value

    def json_schema(self) -> Schema:
        return {"type": "string", "minLength": 1, "maxLength": 256}


@dataclass(frozen=True)
class Ratio(Kind):
    """A number greater than 0 and at most 1."""

    doc_type: ClassVar[str] = "number in (0, 1]"

    def read(self, ctx: Context, node: Node, path: str) -> float:
        expected = "expected a number greater than 0 and at most 1"
        value = _scalar(ctx, node, path, (TAG_INT, TAG_FLOAT), expected)
        # Compared before float(): an int too large for a float is refused, not overflowed.
        if isinstance(value, bool) or not 0 < value <= 1:
            ctx.fail(node, path, f"{expected}, got {describe(node)}")
        return float(value)

    def json_schema(self) -> Schema:
        return {"type": "number", "exclusiveMinimum": 0, "maximum": 1}
