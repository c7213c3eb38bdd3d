"""A private ``redis-server`` on a free port, for tests that change server settings.

The lock watcher's tests set ``notify-keyspace-events`` and restart Redis; the shared
server on :6379 must never see either, so they run their own. No persistence, its own
temporary directory, ended by its PID.

Example::

    with PrivateRedis() as server:
        redis.Redis.from_url(server.url).ping()
        server.restart()
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from processes import stop

__all__ = ["PrivateRedis", "free_port"]


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """One redis-server process of the test's own."""

    def __init__(self, *, notify: str = "") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (make services installs it)")
        self.binary = binary
        self.notify = notify
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="stocksentry-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
                "--notify-keyspace-events", self.notify,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        process, self.process = self.process, None
        stop(process)

    def restart(self) -> None:
        """Stop and start again on the same port (the config set at runtime is gone)."""
        self.stop()
        self.start()

    def __enter__(self) -> PrivateRedis:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
