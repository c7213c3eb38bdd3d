"""The drill's burst as a Locust file, run by ``stocksentry drill --engine locust``.

Every user sends one checkout of the plan (``STOCKSENTRY_DRILL_PLAN``) and stops. Once
spawned, users wait for the master's ``drill_release``: a wall-clock instant shortly
ahead, so every worker's requests leave together. Workers send their records with their
reports; the master writes them to the plan's output file and quits once all are in.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from locust import HttpUser, events, task
from locust.exception import StopUser
from stocksentry.exporter.drill.config import RequestSpec
from stocksentry.exporter.drill.scenarios import intent_values, success_of

_PLAN: dict[str, Any] = json.loads(
    Path(os.environ["STOCKSENTRY_DRILL_PLAN"]).read_text(encoding="utf-8")
)
_SPEC = RequestSpec(
    url=_PLAN["url"],
    method=_PLAN["method"],
    headers=tuple((str(n), str(v)) for n, v in _PLAN["headers"]),
    body=_PLAN["body"],
)
#: Locust's event hooks (its add_listener has no type hints).
_HOOKS: Any = events
_released = Event()
_release_at: list[float] = []
#: This worker's requests not yet reported to the master.
_records: list[dict[str, Any]] = []
#: On the master: every worker's requests.
_collected: list[dict[str, Any]] = []
_counter = iter(range(1, 1_000_000_000))


def _on_init(environment: Any, **_kwargs: Any) -> None:
    runner = environment.runner
    if runner is None:
        return

    def release(environment: Any, msg: Any, **_kw: Any) -> None:
        _release_at.append(float(msg.data))
        _released.set()

    if type(runner).__name__ == "WorkerRunner":
        runner.register_message("drill_release", release)
    if type(runner).__name__ == "MasterRunner":

        def _spawned(user_count: int, **_kw: Any) -> None:
            # A moment for the message to reach every worker; then all go at once.
            runner.send_message("drill_release", time.time() + 0.3)

        def _report(client_id: str, data: dict[str, Any], **_kw: Any) -> None:
            _collected.extend(data.get("drill", []))
            if len(_collected) >= int(_PLAN["requests"]):
                _write()
                gevent.spawn_later(0.1, runner.quit)

        _HOOKS.spawning_complete.add_listener(_spawned)
        _HOOKS.worker_report.add_listener(_report)
        _HOOKS.quitting.add_listener(_write)


def _on_report(client_id: str, data: dict[str, Any], **_kwargs: Any) -> None:
    data["drill"] = list(_records)
    _records.clear()


def _write(**_kwargs: Any) -> None:
    Path(_PLAN["out"]).write_text(json.dumps(_collected), encoding="utf-8")


_HOOKS.init.add_listener(_on_init)
_HOOKS.report_to_master.add_listener(_on_report)


class Buyer(HttpUser):
    """One buyer: one checkout at the release, then done."""

    host = _PLAN["host"]

    @task
    def checkout(self) -> None:
        index = getattr(self.environment.runner, "worker_index", 0)
        n = int(index) * 1_000_000 + next(_counter)
        values = intent_values(_PLAN["run"], "burst", n, _PLAN["sku"], _PLAN["qty"])
        method, url, headers, body = _SPEC.render(values)
        _released.wait()
        delay = _release_at[0] - time.time() if _release_at else 0.0
        if delay > 0:
            gevent.sleep(delay)
        sent = time.time()
        status, text, error = 0, b"", None
        try:
            with self.client.request(
                method, url, headers=dict(headers), data=body, name="checkout", catch_response=True
            ) as response:
                status, text = int(response.status_code or 0), bytes(response.content or b"")
                ok = success_of(status, text, tuple(_PLAN["status"]), _PLAN["json_field"])
                if ok:
                    response.success()
                else:
                    response.failure(f"not a sale: {status}")
        except Exception as exc:  # the report counts it; the user must still stop
            error, ok = type(exc).__name__, False
        _records.append(
            {"sent": sent, "done": time.time(), "status": status, "ok": ok, "error": error}
        )
        raise StopUser
