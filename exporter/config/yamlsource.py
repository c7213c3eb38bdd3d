"""The one YAML reader of the sidecar's files (the exporter config and the web config).

Nodes are composed with PyYAML's safe loader, not loaded: every value keeps its line for
the messages, and no Python object is built from a tag in the file (a scalar's value is
constructed by :func:`scalar_value` only after its tag was checked).

Example::

    >>> root = compose("server:\\n  port: 19464\\n")
    >>> line_of(mapping_entries(mapping_entries(root)["server"].value)["port"].value)
    2
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final, Literal

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

TAG_NULL: Final = "tag:yaml.org,2002:null"
TAG_BOOL: Final = "tag:yaml.org,2002:bool"
TAG_INT: Final = "tag:yaml.org,2002:int"
TAG_FLOAT: Final = "tag:yaml.org,2002:float"
TAG_STR: Final = "tag:yaml.org,2002:str"

# Builds Python values from single scalar nodes whose tag was already checked.
_CONSTRUCTOR: Final = yaml.constructor.SafeConstructor()


class YamlSyntaxError(Exception):
    """The text is not one YAML document; ``context`` and ``problem`` are PyYAML's words
    without the snippet it would quote (it may sit next to a secret)."""

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
    """The root node of the one YAML document in ``text``; ``None`` when it is empty.

    Raises :class:`YamlSyntaxError` for anything PyYAML refuses, two documents, or nesting
    deep enough to overflow the stack.
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

    Raises :class:`KeyProblem` at the first key that is not a plain string, repeats an
    earlier one, or (with ``known``) is unknown: a typo is reported at its own line.
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

    ``!!bool maybe``, ``!!int abc`` or ``0b_`` raise :class:`ValueError`, never a
    traceback from inside PyYAML.
    """
    try:
        if node.tag == TAG_BOOL:
            return bool(_CONSTRUCTOR.construct_yaml_bool(node))
        if node.tag == TAG_INT:
            return int(_CONSTRUCTOR.construct_yaml_int(node))
        return float(_CONSTRUCTOR.construct_yaml_float(node))
    except (ValueError, KeyError, IndexError, TypeError, yaml.YAMLError):
        raise ValueError(f"not a {node.tag.rsplit(':', 1)[-1]}: {node.value!r}") from None
