"""The ``--format json`` text: ``json.dumps(value, indent=2, default=str)``, faster.

Python 3.11's C encoder cannot indent, so ``json.dumps(..., indent=2)`` falls back to the
pure-Python encoder, a generator per nesting level resumed for every token: about 2 s for
the 20 MB report of a big input (1,000 timelines of 50 events), whatever the input's size.
:func:`dumps_indented` writes the very same text (checked against ``json.dumps`` by the
example below and by the tests of the report) with one plain recursive function: strings
through the C string encoder, numbers through the ``repr`` the encoder uses.

Example::

    >>> import json
    >>> value = {"a": [1, 2.5, None, True, {"b": "é", 3: []}], "c": {}, "d": float("nan")}
    >>> dumps_indented(value) == json.dumps(value, indent=2, default=str)
    True
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable
from typing import Final

__all__ = ["dumps_indented"]

_INDENT: Final = "  "
_CHUNK: Final = 65_536
_INFINITY: Final = float("inf")
_float_repr: Final = float.__repr__
_int_repr: Final = int.__repr__
# What json itself uses for ensure_ascii: the C function, the Python one where C is missing.
_encode_str: Final[Callable[[str], str]] = json.encoder.encode_basestring_ascii


def _float_text(value: float) -> str:
    # json's own spelling of the values JSON has no number for (allow_nan=True).
    if value != value:
        return "NaN"
    if value == _INFINITY:
        return "Infinity"
    if value == -_INFINITY:
        return "-Infinity"
    return _float_repr(value)


def _key_text(key: object) -> str:
    """A dict key as json writes it (keys that are no str, number, bool or None fail)."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _float_text(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return _int_repr(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _scalar(value: object) -> str | None:
    """The text of a value that is no container, in json's order of checks; else None."""
    if isinstance(value, str):
        return _encode_str(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return _int_repr(value)
    if isinstance(value, float):
        return _float_text(value)
    return None


def dumps_indented(value: object) -> str:
    """``json.dumps(value, indent=2, default=str)``, the same text (see the module)."""
    # Joined into chunks as it goes: a list of millions of small strings would take more
    # memory than the text itself.
    chunks: list[str] = []
    parts: list[str] = []
    append = parts.append
    encode_str = _encode_str
    int_repr = _int_repr

    def write(item: object, newline: str) -> None:
        # The exact types first (nearly every value), json's isinstance order after.
        kind = type(item)
        if kind is str:
            append(encode_str(item))  # type: ignore[arg-type]
            return
        if kind is int:
            append(int_repr(item))
            return
        if isinstance(item, dict):
            if not item:
                append("{}")
                return
            inner = newline + _INDENT
            separator = "{" + inner
            for key, member in item.items():
                append(separator)
                separator = "," + inner
                append(encode_str(key if type(key) is str else _key_text(key)))
                append(": ")
                if type(member) is str:
                    append(encode_str(member))
                else:
                    write(member, inner)
            append(newline)
            append("}")
            if len(parts) > _CHUNK:
                chunks.append("".join(parts))
                parts.clear()
            return
        if isinstance(item, list | tuple):
            if not item:
                append("[]")
                return
            inner = newline + _INDENT
            separator = "[" + inner
            for member in item:
                append(separator)
                separator = "," + inner
                if type(member) is str:
                    append(encode_str(member))
                else:
                    write(member, inner)
            append(newline)
            append("]")
            return
        text = _scalar(item)
        if text is None:
            # default=str: the text of any other object, written as a JSON string.
            write(str(item), newline)
        else:
            append(text)

    write(value, "\n")
    chunks.append("".join(parts))
    return "".join(chunks)
