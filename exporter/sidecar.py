"""``stocksentry exporter`` and ``stocksentry check-config``: config in, sidecar out.

This module turns a validated :class:`~stocksentry.exporter.config.ExporterConfig` into
the running pieces: the :class:`~stocksentry.exporter.probes.ProbeRunner` (background
database and Redis probes, a collector reading their last snapshot) and the aiohttp
server (``/metrics`` merging the app's multiprocess directory, ``/healthz``,
``/readyz``). Bad input never ends in a traceback: a bad config or web config prints one
line naming file, line and key (``stocksentry check-config: error: config.yaml:12:
probes.oversold.interval: …``) and returns exit status 2.

Example::

    raise SystemExit(run_exporter("exporter/config.example.yaml"))
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from .commandline import ExitCode, report_error
from .config import ConfigError, ExporterConfig, load_config

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from .server import Background

LOGGER = logging.getLogger("stocksentry.exporter")


def check_config(path: str | Path, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Validate the exporter config at ``path`` (and its web config) without starting.

    Prints ``<file>: ok`` and a summary of what would run; or one error line and returns 2.
    """
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        config = load_config(path)
        _web_config(config)
    except (ConfigError, ValueError) as exc:
        return report_error("check-config", str(exc), err)
    print(f"{path}: ok", file=out)
    for line in describe(config):
        print(f"  {line}", file=out)
    return ExitCode.OK


def describe(config: ExporterConfig) -> list[str]:
    """Human lines saying what this config runs (no secrets)."""
    server = config.server
    lines = [
        f"listen {server.listen_address}:{server.port}"
        + (" with TLS/auth web config" if server.web_config_file else " (plain HTTP)"),
        "multiprocess dir: "
        + (str(server.multiprocess_dir) if server.multiprocess_dir else "none"),
        "database probes: "
        + ("off (no database section)" if config.database is None else _enabled(config)),
        "redis: "
        + (
            "cache_drift on promo SKUs"
            if config.redis is not None and config.probes.cache_drift.enabled
            else "off"
        ),
        "lock watch: "
        + (
            "off"
            if config.lock_watch is None
            else ", ".join(config.lock_watch.patterns)
            + (
                " (sets notify-keyspace-events when flags are missing)"
                if config.lock_watch.configure_notifications
                else " (checks notify-keyspace-events, never sets it)"
            )
        ),
    ]
    lines.extend(config.notes)
    return lines


def _enabled(config: ExporterConfig) -> str:
    probes = config.probes
    names = [name for name, settings in probes.builtin().items() if settings.enabled]
    names.extend(custom.name for custom in probes.custom)
    return ", ".join(names) if names else "none enabled"


def _web_config(config: ExporterConfig, override: str | Path | None = None) -> object:
    path = override if override is not None else config.server.web_config_file
    if path is None:
        return None
    from .webconfig import load_web_config

    return load_web_config(path)


def run_exporter(
    path: str | Path,
    *,
    web_config_file: str | Path | None = None,
    err: TextIO | None = None,
) -> int:
    """Load the config at ``path`` and serve until SIGTERM/SIGINT; returns the exit status.

    ``web_config_file`` (the ``--web.config.file`` flag of the Prometheus exporters)
    overrides ``server.web_config_file`` of the config.
    """
    err = err if err is not None else sys.stderr
    try:
        config = load_config(path)
        web_config = _web_config(config, web_config_file)
    except (ConfigError, ValueError) as exc:
        return report_error("exporter", str(exc), err)

    # aiohttp and the probes' drivers load only now: check-config and --help stay light.
    from stocksentry.instrumentation.logs import configure_logging

    from .probes import ProbeRunner
    from .server import ServerSettings, run_server
    from .webconfig import WebConfig

    configure_logging("INFO")
    server = config.server
    settings = ServerSettings(
        listen_address=server.listen_address,
        port=server.port,
        multiprocess_dir=server.multiprocess_dir,
        web_config=web_config if isinstance(web_config, WebConfig) else None,
        multiprocess_check_pids=server.check_worker_pids,
        header_timeout=server.header_timeout,
        body_timeout=server.body_timeout,
        tls_handshake_timeout=server.tls_handshake_timeout,
        keepalive_timeout=server.keepalive_timeout,
    )
    runner = ProbeRunner(config)
    collectors: list[Collector] = [runner]
    background: list[Background] = [runner.cleanup_ctx]
    if config.lock_watch is not None:
        from .lockwatch.watcher import LockWatcher

        watcher = LockWatcher(config.lock_watch, config.sku_guard)
        collectors.append(watcher)
        background.append(watcher.cleanup_ctx)
    for line in describe(config):
        LOGGER.info("config: %s", line)
    try:
        run_server(settings, collectors=collectors, background=background)
    except OSError as exc:
        return report_error(
            "exporter",
            f"cannot listen on {server.listen_address}:{server.port}: {exc.strerror or exc}",
            err,
        )
    return ExitCode.OK
