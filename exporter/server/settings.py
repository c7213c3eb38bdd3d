"""Where and how the exporter serves: :class:`ServerSettings`, and the app's life cycle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..config import model
from ..webconfig import WebConfig

#: Liveness: 200 while the process serves at all.
HEALTHZ_PATH: Final = "/healthz"
#: Readiness: 200 between the end of start-up and the start of shutdown.
READYZ_PATH: Final = "/readyz"
_TIMEOUTS: Final = ("header_timeout", "body_timeout", "tls_handshake_timeout", "keepalive_timeout")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Where and how the exporter serves; docs/exporter-server.md describes each field.

    ``listen_address`` ``""`` is every interface of both families; ``port`` 0 picks a free
    one (see ``RunningServer.port``). The timeouts are in seconds.

    Example::

        >>> ServerSettings(listen_address="127.0.0.1", port=0).metrics_path
        '/metrics'
    """

    listen_address: str
    port: int
    multiprocess_dir: Path | None = None
    also_listen: tuple[tuple[str, int], ...] = ()
    web_config: WebConfig | None = None
    metrics_path: str = "/metrics"
    multiprocess_check_pids: bool = True
    multiprocess_compact: bool = False
    shutdown_timeout: float = 10.0
    drain_seconds: float = 0.0
    # The defaults are the config model's (``server:``), where their reasons are written.
    header_timeout: float = model.HEADER_TIMEOUT
    body_timeout: float = model.BODY_TIMEOUT
    tls_handshake_timeout: float = model.TLS_HANDSHAKE_TIMEOUT
    keepalive_timeout: float = model.KEEPALIVE_TIMEOUT

    def __post_init__(self) -> None:
        for _, port in self.addresses:
            if not 0 <= port <= 65535:
                raise ValueError(f"port must be 0-65535, got {port}")
        listed = [a for a in self.addresses if a[1] != 0]
        if len(set(listed)) != len(listed):
            raise ValueError(f"an address is listed twice: {self.addresses}")
        path = self.metrics_path
        if not path.startswith("/") or path in ("/", HEALTHZ_PATH, READYZ_PATH):
            raise ValueError(
                f"metrics_path must start with '/' and not be /, {HEALTHZ_PATH} or "
                f"{READYZ_PATH}, got {path!r}"
            )
        if not self.shutdown_timeout >= 0 or not self.drain_seconds >= 0:
            raise ValueError("shutdown_timeout and drain_seconds must be >= 0")
        for name in _TIMEOUTS:
            value = getattr(self, name)
            most = 86400 if name == "keepalive_timeout" else 3600
            if not 0 < value <= most:
                raise ValueError(f"{name} must be > 0 and <= {most} seconds, got {value}")

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every ``(address, port)`` served: the first, then ``also_listen``."""
        return ((self.listen_address, self.port), *self.also_listen)


@dataclass(slots=True)
class Lifecycle:
    """Where the app is in its life; ``/readyz`` answers from it."""

    started: bool = False
    stopping: bool = False

    @property
    def ready(self) -> bool:
        """True between the end of start-up and the start of shutdown.

        >>> Lifecycle(started=True).ready, Lifecycle(started=True, stopping=True).ready
        (True, False)
        """
        return self.started and not self.stopping
