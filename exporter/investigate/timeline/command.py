"""``stocksentry timeline``: the command: its arguments, its inputs, its output, its exit.

Building the parser imports nothing beyond the standard library and the command-line
helpers; :func:`run_timeline` imports the analysis when it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import io
import json
import math
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Final, TextIO, cast

from ...commandline import (
    CommandError,
    ExitCode,
    Subcommands,
    duration_in,
    int_in,
    report_error,
    say,
)
from ...inputs import InputFileError, open_log_input, shorten
from .limits import DEFAULT_LIMIT, DEFAULT_REORDER_WINDOW, MAX_LINE, MAX_LINE_SCAN

if TYPE_CHECKING:
    from .model import Event


COMMAND = "timeline"
# The collector's thresholds while timeline runs (see run_timeline).
_GC_YOUNG: Final = 50_000
_GC_OLDER: Final = (20, 100)
#: ``--limit``: at most this many events per SKU and per order (0: all).
MAX_LIMIT = 1_000_000_000
#: ``--reorder-window``: at most a day of disorder is put back in order.
MAX_REORDER_WINDOW = 86400.0
#: Characters read from an input at a time.
READ_CHUNK: Final = 256 * 1024


class InputError(CommandError):
    """An input that cannot be read; the message names it."""


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _open_input(path: str, closers: list[Callable[[], object]]) -> tuple[str, TextIO]:
    """Its label and its text: ``-`` is stdin; gzip by ``.gz`` suffix or magic bytes.

    What to release afterwards goes to ``closers``."""
    label = "<stdin>" if path == "-" else path
    if path == "-":
        raw: IO[bytes] | None = getattr(sys.stdin, "buffer", None)
        if raw is None:
            return label, sys.stdin
    else:
        try:
            # A regular file or a pipe; a FIFO without a writer does not block the open,
            # and a device or a directory is refused.
            raw = open_log_input(path)
        except InputFileError as exc:
            raise InputError(f"cannot read {shorten(path, 200)}: {exc.problem}") from None
        closers.append(raw.close)
    try:
        # The first two bytes, left unread (a pipe cannot seek back: peeked at instead).
        if raw.seekable():
            magic = raw.read(2)
            raw.seek(0)
        else:
            peek = getattr(raw, "peek", None)
            magic = bytes(peek(2))[:2] if callable(peek) else b""
    except OSError as exc:
        raise InputError(f"cannot read {shorten(path, 200)}: {_describe(exc)}") from None
    binary = raw
    if path.endswith(".gz") or magic == b"\x1f\x8b":
        binary = cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace")
    # stdin is detached, so that the wrapper never closes the process's stdin.
    closers.insert(0, text.detach if path == "-" else text.close)
    return label, text


def read_lines(
    label: str, stream: TextIO, *, chunk: int = READ_CHUNK, max_line: int = MAX_LINE
) -> Iterator[str]:
    """The lines of ``stream`` without their line break, each cut to ``max_line + 1``
    characters.

    Read ``chunk`` characters at a time: a longer line is never held whole, what is
    yielded of it is long enough for the parser to skip and count it. An input with no
    line break in :data:`~.limits.MAX_LINE_SCAN` characters (``/dev/zero`` on stdin) is
    not a log: an :class:`InputError`.
    """
    read = stream.read
    lineno = 0
    # The start of a line whose end is in a later chunk, and how long that line is.
    pending = ""
    pending_length = 0
    try:
        while True:
            text = read(chunk)
            if not text:
                if pending_length:
                    yield pending
                return
            lines = text.split("\n")
            last = lines.pop()
            if lines:
                if pending_length:
                    # The line that began in an earlier chunk ends in this one.
                    pending_length += len(lines[0])
                    first = pending + lines[0]
                    lines[0] = first if pending_length <= max_line else first[: max_line + 1]
                lineno += len(lines)
                yield from lines
                pending, pending_length = "", 0
            if last:
                if pending_length <= max_line:
                    pending = (pending + last)[: max_line + 1]
                pending_length += len(last)
                if pending_length > MAX_LINE_SCAN:
                    raise InputError(
                        f"cannot read {label}: line {lineno + 1} has no end in "
                        f"{MAX_LINE_SCAN // (1024 * 1024)} MiB; not a log"
                    )
    except (OSError, EOFError, zlib.error, ValueError) as exc:
        raise InputError(f"cannot read {label}: {_describe(exc)}") from None


def _options(args: argparse.Namespace) -> tuple[list[str], list[str] | None, str, int, float]:
    """The inputs, SKUs, format, limit and reorder window of ``args``, checked: a
    namespace built by hand need not come from the parser."""
    paths = getattr(args, "logfile", None)
    if isinstance(paths, str):
        paths = [paths]
    if not paths:
        raise InputError("no LOGFILE given")
    skus = getattr(args, "sku", None)
    if isinstance(skus, str):
        skus = [skus]
    form = getattr(args, "format", "table") or "table"
    if form not in ("table", "json"):
        raise InputError(f"unknown --format {form!r} (choose table or json)")
    limit = getattr(args, "limit", DEFAULT_LIMIT)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise InputError(f"--limit must be a whole number >= 0, got {limit!r}")
    window = getattr(args, "reorder_window", DEFAULT_REORDER_WINDOW)
    if not isinstance(window, (int, float)) or not 0 <= window < math.inf:
        raise InputError(f"--reorder-window must be a number of seconds >= 0, got {window!r}")
    return list(paths), list(skus) if skus else None, form, limit, float(window)


def run_timeline(args: argparse.Namespace) -> int:
    """Run ``stocksentry timeline``: print the report; 1 with findings, 0 without, 3 when
    no line was a stock event (nothing analysed), 2 on bad input (one line on stderr,
    never a traceback), 130 when interrupted.

    Every ``args.logfile`` (``-`` for stdin) is read at once, merged in timestamp order.
    """
    # The analysis reads the log event catalog, which brings the instrumentation (and
    # prometheus_client) along: imported here, so that building the parser stays light.
    from .analysis import analyse
    from .ordering import OrderedEvents
    from .parsing import ReadStats, read_events
    from .report import format_table

    err = sys.stderr
    closers: list[Callable[[], object]] = []
    stats = ReadStats()
    # Millions of short-lived events and hundreds of thousands of remembered keys, none in
    # a reference cycle: the default thresholds collect so often they cost 15% of a run.
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG, *_GC_OLDER)
    try:
        paths, skus, form, limit, window = _options(args)
        streams: list[Iterator[Event]] = []
        for index, path in enumerate(paths):
            label, stream = _open_input(path, closers)
            lines = read_lines(label, stream)
            streams.append(read_events(lines, label, file_index=index, stats=stats))
        report = analyse(
            OrderedEvents(streams, window),
            limit=limit,
            skus=skus,
            order=getattr(args, "order", None),
            request=getattr(args, "request", None),
            reorder_window=None,
        )
    except InputError as exc:
        return report_error(COMMAND, str(exc), err)
    except KeyboardInterrupt:
        say(err, f"stocksentry {COMMAND}: interrupted")
        return ExitCode.INTERRUPTED
    finally:
        gc.set_threshold(*thresholds)
        for close in closers:
            # Closing a half-read input must not hide the report.
            with contextlib.suppress(OSError, ValueError):
                close()
    report.lines = stats.lines
    report.skipped_lines = stats.skipped
    report.skipped_examples = stats.skipped_examples
    if form == "json":
        text = json.dumps(report.to_dict(), indent=2, default=str)
    else:
        text = format_table(report)
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # `stocksentry timeline big.log | head`: the reader left, which is not our error.
        # Point stdout at devnull so the interpreter's final flush does not fail either.
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return report.exit_code


def add_timeline_parser(subparsers: Subcommands) -> None:
    """Add the ``timeline`` subcommand; it runs :func:`run_timeline`.

    Sets both ``func`` and ``handler`` defaults, whichever the caller dispatches on.

    Example::

        >>> parser = argparse.ArgumentParser(prog="stocksentry")
        >>> add_timeline_parser(parser.add_subparsers(dest="command"))
        >>> args = parser.parse_args(["timeline", "a.log", "-", "--format", "json"])
        >>> args.logfile, args.format, args.limit, args.func is run_timeline
        (['a.log', '-'], 'json', 50, True)
    """
    timeline = subparsers.add_parser(
        "timeline",
        help="rebuild per-SKU / per-order timelines from logs and name the causes of double-sells",
        description=(
            "Read JSON-lines or key=value logs, put the events in timestamp order and print "
            "them per SKU and per order, after a summary per SKU and the findings, each "
            "naming its cause with its evidence lines: lost updates (two writes from the "
            "same old stock, or a write over one its request never read), oversells into "
            "negative stock, duplicate executions (one idempotency key or payment reference "
            "reserving or paying twice), stale reads, lock expiries and the SQL integration's "
            "unsafe read-modify-writes. Exit status 1 when there is a finding, 0 when none, "
            "3 when no line was a stock event (nothing analysed), 2 on bad input, 130 when "
            "interrupted."
        ),
    )
    timeline.add_argument(
        "logfile",
        nargs="+",
        metavar="LOGFILE",
        help="log file; '-' reads stdin; gzip (.gz) is decompressed",
    )
    timeline.add_argument(
        "--sku",
        action="append",
        metavar="SKU",
        help="analyse and show only this SKU (repeatable)",
    )
    timeline.add_argument("--order", metavar="ID", help="show only this order's events")
    timeline.add_argument("--request", metavar="ID", help="show only this request's events")
    timeline.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format (table)"
    )
    timeline.add_argument(
        "--limit",
        type=int_in(0, MAX_LIMIT),
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"events shown per SKU and per order, and findings listed, 0 for all "
        f"({DEFAULT_LIMIT})",
    )
    timeline.add_argument(
        "--reorder-window",
        type=duration_in(0, MAX_REORDER_WINDOW),
        default=DEFAULT_REORDER_WINDOW,
        metavar="DURATION",
        help="timestamp disorder within one file that is put back in order: seconds or a "
        f"duration like 90s, at most 1d ({DEFAULT_REORDER_WINDOW:g})",
    )
    timeline.set_defaults(func=run_timeline, handler=run_timeline)
