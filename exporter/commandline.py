"""What every ``stocksentry`` subcommand shares: exit codes, the error line, argument types.

Every subcommand (``demo``, ``exporter``, ``check-config``, ``reconcile``, ``timeline``)
ends with one of the :class:`ExitCode` values and reports a problem as one line on
stderr, in one format::

    stocksentry <command>: error: <what is wrong>

where a problem in a file names it first (``config.yaml:12: probes.oversold.interval:
…``). An implementation raises :class:`CommandError` with the message; the dispatcher in
:mod:`stocksentry.exporter.cli` prints it and exits 2. Numeric arguments are parsed by the
bounded types below, so every one has a documented range and a clear refusal.

Example::

    parser.add_argument("--buyers", type=int_in(1, 1_000_000), default=500)
    parser.add_argument("--since", type=duration_in(0, 10 * 365 * 86400))
    raise CommandError("--database: not a database URL")   # exit 2, one line
"""

from __future__ import annotations

import argparse
import enum
import math
import sys
from collections.abc import Callable
from typing import TextIO, TypeAlias

from .durations import format_duration, parse_duration

__all__ = [
    "PROG",
    "CommandError",
    "ExitCode",
    "Subcommands",
    "duration_in",
    "error_line",
    "float_in",
    "int_in",
    "port",
    "report_error",
    "say",
]

PROG = "stocksentry"

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class ExitCode(enum.IntEnum):
    """The exit status of every subcommand.

    ``FINDINGS`` means the command did its job and found something wrong: a violated
    invariant (``reconcile``), a lost update (``timeline``), metric totals that disagree
    with the database (``demo``). ``INCOMPLETE`` means it found nothing wrong but could
    not look everywhere (``reconcile``: an audit that could not run or finish), which is
    not an all-clear.
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


def error_line(command: str, message: str) -> str:
    """The one error-line format: ``stocksentry <command>: error: <message>``, on one line.

    Example::

        >>> error_line("reconcile", "--since: not a duration: 'x'")
        "stocksentry reconcile: error: --since: not a duration: 'x'"
    """
    text = " ".join(message.split())
    if len(text) > 1000:
        text = text[:997] + "..."
    return f"{PROG} {command}: error: {text}" if command else f"{PROG}: error: {text}"


def say(stream: TextIO, line: str) -> None:
    """Write one line and flush, so it is seen before a long run goes on."""
    stream.write(line + "\n")
    stream.flush()


def report_error(command: str, message: str, stream: TextIO | None = None) -> ExitCode:
    """Print :func:`error_line` on stderr (or ``stream``) and return :attr:`ExitCode.USAGE`."""
    say(stream if stream is not None else sys.stderr, error_line(command, message))
    return ExitCode.USAGE


# --- argument types ------------------------------------------------------------------------


def int_in(minimum: int, maximum: int) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[minimum, maximum]``.

    Example::

        >>> int_in(1, 10)("3")
        3
    """

    def parse(text: str) -> int:
        stripped = text.strip()
        if len(stripped) > 20:
            raise argparse.ArgumentTypeError(f"must be between {minimum} and {maximum}")
        try:
            value = int(stripped)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be between {minimum} and {maximum}, got {value}"
            )
        return value

    parse.__name__ = f"whole number {minimum}..{maximum}"
    return parse


def float_in(minimum: float, maximum: float) -> Callable[[str], float]:
    """An argparse type: a finite number in ``[minimum, maximum]``.

    Example::

        >>> float_in(0, 1)("0.25")
        0.25
    """

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text[:40]!r}") from None
        # `not minimum <= value` also refuses NaN.
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be a number between {minimum:g} and {maximum:g}, got {text[:40]}"
            )
        return value

    parse.__name__ = f"number {minimum:g}..{maximum:g}"
    return parse


def duration_in(minimum: float, maximum: float) -> Callable[[str], float]:
    """An argparse type: a duration (:mod:`stocksentry.exporter.durations`) in seconds,
    within ``[minimum, maximum]``.

    Example::

        >>> duration_in(0, 86400)("1h30m")
        5400.0
    """

    def parse(text: str) -> float:
        try:
            value = parse_duration(_number_or_text(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be between {format_duration(minimum)} and {format_duration(maximum)},"
                f" got {text[:40]}"
            )
        return value

    parse.__name__ = "duration"
    return parse


def _number_or_text(text: str) -> str | float:
    # A bare number on the command line is seconds, as in the config.
    try:
        return float(text) if len(text) <= 40 else text
    except ValueError:
        return text


def port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    try:
        return int_in(0, 65535)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text[:40]!r}") from None
