"""Where and how the exporter serves: :class:`ServerSettings`, and the app's life cycle.

Example::

    >>> ServerSettings(listen_address="127.0.0.1", port=0).metrics_path
    '/metrics'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ..webconfig import WebConfig
from .deadlines import BODY_TIMEOUT, HANDSHAKE_TIMEOUT, HEADER_TIMEOUT, KEEPALIVE_TIMEOUT

__all__ = ["HEALTHZ_PATH", "READYZ_PATH", "Lifecycle", "ServerSettings"]

#: Liveness: 200 while the process serves at all.
HEALTHZ_PATH: Final = "/healthz"
#: Readiness: 200 between the end of start-up and the start of shutdown.
READYZ_PATH: Final = "/readyz"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Where and how the exporter serves.

    Args:
        listen_address: the address to bind (``0.0.0.0`` in a pod, so Prometheus can reach
            the pod IP; ``127.0.0.1`` on a laptop; ``::`` for IPv6; ``""`` for every
            interface of both families, as ``--web.listen-address=:19464`` says).
        port: the TCP port; 0 picks a free one (see ``RunningServer.port``).
        also_listen: more ``(address, port)`` pairs served the same way (a repeated
            ``--web.listen-address``).
        multiprocess_dir: the app's ``PROMETHEUS_MULTIPROC_DIR``, or None.
        web_config: TLS and basic auth, or None for plain HTTP (logged at start).
        metrics_path: where the exposition is served.
        multiprocess_check_pids: drop ``live*`` gauges of pids that ``os.kill(pid, 0)``
            says are gone; set False when the exporter does not share the app's PID
            namespace (see :mod:`stocksentry.exporter.multiproc`).
        shutdown_timeout: seconds in-flight requests get to finish at shutdown.
        drain_seconds: seconds between the stop signal and closing the listener, during
            which ``/readyz`` already answers 503 (for load balancers that must notice).
        header_timeout: seconds a client has to send a whole request head (request line
            and headers), from the connection's start or the head's first byte; then the
            connection is closed (see :mod:`~.deadlines`).
        body_timeout: seconds a client has to send a request body after its head.
        tls_handshake_timeout: seconds a TLS handshake may take.
        keepalive_timeout: seconds an idle kept-alive connection stays open between
            requests (Prometheus reuses its connection from one scrape to the next).

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
    shutdown_timeout: float = 10.0
    drain_seconds: float = 0.0
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    tls_handshake_timeout: float = HANDSHAKE_TIMEOUT
    keepalive_timeout: float = KEEPALIVE_TIMEOUT

    def __post_init__(self) -> None:
        for _, port in self.addresses:
            if not 0 <= port <= 65535:
                raise ValueError(f"port must be 0-65535, got {port}")
        listed = [a for a in self.addresses if a[1] != 0]
        if len(set(listed)) != len(listed):
            raise ValueError(f"an address is listed twice: {self.addresses}")
        if not self.metrics_path.startswith("/") or self.metrics_path in (
            "/",
            HEALTHZ_PATH,
            READYZ_PATH,
        ):
            raise ValueError(
                f"metrics_path must start with '/' and not be /, {HEALTHZ_PATH} or "
                f"{READYZ_PATH}, got {self.metrics_path!r}"
            )
        if not self.shutdown_timeout >= 0 or not self.drain_seconds >= 0:
            raise ValueError("shutdown_timeout and drain_seconds must be >= 0")
        for name in ("header_timeout", "body_timeout", "tls_handshake_timeout"):
            value = getattr(self, name)
            if not 0 < value <= 3600:
                raise ValueError(f"{name} must be > 0 and <= 3600 seconds, got {value}")
        if not 0 < self.keepalive_timeout <= 86400:
            raise ValueError(
                f"keepalive_timeout must be > 0 and <= 86400 seconds, got {self.keepalive_timeout}"
            )

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every ``(address, port)`` served: the first, then ``also_listen``."""
        return ((self.listen_address, self.port), *self.also_listen)


@dataclass(slots=True)
class Lifecycle:
    """Where the app is in its life; ``/readyz`` answers from it.

    Example::

        >>> Lifecycle(started=True).ready, Lifecycle(started=True, stopping=True).ready
        (True, False)
    """

    started: bool = False
    stopping: bool = False

    @property
    def ready(self) -> bool:
        """True between the end of start-up and the start of shutdown."""
        return self.started and not self.stopping
