"""A real Prometheus for integration tests: start, scrape, evaluate rules, query, stop.

:class:`Prometheus` runs ``/usr/bin/prometheus`` (or ``$PROMETHEUS``) on a free loopback
port with a throw-away storage directory, a 1 s scrape and evaluation interval by default,
optional rule files and an optional Alertmanager. It is a context manager; on exit the
process is terminated, waited for, and killed if it does not stop in time.

Example (a dashboard or alerting end-to-end test)::

    from prom import Prometheus, free_port

    with Prometheus(
        targets={"stocksentry": [f"127.0.0.1:{app_port}"]},
        rule_files=["alert_rules/stocksentry.rules.yml"],
        alertmanager="127.0.0.1:9093",           # optional: where alerts are sent
    ) as prom:
        prom.wait_for_targets_up("stocksentry")
        prom.wait_for("stock_reservation_success_total")   # until it returns a series
        for series in prom.query("sum by (sku) (stock_reservation_success_total)"):
            print(series["metric"]["sku"], series["value"][1])
        firing = prom.alerts(state="firing")

``query`` returns the API's ``result`` list (vector elements are
``{"metric": {...}, "value": [ts, "text"]}``; a scalar or string result comes back as a
one-element list). Any API error raises :class:`PrometheusError` with Prometheus's
message. On a start-up failure the error carries the tail of Prometheus's log.

History: ``history=`` takes OpenMetrics text with timestamps (build it with
:func:`openmetrics_history`) and writes it into the fresh storage with ``promtool tsdb
create-blocks-from openmetrics`` before the server starts, for rules that look back
further than a test can wait (``offset 5m``)::

    now = time.time()
    past = openmetrics_history({'up{instance="127.0.0.1:8000",job="app"}': 1},
                               start=now - 600, end=now - 2)
    with Prometheus(targets={"app": ["127.0.0.1:8000"]}, history=past) as prom: ...

Module import is cheap and needs only the standard library (``urllib``, ``subprocess``).
``make test`` installs the binary; a missing one is an error, not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polling import WaitTimeout, http_ok, wait_until
from processes import stop

__all__ = [
    "Prometheus",
    "PrometheusError",
    "backfill",
    "free_port",
    "openmetrics_history",
    "prometheus_binary",
    "promtool_binary",
]

#: Seconds to wait for /-/ready before giving up.
READY_TIMEOUT_S = 30.0
#: Seconds to wait for a terminated Prometheus before killing it.
STOP_TIMEOUT_S = 10.0


class PrometheusError(RuntimeError):
    """Prometheus did not start, or its HTTP API answered with an error."""


def binary(name: str) -> str | None:
    """The ``name`` binary (prometheus, promtool) to run: ``$NAME`` (upper case),
    ``/usr/bin/NAME`` or on PATH."""
    candidate = os.environ.get(name.upper())
    if candidate:
        return candidate if Path(candidate).exists() else None
    if Path(f"/usr/bin/{name}").exists():
        return f"/usr/bin/{name}"
    return shutil.which(name)


def prometheus_binary() -> str | None:
    """The Prometheus server to run: ``$PROMETHEUS``, ``/usr/bin/prometheus`` or on PATH."""
    return binary("prometheus")


def promtool_binary() -> str | None:
    """promtool, for :func:`backfill`: ``$PROMTOOL``, ``/usr/bin/promtool`` or on PATH."""
    return binary("promtool")


def openmetrics_history(
    series: Mapping[str, float], *, start: float, end: float, step: float = 15.0
) -> str:
    """OpenMetrics text holding each of ``series`` at its constant value, every ``step``
    seconds from ``start`` to ``end`` (Unix times), for :func:`backfill`.

    Keys are series as the text format writes them, ``name{label="value",...}``.

    >>> print(openmetrics_history({'up{job="a"}': 1}, start=0, end=20, step=10), end="")
    up{job="a"} 1 0.000
    up{job="a"} 1 10.000
    up{job="a"} 1 20.000
    # EOF
    """
    if step <= 0 or end < start:
        raise ValueError("need step > 0 and end >= start")
    count = int((end - start) // step) + 1
    lines = [
        f"{key} {value:g} {start + i * step:.3f}"
        # One metric family after the other, as OpenMetrics wants.
        for key, value in sorted(series.items())
        for i in range(count)
    ]
    return "\n".join([*lines, "# EOF"]) + "\n"


def backfill(data_dir: str | os.PathLike[str], openmetrics: str) -> None:
    """Write ``openmetrics`` (text with timestamps, ending in ``# EOF``) as TSDB blocks
    into ``data_dir`` with ``promtool tsdb create-blocks-from openmetrics``.

    Prometheus loads them when it starts on ``data_dir``. Raises :class:`PrometheusError`
    with promtool's output when it fails.
    """
    promtool = promtool_binary()
    if promtool is None:
        raise PrometheusError("no promtool binary (set $PROMTOOL or install it)")
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stocksentry-backfill-") as work:
        source = Path(work) / "history.om"
        source.write_text(openmetrics, encoding="utf-8")
        done = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    if done.returncode != 0:
        raise PrometheusError(f"promtool backfill failed:\n{done.stdout}{done.stderr}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _yaml_list(items: Sequence[str]) -> str:
    # JSON is YAML: quoting through json.dumps keeps paths and targets literal.
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


class Prometheus:
    """A Prometheus server of the test's own.

    ``targets`` maps a job name to ``host:port`` targets (scraped at ``/metrics``);
    ``scrape_configs`` adds raw scrape configs (dicts, written as JSON-in-YAML) for
    anything else (basic auth, TLS, another path). ``rule_files`` are loaded as given
    (paths made absolute); ``alertmanager`` is a ``host:port`` Alertmanager to send
    alerts to. ``extra_args`` go to the command line (e.g.
    ``["--enable-feature=exemplar-storage"]``). ``history`` is OpenMetrics text that
    :func:`backfill` writes into the storage before the start (data from before the server
    existed). ``external_labels`` and ``remote_write`` (raw remote_write entries) go into
    the config as given: a "cluster" Prometheus that forwards to a central one started with
    ``extra_args=["--web.enable-remote-write-receiver"]``.
    """

    def __init__(
        self,
        targets: Mapping[str, Sequence[str]] | None = None,
        *,
        scrape_configs: Sequence[Mapping[str, Any]] = (),
        rule_files: Sequence[str | os.PathLike[str]] = (),
        alertmanager: str | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        history: str | None = None,
        external_labels: Mapping[str, str] | None = None,
        remote_write: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.targets = dict(targets or {})
        self.scrape_configs = list(scrape_configs)
        self.rule_files = [str(Path(f).resolve()) for f in rule_files]
        self.alertmanager = alertmanager
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.extra_args = list(extra_args)
        self.binary = binary or prometheus_binary()
        self.history = history
        self.external_labels = dict(external_labels or {})
        self.remote_write = list(remote_write)
        self.port: int | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # --- life cycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running server."""
        if self.port is None:
            raise PrometheusError("Prometheus is not running")
        return f"http://127.0.0.1:{self.port}"

    def config_text(self) -> str:
        """The prometheus.yml this instance runs with."""
        lines = [
            "global:",
            f"  scrape_interval: {self.scrape_interval}",
            f"  evaluation_interval: {self.evaluation_interval}",
            f"  scrape_timeout: {self.scrape_interval}",
        ]
        if self.external_labels:
            lines.append(f"  external_labels: {json.dumps(self.external_labels)}")
        if self.remote_write:
            lines.append(f"remote_write: {json.dumps(self.remote_write)}")
        if self.rule_files:
            lines.append(f"rule_files: {_yaml_list(self.rule_files)}")
        if self.alertmanager:
            lines += [
                "alerting:",
                "  alertmanagers:",
                f"    - static_configs: [{{targets: {_yaml_list([self.alertmanager])}}}]",
            ]
        lines.append("scrape_configs:")
        for job, hosts in self.targets.items():
            lines += [
                f"  - job_name: {json.dumps(job)}",
                f"    static_configs: [{{targets: {_yaml_list(list(hosts))}}}]",
            ]
        lines += [f"  - {json.dumps(dict(config))}" for config in self.scrape_configs]
        if not self.targets and not self.scrape_configs:
            lines[-1] = "scrape_configs: []"
        return "\n".join(lines) + "\n"

    def start(self, attempts: int = 3) -> Prometheus:
        """Start the server and wait until it is ready; returns ``self``.

        The port is chosen free just before the start; if another process takes it in
        between, the start is retried on a new port (``attempts`` times in all).
        """
        if self.binary is None:
            raise PrometheusError("no prometheus binary (set $PROMETHEUS or install it)")
        if self._process is not None:
            raise PrometheusError("already started")
        self._dir = tempfile.TemporaryDirectory(prefix="stocksentry-prom-")
        base = Path(self._dir.name)
        config = base / "prometheus.yml"
        config.write_text(self.config_text(), encoding="utf-8")
        if self.history:
            try:
                backfill(base / "data", self.history)
            except PrometheusError:
                self.stop()
                raise
        last_error: PrometheusError | None = None
        for attempt in range(attempts):
            self.port = free_port()
            log_path = base / f"prometheus-{attempt}.log"
            self._log = log_path.open("wb")
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={base / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--web.enable-lifecycle",
                    "--log.level=info",
                    *self.extra_args,
                ],
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            try:
                self._wait_ready(log_path)
                return self
            except PrometheusError as exc:
                last_error = exc
                self._stop_process()
                if "address already in use" not in str(exc):
                    break
        self.stop()
        assert last_error is not None
        raise last_error

    def _wait_ready(self, log_path: Path) -> None:
        process = self._process
        assert process is not None

        def ready() -> bool:
            if process.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {process.returncode}:\n{_tail(log_path)}"
                )
            return http_ok(f"{self.url}/-/ready")

        try:
            wait_until(ready, timeout=READY_TIMEOUT_S, interval=0.1, message="ready")
        except WaitTimeout:
            raise PrometheusError(
                f"prometheus not ready in {READY_TIMEOUT_S} s:\n{_tail(log_path)}"
            ) from None

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        stop(process, STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """Stop the server (terminate, wait, kill on timeout) and remove its storage."""
        self._stop_process()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self.port = None

    def log(self) -> str:
        """Prometheus's log so far (for failure messages)."""
        if self._dir is None:
            return ""
        logs = sorted(Path(self._dir.name).glob("prometheus-*.log"))
        return logs[-1].read_text(encoding="utf-8", errors="replace") if logs else ""

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- HTTP API --------------------------------------------------------------------------

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raises on an API error."""
        query = urllib.parse.urlencode(
            [(k, v) for k, vs in params.items() for v in ([vs] if isinstance(vs, str) else vs)]
        )
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                body = json.load(exc)
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {exc.code}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Any]:
        """Evaluate ``expr`` at ``at`` (Unix time; default now); returns the result list."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [result]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[Any]:
        """Evaluate ``expr`` over ``[start, end]`` every ``step`` seconds (a matrix)."""
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        return list(data["result"])

    def label_values(self, label: str, match: Sequence[str] = ()) -> list[str]:
        """Values of ``label``, optionally among series matching selectors ``match``."""
        return list(self.api(f"label/{label}/values", **({"match[]": match} if match else {})))

    def targets_status(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last error."""
        return list(self.api("targets", state="active")["activeTargets"])

    def alerts(self, state: str | None = None) -> list[dict[str, Any]]:
        """Alerts of the loaded rules (``state``: ``pending`` or ``firing`` to filter)."""
        found = list(self.api("alerts")["alerts"])
        return [a for a in found if state is None or a.get("state") == state]

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups with each rule's health and last error."""
        return list(self.api("rules")["groups"])

    # --- waiting ---------------------------------------------------------------------------

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[Any]], bool] = bool,
        timeout: float = 20.0,
        interval: float = 0.25,
    ) -> list[Any]:
        """Query ``expr`` until ``predicate(result)`` holds (default: not empty).

        Returns the result that satisfied it; raises :class:`TimeoutError` with the last
        result otherwise.
        """
        try:
            return wait_until(
                lambda: self.query(expr),
                accept=predicate,
                timeout=timeout,
                interval=interval,
                message=lambda last: f"{expr!r} still {last!r}",
            )
        except WaitTimeout as timed_out:
            raise TimeoutError(str(timed_out)) from None

    def wait_for_targets_up(self, job: str, timeout: float = 20.0) -> None:
        """Wait until every target of ``job`` has been scraped successfully."""

        def mine() -> list[dict[str, Any]]:
            return [t for t in self.targets_status() if t["labels"].get("job") == job]

        try:
            wait_until(
                mine,
                accept=lambda ts: ts and all(t["health"] == "up" for t in ts),
                timeout=timeout,
                interval=0.25,
                message=lambda ts: f"targets of {job!r} not up: {_errors(ts)}",
            )
        except WaitTimeout as timed_out:
            raise TimeoutError(str(timed_out)) from None


def _errors(targets: list[dict[str, Any]]) -> list[Any]:
    return [t.get("lastError") for t in targets]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
