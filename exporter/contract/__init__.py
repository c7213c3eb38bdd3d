"""The language-neutral metric contract and ``stocksentry check-metrics URL|FILE``.

:mod:`.spec` builds the contract from the catalog, :mod:`.exposition` reads an exposition
strictly and boundedly, :mod:`.check` compares the two (docs/other-languages.md). The
command exits 0 conforming, 1 not (one line per problem), 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO, Final

from ..commandline import CommandError, ExitCode, Subcommands, duration_in, int_in

DEFAULT_MAX_BYTES: Final = 16 * 1024 * 1024
_CHUNK: Final = 64 * 1024
_ACCEPT: Final = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5,*/*;q=0.1"


def add_check_metrics_parser(commands: Subcommands) -> None:
    """Register ``check-metrics`` on ``commands``."""
    parser = commands.add_parser(
        "check-metrics",
        help="check an app's metrics exposition against the stocksentry metric contract",
        description=(
            "Check a Prometheus exposition (URL, file or -) against the metric contract: "
            "missing, misnamed, mistyped or unbounded metrics. Exit 0 conforming, 1 not, "
            "2 bad input."
        ),
    )
    parser.add_argument("target", nargs="?", metavar="URL|FILE", help="http(s) URL, file or -")
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="METRIC",
        help="also require this contract metric (repeatable)",
    )
    parser.add_argument(
        "--max-label-values",
        type=int_in(1, 1_000_000),
        default=None,
        metavar="N",
        help="distinct values an open label may hold (default: the contract's, 100)",
    )
    parser.add_argument(
        "--max-bytes",
        type=int_in(1, 1024 * 1024 * 1024),
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help="refuse a larger input (default 16 MiB)",
    )
    parser.add_argument(
        "--timeout",
        type=duration_in(0.001, 600),
        default=10.0,
        metavar="DURATION",
        help="the whole read may take this long (default 10s)",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument(
        "--print-contract", action="store_true", help="print the contract as JSON and exit"
    )
    parser.set_defaults(handler=_run)


def _read_input(target: str, *, max_bytes: int, timeout: float) -> str:
    """The text at ``target``; :class:`CommandError` (exit 2) when it cannot be had."""
    deadline = time.monotonic() + timeout
    if target.startswith(("http://", "https://")):
        request = urllib.request.Request(target, headers={"Accept": _ACCEPT})  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only, checked above
                data = _read(response, target, max_bytes, deadline)
        except urllib.error.HTTPError as exc:
            raise CommandError(f"{target}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CommandError(f"{target}: {reason}") from None
    elif target == "-":
        data = _read(sys.stdin.buffer, "<stdin>", max_bytes, deadline)
    else:
        path = Path(target)
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "no such file"
            raise CommandError(f"{target}: {what}")
        try:
            with path.open("rb") as stream:
                data = _read(stream, target, max_bytes, deadline)
        except OSError as exc:
            raise CommandError(f"{target}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"{target}: not UTF-8 text (byte {exc.start})") from None


def _read(stream: BinaryIO, label: str, max_bytes: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    # read1 returns what has arrived: read() waits for a whole chunk, so a server that
    # dribbles bytes would hold the command far past --timeout between two checks.
    read = getattr(stream, "read1", stream.read)
    while True:
        if time.monotonic() > deadline:
            raise CommandError(f"{label}: not read within --timeout")
        chunk = read(min(_CHUNK, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise CommandError(f"{label}: larger than --max-bytes ({max_bytes})")
        chunks.append(chunk)


def _run(args: argparse.Namespace) -> int:
    """Run ``check-metrics``; returns the exit status."""
    from .check import check, exposed_metrics
    from .exposition import ExpositionError, parse
    from .spec import contract_json

    out = sys.stdout
    if args.print_contract:
        out.write(contract_json())
        return ExitCode.OK
    if not args.target:
        raise CommandError("give a URL or FILE (or --print-contract)")
    text = _read_input(args.target, max_bytes=args.max_bytes, timeout=args.timeout)
    try:
        exposition = parse(text)
    except ExpositionError as exc:
        raise CommandError(f"{args.target}: {exc}") from None
    try:
        problems = check(exposition, require=args.require, max_values=args.max_label_values)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.format == "json":
        payload = {
            "target": args.target,
            "conforming": not problems,
            "problems": [dataclasses.asdict(p) for p in problems],
        }
        out.write(json.dumps(payload, indent=2) + "\n")
    elif not problems:
        found = len(exposed_metrics(exposition))
        out.write(f"{args.target}: conforms to the metric contract ({found} contract metrics)\n")
    else:
        out.write(f"{args.target}: {len(problems)} problem(s) against the metric contract\n")
        for p in problems:
            out.write(f"  {p.kind.upper():<9} {p.metric}: {p.message}\n")
    return ExitCode.FINDINGS if problems else ExitCode.OK
