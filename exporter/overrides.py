"""The exporter's command-line flags that override its YAML config, and their values.

The flags are the Prometheus exporters' (exporter-toolkit's ``--web.*``, promslog's
``--log.*``); the config keys they override are ``server.listen_address`` and
``server.port``, ``server.telemetry_path``, ``server.web_config_file``, ``log.level`` and
``log.format``. This module is imported when the ``stocksentry`` parser is built, so it
loads nothing but the standard library.

Example::

    >>> Overrides(log_level="debug").log_level
    'debug'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "TELEMETRY_PATH_PATTERN", "Overrides"]

#: The levels of ``log.level`` and ``--log.level``, as promslog names them.
LOG_LEVELS: Final = ("debug", "info", "warn", "error")
#: The formats of ``log.format`` and ``--log.format``, as promslog names them.
LOG_FORMATS: Final = ("logfmt", "json")
#: A URL path for the metrics: starts with ``/``, is not ``/`` itself (the landing page)
#: and not one of the health paths.
TELEMETRY_PATH_PATTERN: Final = r"/(?!(?:healthz|readyz)$)[A-Za-z0-9._~/-]+"


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
