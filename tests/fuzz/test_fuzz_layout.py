"""The fuzz suite is pure: the unit suite's guard is on, and every test is marked fuzz."""

from __future__ import annotations

import socket

import pytest
from service_guard import ServiceUsedInUnitTest


def test_the_guard_refuses_services_in_the_fuzz_suite() -> None:
    with socket.socket() as sock, pytest.raises(ServiceUsedInUnitTest, match="5432"):
        sock.connect(("127.0.0.1", 5432))


def test_fuzz_tests_carry_the_fuzz_mark(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fuzz") is not None
