"""The one YAML reader of the sidecar's files: composed nodes that keep their line.

Both the exporter config (:mod:`.loader`) and the web config
(:mod:`stocksentry.exporter.webconfig`) are read through this module. PyYAML's node API
(``yaml.compose`` with the safe loader) is used instead of ``yaml.safe_load``, so every
value keeps the line it was written on for the error messages, and no Python object is
ever built from a tag in the file: a scalar's value is constructed only after its tag
was checked, by :func:`scalar_value`.

What each file calls an error is worded by its own loader; this module reports what went
wrong as exceptions carrying the node (:class:`KeyProblem`) or the line
(:class:`YamlSyntaxError`).

Example::

    >>> root = compose("server:\\n  port: 19464\\n")
    >>> section = mapping_entries(root)["server"].value
    >>> line_of(mapping_entries(section)["port"].value)
    2
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final, Literal

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

__all__ = [
    "TAG_BOOL",
    "TAG_FLOAT",
    "TAG_INT",
    "TAG_NULL",
    "TAG_STR",
    "Entry",
    "KeyProblem",
    "MappingNode",
    "Node",
    "ScalarNode",
    "SequenceNode",
    "YamlSyntaxError",
    "compose",
    "is_null",
    "line_of",
    "mapping_entries",
    "scalar_value",
]

TAG_NULL: Final = "tag:yaml.org,2002:null"
TAG_BOOL: Final = "tag:yaml.org,2002:bool"
TAG_INT: Final = "tag:yaml.org,2002:int"
TAG_FLOAT: Final = "tag:yaml.org,2002:float"
TAG_STR: Final = "tag:yaml.org,2002:str"

# Builds Python values from single scalar nodes whose tag was already checked.
_CONSTRUCTOR: Final = yaml.constructor.SafeConstructor()


class YamlSyntaxError(Exception):
    """The text is not one YAML document.

    ``line`` is 1-based (``None`` when PyYAML gave no position); ``context`` and
    ``problem`` are PyYAML's own words without the snippet of the file it would quote
    (a snippet may sit next to something secret); ``kind`` is the PyYAML error class for
    errors without a position, and ``"nesting"`` for a document nested too deeply.
    """

    def __init__(
        self, line: int | None, context: str | None, problem: str | None, kind: str
    ) -> None:
        self.line = line
        self.context = context
        self.problem = problem
        self.kind = kind
        super().__init__(problem or context or kind)


@dataclass(frozen=True, slots=True)
class Entry:
    """One key of a mapping: its name, its key node and its value node."""

    name: str
    key: ScalarNode
    value: Node


class KeyProblem(Exception):
    """A mapping key that is not a plain string (``reason="not-a-name"``), a duplicate
    (``"duplicate"``) or not one of the known keys (``"unknown"``); ``node`` is the key
    node at fault."""

    def __init__(
        self, node: Node, reason: Literal["not-a-name", "duplicate", "unknown"], name: str
    ) -> None:
        self.node = node
        self.reason = reason
        self.name = name
        super().__init__(f"{reason}: {name}")


def compose(text: str) -> Node | None:
    """The root node of the single YAML document in ``text``; ``None`` when it is empty.

    Raises :class:`YamlSyntaxError` for anything PyYAML refuses, two documents, or a
    document nested so deeply that composing it would overflow the stack.
    """
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise YamlSyntaxError(
            None if mark is None else mark.line + 1, exc.context, exc.problem, "marked"
        ) from None
    except yaml.reader.ReaderError as exc:
        # A character YAML does not allow (a control character, say): its code, not the
        # text around it.
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        line = text[: exc.position].count("\n") + 1
        problem = f"unacceptable character #x{code:04x}: {exc.reason}"
        raise YamlSyntaxError(line, None, problem, "ReaderError") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(None, None, None, type(exc).__name__) from None
    except RecursionError:
        # yaml.compose recurses once per nesting level: "[[[[..." thousands deep.
        raise YamlSyntaxError(None, None, "nested too deeply", "nesting") from None


def line_of(node: Node) -> int:
    """The 1-based line a node starts on."""
    return int(node.start_mark.line) + 1


def is_null(node: Node | None) -> bool:
    """Whether ``node`` is absent or an explicit null (``~``, ``null``, nothing)."""
    return node is None or (isinstance(node, ScalarNode) and node.tag == TAG_NULL)


def mapping_entries(node: MappingNode, known: Collection[str] | None = None) -> dict[str, Entry]:
    """The entries of a mapping node by name, in document order.

    Raises :class:`KeyProblem` at the first key, in document order, that is not a plain
    string scalar, that repeats an earlier key, or (with ``known``) that is not known:
    a typo is reported at its own line before anything that depends on it.
    """
    entries: dict[str, Entry] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, ScalarNode) or key_node.tag != TAG_STR:
            raise KeyProblem(key_node, "not-a-name", str(getattr(key_node, "value", "?")))
        name = str(key_node.value)
        if name in entries:
            raise KeyProblem(key_node, "duplicate", name)
        if known is not None and name not in known:
            raise KeyProblem(key_node, "unknown", name)
        entries[name] = Entry(name, key_node, value_node)
    return entries


def scalar_value(node: ScalarNode) -> bool | int | float:
    """The value of a bool, int or float scalar whose tag the caller checked.

    An explicit tag the constructor refuses (``!!bool maybe``, ``!!int abc``) or a
    resolver edge case (``0b_``) raises :class:`ValueError`, never a traceback of
    PyYAML's internals.
    """
    try:
        if node.tag == TAG_BOOL:
            return bool(_CONSTRUCTOR.construct_yaml_bool(node))
        if node.tag == TAG_INT:
            return int(_CONSTRUCTOR.construct_yaml_int(node))
        if node.tag == TAG_FLOAT:
            return float(_CONSTRUCTOR.construct_yaml_float(node))
    except (ValueError, KeyError, IndexError, TypeError, yaml.YAMLError):
        raise ValueError(f"not a {node.tag.rsplit(':', 1)[-1]}: {node.value!r}") from None
    raise ValueError(f"not a bool, int or float scalar: {node.tag}")
