"""The suite's layout holds: integration modules are marked, unit tests reach no service.

``tests/conftest.py`` fails a run that collects an unmarked integration test; this check
also holds when only ``tests/unit`` is collected. ``tests/unit/conftest.py``'s guard is
tested here on the calls it must refuse and the ones it must let through.
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from service_guard import SERVICE_PORTS, ServiceUsedInUnitTest

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
MODULES = sorted(INTEGRATION.glob("test_*.py"))


def _module_marks(path: Path) -> list[str]:
    """The source text of each mark assigned to ``pytestmark`` at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return [ast.unparse(item) for item in items]
    return []


def test_there_are_integration_modules() -> None:
    assert len(MODULES) >= 10, MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_every_integration_module_is_marked(path: Path) -> None:
    assert "pytest.mark.integration" in _module_marks(path), (
        f"{path.name}: add `pytestmark = pytest.mark.integration`"
    )


@pytest.mark.parametrize("port", sorted(SERVICE_PORTS))
def test_guard_refuses_service_ports(port: int) -> None:
    with socket.socket() as sock, pytest.raises(ServiceUsedInUnitTest, match=str(port)):
        sock.connect(("127.0.0.1", port))


def test_guard_refuses_other_hosts() -> None:
    with socket.socket() as sock, pytest.raises(ServiceUsedInUnitTest, match="off this machine"):
        sock.connect(("192.0.2.1", 80))


def test_guard_lets_a_test_talk_to_its_own_loopback_server() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            conn, _ = server.accept()
            conn.close()


def test_guard_refuses_postgresql_through_libpq() -> None:
    import psycopg

    with pytest.raises(ServiceUsedInUnitTest, match="PostgreSQL"):
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.mark.parametrize("program", ["promtool", "/usr/bin/amtool", "redis-cli"])
def test_guard_refuses_service_binaries(program: str) -> None:
    with pytest.raises(ServiceUsedInUnitTest, match=Path(program).name):
        subprocess.run([program, "--version"], check=False)


def test_guard_lets_python_run() -> None:
    done = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)
    assert done.stdout == b"1\n"
