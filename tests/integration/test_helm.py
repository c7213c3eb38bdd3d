"""The Helm chart (helm/stocksentry): lint, render, validate, and refuse bad values.

Helm is Helm v4's Go SDK from the PyPI package helm-python-sdk (there is no helm binary
for Linux in a registry this project reaches); `bash helm/install-helm.sh` installs it and
kubernetes-validate into the venv. Every case renders the chart offline and checks:

- `helm lint --strict` (the SDK's lint with strict on) reports no warning or error;
- each manifest validates against the Kubernetes schemas of kubernetes-validate (strict,
  at the chart's lowest supported Kubernetes and the newest the package ships) or, for
  ServiceMonitor, PodMonitor and PrometheusRule, against the prometheus-operator schemas
  in helm/testdata/crds/;
- the exporter ConfigMap passes `stocksentry check-config` with the environment the
  container gets from its Secrets filled with dummy URLs;
- the PrometheusRule holds exactly alert_rules/stocksentry.rules.yml's groups with the
  defaults and passes `promtool check rules`; with other values (location labels, links,
  job, disabled alerts, extra labels, settings) it is what alert_rules/render.py renders
  and what the values say, and alert_rules/tests/*.yml pass on it; the dashboard
  ConfigMaps hold exactly dashboards/*.json, runbook links from links.runbookBaseUrl;
- the health alerts, run by promtool on the rendered rules with the labels
  prometheus-operator attaches to the rendered ServiceMonitor / PodMonitor's targets
  (prober and sidecar mode), fire when the target is down and are quiet when it is up;
- wrong types, typo'd keys and contradictory options fail with a message naming them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

try:
    import helm_python
    import jsonschema  # comes with kubernetes-validate
    import kubernetes_validate
except ImportError:  # the tests below say how to get them
    helm_python = None
    kubernetes_validate = None

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "stocksentry"
EXAMPLE = CHART / "examples" / "app-with-sidecar"
CRD_SCHEMAS = ROOT / "helm" / "testdata" / "crds"
RULES_FILE = ROOT / "alert_rules" / "stocksentry.rules.yml"
RELEASE, NAMESPACE = "shop", "checkout"
DUMMY_URLS = {
    "database": "postgresql://stocksentry:secret@db.example:5432/shop",
    "redis": "redis://:secret@redis.example:6379/0",
}
#: Kubernetes versions the manifests are validated against: the chart's kubeVersion
#: floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25.0", "1.37.0")

CI_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
#: Per case, the kinds (and how many of each) the chart must render.
PROBER = {"ConfigMap": 1, "Deployment": 1, "Service": 1, "ServiceAccount": 1}
EXPECTED_KINDS: dict[str, dict[str, int]] = {
    "default": PROBER,
    "dashboards-values.yaml": {**PROBER, "ConfigMap": 4},
    "full-config-values.yaml": PROBER,
    "networkpolicy-values.yaml": {**PROBER, "NetworkPolicy": 1},
    "pdb-values.yaml": {**PROBER, "PodDisruptionBudget": 1},
    "podmonitor-values.yaml": {**PROBER, "PodMonitor": 1},
    "prometheusrule-values.yaml": {**PROBER, "PrometheusRule": 1},
    "redis-values.yaml": PROBER,
    "servicemonitor-values.yaml": {**PROBER, "ServiceMonitor": 1},
    "sidecar-values.yaml": {"ConfigMap": 4, "PodMonitor": 1, "PrometheusRule": 1},
    "webconfig-values.yaml": {**PROBER, "ServiceMonitor": 1},
}
CASES = ["default", *CI_FILES]

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.fixture(autouse=True)
def _helm_tools() -> None:
    if helm_python is None or kubernetes_validate is None:
        pytest.fail(
            "helm-python-sdk / kubernetes-validate missing: run `bash helm/install-helm.sh`"
        )


# --- helpers --------------------------------------------------------------------------------


#: The least an install sets (README "Kubernetes"): the chart refuses to render without the
#: allocation column, so StockOversold can fire.
#: The runbook base of the committed rules file (links.runbookBaseUrl has no default).
RUNBOOKS = "https://github.com/stocksentry/stocksentry/blob/main/docs/runbooks"
SHOP = {
    "config": {"schema": {"products": {"allocation": "initial_stock"}}},
    "links": {"runbookBaseUrl": RUNBOOKS},
}


def case_values(case: str) -> dict[str, Any]:
    if case == "default":
        return {}
    loaded: dict[str, Any] = yaml.safe_load((CHART / "ci" / case).read_text(encoding="utf-8"))
    return loaded


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def render_raw(
    values: dict[str, Any], chart: Path = CHART, *, shop: bool = True
) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would print it; the chart's own
    values over :data:`SHOP` unless ``shop`` is false."""
    if shop and chart == CHART:
        values = merge(SHOP, values)
    with helm_python.Chart.load(chart) as loaded:
        rendered: dict[str, str] = loaded.render(values, name=RELEASE, namespace=NAMESPACE)
    return rendered


