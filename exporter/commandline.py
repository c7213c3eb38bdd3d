"""What every ``stocksentry`` subcommand shares: exit codes, the error line, argument types.

A problem is one line on stderr, ``stocksentry <command>: error: <what is wrong>``: a
subcommand raises :class:`CommandError`, the dispatcher prints it and exits 2. Numeric
arguments go through the bounded types below, each with a range and a clear refusal.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import math
import sys
from collections.abc import Callable
from typing import Protocol, TextIO, TypeVar

from .durations import format_duration, parse_duration

PROG = "stocksentry"
_Number = TypeVar("_Number", int, float)


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as a subcommand uses it
    (argparse documents the object, not a public name for its type)."""

    def add_parser(
        self, name: str, *, help: str | None = ..., description: str | None = ...
    ) -> argparse.ArgumentParser: ...


class ExitCode(enum.IntEnum):
    """The exit status of every subcommand.

    ``FINDINGS``: the command did its job and found something wrong (a violated invariant,
    a lost update, metrics that disagree with the database). ``INCOMPLETE``: nothing wrong
    found, but it could not look everywhere, which is not an all-clear.
    """

    OK = 0
    FINDINGS = 1
    USAGE = 2
    INCOMPLETE = 3
    INTERRUPTED = 130


class CommandError(Exception):
    """A problem with the input or the environment: one line, exit 2, no traceback.

    The message must already be safe to print (no password, bounded in length).
    """


def say(stream: TextIO, line: str) -> None:
    """Write one line and flush, so it is seen before a long run goes on."""
    stream.write(line + "\n")
    stream.flush()


def report_error(command: str, message: str, stream: TextIO | None = None) -> ExitCode:
    """Print ``stocksentry <command>: error: <message>`` as one line on stderr (or
    ``stream``) and return :attr:`ExitCode.USAGE`.

    >>> report_error("reconcile", "--since: not a duration:\\n'x'", sys.stdout)
        stocksentry reconcile: error: --since: not a duration: 'x'
        <ExitCode.USAGE: 2>
    """
    text = " ".join(message.split())
    if len(text) > 1000:
        text = text[:997] + "..."
    prefix = f"{PROG} {command}" if command else PROG
    say(stream if stream is not None else sys.stderr, f"{prefix}: error: {text}")
    return ExitCode.USAGE


def installed(package: str) -> bool:
    """Whether ``package`` can be imported; found, not imported, so checking stays light."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _bounded(
    read: Callable[[str], _Number],
    minimum: _Number,
    maximum: _Number,
    show: Callable[[_Number], str] = str,
    what: str = "",
) -> Callable[[str], _Number]:
    """An argparse type: ``read`` the text (its ``ValueError`` says why it is refused),
    then check it is within ``[minimum, maximum]`` (NaN is not)."""

    def parse(text: str) -> _Number:
        try:
            value = read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not minimum <= value <= maximum:
            got = str(value) if isinstance(value, int) else text
            raise argparse.ArgumentTypeError(
                f"must be {what}between {show(minimum)} and {show(maximum)}, got {got[:40]}"
            )
        return value

    return parse


def _whole(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"not a whole number: {text[:40]!r}") from None


def _real(text: str) -> float:
    try:
        return float(text) if len(text) <= 40 else math.nan
    except ValueError:
        raise ValueError(f"not a number: {text[:40]!r}") from None


def _duration(text: str) -> float:
    # A bare number on the command line is seconds, as in the config.
    try:
        value: str | float = float(text) if len(text) <= 40 else text
    except ValueError:
        value = text
    return parse_duration(value)


def int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[minimum, maximum]``."""
    return _bounded(_whole, minimum, maximum)


def float_in(minimum: float, maximum: float) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[minimum, maximum]``."""
    return _bounded(_real, minimum, maximum, lambda value: f"{value:g}", "a number ")


def duration_in(minimum: float, maximum: float) -> Callable[[str], float]:
    """An argparse type: a duration in seconds within ``[minimum, maximum]``.

    >>> duration_in(0, 86400)("1h30m")
    5400.0
    """
    return _bounded(_duration, minimum, maximum, format_duration)


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        return int_in(0, 65535)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text[:40]!r}") from None
