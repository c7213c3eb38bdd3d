"""``stocksentry exporter`` and ``stocksentry check-config``: config in, sidecar out.

A validated config becomes the :class:`~stocksentry.exporter.probes.ProbeRunner` and the
aiohttp server. A bad config or web config is one line naming file, line and key, and
exit status 2, never a traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .commandline import ExitCode, report_error
from .config import ConfigError, ExporterConfig, load_config
from .config.containment import WEBHOOK_PATH
from .durations import format_duration
from .listen import format_listen_address
from .sidecar_cli import Overrides

if TYPE_CHECKING:
    from .containment.webhook import Containment
    from .lockwatch.watcher import LockWatcher
    from .probes import ProbeRunner
    from .webconfig import WebConfig

LOGGER = logging.getLogger("stocksentry.exporter")
#: The pages an on-call most needs from the database probes, and the probe each reads.
HEADLINE_ALERTS: tuple[tuple[str, str], ...] = (
    ("StockOversold", "oversold"),
    ("StockNegativeInventory", "negative_stock"),
    ("StockDuplicateOrders", "duplicate_orders"),
)


def silent_headlines(config: ExporterConfig) -> str | None:
    """The line naming the headline alerts this config can never fire (their probe is
    off), or None. Only with a database section: without one the exporter probes nothing
    by design (a sidecar serving the app's metrics), and says so."""
    if config.database is None:
        return None
    builtin = config.probes.builtin()
    silent = [
        f"{alert} (probe {probe} is off)"
        for alert, probe in HEADLINE_ALERTS
        if not builtin[probe].enabled
    ]
    if not silent:
        return None
    return "headline alerts that cannot fire with this config: " + ", ".join(silent)


def check_config(path: str | Path, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Validate the config at ``path`` (and its web config): ``<file>: ok`` and what would
    run, or one error line and exit status 2."""
    try:
        config, web_config = _load(path, Overrides())
    except (ConfigError, ValueError) as exc:
        return report_error("check-config", str(exc), err)
    lines = [f"{path}: ok", *(f"  {line}" for line in describe(config, web_config=web_config))]
    print("\n".join(lines), file=out if out is not None else sys.stdout)
    return ExitCode.OK


def describe(
    config: ExporterConfig,
    addresses: Sequence[tuple[str, int]] | None = None,
    web_config: WebConfig | None = None,
) -> list[str]:
    """Human lines saying what this config runs (no secrets); ``addresses``: the
    ``--web.listen-address`` pairs when given, ``web_config``: the loaded web config."""
    server = config.server
    if addresses is None:
        addresses = [(server.listen_address, server.port)]
    listen = ", ".join(format_listen_address(host, port) for host, port in addresses)
    where = server.web_config_file
    if web_config is not None:
        security = web_config.describe() + (f" (web config {where})" if where else "")
    else:
        security = f"as web config {where} says" if where else "plain HTTP, no authentication"
    watch = config.lock_watch
    watched = "off"
    if watch is not None:
        how = (
            "sets notify-keyspace-events when flags are missing"
            if watch.configure_notifications
            else "checks notify-keyspace-events, never sets it"
        )
        watched = f"{', '.join(watch.patterns)} ({how})"
    probes = [name for name, settings in config.probes.builtin().items() if settings.enabled]
    probes.extend(custom.name for custom in config.probes.custom)
    if config.database is None:
        probing = "off (no database section)"
    else:
        probing = ", ".join(probes) if probes else "none enabled"
    contained = "off"
    if (section := config.containment) is not None:
        contained = (
            f"webhook {section.mode} at {WEBHOOK_PATH} for {', '.join(section.alerts)}, at "
            f"most {section.max_auto_frozen} SKUs frozen automatically, each for "
            f"{format_duration(section.expiry)}; keys {section.key_template}"
        )
    cache = config.redis is not None and config.probes.cache_drift.enabled
    lines = [
        f"listen {listen}, metrics at {server.telemetry_path}: {security}",
        f"log level {config.log.level}, format {config.log.format}",
        f"multiprocess dir: {server.multiprocess_dir or 'none'}",
        f"database probes: {probing}",
        f"redis: {'cache_drift on promo SKUs' if cache else 'off'}",
        f"lock watch: {watched}",
        f"containment: {contained}",
    ]
    lines.extend(config.notes)
    headline = silent_headlines(config)
    if headline is not None:
        lines.append(headline)
    return lines


def apply_overrides(config: ExporterConfig, overrides: Overrides) -> ExporterConfig:
    """``config`` with the flags given in place of their YAML keys (the first listen
    address in ``server.listen_address``/``port``)."""
    first = overrides.listen_addresses[0] if overrides.listen_addresses else (None, None)
    path = overrides.web_config_file
    server = _given(
        listen_address=first[0],
        port=first[1],
        telemetry_path=overrides.telemetry_path,
        web_config_file=None if path is None else Path(path),
    )
    log = _given(level=overrides.log_level, format=overrides.log_format)
    return dataclasses.replace(
        config,
        server=dataclasses.replace(config.server, **server),
        log=dataclasses.replace(config.log, **log),
    )


def _given(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


def configure_exporter_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Log as ``log.level``/``log.format`` say: promslog's levels, logfmt or JSON lines."""
    from stocksentry.instrumentation.logs import configure_logging

    numeric = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR"}[level]
    configure_logging(numeric, stream=stream, json=fmt == "json", logfmt=fmt == "logfmt")


def _load(path: str | Path, overrides: Overrides) -> tuple[ExporterConfig, WebConfig | None]:
    config = apply_overrides(load_config(path), overrides)
    web_config_file = config.server.web_config_file
    if web_config_file is None:
        return config, None
    from .webconfig import load_web_config

    return config, load_web_config(web_config_file)


def run_exporter(
    path: str | Path,
    *,
    overrides: Overrides | None = None,
    err: TextIO | None = None,
) -> int:
    """Load the config at ``path``, the command-line ``overrides`` in place of their keys,
    and serve until SIGTERM/SIGINT; returns the exit status."""
    overrides = overrides if overrides is not None else Overrides()
    try:
        config, web_config = _load(path, overrides)
    except (ConfigError, ValueError) as exc:
        return report_error("exporter", str(exc), err)

    # aiohttp and the probes' drivers load only now: check-config and --help stay light.
    from .probes import ProbeRunner
    from .server import ServerSettings, run_server

    configure_exporter_logging(config.log.level, config.log.format)
    server = config.server
    addresses = overrides.listen_addresses or ((server.listen_address, server.port),)
    try:
        settings = ServerSettings(
            listen_address=addresses[0][0],
            port=addresses[0][1],
            also_listen=tuple(addresses[1:]),
            metrics_path=server.telemetry_path,
            multiprocess_dir=server.multiprocess_dir,
            web_config=web_config,
            multiprocess_check_pids=server.check_worker_pids,
            multiprocess_compact=server.compact_dead_workers,
            header_timeout=server.header_timeout,
            body_timeout=server.body_timeout,
            tls_handshake_timeout=server.tls_handshake_timeout,
            keepalive_timeout=server.keepalive_timeout,
        )
    except ValueError as exc:
        return report_error("exporter", f"--web.listen-address: {exc}", err)
    # Each part is a collector with a background task (app.cleanup_ctx); redis loads only
    # for the parts that need it.
    parts: list[ProbeRunner | LockWatcher | Containment] = [ProbeRunner(config)]
    if config.lock_watch is not None:
        from .lockwatch.watcher import LockWatcher

        parts.append(LockWatcher(config.lock_watch, config.sku_guard))
    routes = []
    if config.containment is not None:
        from .containment.webhook import Containment

        parts.append(containment := Containment(config.containment))
        routes = containment.routes()
    headline = silent_headlines(config)
    for line in describe(config, addresses, web_config):
        # The silent headline alerts are a warning: the page on-call expects will not come.
        LOGGER.log(logging.WARNING if line == headline else logging.INFO, "config: %s", line)
    try:
        background = [part.cleanup_ctx for part in parts]
        run_server(settings, collectors=parts, background=background, routes=routes)
    except OSError as exc:
        where = ", ".join(format_listen_address(host, port) for host, port in addresses)
        return report_error("exporter", f"cannot listen on {where}: {exc.strerror or exc}", err)
    return ExitCode.OK
