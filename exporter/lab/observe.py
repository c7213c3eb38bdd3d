"""What watches the lab: the exporter sidecar and, when the binary is installed, a real
Prometheus evaluating ``alert_rules/stocksentry.rules.yml`` unchanged, every second."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stocksentry.instrumentation.secrets import url_has_password

from .config import REDIS_PREFIX, STRATEGY_NAMES, StrategyResult, cache_key_template, sku_for
from .embedded import signal_handler

#: The rules Prometheus evaluates: the project's own file.
RULES_FILE = "alert_rules/stocksentry.rules.yml"
#: How often Prometheus scrapes and evaluates, and the exporter's probes run.
INTERVAL = "1s"
#: The exporter's figures the report shows, per SKU (metric name -> short title).
EXPORTER_FIGURES = {
    "stock_oversold_units": "oversold",
    "stock_inventory_negative_units": "negative",
    "stock_duplicate_order_keys": "dup keys",
    "stock_outbox_lag_seconds": "outbox lag s",
    "stock_outbox_pending_events": "pending",
    "stock_db_lock_waiters": "waiters",
}
#: The alerts without a sku or lock label, and the strategies (by SQL and the lab's own
#: counts) that can raise them: such an alert belongs to the last of these whose sale had
#: started when it went active.
CAUSES: dict[str, Callable[[StrategyResult], bool]] = {
    "StockNegativeInventory": lambda r: r.final_stock < 0,
    "StockDuplicateOrders": lambda r: r.db.duplicate_keys > 0,
    "StockUnsafeReadModifyWrite": lambda r: bool(r.unsafe_read_modify_write),
    "StockDeadlocksIncreasing": lambda r: r.deadlocks > 0,
    "StockOutboxLag": lambda r: r.outbox_unpublished > 0,
}
#: The exporter's figures without a sku label, and which strategies' rows (by SQL) they
#: count, as the alerts on them: a strategy shows the figure when it is the only one.
SHOP_WIDE = {
    "stock_inventory_negative_units": CAUSES["StockNegativeInventory"],
    "stock_duplicate_order_keys": CAUSES["StockDuplicateOrders"],
}
#: How long the lab waits for the exporter's probes to report a first success.
PROBES_UP_WAIT_S = 5.0
#: How long the processes get to come up.
START_TIMEOUT_S = 20.0
#: How long after the stale cache's sale began the lab waits for its alert: the probe's
#: grace (2 s) and runs, a scrape, StockCacheDrift's `for` (10 s), a rule round.
STALE_CACHE_WAIT_S = 30.0
#: The alert that names a stale cache from the sidecar's side.
CACHE_DRIFT_ALERT = "StockCacheDrift"
#: The cache-drift probe's default grace plus a run: a cache that catches up sooner is
#: never counted.
DRIFT_GRACE_S = 3.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_rules() -> Path | None:
    """The project's alert rules file, beside the source tree (an editable install)."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / RULES_FILE
        if candidate.is_file():
            return candidate
    return None


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - our own
        return bytes(response.read())


def _prometheus(port: int, api: str, params: dict[str, str]) -> list[Any] | None:
    """The ``result`` list of a Prometheus HTTP API query (``None`` when it failed)."""
    url = f"http://127.0.0.1:{port}/api/v1/{api}?{urllib.parse.urlencode(params)}"
    try:
        return list(json.loads(_get(url)).get("data", {}).get("result", []))
    except (OSError, ValueError):
        return None


