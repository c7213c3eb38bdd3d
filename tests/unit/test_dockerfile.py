"""The Dockerfile says what the chart and the package expect (no docker engine runs here).

tests/integration/test_image.py repeats the Dockerfile's build steps and serves the
chart's ConfigMap; this file keeps the Dockerfile's own statements in step with the
chart (user, port, command), the package (version, the ``[exporter]`` extra) and the
image conventions the issue asks for (slim base, two stages, OCI labels, exec form).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
VALUES = yaml.safe_load((ROOT / "helm" / "stocksentry" / "values.yaml").read_text())
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def test_two_stages_on_a_slim_python_base() -> None:
    froms = [args for word, args in instructions() if word == "FROM"]
    assert froms == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]
    (default,) = [a for w, a in instructions() if w == "ARG" and a.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.1[1-9]-slim(-\w+)?", default), default
    minor = int(default.split(":3.")[1].split("-")[0])
    assert minor >= int(PROJECT["requires-python"].removeprefix(">=3."))


def test_the_wheel_is_built_first_and_only_the_exporter_extra_installed() -> None:
    runs = " ".join(args for word, args in instructions() if word == "RUN")
    assert "pip wheel --no-deps --wheel-dir /dist ." in runs
    installs = re.findall(r'pip install ("[^"]*"|\S+)', runs)
    assert installs == ['"$(ls /dist/stocksentry-*.whl)[exporter]"']
    assert "printf '%s\\n' \"${REVISION}\" > exporter/REVISION" in runs
    # The runtime stage copies the venv and runs nothing.
    runtime = DOCKERFILE.split("FROM ${PYTHON_IMAGE}\n", 1)[1]
    assert "\nRUN " not in runtime
    assert "COPY --from=build /opt/stocksentry /opt/stocksentry" in runtime


def test_runs_as_the_charts_non_root_user_with_an_exec_form_entrypoint() -> None:
    (user,) = [args for word, args in instructions() if word == "USER"]
    security = VALUES["containerSecurityContext"]
    assert user == f"{security['runAsUser']}:{security['runAsGroup']}"
    assert security["runAsUser"] != 0
    (entrypoint,) = [args for word, args in instructions() if word == "ENTRYPOINT"]
    (cmd,) = [args for word, args in instructions() if word == "CMD"]
    # Exec form (JSON arrays): no /bin/sh -c between the runtime and the exporter.
    assert json.loads(entrypoint) == ["stocksentry"]
    assert json.loads(cmd) == ["exporter", "--config=/etc/stocksentry/config/config.yaml"]
    (expose,) = [args for word, args in instructions() if word == "EXPOSE"]
    assert int(expose) == VALUES["port"] == 19464


def test_oci_labels_name_version_and_revision() -> None:
    (labels,) = [args for word, args in instructions() if word == "LABEL"]
    keys = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", labels))
    assert {
        "org.opencontainers.image.title",
        "org.opencontainers.image.description",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.licenses",
        "org.opencontainers.image.base.name",
    } <= keys
    assert f'org.opencontainers.image.licenses="{PROJECT["license"]}"' in labels
    assert f"ARG VERSION={PROJECT['version']}" in DOCKERFILE


def test_the_build_context_starts_from_nothing() -> None:
    rules = [
        line
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*"
    assert {"!pyproject.toml", "!README.md", "!instrumentation", "!exporter"} <= set(rules)
    assert PROJECT["readme"] == "README.md"
