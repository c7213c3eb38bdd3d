"""The config's one error type, and the context every reader reports through."""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from yaml.nodes import MappingNode, Node, SequenceNode

from ..inputs import ECHO_LIMIT, escape, shorten
from .yamlsource import (
    TAG_NULL,
    Entry,
    KeyProblem,
    is_null,
    line_of,
    mapping_entries,
)

# How much of the file's own text an error line echoes: a source path, a key path, and
# the whole line (a message never grows with the file).
_SOURCE_ECHO: Final = 200
_PATH_ECHO: Final = 120
_LINE_LIMIT: Final = 1000


class ConfigError(Exception):
    """The configuration cannot be used; ``str()`` is one line naming file, line and key:
    ``config.yaml:1: server.port: must be at most 65535, got 99999``.

    ``line`` is 1-based (``None`` when unknown), ``path`` the dotted key path (``""``: the
    whole file).
    """

    def __init__(
        self, message: str, *, source: str, line: int | None = None, path: str = ""
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.path = path
        shown = shorten(source, _SOURCE_ECHO)
        where = shown if line is None else f"{shown}:{line}"
        # A key path echoes the file's own keys: a 100k-character key is cut, and a
        # control character in one is escaped, like every echoed value (describe()).
        key = shorten(path, _PATH_ECHO)
        text = f"{where}: {key}: {message}" if key else f"{where}: {message}"
        # One message, one line, whatever a YAML problem or an OS error put in it.
        super().__init__(shorten(" ".join(text.split()), _LINE_LIMIT))


class Context:
    """Where errors point, and where secrets and relative paths are looked up.

    ``values`` and ``nodes`` hold, by dotted key path, every key read so far and its value
    node: the rules that relate two sections find their line there.
    """

    def __init__(self, source: str, environ: Mapping[str, str], base_dir: Path) -> None:
        self.source = source
        self.environ = environ
        self.base_dir = base_dir
        self.notes: list[str] = []
        self.values: dict[str, object] = {}
        self.nodes: dict[str, Node] = {}
        #: The items of a list already read, while the next one is read.
        self.earlier: list[Any] = []

    def fail(self, node: Node | None, path: str, message: str) -> NoReturn:
        """Raise the :class:`ConfigError` of ``path``, at the line of ``node``."""
        raise ConfigError(
            message, source=self.source, line=None if node is None else line_of(node), path=path
        )

    def fail_at(self, path: str, message: str) -> NoReturn:
        """Raise the :class:`ConfigError` of the key read at ``path``, at its value's line."""
        self.fail(self.nodes.get(path), path, message)


def join(path: str, key: str) -> str:
    """The dotted path of ``key`` inside ``path`` (``""`` is the top level)."""
    return f"{path}.{key}" if path else key


def describe(node: Node, *, secret: bool = False) -> str:
    """How a message shows a value: its kind for collections, else its text quoted, cut
    at 80 characters, control characters escaped (or not at all for a secret)."""
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    if node.tag == TAG_NULL:
        return "nothing (null)"
    if secret:
        return "a value (not shown)"
    # Cut first (a huge value costs no more than the cut to show), then quote as JSON:
    # quotes and backslashes escaped, control characters too (shorten() escapes the rest).
    value = str(node.value)
    quoted = escape(json.dumps(value[:ECHO_LIMIT], ensure_ascii=False))
    # Escapes may lengthen the text: at most six characters each (\u001b).
    cut = len(value) > ECHO_LIMIT or len(quoted) > 3 * ECHO_LIMIT
    return quoted[: 3 * ECHO_LIMIT] + ("…" if cut else "")


class CheckedMapping:
    """A YAML mapping whose keys were checked against ``allowed`` on construction (in
    document order, so a typo is reported first); its value nodes go to ``ctx.nodes``.
    ``node`` ``None`` is a section left out: no keys."""

    def __init__(self, ctx: Context, node: Node | None, path: str, allowed: Sequence[str]) -> None:
        self.ctx = ctx
        self.node = node
        self.path = path
        self.entries: dict[str, Entry] = {}
        if node is None:
            return
        if not isinstance(node, MappingNode):
            top = "" if path else " at the top level"
            ctx.fail(node, path, f"expected a mapping{top}, got {describe(node)}")
        try:
            self.entries = mapping_entries(node, allowed)
        except KeyProblem as problem:
            where = join(path, problem.name)
            if problem.reason == "not-a-name":
                what = describe(problem.node)
                ctx.fail(problem.node, path, f"keys must be plain names, got {what}")
            if problem.reason == "duplicate":
                ctx.fail(problem.node, where, "duplicate key")
            # A suggestion only for a name that could be a typo of one (difflib's work
            # grows with the name's length).
            close = (
                difflib.get_close_matches(problem.name, allowed, n=1)
                if len(problem.name) <= ECHO_LIMIT
                else []
            )
            hint = (
                f'did you mean "{close[0]}"?'
                if close
                else "expected one of: " + ", ".join(allowed)
            )
            ctx.fail(problem.node, where, f"unknown key ({hint})")
        for name, entry in self.entries.items():
            ctx.nodes[join(path, name)] = entry.value

    def fail(self, name: str, message: str) -> NoReturn:
        """Raise the :class:`ConfigError` of key ``name``, at the line of the key."""
        self.ctx.fail(self.entries[name].key, join(self.path, name), message)

    def get(self, name: str) -> Node | None:
        """The value node, or ``None`` when the key is absent or explicitly null."""
        entry = self.entries.get(name)
        return None if entry is None or is_null(entry.value) else entry.value

    def require(self, name: str) -> Node:
        """The value node; a key absent or null is an error ("is required")."""
        node = self.get(name)
        if node is None:
            entry = self.entries.get(name)
            where = self.node if entry is None else entry.value
            self.ctx.fail(where, join(self.path, name), "is required")
        return node
