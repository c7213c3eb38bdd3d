"""``--engine locust``: the burst sent by a Locust master and ``--workers N`` local workers
(for load one process cannot offer); the drill still sets the stock and judges. The
workers run :data:`LOCUSTFILE` with a JSON plan named by ``STOCKSENTRY_DRILL_PLAN``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import socket
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .truth import Unverifiable
from .wire import Response

if TYPE_CHECKING:
    from .scenarios import Drill

__all__ = ["LOCUSTFILE", "locust_burst", "plan"]

#: The Locust file the master and the workers run: in a folder that is not a package, as
#: importing locust monkey-patches the process for gevent (only Locust's own may import it).
LOCUSTFILE: Final = Path(__file__).with_name("locust_files") / "locustfile.py"
#: How long the master may take to start, spawn and collect, beyond the requests' own time.
STARTUP_S: Final = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plan(drill: Drill, out: Path) -> dict[str, Any]:
    """What the workers need: the checkout request, the success rule, the run."""
    config = drill.config
    checkout, rule = config.target.checkout, config.target.success
    parts = urllib.parse.urlsplit(checkout.url)
    return {
        **dataclasses.asdict(checkout),  # url, method, headers, body
        "host": f"{parts.scheme}://{parts.netloc}",
        "status": list(rule.status),
        "json_field": rule.json_field,
        "sku": config.drill.sku,
        "qty": config.drill.qty,
        "run": drill.run,
        "requests": config.drill.requests,
        "out": str(out),
    }


async def locust_burst(workers: int, drill: Drill) -> tuple[list[Response], list[float]]:
    """Send ``drill``'s burst through a Locust master and ``workers`` local workers."""
    total = drill.config.drill.requests
    with tempfile.TemporaryDirectory(prefix="stocksentry-drill-locust-") as folder:
        out = Path(folder) / "requests.json"
        plan_file = Path(folder) / "plan.json"
        plan_file.write_text(json.dumps(plan(drill, out)), encoding="utf-8")
        env = {**os.environ, "STOCKSENTRY_DRILL_PLAN": str(plan_file)}
        port = _free_port()
        limit = STARTUP_S + drill.config.target.timeout

        def spawn(*args: str) -> Awaitable[asyncio.subprocess.Process]:
            return asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "locust",
                "-f",
                str(LOCUSTFILE),
                "--loglevel",
                "WARNING",
                *args,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )

        master = await spawn(
            "--master",
            "--headless",
            "--master-bind-host",
            "127.0.0.1",
            "--master-bind-port",
            str(port),
            "--expect-workers",
            str(workers),
            "--users",
            str(total),
            "--spawn-rate",
            str(total),
            "--run-time",
            f"{int(limit)}s",
            "--only-summary",
            "--exit-code-on-error",
            "0",
        )
        followers = [
            await spawn("--worker", "--master-host", "127.0.0.1", "--master-port", str(port))
            for _ in range(workers)
        ]
        try:
            _, err = await asyncio.wait_for(master.communicate(), limit + 30)
            stderr = err.decode("utf-8", "replace")[-2000:]
        except TimeoutError:
            raise Unverifiable(f"the Locust master did not finish within {limit:g} s") from None
        finally:
            for process in (master, *followers):
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.terminate()
            for process in followers:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), 10)
        try:
            records = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last = stderr.strip().splitlines()[-1:] or ["no output"]
            raise Unverifiable(f"the Locust run wrote no results ({last[0]})") from None
    if len(records) < total:
        raise Unverifiable(f"the Locust run reported {len(records)} of {total} requests")
    # The workers' wall clock, on this process's perf_counter scale (the timeline's).
    offset = time.time() - time.perf_counter()
    responses = [
        Response(
            status=int(r["status"]),
            error=r["error"],
            sent_at=float(r["sent"]) - offset,
            done_at=float(r["done"]) - offset,
            sale=bool(r["ok"]),
        )
        for r in records
    ]
    sent = [r.sent_at for r in responses]
    return responses, [max(sent) - min(sent)]