@cache
def _render_cached(values_json: str, chart: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    raw = render_raw(json.loads(values_json), Path(chart))
    docs = [
        doc
        for path, text in sorted(raw.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return raw, docs


def render(
    values: dict[str, Any], chart: Path = CHART
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The rendered templates and the manifests parsed from them (callers must not mutate)."""
    return _render_cached(json.dumps(values, sort_keys=True), str(chart))


def render_error(values: dict[str, Any], chart: Path = CHART, *, shop: bool = True) -> str:
    with pytest.raises(helm_python.HelmError) as caught:
        render_raw(values, chart, shop=shop)
    return str(caught.value)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


@cache
def crd_validator(kind: str) -> Any:
    schema = json.loads((CRD_SCHEMAS / f"{kind.lower()}-monitoring-v1.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def validate_manifest(doc: dict[str, Any]) -> None:
    """Kubernetes or prometheus-operator schema, plus the name and label rules."""
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        errors = sorted(crd_validator(doc["kind"]).iter_errors(doc), key=str)
        assert not errors, f"{where}: " + "; ".join(
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors
        )
    else:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{where} against Kubernetes {version}: {path}: {exc.message}")
    metadata = doc["metadata"]
    assert len(metadata["name"]) <= 63, where
    assert DNS_LABEL.match(metadata["name"]) or DNS_SUBDOMAIN.match(metadata["name"]), where
    for key, value in metadata.get("labels", {}).items():
        assert isinstance(value, str), f"{where}: label {key} is not a string"
        assert len(value) <= 63, f"{where}: label {key}={value!r}"
        assert LABEL_VALUE.match(value), f"{where}: label {key}={value!r}"


def containers(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["spec"]["template"]["spec"]["containers"]}


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )


def check_config(config_text: str, container: dict[str, Any], tmp_path: Path) -> str:
    """`stocksentry check-config` on the rendered config with the container's Secret-fed
    environment filled with dummy URLs; returns its output."""
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    for item in container.get("env", []):
        secret = item.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None:
            kind = "redis" if "REDIS" in item["name"] else "database"
            env[item["name"]] = DUMMY_URLS[kind]
    path = tmp_path / "config.yaml"
    path.write_text(config_text, encoding="utf-8")
    done = run(sys.executable, "-m", "stocksentry.exporter", "check-config", path, env=env)
    assert done.returncode == 0, f"check-config failed:\n{config_text}\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def example_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example application chart with this chart in charts/, as `helm dependency
    build` would leave it (without the archive)."""
    app = tmp_path_factory.mktemp("example") / "checkout"
    shutil.copytree(EXAMPLE, app)
    shutil.copytree(
        CHART, app / "charts" / "stocksentry", ignore=shutil.ignore_patterns("examples")
    )
    return app


# --- generated files --------------------------------------------------------------------


def test_generated_files_are_fresh() -> None:
    """Rules and dashboard copies and values.schema.json match what helm/sync.py builds."""
    done = run(sys.executable, "helm/sync.py", "--check")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done.stdout + done.stderr


def test_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


# --- lint and render ----------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_lint_strict(case: str) -> None:
    report = helm_python.lint(
        CHART, merge(SHOP, case_values(case)), strict=True, namespace=NAMESPACE
    )
    findings = [m for m in report["messages"] if m["severity"] >= 2]
    assert (report["errors"], findings) == ([], []), report


@pytest.mark.parametrize("case", CASES)
def test_render_validates(case: str) -> None:
    _, docs = render(case_values(case))
    kinds: dict[str, int] = {}
    for doc in docs:
        kinds[doc["kind"]] = kinds.get(doc["kind"], 0) + 1
        validate_manifest(doc)
    assert kinds == EXPECTED_KINDS[case]
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names))
    namespaces = {d["metadata"]["namespace"] for d in docs}
    assert namespaces <= {NAMESPACE, "monitoring"}


@pytest.fixture(scope="module")
def include_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throw-away parent chart whose one template includes a named template of this
    chart with its scope: `{{ include NAME .Subcharts.stocksentry }}`."""
    parent = tmp_path_factory.mktemp("include") / "probe"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: probe\nversion: 0.1.0\n"
        "dependencies:\n  - name: stocksentry\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text("template: stocksentry.sidecar.container\n")
    (parent / "templates" / "out.yaml").write_text(
        "{{- include .Values.template .Subcharts.stocksentry }}\n"
    )
    shutil.copytree(
        CHART, parent / "charts" / "stocksentry", ignore=shutil.ignore_patterns("examples")
    )
    return parent


def render_include(chart: Path, name: str, values: dict[str, Any]) -> str:
    raw, _ = render({"template": name, "stocksentry": values}, chart)
    return raw["probe/templates/out.yaml"]


@pytest.mark.parametrize("case", CASES)
def test_exporter_config_passes_check_config(
    case: str, tmp_path: Path, include_chart: Path
) -> None:
    values = case_values(case)
    if values.get("mode") == "sidecar":
        # The multiprocess directory must exist where check-config runs.
        values = merge(values, {"sidecar": {"multiprocessDir": str(tmp_path)}})
    _, docs = render(values)
    config_map = one(docs, "ConfigMap", f"{RELEASE}-stocksentry")
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    if deployments:
        container = containers(deployments[0])["exporter"]
    else:
        text = render_include(include_chart, "stocksentry.sidecar.container", values)
        container = yaml.safe_load(text)[0]
    out = check_config(config_map["data"]["config.yaml"], container, tmp_path)
    assert out.startswith(f"{tmp_path / 'config.yaml'}: ok\n")
    assert "database probes: negative_stock" in out


# --- what the defaults promise ------------------------------------------------------------


def test_prober_secure_defaults() -> None:
    raw, docs = render({})
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    exporter = containers(deployment)["exporter"]
    security = exporter["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["runAsNonRoot"] is True
    assert set(exporter["resources"]) == {"requests", "limits"}
    assert set(exporter["resources"]["limits"]) == {"cpu", "memory"}
    assert exporter["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "metrics",
        "scheme": "HTTP",
    }
    assert exporter["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert exporter["args"] == ["exporter", "--config=/etc/stocksentry/config/config.yaml"]
    assert exporter["ports"] == [{"name": "metrics", "containerPort": 19464, "protocol": "TCP"}]
    # The URL comes from the Secret, through the variable the config names.
    assert exporter["env"] == [
        {
            "name": "STOCKSENTRY_DATABASE_URL",
            "valueFrom": {
                "secretKeyRef": {"name": f"{RELEASE}-stocksentry-database", "key": "url"}
            },
        }
    ]
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    assert config["database"]["url_env"] == "STOCKSENTRY_DATABASE_URL"
    assert config["server"] == {"listen_address": "0.0.0.0", "port": 19464}  # noqa: S104
    # checksum/config is the hash of the rendered ConfigMap: a config change restarts.
    annotation = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    text = raw["stocksentry/templates/configmap.yaml"]
    assert annotation == hashlib.sha256(text.encode()).hexdigest()
    _, changed = render({"config": {"sku_guard": {"max_skus": 5}}})
    new = one(changed, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert new["checksum/config"] != annotation


def test_default_config_is_the_exporters_default(tmp_path: Path) -> None:
    """values.yaml's `config` spells out the exporter's own defaults, nothing else (with
    the allocation every install must set)."""
    from stocksentry.exporter.config import parse_config

    _, docs = render({})
    environ = {"STOCKSENTRY_DATABASE_URL": DUMMY_URLS["database"]}
    rendered = parse_config(one(docs, "ConfigMap")["data"]["config.yaml"], environ=environ)
    bare = parse_config(
        "database: {url_env: STOCKSENTRY_DATABASE_URL}\n"
        "schema: {products: {allocation: initial_stock}}\n",
        environ=environ,
        base_dir=tmp_path,
    )
    for section in ("sku_guard", "database", "schema", "probes", "redis"):
        assert getattr(rendered, section) == getattr(bare, section), section
    assert rendered.database is not None
    assert rendered.database.url_source == "env STOCKSENTRY_DATABASE_URL"


def test_prometheus_rule_is_the_rules_file(tmp_path: Path) -> None:
    _, docs = render({"prometheusRule": {"enabled": True}})
    rule = one(docs, "PrometheusRule")
    source = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
    assert rule["spec"]["groups"] == source["groups"]
    path = tmp_path / "rendered.rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not on PATH: `make tools` installs it"
    done = run(promtool, "check", "rules", path)
    count = sum(len(group["rules"]) for group in source["groups"])
    assert (done.returncode, done.stdout.strip()) == (
        0,
        f"Checking {path}\n  SUCCESS: {count} rules found",
    ), done.stdout + done.stderr


def test_dashboards_are_the_built_json() -> None:
    _, docs = render({"dashboards": {"enabled": True}})
    maps = {
        d["metadata"]["name"]: d for d in docs if "grafana_dashboard" in d["metadata"]["labels"]
    }
    files = sorted((ROOT / "dashboards").glob("*.json"))
    assert sorted(maps) == [
        f"{RELEASE}-stocksentry-dashboard-{p.stem.removeprefix('stocksentry-')}" for p in files
    ]
    for source in files:
        name = f"{RELEASE}-stocksentry-dashboard-{source.stem.removeprefix('stocksentry-')}"
        config_map = maps[name]
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "stocksentry"}
        assert json.loads(config_map["data"][source.name]) == json.loads(source.read_text())
    _, custom = render(case_values("dashboards-values.yaml"))
    labelled = [d for d in custom if d["metadata"]["labels"].get("grafana_dashboard")]
    assert {d["metadata"]["labels"]["grafana_dashboard"] for d in labelled} == {"stocksentry"}
    assert {d["metadata"]["namespace"] for d in labelled} == {"monitoring"}


def test_monitors_scrape_what_the_chart_serves() -> None:
    _, docs = render(case_values("servicemonitor-values.yaml"))
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert [p["name"] for p in service["spec"]["ports"]] == [
        monitor["spec"]["endpoints"][0]["port"]
    ]
    _, docs = render(case_values("podmonitor-values.yaml"))
    monitor, deployment = one(docs, "PodMonitor"), one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    _, docs = render(case_values("webconfig-values.yaml"))
    exporter = containers(one(docs, "Deployment"))["exporter"]
    assert "--web.config.file=/etc/stocksentry/web/web-config.yml" in exporter["args"]
    assert exporter["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert one(docs, "ServiceMonitor")["spec"]["endpoints"][0]["scheme"] == "https"


def test_long_release_names_stay_within_63_characters() -> None:
    name = "a-very-long-release-name-for-a-flash-sale-checkout-stack-x"
    with helm_python.Chart.load(CHART) as chart:
        values = merge(SHOP, {"dashboards": {"enabled": True}})
        raw = chart.render(values, name=name, namespace=NAMESPACE)
    docs = [
        d
        for p, t in raw.items()
        if not p.endswith("NOTES.txt")
        for d in yaml.safe_load_all(t)
        if d
    ]
    names = sorted(d["metadata"]["name"] for d in docs)
    assert all(len(n) <= 63 and DNS_LABEL.match(n) for n in names), names
    assert len({(d["kind"], d["metadata"]["name"]) for d in docs}) == len(docs)
    assert any(n.endswith("-dashboard-overview") for n in names)


# --- the sidecar ------------------------------------------------------------------------


def test_example_app_with_sidecar(example_chart: Path, tmp_path: Path) -> None:
    report = helm_python.lint(example_chart, {}, strict=True, with_subcharts=True)
    assert (report["errors"], [m for m in report["messages"] if m["severity"] >= 2]) == ([], [])
    values = {"stocksentry": {"sidecar": {"multiprocessDir": str(tmp_path)}}}
    raw, docs = render(values, example_chart)
    for doc in docs:
        validate_manifest(doc)
    app = one(docs, "Deployment")
    pod = app["spec"]["template"]
    checkout, sidecar = containers(app)["checkout"], containers(app)["stocksentry"]
    # The app writes the multiprocess directory, the sidecar reads it (read-only).
    assert {"name": "PROMETHEUS_MULTIPROC_DIR", "value": str(tmp_path)} in checkout["env"]
    assert {"name": "stocksentry-multiproc", "mountPath": str(tmp_path)} in checkout[
        "volumeMounts"
    ]
    assert {
        "name": "stocksentry-multiproc",
        "mountPath": str(tmp_path),
        "readOnly": True,
    } in sidecar["volumeMounts"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes["stocksentry-multiproc"]
    assert volumes["stocksentry-config"]["configMap"]["name"] == f"{RELEASE}-stocksentry"
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    # Restarts on a config change.
    text = raw["checkout/charts/stocksentry/templates/configmap.yaml"]
    assert pod["metadata"]["annotations"]["checksum/stocksentry-config"] == (
        hashlib.sha256(text.encode()).hexdigest()
    )
    # The PodMonitor scrapes the sidecar's port on the app's pods.
    monitor = one(docs, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
    assert port in [p["name"] for p in sidecar["ports"]]
    # The sidecar config: the app's directory, no pid checks across PID namespaces.
    config_text = one(docs, "ConfigMap", f"{RELEASE}-stocksentry")["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    assert config["server"]["multiprocess_dir"] == str(tmp_path)
    assert config["server"]["check_worker_pids"] is False
    assert config["database"]["leader_election"] is True
    out = check_config(config_text, sidecar, tmp_path)
    assert f"multiprocess dir: {tmp_path}" in out
    assert one(docs, "PrometheusRule")["spec"]["groups"]
    # The pods, their Service and the rest belong to the app: only its own are there.
    workloads = [(d["kind"], d["metadata"]["name"]) for d in docs if "spec" in d]
    assert sorted(k for k, _ in workloads if k in ("Deployment", "Service")) == [
        "Deployment",
        "Service",
    ]


def test_sidecar_compaction_mounts_the_directory_writable(
    example_chart: Path, tmp_path: Path
) -> None:
    values = {
        "stocksentry": {
            "sidecar": {
                "multiprocessDir": str(tmp_path),
                "checkWorkerPids": True,
                "compactDeadWorkers": True,
            }
        }
    }
    _, docs = render(values, example_chart)
    sidecar = containers(one(docs, "Deployment"))["stocksentry"]
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "stocksentry-multiproc")
    assert mount["readOnly"] is False  # compaction renames and writes files there
    config_text = one(docs, "ConfigMap", f"{RELEASE}-stocksentry")["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    assert config["server"]["compact_dead_workers"] is True
    assert config["server"]["check_worker_pids"] is True
    out = check_config(config_text, sidecar, tmp_path)
    assert f"multiprocess dir: {tmp_path}" in out


def test_sidecar_templates_refuse_prober_mode(example_chart: Path) -> None:
    message = render_error(
        {"stocksentry": {"mode": "prober", "podMonitor": {"enabled": False, "selector": None}}},
        example_chart,
    )
    assert "need the stocksentry chart in mode: sidecar" in message


# --- bad values -----------------------------------------------------------------------------

BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("wrong type", {"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
    ("typo'd key", {"serviceMonitr": {"enabled": True}}, "additional properties 'serviceMonitr'"),
    (
        "typo in the exporter config",
        {"config": {"schema": {"products": {"stok": "qty"}}}},
        "at '/config/schema/products': additional properties 'stok' not allowed",
    ),
    (
        "enum",
        {"config": {"probes": {"oversold": {"scope": "hot"}}}},
        "at '/config/probes/oversold/scope': value must be one of 'all', 'promo'",
    ),
    ("mode enum", {"mode": "daemonset"}, "at '/mode': value must be one of 'prober', 'sidecar'"),
    (
        "duration",
        {"config": {"probes": {"defaults": {"interval": "fast"}}}},
        "at '/config/probes/defaults/interval': 'fast' does not match pattern",
    ),
    (
        "secret in values",
        {"config": {"database": {"url": "postgresql://u:p@db/shop"}}},
        "at '/config/database': additional properties 'url' not allowed",
    ),
    (
        "numeric SKU",
        {"config": {"sku_guard": {"promo_skus": [12]}}},
        "at '/config/sku_guard/promo_skus/0': got number, want string",
    ),
    (
        "two monitors",
        {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
        "serviceMonitor.enabled and podMonitor.enabled are both true",
    ),
    (
        "sidecar setting in prober mode",
        {"sidecar": {"checkWorkerPids": True}},
        "sidecar.checkWorkerPids applies to mode: sidecar only",
    ),
    (
        "app selector in prober mode",
        {"podMonitor": {"enabled": True, "selector": {"app": "checkout"}}},
        "podMonitor.selector is for mode: sidecar",
    ),
    (
        "prober without database",
        {"database": {"enabled": False}},
        "mode: prober needs database.enabled: true",
    ),
    (
        "replicas without election",
        {"replicaCount": 2, "config": {"database": {"leader_election": False}}},
        "replicaCount: 2 with config.database.leader_election: false",
    ),
    (
        "pdb blocking drains",
        {"podDisruptionBudget": {"enabled": True, "minAvailable": 1}},
        "podDisruptionBudget.minAvailable: 1 with replicaCount: 1 would block every node drain",
    ),
    (
        "pdb both bounds",
        {
            "replicaCount": 3,
            "podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1},
        },
        "give minAvailable or maxUnavailable, not both",
    ),
    (
        "servicemonitor in sidecar mode",
        {"mode": "sidecar", "serviceMonitor": {"enabled": True}},
        "serviceMonitor.enabled in mode: sidecar",
    ),
    (
        "podmonitor without selector in sidecar mode",
        {"mode": "sidecar", "podMonitor": {"enabled": True}},
        "podMonitor.enabled in mode: sidecar needs podMonitor.selector",
    ),
    (
        "networkpolicy in sidecar mode",
        {"mode": "sidecar", "networkPolicy": {"enabled": True}},
        "networkPolicy.enabled in mode: sidecar",
    ),
    (
        "no election in sidecar mode",
        {"mode": "sidecar", "config": {"database": {"leader_election": False}}},
        "config.database.leader_election: false in mode: sidecar",
    ),
    (
        "compaction without the pid namespace",
        {"mode": "sidecar", "sidecar": {"compactDeadWorkers": True}},
        "sidecar.compactDeadWorkers needs sidecar.checkWorkerPids: true",
    ),
    (
        "compaction in prober mode",
        {"sidecar": {"compactDeadWorkers": True}},
        "sidecar.compactDeadWorkers applies to mode: sidecar only",
    ),
    (
        "tls without secret",
        {"webConfig": {"tls": True}},
        "webConfig.tls: true needs webConfig.existingSecret",
    ),
    (
        "tls scraped over http",
        {
            "webConfig": {"tls": True, "existingSecret": "web"},
            "serviceMonitor": {"enabled": True, "scheme": "http"},
        },
        "serviceMonitor.scheme: http with webConfig.tls: true",
    ),
]


@pytest.mark.parametrize(
    ("values", "message"),
    [pytest.param(v, m, id=name) for name, v, m in BAD_VALUES],
)
def test_bad_values_fail_clearly(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_the_exporters_example_config_fits_the_schema(tmp_path: Path) -> None:
    """exporter/config.example.yaml, minus what the chart owns, is valid chart values and
    renders to a config check-config accepts: the schema follows the exporter's model."""
    example = yaml.safe_load((ROOT / "exporter" / "config.example.yaml").read_text())
    example.pop("server")
    example["database"].pop("url_env")
    example["redis"].pop("url_env")
    # Helm drops nulls; "" is the chart's spelling of "not mapped".
    example["schema"]["orders"]["idempotency_key"] = ""
    values = {"config": example, "redis": {"enabled": True}}
    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(chart.merge_values(values))
    _, docs = render(values)
    container = containers(one(docs, "Deployment"))["exporter"]
    out = check_config(one(docs, "ConfigMap")["data"]["config.yaml"], container, tmp_path)
    assert "recent_paid_orders" in out
    assert "redis: cache_drift on promo SKUs" in out


def iter_schema_objects(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, Any]]:
    if schema.get("type") == "object" or "properties" in schema:
        yield path, schema
        for key, sub in schema.get("properties", {}).items():
            yield from iter_schema_objects(sub, f"{path}.{key}")


def test_schema_refuses_unknown_keys_in_every_section() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects = [
        path
        for path, sub in iter_schema_objects(schema)
        if "properties" in sub and sub.get("additionalProperties") is not False
    ]
    assert open_objects == []


# --- the health alerts under prometheus-operator ---------------------------------------------
#
# What prometheus-operator makes of a ServiceMonitor endpoint or PodMonitor
# podMetricsEndpoint, as its config generator writes it (prometheus-operator,
# pkg/prometheus/promcfg.go, generateServiceMonitorConfig / generatePodMonitorConfig, e.g.
# at commit 4d3991d5604ad6a01179c2b9ebbdca5efa331213; later releases build the same list):
# after keeping the selected targets, its own relabelings set `namespace` (from
# __meta_kubernetes_namespace), `service` (ServiceMonitor only, the Service's name), `pod`,
# `container`, then `job` = the Service's name (ServiceMonitor) or
# "<namespace>/<PodMonitor name>" (PodMonitor), replaced by the value of the Service's /
# pod's label `spec.jobLabel` when that is set and non-empty, then `endpoint` = the port
# name; the endpoint's own `relabelings` come after all of these, in order (then only the
# enforced namespace label and the sharding hashmod). `instance` is Prometheus's default,
# the target address. So a relabeling of the endpoint that sets `job` has the last word.

_TARGET_ADDRESS = "10.42.0.17"


def _expand(replacement: str, match: re.Match[str]) -> str:
    """Prometheus's $1 / ${1} / ${name} expansion of a relabel replacement."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\d+)",
        lambda m: match.group(int(m.group(2)) if m.group(2) else m.group(1)) or "",
        replacement,
    )


def relabel(labels: dict[str, str], config: dict[str, Any]) -> dict[str, str] | None:
    """One relabel_config (operator field names) applied as Prometheus does; None: dropped."""
    action = config.get("action", "replace").lower()
    value = config.get("separator", ";").join(
        labels.get(name, "") for name in config.get("sourceLabels", [])
    )
    regex = re.compile(config.get("regex", "(.*)"))
    match = regex.fullmatch(value)
    if action == "replace":
        if match is not None:
            target = _expand(config["targetLabel"], match)
            result = _expand(config.get("replacement", "$1"), match)
            labels = (
                {**labels, target: result}
                if result
                else {k: v for k, v in labels.items() if k != target}
            )
        return labels
    if action == "keep":
        return labels if match is not None else None
    if action == "drop":
        return None if match is not None else labels
    raise AssertionError(f"relabel action {action!r} is not modelled here")


def operator_target_labels(
    monitor: dict[str, Any], *, service: str, pod: str, container: str, port: int
) -> dict[str, str]:
    """The labels of the scraped series of one target of ``monitor`` (model above)."""
    kind = monitor["kind"]
    spec = monitor["spec"]
    endpoint = (spec["endpoints"] if kind == "ServiceMonitor" else spec["podMetricsEndpoints"])[0]
    namespace = spec["namespaceSelector"]["matchNames"][0]
    labels: dict[str, str] = {
        "__address__": f"{_TARGET_ADDRESS}:{port}",
        "namespace": namespace,
        "pod": pod,
        "container": container,
    }
    if kind == "ServiceMonitor":
        labels["service"] = service
        labels["job"] = service
    else:
        labels["job"] = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    if spec.get("jobLabel"):
        raise AssertionError("the chart sets no jobLabel; model it before relying on it")
    labels["endpoint"] = endpoint["port"]
    for config in endpoint.get("relabelings", []):
        relabelled = relabel(labels, config)
        assert relabelled is not None, f"the monitor's relabeling drops the target: {config}"
        labels = relabelled
    labels.setdefault("instance", labels["__address__"])
    return {k: v for k, v in labels.items() if not k.startswith("__")}


#: The three ways the chart is scraped, with the target's pod and Service as Kubernetes
#: would name them.
MONITOR_CASES = {
    "prober, ServiceMonitor": {"serviceMonitor": {"enabled": True}},
    "prober, PodMonitor": {"podMonitor": {"enabled": True}},
    "sidecar, PodMonitor": merge(
        case_values("sidecar-values.yaml"), {"dashboards": {"enabled": False}}
    ),
}


def _monitor_labels(values: dict[str, Any], drop_job_relabeling: bool = False) -> dict[str, str]:
    _, docs = render(values)
    monitor = copy.deepcopy(next(d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")))
    if drop_job_relabeling:  # the chart as it was: no relabeling of job
        for endpoint in monitor["spec"].get(
            "endpoints", monitor["spec"].get("podMetricsEndpoints")
        ):
            endpoint["relabelings"] = [
                r for r in endpoint["relabelings"] if r.get("targetLabel") != "job"
            ]
    sidecar = values.get("mode") == "sidecar"
    _, prober_docs = render({})
    container = next(iter(containers(one(prober_docs, "Deployment"))))
    return operator_target_labels(
        monitor,
        service=f"{RELEASE}-stocksentry",
        pod="checkout-7d9f8b6c5-x2x9q" if sidecar else f"{RELEASE}-stocksentry-5f7c9d8b4-k2p7m",
        container=container,
        port=int(values.get("port", 19464)),
    )


def _series(labels: dict[str, str]) -> str:
    return "up{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _health_test(
    labels: dict[str, str], *, summary: str, description: str, runbooks: str = RUNBOOKS
) -> list[dict[str, Any]]:
    """promtool test groups: the target down from 0 (fires at 2m), and up (quiet)."""
    down = {**labels, "severity": "critical", "team": "sre"}
    runbook = f"{runbooks}/StocksentryExporterDown.md"
    return [
        {
            "name": "down: StocksentryExporterDown fires with the target's labels",
            "interval": "1m",
            "external_labels": {"cluster": "eu-1"},
            "input_series": [{"series": _series(labels), "values": "0x15"}],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "StocksentryExporterDown", "exp_alerts": []},
                {
                    "eval_time": "2m",
                    "alertname": "StocksentryExporterDown",
                    "exp_alerts": [
                        {
                            "exp_labels": down,
                            "exp_annotations": {
                                "summary": summary,
                                "description": description,
                                "runbook_url": runbook,
                            },
                        }
                    ],
                },
                {"eval_time": "15m", "alertname": "StocksentryMetricsAbsent", "exp_alerts": []},
            ],
        },
        {
            "name": "up: both health alerts are quiet",
            "interval": "1m",
            "input_series": [{"series": _series(labels), "values": "1x15"}],
            "alert_rule_test": [
                {"eval_time": "15m", "alertname": "StocksentryExporterDown", "exp_alerts": []},
                {"eval_time": "15m", "alertname": "StocksentryMetricsAbsent", "exp_alerts": []},
            ],
        },
    ]


def _promtool_test(
    tmp_path: Path, groups: list[dict[str, Any]], tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not on PATH: `make tools` installs it"
    rules = tmp_path / "rendered.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    test = tmp_path / "health_test.yml"
    test.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rules)],
                "evaluation_interval": "1m",
                "group_eval_order": [g["name"] for g in groups],
                "tests": tests,
            }
        ),
        encoding="utf-8",
    )
    return run(promtool, "test", "rules", test)


@pytest.mark.parametrize("case", sorted(MONITOR_CASES))
def test_health_alerts_see_the_targets_the_chart_monitors(case: str, tmp_path: Path) -> None:
    """Finding: with job = the Service name or "<ns>/<podmonitor>", ExporterDown never fired
    and MetricsAbsent fired for ever. The monitors now set job=scrapeJob last."""
    values = merge(MONITOR_CASES[case], {"prometheusRule": {"enabled": True}})
    labels = _monitor_labels(values)
    assert labels["job"] == "stocksentry"
    assert labels["namespace"] == NAMESPACE
    _, docs = render(values)
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    instance = labels["instance"]
    done = _promtool_test(
        tmp_path,
        groups,
        _health_test(
            labels,
            runbooks=merge(SHOP, values)["links"]["runbookBaseUrl"],
            # In-cluster evaluation: the cluster comes from Prometheus's external labels.
            summary=(
                f"stocksentry exporter {instance} is down in cluster eu-1, namespace {NAMESPACE}."
            ),
            description=(
                f"Prometheus cannot scrape {instance}: stock invariants (negative stock,"
                " oversell, duplicates) are not being watched."
            ),
        ),
    )
    assert (done.returncode, done.stdout.strip()) == (
        0,
        f"Unit Testing:  {tmp_path / 'health_test.yml'}\n  SUCCESS",
    ), done.stdout + done.stderr


@pytest.mark.parametrize("case", sorted(MONITOR_CASES))
def test_without_the_job_relabeling_the_health_alerts_were_wrong(
    case: str, tmp_path: Path
) -> None:
    """The same promtool test, on the labels the operator gives without the chart's
    relabeling, fails the way the finding says: no ExporterDown, and MetricsAbsent."""
    values = merge(MONITOR_CASES[case], {"prometheusRule": {"enabled": True}})
    labels = _monitor_labels(values, drop_job_relabeling=True)
    expected_job = (
        f"{RELEASE}-stocksentry"
        if "ServiceMonitor" in case
        else f"{NAMESPACE}/{RELEASE}-stocksentry"
    )
    assert labels["job"] == expected_job
    _, docs = render(values)
    done = _promtool_test(
        tmp_path,
        one(docs, "PrometheusRule")["spec"]["groups"],
        _health_test(labels, summary="", description=""),
    )
    assert done.returncode == 1
    assert "alertname: StocksentryExporterDown, time: 2m" in done.stderr, done.stderr
    assert "alertname: StocksentryMetricsAbsent, time: 15m" in done.stderr, done.stderr


def test_scrape_job_is_one_value_for_monitors_and_rules(tmp_path: Path) -> None:
    values = {
        "scrapeJob": "shop-stocksentry",
        "serviceMonitor": {
            "enabled": True,
            # a user relabeling of job comes before the chart's: the rules still match
            "relabelings": [{"targetLabel": "job", "replacement": "other", "action": "replace"}],
        },
        "prometheusRule": {"enabled": True},
    }
    labels = _monitor_labels(values)
    assert labels["job"] == "shop-stocksentry"
    _, docs = render(values)
    alerts = {
        r["alert"]: r
        for g in one(docs, "PrometheusRule")["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert alerts["StocksentryExporterDown"]["expr"] == 'up{job="shop-stocksentry"} == 0'
    assert alerts["StocksentryMetricsAbsent"]["expr"] == 'absent(up{job="shop-stocksentry"})'


# --- rule customisation from values ----------------------------------------------------------

sys.path.insert(0, str(ROOT / "alert_rules"))
import render as rules_render  # noqa: E402 - alert_rules/render.py, a script beside the rules

RULE_TESTS = sorted((ROOT / "alert_rules" / "tests").glob("*.yml"))


def _rule_groups(values: dict[str, Any]) -> list[dict[str, Any]]:
    _, docs = render(merge({"prometheusRule": {"enabled": True}}, values))
    groups: list[dict[str, Any]] = one(docs, "PrometheusRule")["spec"]["groups"]
    return groups


def _rules_by_name(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(r.get("alert") or r.get("record")): r for g in groups for r in g["rules"]}


def test_rule_unit_tests_pass_on_the_rendered_rules(tmp_path: Path) -> None:
    """alert_rules/tests/*.yml, pointed at the chart's PrometheusRule instead of the file.

    Rendered with a third location label: the tests' series carry none of them, so the
    alerts, their labels and summaries are those the tests expect. (With the defaults the
    chart renders exactly the committed file, which tests/integration/test_promtool.py
    runs these tests on: test_prometheus_rule_is_the_rules_file.) One promtool per file,
    two at a time: the files with days of history take most of a minute each.
    """
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is not on PATH: `make tools` installs it"
    rules = tmp_path / "chart.rules.yml"
    groups = _rule_groups({"locationLabels": ["region", "cluster", "namespace"]})
    assert "sum by (region, cluster, namespace, sku)" in yaml.safe_dump(groups)
    rules.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    check = run(promtool, "check", "rules", rules)
    assert check.returncode == 0, check.stdout + check.stderr
    for source in RULE_TESTS:
        doc = yaml.safe_load(source.read_text(encoding="utf-8"))
        doc["rule_files"] = [str(rules)]
        (tmp_path / source.name).write_text(yaml.safe_dump(doc), encoding="utf-8")

    def one_file(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [promtool, "test", "rules", name],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(RULE_TESTS, pool.map(one_file, [p.name for p in RULE_TESTS]), strict=True))
    failed = {p.name: r.stdout + r.stderr for p, r in runs.items() if r.returncode != 0}
    assert failed == {}


def test_chart_and_render_py_agree_on_every_placeholder() -> None:
    options = rules_render.Options(
        location_labels=("region", "namespace"),
        job="shop-stocksentry",
        runbook_base="https://git.shop.example/sre/runbooks",
        dashboard_base="https://grafana.shop.example/",
    )
    source = (ROOT / "alert_rules" / "source" / "stocksentry.rules.yml").read_text(
        encoding="utf-8"
    )
    expected = yaml.safe_load(rules_render.render(source, options))["groups"]
    groups = _rule_groups(
        {
            "locationLabels": ["region", "namespace"],
            "scrapeJob": "shop-stocksentry",
            "links": {
                "runbookBaseUrl": "https://git.shop.example/sre/runbooks",
                "dashboardBaseUrl": "https://grafana.shop.example/",
            },
        }
    )
    assert groups == expected


CUSTOM_RULES = {
    "links": {"dashboardBaseUrl": "https://grafana.shop.example"},
    "prometheusRule": {
        "disabled": {"StockCacheDrift": True, "StockStaleCacheDecisions": True},
        "additionalRuleLabels": {"owner": "shop-sre", "team": "ignored"},
        "additionalRuleAnnotations": {"playbook": "https://wiki.shop.example/sale"},
        "customRules": {
            "StockOutboxLag": {
                "severity": "critical",
                "for": "2m",
                "labels": {"team": "platform"},
            }
        },
        "settings": {
            "outbox_lag_seconds": 120,
            "promo_active": "max(shop_promo_running) or on() vector(0)",
        },
    },
}


def test_rules_follow_the_values(tmp_path: Path) -> None:
    groups = _rule_groups(CUSTOM_RULES)
    rules = _rules_by_name(groups)
    assert "StockCacheDrift" not in rules
    assert "StockStaleCacheDecisions" not in rules
    default = _rules_by_name(_rule_groups({}))
    assert set(default) - set(rules) == {"StockCacheDrift", "StockStaleCacheDecisions"}
    oversold = rules["StockOversold"]
    # an alert's own labels win over additionalRuleLabels; customRules win over both
    assert oversold["labels"] == {"severity": "critical", "team": "checkout", "owner": "shop-sre"}
    assert oversold["annotations"]["playbook"] == "https://wiki.shop.example/sale"
    assert oversold["annotations"]["dashboard_url"] == (
        "https://grafana.shop.example/d/stocksentry-sku?var-sku={{ $labels.sku | urlquery }}"
    )
    assert rules["stocksentry:threshold:outbox_lag_seconds"]["expr"] == "vector(120)"
    assert rules["stocksentry:promo_active"]["expr"] == "max(shop_promo_running) or on() vector(0)"
    # The rendered rules load, and the customised alert behaves as the values say: a lag
    # of 90 s is quiet (the default 30 s would fire), 150 s fires after 2m, as critical,
    # with the extra label and annotation.
    lag = (
        'stock_outbox_lag_seconds{cluster="a",namespace="shop",instance="p:9184",'
        'job="stocksentry"}'
    )
    tests = [
        {
            "name": "outbox lag with the chart's threshold and labels",
            "interval": "1m",
            "input_series": [{"series": lag, "values": "90x10 150x10"}],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "StockOutboxLag", "exp_alerts": []},
                {"eval_time": "12m", "alertname": "StockOutboxLag", "exp_alerts": []},
                {
                    "eval_time": "13m",
                    "alertname": "StockOutboxLag",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "critical",
                                "team": "platform",
                                "owner": "shop-sre",
                                "cluster": "a",
                                "namespace": "shop",
                            },
                            "exp_annotations": {
                                "summary": (
                                    "Outbox events are 2m 30s behind in cluster a, namespace shop."
                                ),
                                "description": (
                                    "The oldest unpublished outbox event is 2m 30s old,"
                                    " beyond the publish latency the outbox may take: the"
                                    " publisher is stuck and order or stock events are not"
                                    " reaching other systems. The sidecar's log line"
                                    ' "outbox stuck" names how many events wait and the'
                                    " oldest one's id."
                                ),
                                "runbook_url": "https://github.com/stocksentry/stocksentry/blob/main/docs/runbooks/StockOutboxLag.md",
                                "dashboard_url": "https://grafana.shop.example/d/stocksentry-overview",
                                "playbook": "https://wiki.shop.example/sale",
                            },
                        }
                    ],
                },
            ],
        }
    ]
    done = _promtool_test(tmp_path, groups, tests)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prometheusRule": {"disabled": {"StockNoSuchAlert": True}}}, "invalid propertyName"),
        (
            {"prometheusRule": {"settings": {"no_such_threshold": 1}}},
            "'no_such_threshold' not allowed",
        ),
        (
            {"prometheusRule": {"settings": {"conflict_ratio": "0.3"}}},
            "/prometheusRule/settings/conflict_ratio",
        ),
        ({"prometheusRule": {"customRules": {"StockOversold": {"for": "soon"}}}}, "for"),
        ({"locationLabels": []}, "/locationLabels"),
        ({"locationLabels": ["cluster", "sku"]}, "/locationLabels/1"),
        ({"locationLabels": ["cluster", "cluster"]}, "/locationLabels"),
        ({"links": {"runbookBaseUrl": "git.shop.example/runbooks"}}, "/links/runbookBaseUrl"),
        ({"links": {"dashboardBaseUrl": "grafana"}}, "/links/dashboardBaseUrl"),
        ({"scrapeJob": 'a"b'}, "/scrapeJob"),
    ],
)
def test_bad_rule_values_fail_clearly(values: dict[str, Any], message: str) -> None:
    assert message in render_error(merge({"prometheusRule": {"enabled": True}}, values))


@pytest.mark.parametrize("part", ["prometheusRule", "dashboards"])
def test_rules_and_dashboards_need_a_runbook_base(part: str) -> None:
    values = merge(SHOP, {part: {"enabled": True}, "links": {"runbookBaseUrl": ""}})
    message = render_error(values, shop=False)
    assert f"links.runbookBaseUrl is required with {part}.enabled" in message
    assert message.count("\n") <= 1
    # Without either, nothing links a runbook: the default install needs no base.
    _, docs = render({"links": {"runbookBaseUrl": ""}})
    assert "PrometheusRule" not in {d["kind"] for d in docs}


def test_dashboards_link_the_runbook_base_of_the_values() -> None:
    base = "https://git.shop.example/sre/runbooks"
    _, docs = render({"dashboards": {"enabled": True}, "links": {"runbookBaseUrl": base + "/"}})
    maps = [d for d in docs if "grafana_dashboard" in d["metadata"]["labels"]]
    assert len(maps) == 3
    for config_map in maps:
        (text,) = config_map["data"].values()
        board = json.loads(text)
        links = re.findall(r"https?://[^\s\"()\]]+\.md", text)
        assert links, config_map["metadata"]["name"]
        assert all(link.startswith(base + "/") for link in links), links
        assert board["uid"].startswith("stocksentry-")
    assert "github.com/stocksentry" not in json.dumps([m["data"] for m in maps])


# --- the headline alert can fire -----------------------------------------------------------


def test_the_chart_refuses_to_render_without_the_allocation() -> None:
    message = render_error({}, shop=False)
    assert "config.schema.products.allocation is empty" in message
    assert "StockOversold could never fire" in message
    assert "config.probes.oversold.enabled: false" in message


def test_opting_out_of_the_oversold_probe_renders_it_off() -> None:
    raw = render_raw({"config": {"probes": {"oversold": {"enabled": False}}}}, shop=False)
    config = yaml.safe_load(
        yaml.safe_load(raw["stocksentry/templates/configmap.yaml"])["data"]["config.yaml"]
    )
    assert config["probes"]["oversold"]["enabled"] is False


def test_a_sidecar_without_the_database_needs_no_allocation() -> None:
    raw = render_raw({"mode": "sidecar", "database": {"enabled": False}}, shop=False)
    assert "stocksentry/templates/configmap.yaml" in raw
