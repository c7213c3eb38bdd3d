"""The fuzz suite: hypothesis profiles, and the unit suite's guard against services.

Every test here is pure (no service, no network, no service binary), like ``tests/unit``:
the same guard (:mod:`service_guard`) is switched on around each test. The mark ``fuzz``
is added to every test collected here, so ``-m "not fuzz"`` leaves the suite out.

Profiles (``HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: what ``make test`` runs, a fixed budget per target (:func:`fuzzing.examples`)
  with ``derandomize=True``, so every run tries the same inputs and a failure in CI
  reproduces anywhere;
- ``long``: ``make fuzz``, fifty times the examples with fresh randomness; what it
  finds is kept in ``.hypothesis/`` and replayed first by the next run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

_TESTS = Path(__file__).resolve().parents[1]
# The guard module lives with the unit suite; pytest puts tests/unit on sys.path only when
# it collects that folder, so a run of tests/fuzz alone adds it here (same module name,
# hence one audit hook however the suites are collected).
if str(_TESTS / "unit") not in sys.path:
    sys.path.append(str(_TESTS / "unit"))

from service_guard import services_refused  # noqa: E402 - needs the path above

FUZZ_DIR = Path(__file__).resolve().parent
# deadline=None: the machine is shared, and a slow example is not a bug of the code.
# too_slow/data_too_large: some targets build files or whole configs per example.
_COMMON = {
    "deadline": None,
    "print_blob": True,
    "suppress_health_check": (HealthCheck.too_slow, HealthCheck.data_too_large),
}
# Hypothesis refuses derandomize=True with a database (a derandomized run has nothing to
# replay): ci is reproducible by its fixed seed, long keeps what it finds.
settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile(
    "long",
    derandomize=False,
    database=DirectoryBasedExampleDatabase(str(_TESTS.parent / ".hypothesis" / "fuzz")),
    **_COMMON,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``fuzz``."""
    for item in items:
        if item.path.is_relative_to(FUZZ_DIR):
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture(autouse=True)
def _no_services(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The unit suite's guard, on for each fuzz test."""
    with services_refused(monkeypatch):
        yield
