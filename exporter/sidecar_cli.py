"""``stocksentry exporter`` and ``stocksentry check-config``: the sidecar's subcommands.

Their arguments are declared here; the work is :func:`stocksentry.exporter.sidecar.run_exporter`
and :func:`~stocksentry.exporter.sidecar.check_config`, imported only when the command
runs, so building the ``stocksentry`` parser loads neither aiohttp nor a database driver.
A bad config prints one line naming file, line and key, and exits 2.

Example::

    stocksentry check-config exporter/config.example.yaml
    stocksentry exporter --config exporter/config.example.yaml --web.config.file web.yaml
"""

from __future__ import annotations

import argparse

from .commandline import Subcommands

__all__ = ["add_check_config_parser", "add_exporter_parser", "add_parsers"]


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
    exporter.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, in the Prometheus exporters' web-config format "
        "(overrides server.web_config_file)",
    )
    exporter.set_defaults(handler=run_exporter_command, parser=exporter)
    return exporter


def run_exporter_command(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status."""
    from .sidecar import run_exporter

    return run_exporter(args.config, web_config_file=args.web_config_file)


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
