"""``stocksentry exporter`` and ``stocksentry check-config``: their flags, and the YAML keys
the flags override (exporter-toolkit's ``--web.*``, promslog's ``--log.*``).

The work is in :mod:`stocksentry.exporter.sidecar`, imported only when a command runs:
this module loads nothing but the standard library, so ``stocksentry --help`` stays light.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .commandline import Subcommands
from .listen import parse_listen_address

#: The levels of ``log.level`` and ``--log.level``, as promslog names them.
LOG_LEVELS: Final = ("debug", "info", "warn", "error")
#: The formats of ``log.format`` and ``--log.format``, as promslog names them.
LOG_FORMATS: Final = ("logfmt", "json")
#: A metrics path: starts with ``/``, is not ``/`` (the landing page) nor a health path.
TELEMETRY_PATH_PATTERN: Final = r"/(?!(?:healthz|readyz)$)[A-Za-z0-9._~/-]+"
TELEMETRY_PATH: Final = "a path starting with / other than /, /healthz and /readyz"


@dataclass(frozen=True, slots=True)
class Overrides:
    """Flags given on the command line; ``None``: keep the YAML config's value.

    ``listen_addresses``: ``(host, port)`` pairs, ``host`` ``""`` for every interface.
    """

    listen_addresses: tuple[tuple[str, int], ...] | None = None
    telemetry_path: str | None = None
    web_config_file: str | Path | None = None
    log_level: str | None = None
    log_format: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Overrides:
        """The flags of a parsed ``exporter`` command line."""
        return cls(
            listen_addresses=tuple(args.listen_addresses) if args.listen_addresses else None,
            telemetry_path=args.telemetry_path,
            web_config_file=args.web_config_file,
            log_level=args.log_level,
            log_format=args.log_format,
        )


def add_parsers(commands: Subcommands) -> None:
    """Add ``exporter`` and ``check-config`` to the ``stocksentry`` parser."""
    exporter = commands.add_parser(
        "exporter",
        help="run the sidecar: /metrics, /healthz, /readyz and the background probes",
        description=(
            "Serve /metrics (the app's multiprocess metrics merged with the probes' "
            "figures), /healthz and /readyz, and run the database and Redis probes in the "
            "background. A bad config prints one line naming file, line and key, exit 2."
        ),
    )
    exporter.add_argument(
        "--config", required=True, metavar="FILE", help="the exporter's YAML config"
    )
    web = exporter.add_argument_group(
        "web and log flags",
        "As the Prometheus exporters have them (exporter-toolkit, promslog); each one "
        "given overrides its key in the YAML config.",
    )
    web.add_argument(
        "--web.listen-address",
        dest="listen_addresses",
        action="append",
        type=_listen_address,
        metavar="[HOST]:PORT",
        help="an address to listen on, repeatable: ':19464' (every interface, IPv4 and "
        "IPv6), '0.0.0.0:19464', '[::]:19464' (IPv6), '127.0.0.1:19464' "
        "(overrides server.listen_address and server.port)",
    )
    web.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        type=_telemetry_path,
        metavar="PATH",
        help="where the metrics are served, e.g. /metrics (overrides server.telemetry_path)",
    )
    web.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, in the Prometheus exporters' web-config format "
        "(overrides server.web_config_file)",
    )
    web.add_argument(
        "--log.level",
        dest="log_level",
        choices=LOG_LEVELS,
        help="only log messages with the given severity or above (overrides log.level)",
    )
    web.add_argument(
        "--log.format",
        dest="log_format",
        choices=LOG_FORMATS,
        help="output format of log messages (overrides log.format)",
    )
    exporter.set_defaults(handler=_run_exporter, parser=exporter)
    check = commands.add_parser(
        "check-config",
        help="validate an exporter config (and its web config) without starting",
        description="Validate an exporter config; exit 0 when usable, 2 with one line if not.",
    )
    check.add_argument("file", metavar="FILE", help="the exporter's YAML config")
    check.set_defaults(handler=_check_config, parser=check)


def _listen_address(text: str) -> tuple[str, int]:
    try:
        return parse_listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _telemetry_path(text: str) -> str:
    if not re.fullmatch(TELEMETRY_PATH_PATTERN, text):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise argparse.ArgumentTypeError(f"{shown!r} is not {TELEMETRY_PATH}")
    return text


def _run_exporter(args: argparse.Namespace) -> int:
    from . import sidecar

    return sidecar.run_exporter(args.config, overrides=Overrides.from_args(args))


def _check_config(args: argparse.Namespace) -> int:
    from . import sidecar

    return sidecar.check_config(args.file)