def _wait_scraped(port: int, targets: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until every target was scraped once and (briefly) every probe succeeded once,
    then one rule round: the rules about absent targets and probes down would otherwise
    go pending on an empty start."""

    def until(expr: str, done: Callable[[int | None], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            result = _prometheus(port, "query", {"query": expr})
            if done(None if result is None else len(result)):
                return
            time.sleep(0.2)

    until("up == 1", lambda n: (n or 0) >= targets, START_TIMEOUT_S)
    until("stocksentry_probe_up == 0", lambda n: n == 0, PROBES_UP_WAIT_S)
    time.sleep(1.2)  # one evaluation round on the scraped targets


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass(slots=True)
class Observers:
    """The running exporter and Prometheus (either may be absent, with the reason)."""

    folder: Path
    exporter_port: int | None = None
    prometheus_port: int | None = None
    alertmanager_port: int | None = None
    exporter_note: str = ""
    prometheus_note: str = ""
    alertmanager_note: str = ""
    #: Whether the exporter's cache-drift probe reads the stale cache's Redis key, or why
    #: not (for the report of a stale cache no alert named).
    cache_watched: bool = False
    cache_note: str = ""
    #: How often the lab refreshes its stale cache (``--cache-refresh-ms``), in seconds.
    cache_refresh_s: float = 0.05
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: The exporter's figures per SKU, and its shop-wide ones (no sku label).
    figures: dict[str, dict[str, float]] = field(default_factory=dict)
    shop: dict[str, float] = field(default_factory=dict)

    def notes(self) -> list[str]:
        notes = [f"exporter: {self.exporter_note}", f"alerts: {self.prometheus_note}"]
        if self.alertmanager_note:
            notes.append(f"containment: {self.alertmanager_note}")
        if self.shop:
            shop = ", ".join(f"{name} {value:.3g}" for name, value in sorted(self.shop.items()))
            notes.append(f"exporter, shop-wide at the end: {shop}")
        return notes

    def read_exporter(self) -> None:
        """Wait for a probe round that began after the sales, then keep the exporter's
        figures per SKU (the shop's rows stay as each strategy left them)."""
        if self.exporter_port is None:
            return
        from prometheus_client.parser import text_string_to_metric_families

        # Probes run every second: after two, a whole round has run on the final rows.
        time.sleep(2.1)
        try:
            text = _get(f"http://127.0.0.1:{self.exporter_port}/metrics").decode()
        except OSError as exc:
            self.exporter_note += f" (its /metrics could not be read: {exc})"
            return
        samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
        for each in samples:
            name, value, sku = each.name, float(each.value), each.labels.get("sku")
            if name not in EXPORTER_FIGURES:
                continue
            if sku is None:
                self.shop[name] = max(self.shop.get(name, 0.0), value)
                # The outbox figures carry no sku: only the outbox scenario writes events.
                if not name.startswith("stock_outbox"):
                    continue
                sku = sku_for("outbox")
            figures = self.figures.setdefault(sku, {})
            figures[name] = max(figures.get(name, 0.0), value)

    def _query_range(self, expr: str, start: float, end: float, step: str) -> list[Any]:
        if self.prometheus_port is None or end <= start:
            return []
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        return _prometheus(self.prometheus_port, "query_range", params) or []

    def annotate(self, results: list[StrategyResult]) -> list[StrategyResult]:
        """Each result with the exporter's figures for its SKU and its alerts (see
        :func:`alert_owner`), timed from the strategy's first oversell, or from the start
        of its sale when it oversold nothing."""
        self.read_exporter()
        ran = [r for r in results if r.skipped is None]
        if not ran:
            return results
        if self.prometheus_port is not None:
            # One more evaluation round after the last probe round was scraped.
            time.sleep(1.5)
        unnamed = self._await_cache_drift(ran)
        # Every alert series pending or firing since the first sale.
        series = []
        for each in self._query_range("ALERTS", ran[0].started_at, time.time(), "1"):
            labels = dict(each.get("metric", {}))
            times = [float(t) for t, value in each.get("values", []) if value == "1"]
            if labels.get("alertname") and times:
                series.append(AlertSeries(labels, min(times)))
        owners = [alert_owner(each, ran) for each in series]
        annotated = []
        for result in results:
            if result.skipped is not None:
                annotated.append(result)
                continue
            probes = dict(self.figures.get(result.sku, {}))
            position = ran.index(result)
            later = ran[position + 1].started_at if position + 1 < len(ran) else time.time()
            end = min(later, result.ended_at) + 2
            waiters = self._query_range(
                "max(stock_db_lock_waiters)", result.started_at + 1, end, "0.5"
            )
            values = [float(v) for each in waiters for _t, v in each.get("values", [])]
            if values:
                probes["stock_db_lock_waiters"] = max(values)
            for name, has_it in SHOP_WIDE.items():
                # A shop-wide figure is this strategy's when SQL says only its SKU has it.
                holders = [r for r in ran if has_it(r)]
                if holders == [result] and name in self.shop:
                    probes[name] = self.shop[name]
            origin = result.first_oversell_at or result.started_at
            alerts: dict[str, dict[str, Any]] = {}
            for each, strategy in zip(series, owners, strict=True):
                if strategy != result.strategy:
                    continue
                name = each.labels["alertname"]
                state = each.labels.get("alertstate", "pending")
                after = round(max(0.0, each.first - origin), 1)
                now = alerts.get(name)
                if now is None or (state == "firing" and now["state"] != "firing"):
                    alerts[name] = {"state": state, "after_s": after}
                elif state == now["state"]:
                    now["after_s"] = min(now["after_s"], after)
            notes = result.notes
            if result.strategy == "stale_cache" and unnamed and CACHE_DRIFT_ALERT not in alerts:
                notes = (*notes, unnamed)
            annotated.append(
                dataclasses.replace(
                    result, alerts=dict(sorted(alerts.items())), probes=probes, notes=notes
                )
            )
        return annotated

    def _await_cache_drift(self, ran: list[StrategyResult]) -> str:
        """Give the stale cache's drift the time its alert takes (when it can last past the
        probe's grace); else, or when none fired, why no alert of the sidecar named it."""
        stale = [r for r in ran if r.strategy == "stale_cache"]
        if not stale or self.prometheus_port is None:
            return ""
        result = stale[0]
        refresh_s = self.cache_refresh_s
        if self.cache_watched and refresh_s > DRIFT_GRACE_S:
            expr = (
                f'ALERTS{{alertname="{CACHE_DRIFT_ALERT}",alertstate="firing",sku="{result.sku}"}}'
            )
            deadline = result.started_at + STALE_CACHE_WAIT_S
            while time.time() < deadline:
                if _prometheus(self.prometheus_port, "query", {"query": expr}):
                    time.sleep(1.5)  # a step of the range query past the first firing round
                    return ""
                time.sleep(0.5)
        if not self.cache_watched:
            drift = f"{CACHE_DRIFT_ALERT} cannot fire: {self.cache_note}"
        elif refresh_s <= DRIFT_GRACE_S:
            drift = (
                f"{CACHE_DRIFT_ALERT} cannot fire: the cache caught up every {refresh_s * 1000:g} "
                "ms, within the cache_drift probe's grace (2 s, runs 1 s apart; an app that "
                "reloads every 5 s: --cache-refresh-ms 5000)"
            )
        else:
            drift = f"{CACHE_DRIFT_ALERT} did not fire within {STALE_CACHE_WAIT_S:g} s of the sale"
        return (
            f"{drift}; the {result.stale_cache_hits} stale decisions the lab counted itself "
            "reach StockStaleCacheDecisions only from an app that reports its cache reads "
            '(stock_check(source="cache"))'
        )


@dataclass(frozen=True, slots=True)
class AlertSeries:
    """One ``ALERTS`` series: its labels, and when (Unix time) it was first active."""

    labels: dict[str, str]
    first: float


def alert_owner(series: AlertSeries, ran: list[StrategyResult]) -> str:
    """The strategy an alert series belongs to (see :meth:`Observers.annotate`).

    By its ``sku`` or ``lock`` label when it has one; otherwise, among the strategies
    that can cause it (:data:`CAUSES`), the last whose sale had started when the alert
    went active; for any other alert (the error budget, the exporter's health) the last
    strategy whose sale had started a second before.
    """
    sku = series.labels.get("sku")
    lock = series.labels.get("lock")
    for result in ran:
        if sku == result.sku or lock == result.strategy:
            return result.strategy
    cause = CAUSES.get(series.labels.get("alertname", ""))
    candidates = [r for r in ran if cause(r)] if cause is not None else []
    when = series.first if candidates else series.first - 1.0
    chosen = (candidates or ran)[0].strategy
    for result in candidates or ran:
        if result.started_at <= when:
            chosen = result.strategy
    return chosen


def _spawn(watch: Observers, name: str, argv: list[str], ready_url: str, what: str) -> None:
    """Start one of our processes (output in ``<name>.log``) and wait until it answers."""
    with (watch.folder / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(  # noqa: S603 - our own interpreter, or Prometheus from PATH
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    watch.procs.append(proc)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        with contextlib.suppress(OSError):
            _get(ready_url, timeout=1.0)
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {ready_url} within {START_TIMEOUT_S:g} s")


def _start_binary(
    watch: Observers, what: str, binary: str, config: dict[str, Any], storage: str, extra: str
) -> int:
    """Prometheus or Alertmanager on a free port, with ``config`` (JSON is YAML) and its
    ``--<storage>`` folder in ours; returns the port."""
    name = what.lower()
    path = watch.folder / f"{name}.yml"
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    port = free_port()
    listen = f"--web.listen-address=127.0.0.1:{port}"
    argv = [binary, f"--config.file={path}", f"--{storage}={watch.folder / name}", listen, extra]
    _spawn(watch, name, argv, f"http://127.0.0.1:{port}/-/ready", what)
    return port


def _start_exporter(
    watch: Observers,
    database_url: str,
    containment: dict[str, Any] | None,
    redis_url: str | None,
) -> None:
    from .contain import CONTAINED_SKU

    skus = [sku_for(n) for n in STRATEGY_NAMES]
    if containment is not None:
        skus.append(CONTAINED_SKU)
    port = free_port()
    config = watch.folder / "exporter.yml"
    # JSON is YAML: the exporter on the lab's tables, probes every second, no election.
    exporter = {
        "server": {"listen_address": "127.0.0.1", "port": port},
        "sku_guard": {"promo_skus": skus, "max_skus": 100},
        # The exporter takes a libpq URL: no SQLAlchemy driver suffix.
        "database": {
            "url": database_url.replace("postgresql+psycopg://", "postgresql://", 1),
            "leader_election": False,
        },
        "schema": {
            "products": {"allocation": "initial_stock"},
            "outbox": {
                "table": "outbox",
                "created_at": "created_at",
                "published_at": "published_at",
            },
        },
        "probes": {"defaults": {"interval": INTERVAL, "timeout": "900ms"}},
    }
    if containment is not None:
        exporter["containment"] = containment
    if redis_url is not None:
        # The stale cache's key, compared with the database by the cache-drift probe.
        exporter["redis"] = {
            "url": redis_url,
            "key_template": cache_key_template(REDIS_PREFIX),
        }
    config.write_text(json.dumps(exporter, indent=2), encoding="utf-8")
    argv = [sys.executable, "-m", "stocksentry.exporter", "exporter", "--config", str(config)]
    _spawn(watch, "exporter", argv, f"http://127.0.0.1:{port}/metrics", "the exporter")
    watch.exporter_port = port


def _start_prometheus(watch: Observers, lab_port: int) -> None:
    """Prometheus on the project's rules; a RuntimeError or OSError says why it cannot."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("no prometheus binary (Debian: apt-get install prometheus)")
    rules = find_rules()
    if rules is None:
        raise RuntimeError(f"{RULES_FILE} not found")
    targets = {"stocksentry-lab": lab_port}
    if watch.exporter_port is not None:
        targets["stocksentry"] = watch.exporter_port
    scrape = [
        {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        for job, port in targets.items()
    ]
    prometheus: dict[str, Any] = {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
        "rule_files": [str(rules)],
        "scrape_configs": scrape,
    }
    if watch.alertmanager_port is not None:
        target = f"127.0.0.1:{watch.alertmanager_port}"
        prometheus["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [target]}]}]}
    retention = "--storage.tsdb.retention.time=1h"
    port = _start_binary(watch, "Prometheus", binary, prometheus, "storage.tsdb.path", retention)
    watch.prometheus_port = port
    _wait_scraped(port, len(targets), watch.procs[-1])
    watch.prometheus_note = (
        f"Prometheus evaluated {RULES_FILE} (unchanged) every {INTERVAL}, scraping the lab"
        f" and the exporter every {INTERVAL}"
    )


def _start_alertmanager(watch: Observers) -> None:
    """Alertmanager (Debian's ``prometheus-alertmanager``) routing the oversell alerts to
    the exporter's freeze webhook (:mod:`.contain`); no cluster, its own folder."""
    from stocksentry.exporter.config.containment import WEBHOOK_PATH

    from .contain import alertmanager_config

    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        raise RuntimeError(
            "no alertmanager binary (Debian: apt-get install prometheus-alertmanager)"
        )
    if watch.exporter_port is None:
        raise RuntimeError("the exporter (its freeze webhook) is not running")
    config = alertmanager_config(f"http://127.0.0.1:{watch.exporter_port}{WEBHOOK_PATH}")
    watch.alertmanager_port = _start_binary(
        watch, "Alertmanager", binary, config, "storage.path", "--cluster.listen-address="
    )
    watch.alertmanager_note = (
        "Alertmanager routed StockOversold, StockNegativeInventory and StockNegativeWrite of"
        " the contained run's SKU to the exporter's freeze webhook (enforce) at once"
    )


@contextlib.contextmanager
def observers(
    database_url: str | None,
    lab_port: int,
    containment: dict[str, Any] | None = None,
    redis_url: str | None = None,
) -> Iterator[Observers]:
    """Start the exporter (beside a server database) and Prometheus for the block; one that
    cannot start is left out, with the reason in its note. With ``containment`` (the
    exporter's section), also Alertmanager, routing to its freeze webhook. ``redis_url``:
    the Redis of the stale cache, which the exporter's cache-drift probe then compares with
    the database. All are stopped by pid, and their temporary folder removed."""
    folder = Path(tempfile.mkdtemp(prefix="stocksentry-demo-watch-"))
    watch = Observers(folder=folder)
    try:
        if database_url is not None:
            cache_url = redis_url
            if redis_url is not None and url_has_password(redis_url):
                cache_url = None
                watch.cache_note = "the lab's Redis URL carries a password"
            elif redis_url is None:
                watch.cache_note = "the lab ran without Redis, so its cache is in memory"
            try:
                _start_exporter(watch, database_url, containment, cache_url)
                watch.cache_watched = cache_url is not None
                watch.exporter_note = "the exporter's probes ran every 1s on the lab's database"
            except (RuntimeError, OSError) as exc:
                watch.exporter_note = f"exporter not run: {exc}"
        else:
            watch.exporter_note = "exporter not run: its probes need PostgreSQL or MySQL / MariaDB"
            watch.cache_note = "no exporter beside a SQLite shop"
        if containment is not None:
            try:
                _start_alertmanager(watch)
            except (RuntimeError, OSError) as exc:
                watch.alertmanager_note = f"not run: {exc}"
        try:
            _start_prometheus(watch, lab_port)
        except (RuntimeError, OSError) as exc:
            watch.prometheus_note = f"alerts not evaluated: {exc}"
        yield watch
    finally:
        with signal_handler(signal.SIGINT, signal.SIG_IGN):
            for proc in reversed(watch.procs):
                _stop(proc)
            shutil.rmtree(folder, ignore_errors=True)
