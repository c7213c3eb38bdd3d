"""The unit suite's guard: no service, no service binary (``tests/unit/conftest.py`` uses it).

While a unit test runs (an autouse fixture switches the guard on), an audit hook
(:func:`sys.addaudithook`) refuses:

- a socket connection to a port of the services the integration suite uses (PostgreSQL
  5432, Redis 6379, MariaDB 3306, Prometheus 9090, Alertmanager 9093) on any host, and
  any TCP connection to a host that is not loopback. Loopback on other ports stays open:
  aiohttp's test client and the tests' own servers listen there;
- starting a service binary (promtool, amtool, prometheus, alertmanager, helm, psql,
  redis-cli, mariadb, ...), whatever runs it.

libpq opens its sockets in C, out of the audit hook's sight, so psycopg's connect
(``psycopg.connect`` and the connection classes' ``connect``) is refused as well (by
:func:`refuse_libpq`, which the unit conftest puts in their place). A refused call raises
:class:`ServiceUsedInUnitTest`; the fix is to move the test to ``tests/integration`` and
mark it.

The hook stays installed for the rest of the process (audit hooks cannot be removed) but
does nothing while the guard is off, so ``pytest tests`` still runs the integration suite
after the unit suite.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
from collections.abc import Iterator
from typing import Any

#: Ports of PostgreSQL, Redis, MariaDB, Prometheus and Alertmanager.
SERVICE_PORTS = frozenset({5432, 6379, 3306, 9090, 9093})
#: Programs a unit test must not start.
SERVICE_BINARIES = frozenset(
    {
        "promtool",
        "amtool",
        "prometheus",
        "alertmanager",
        "prometheus-alertmanager",
        "helm",
        "psql",
        "pg_ctl",
        "pg_ctlcluster",
        "pg_isready",
        "postgres",
        "redis-server",
        "redis-cli",
        "mariadb",
        "mariadbd",
        "mysql",
        "mysqld",
        "mariadb-admin",
    }
)


class ServiceUsedInUnitTest(RuntimeError):
    """A unit test tried to reach a service or start a service binary."""


_guard_on = False


def switch(on: bool) -> None:
    """Turn the guard on (for one unit test) or off."""
    global _guard_on
    _guard_on = on


def _loopback(host: object) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False  # a host name other than localhost: not loopback


def _check_connect(address: object) -> None:
    if not isinstance(address, tuple) or len(address) < 2:
        return  # AF_UNIX paths and the like
    host, port = address[0], address[1]
    if port in SERVICE_PORTS:
        raise ServiceUsedInUnitTest(
            f"a unit test connected to {host}:{port}, a service port; move it to "
            "tests/integration and mark it"
        )
    if not _loopback(host):
        raise ServiceUsedInUnitTest(f"a unit test connected to {host}:{port}, off this machine")


def _check_exec(executable: object, args: object) -> None:
    names = {os.path.basename(os.fsdecode(executable))} if executable else set()
    if isinstance(args, (list, tuple)) and args:
        names.add(os.path.basename(os.fsdecode(args[0])))
    elif isinstance(args, (str, bytes)):
        names.add(os.path.basename(os.fsdecode(args).split()[0]) if args.strip() else "")
    used = names & SERVICE_BINARIES
    if used:
        raise ServiceUsedInUnitTest(
            f"a unit test ran {sorted(used)}; move it to tests/integration and mark it"
        )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _guard_on:
        return
    if event == "socket.connect":
        _check_connect(args[1])
    elif event in ("subprocess.Popen", "os.exec", "os.posix_spawn"):
        _check_exec(args[0], args[1])


sys.addaudithook(_audit)


def refuse_libpq(*_args: object, **_kwargs: object) -> Any:
    """Stands in for psycopg's connect while the guard is on."""
    raise ServiceUsedInUnitTest(
        "a unit test opened a PostgreSQL connection; move it to tests/integration and mark it"
    )


def guard_this_process() -> None:
    """Guard a whole child process (a documentation snippet run by the unit suite)."""
    try:
        import psycopg
    except ImportError:  # dev installs psycopg; a bare checkout may not have it
        pass
    else:
        # The child exits after the snippet: nothing to put back.
        setattr(psycopg, "connect", refuse_libpq)  # noqa: B010 - the same calls as the conftest's
        setattr(psycopg.Connection, "connect", classmethod(refuse_libpq))  # noqa: B010
        setattr(psycopg.AsyncConnection, "connect", classmethod(refuse_libpq))  # noqa: B010
    switch(True)


@contextlib.contextmanager
def services_refused(monkeypatch: Any) -> Iterator[None]:
    """The guard on for one test: psycopg's connects refused (put back by ``monkeypatch``)
    and the audit hook switched on until the block ends. Both suites' conftests use it."""
    try:
        import psycopg
    except ImportError:  # dev installs psycopg; a bare checkout may not have it
        pass
    else:
        # psycopg.connect is Connection.connect bound at import: both need replacing.
        monkeypatch.setattr(psycopg, "connect", refuse_libpq)
        monkeypatch.setattr(psycopg.Connection, "connect", classmethod(refuse_libpq))
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(refuse_libpq))
    switch(True)
    try:
        yield
    finally:
        switch(False)
