"""The image, built the way the Dockerfile builds it, serves the chart's ConfigMap.

There is no docker engine on the machines this project is built on, so this test repeats
the Dockerfile's steps by hand (tests/unit/test_dockerfile.py keeps the two in step):

1. the build context is the repository filtered by .dockerignore;
2. the build writes REVISION into the package and builds the wheel with
   ``pip wheel --no-deps``;
3. a fresh venv gets ``pip install '<wheel>[exporter]'``, and nothing else;
4. the container's command and arguments come from the Deployment the chart renders
   (Helm SDK), with the ConfigMap's config.yaml where the pod mounts it and the
   Secret-fed environment pointing at the real PostgreSQL and Redis.

Then it scrapes the exporter: every probe of the chart's config is up (cache_drift
through the redis package of the ``[exporter]`` extra), the negative-stock figure is the
SQL truth, and ``stocksentry_build_info`` carries the revision written at build time.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import uuid
import venv
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import yaml
from dbs import PG_SHOP_TABLES
from polling import http_ok, wait_until
from prom import free_port
from prometheus_client.parser import text_string_to_metric_families
from services import REDIS_URL

try:
    import helm_python
except ImportError:  # said by the test, plainly
    helm_python = None

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "stocksentry"
CONFIG_MOUNT = "/etc/stocksentry/config/config.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

SCHEMA = (
    PG_SHOP_TABLES
    + """
CREATE INDEX products_stock_negative_idx ON products (available_stock)
    WHERE available_stock < 0;
CREATE INDEX orders_created_at_idx ON orders (created_at);
CREATE INDEX order_items_product_id_idx ON order_items (product_id);
INSERT INTO products (sku, available_stock, initial_stock) VALUES
    ('EGG-01', 4, 10), ('EGG-02', 7, 10), ('0012', 1, 10), ('SKU-NEG', -2, 10);
