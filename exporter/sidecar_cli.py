"""``stocksentry exporter`` and ``stocksentry check-config``: the sidecar's subcommands.

Their arguments are declared here; the work is :func:`stocksentry.exporter.sidecar.run_exporter`
and :func:`~stocksentry.exporter.sidecar.check_config`, imported only when the command
runs, so building the ``stocksentry`` parser loads neither aiohttp nor a database driver.
A bad config prints one line naming file, line and key, and exits 2.

Example::

    stocksentry check-config exporter/config.example.yaml
    stocksentry exporter --config exporter/config.example.yaml --web.config.file web.yaml
    stocksentry exporter --config config.yaml --web.listen-address=:19464 \
        --web.listen-address=[::1]:19465 --log.level=debug --log.format=logfmt
"""

from __future__ import annotations

import argparse
import re

from .commandline import Subcommands
from .listen import parse_listen_address
from .overrides import LOG_FORMATS, LOG_LEVELS, TELEMETRY_PATH_PATTERN, Overrides

__all__ = [
    "add_check_config_parser",
    "add_exporter_parser",
    "add_parsers",
    "listen_address",
    "overrides",
    "telemetry_path",
]


def add_parsers(commands: Subcommands) -> None:
    """Add ``exporter`` and ``check-config`` to the ``stocksentry`` parser."""
    add_exporter_parser(commands)
    add_check_config_parser(commands)


def add_exporter_parser(commands: Subcommands) -> argparse.ArgumentParser:
    """Add the ``exporter`` subcommand; returns its parser."""
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
        type=listen_address,
        metavar="[HOST]:PORT",
        help="an address to listen on, repeatable: ':19464' (every interface, IPv4 and "
        "IPv6), '0.0.0.0:19464', '[::]:19464' (IPv6), '127.0.0.1:19464' "
        "(overrides server.listen_address and server.port)",
    )
    web.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        type=telemetry_path,
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
    exporter.set_defaults(handler=run_exporter_command, parser=exporter)
    return exporter


def listen_address(text: str) -> tuple[str, int]:
    """An argparse type: one ``--web.listen-address`` (see :mod:`.listen`)."""
    try:
        return parse_listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def telemetry_path(text: str) -> str:
    """An argparse type: a ``--web.telemetry-path``, as ``server.telemetry_path`` allows."""
    if not re.fullmatch(TELEMETRY_PATH_PATTERN, text):
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not a path starting with / other than /, /healthz and /readyz"
        )
    return text


def overrides(args: argparse.Namespace) -> Overrides:
    """The flags given on the command line, as overrides of the YAML config."""
    addresses = args.listen_addresses
    return Overrides(
        listen_addresses=tuple(addresses) if addresses else None,
        telemetry_path=args.telemetry_path,
        web_config_file=args.web_config_file,
        log_level=args.log_level,
        log_format=args.log_format,
    )


def run_exporter_command(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status."""
    from .sidecar import run_exporter

    return run_exporter(args.config, overrides=overrides(args))


def add_check_config_parser(commands: Subcommands) -> argparse.ArgumentParser:
    """Add the ``check-config`` subcommand; returns its parser."""
    check = commands.add_parser(
        "check-config",
        help="validate an exporter config (and its web config) without starting",
        description="Validate an exporter config; exit 0 when usable, 2 with one line if not.",
    )
    check.add_argument("file", metavar="FILE", help="the exporter's YAML config")
    check.set_defaults(handler=run_check_config_command, parser=check)
    return check


def run_check_config_command(args: argparse.Namespace) -> int:
    """Validate the config; returns the exit status."""
    from .sidecar import check_config

    return check_config(args.file)
