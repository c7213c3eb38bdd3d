"""The ``>>>`` examples of every module of both packages (and of dashboards/) run and hold.

Modules are found by walking the packages (so a new module is covered without a list to
update); the dev install has every optional extra, so every module imports. Examples in
``Example::`` literal blocks are for reading and are not run.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import stocksentry.exporter
import stocksentry.instrumentation

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dashboards  # noqa: E402 - needs the repository root on sys.path

#: Both packages, and the dashboards' builder and linter.
PACKAGES: tuple[ModuleType, ...] = (stocksentry.instrumentation, stocksentry.exporter, dashboards)


def _module_names() -> list[str]:
    names: list[str] = []
    for package in PACKAGES:
        names.append(package.__name__)
        names += [
            info.name
            for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + ".")
            if not info.name.endswith(".__main__")  # importing it runs the command
        ]
    return sorted(names)


MODULES = _module_names()


def test_both_packages_are_walked() -> None:
    assert "stocksentry.instrumentation.catalog" in MODULES
    assert "stocksentry.exporter.durations" in MODULES
    assert any(name.startswith("stocksentry.exporter.probes.") for name in MODULES)
    assert "dashboards.lint" in MODULES


def test_there_are_examples_to_run() -> None:
    finder = doctest.DocTestFinder()
    examples = sum(
        len(test.examples)
        for name in MODULES
        for test in finder.find(importlib.import_module(name), name)
    )
    assert examples >= 20, examples


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    failed = sum(runner.run(test, out=report.append).failed for test in finder.find(module, name))
    assert failed == 0, "".join(report)