"""
)


def run(*cmd: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _pattern(rule: str) -> re.Pattern[str]:
    """A .dockerignore pattern (the subset the file uses: *, ?, **/) as a regex."""
    out = ""
    i = 0
    while i < len(rule):
        if rule.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif rule[i] == "*":
            out += "[^/]*"
            i += 1
        elif rule[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(rule[i])
            i += 1
    return re.compile(out)


def docker_context(dest: Path) -> list[str]:
    """Copy what .dockerignore lets into the build context to ``dest``; the paths copied.

    Docker's rules: patterns in order, the last one matching wins, ``!`` re-includes, and
    a path matches when it or one of its parent folders does.
    """
    rules: list[tuple[bool, str, re.Pattern[str]]] = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        rule = line.lstrip("!").rstrip("/")
        rules.append((include, rule, _pattern(rule)))

    def excluded(rel: str) -> bool:
        parts = rel.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        verdict = False
        for include, _, pattern in rules:
            if any(pattern.fullmatch(p) for p in prefixes):
                verdict = not include
        return verdict

    def may_hold_included(rel: str) -> bool:
        return any(inc and (rule.startswith(f"{rel}/") or "*" in rule) for inc, rule, _ in rules)

    copied = []
    for folder, dirs, files in os.walk(ROOT):
        base = Path(folder).relative_to(ROOT).as_posix()
        base = "" if base == "." else f"{base}/"
        # Skip folders (.git, .venv, ...) nothing inside could be re-included from.
        dirs[:] = sorted(d for d in dirs if not excluded(base + d) or may_hold_included(base + d))
        for name in sorted(files):
            rel = base + name
            if excluded(rel):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target)
            copied.append(rel)
    return copied


def render_chart(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm_python.Chart.load(CHART) as chart:
        rendered: dict[str, str] = chart.render(values, name="shop", namespace="checkout")
    return [
        doc
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def test_the_image_build_serves_the_charts_configmap(
    tmp_path: Path, pg_database: str, redis_prefix: str
) -> None:
    if helm_python is None:
        pytest.fail("helm-python-sdk missing: run `bash helm/install-helm.sh`")

    # 1-2. The build stage: the context .dockerignore lets through, REVISION, the wheel.
    context = tmp_path / "context"
    copied = docker_context(context)
    assert "pyproject.toml" in copied
    assert "exporter/cli.py" in copied
    assert not [p for p in copied if p.startswith(("tests/", "helm/", ".git/", ".venv/"))]
    assert not [p for p in copied if "__pycache__" in p]
    revision = uuid.uuid4().hex + uuid.uuid4().hex[:8]
    (context / "exporter" / "REVISION").write_text(f"{revision}\n")
    dist = tmp_path / "dist"
    # The Dockerfile's `pip wheel --no-deps`, without build isolation: the setuptools of
    # this venv builds it instead of a freshly downloaded one.
    run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "--wheel-dir", dist, context,
    )  # fmt: skip
    (wheel,) = dist.glob("stocksentry-*.whl")

    # 3. A fresh venv with the [exporter] extra only, as /opt/stocksentry in the image.
    env_dir = tmp_path / "opt-stocksentry"
    venv.create(env_dir, with_pip=True)
    pip = env_dir / "bin" / "pip"
    run(pip, "install", "-q", "--disable-pip-version-check", f"{wheel}[exporter]")
    installed = run(pip, "list", "--format=freeze", "--disable-pip-version-check")
    names = {line.split("==")[0].lower() for line in installed.split()}
    assert {"stocksentry", "aiohttp", "psycopg", "redis", "bcrypt", "pyyaml"} <= names
    assert not names & {"sqlalchemy", "pottery", "opentelemetry-sdk"}, names
    run(pip, "uninstall", "-q", "--yes", "pip")  # the image keeps no installer
    stocksentry = env_dir / "bin" / "stocksentry"
    assert run(stocksentry, "--version", cwd=tmp_path).strip() == f"stocksentry {VERSION}"

    # 4. The chart, rendered as a release with Redis, on a port of this test's own.
    port = free_port()
    values = yaml.safe_load((CHART / "ci" / "redis-values.yaml").read_text())
    values["port"] = port
    values["config"]["redis"]["key_template"] = redis_prefix + "inventory:{sku}:available"
    docs = render_chart(values)
    config_text = one(docs, "ConfigMap")["data"]["config.yaml"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["stocksentry"]
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_text)
    args = [a.replace(CONFIG_MOUNT, str(config_file)) for a in container["args"]]
    assert args == ["exporter", f"--config={config_file}"]
    secrets = {
        values["database"]["existingSecret"]: pg_database,
        values["redis"]["existingSecret"]: REDIS_URL,
    }
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin"}
    for item in container["env"]:
        env[item["name"]] = secrets[item["valueFrom"]["secretKeyRef"]["name"]]
    assert set(env) == {"PATH", "STOCKSENTRY_DATABASE_URL", "STOCKSENTRY_REDIS_URL"}

    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(SCHEMA)
    cache = redis.Redis.from_url(REDIS_URL)
    for sku, stock in (("EGG-01", 4), ("EGG-02", 7), ("0012", 1)):
        cache.set(f"{redis_prefix}inventory:{sku}:available", stock)

    log = tmp_path / "exporter.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [*container["command"], *args],  # `stocksentry` found on the venv's PATH
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(
            lambda: http_ok(f"{base}/readyz"),
            timeout=60,
            message=lambda _: f"exporter not ready; log:\n{log.read_text()[-3000:]}",
        )
        probes = ("negative_stock", "oversold", "duplicate_orders", "lock_waiters", "cache_drift")
        metrics = wait_until(
            lambda: scrape(f"{base}/metrics"),
            timeout=60,
            accept=lambda text: all(
                f'stocksentry_probe_up{{probe="{p}"}} 1.0' in text for p in probes
            ),
            message=lambda text: f"not every probe up:\n{text[-3000:]}\n{log.read_text()}",
        )
        # The SQL truth: one SKU below zero.
        assert "stock_inventory_negative_skus 1.0" in metrics
        python_version = run(env_dir / "bin" / "python", "-c", "import platform;"
                             "print(platform.python_version())").strip()  # fmt: skip
        (info,) = [
            sample
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "stocksentry_build_info"
        ]
        assert info.labels == {
            "version": VERSION,
            "revision": revision,
            "python_version": python_version,
        }
        assert info.value == 1.0
        landing = scrape(f"{base}/")
        assert f"Version: {VERSION} (revision {revision}, Python {python_version})" in landing
        assert server.poll() is None, log.read_text()
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = log.read_text()
    assert server.returncode == 0, text[-3000:]
    # What the start-up says it serves: this address, plain HTTP, nobody asked who.
    assert (
        f"listening on http://0.0.0.0:{port}/ with metrics at http://0.0.0.0:{port}/metrics"
        in text
    )
    assert "plain HTTP, no authentication" in text
    assert f"starting stocksentry {VERSION} (revision {revision}" in text
