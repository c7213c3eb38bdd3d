"""Every package folder of the two source trees is listed in pyproject.toml's ``packages``.

setuptools maps ``instrumentation/`` and ``exporter/`` into ``stocksentry`` by an explicit
list; a subpackage missing from it would work in the editable install and be absent from
the wheel.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _package_folders() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    found: set[str] = set()
    for package, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            parts = [package, *relative.parts]
            found.add(".".join(parts))
    return found


def test_every_package_folder_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    assert listed == _package_folders()
