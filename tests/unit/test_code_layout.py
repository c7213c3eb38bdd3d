"""The source trees keep the rules that make them safe to upgrade and easy to read.

- No module imports a ``_name`` from another module, ours or a dependency's: an underscore
  is for names local to their module, and a dependency's private name may change in any
  minor release of it (ruff's PLC2701 sees only part of this: not relative imports).
- No ``_attribute`` is read through an imported name (``import x; x._y``,
  ``from . import m; m._y``).
- Every dependency of the distribution has an upper bound (its next major version).
- No source module is over 600 lines.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    path for folder in ("instrumentation", "exporter") for path in (ROOT / folder).rglob("*.py")
)
DUNDER = re.compile(r"^__\w+__$")


def _private(name: str) -> bool:
    return name.startswith("_") and not DUNDER.match(name)


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    imported_modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if any(_private(part) for part in module.split(".") if part):
                found.append(f"{path.name}:{node.lineno} from {module}")
            imported_modules.update(alias.asname or alias.name for alias in node.names)
            found.extend(
                f"{path.name}:{node.lineno} {alias.name} from {'.' * node.level}{module}"
                for alias in node.names
                if _private(alias.name)
            )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(_private(part) for part in alias.name.split(".")):
                    found.append(f"{path.name}:{node.lineno} import {alias.name}")
                imported_modules.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported_modules
        ):
            found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_imports_a_private_name(path: Path) -> None:
    assert _private_imports(path) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_module_is_over_600_lines(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= 600, f"{path.relative_to(ROOT)} has {lines} lines"


def _requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        found.extend(r for r in extra if not r.startswith("stocksentry"))
    # types-* stubs follow the package they describe.
    return [r for r in found if not r.startswith("types-")]


@pytest.mark.parametrize("requirement", _requirements())
def test_every_dependency_is_bounded_above(requirement: str) -> None:
    # An exact pin is a bound too.
    assert "<" in requirement or "==" in requirement, requirement
