"""The probe runner and the probe contract, in process: fake probes, injected clocks.

A :class:`ProbeRunner` built from a config without a database section runs no probe of
its own, so each test hands :meth:`ProbeRunner.run_once` a :class:`Probe` subclass and
reads what a scrape would see through the collector protocol. Backoff and the error log
take an injected clock; no assertion depends on wall-clock time.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from stocksentry.exporter.config import parse_config
from stocksentry.exporter.probes import ProbeResult, ProbeRunner
from stocksentry.exporter.probes.base import (
    Backoff,
    ErrorLog,
    Probe,
    ProbeUnavailableError,
    describe_error,
    family,
)
from stocksentry.instrumentation import catalog
from stocksentry.instrumentation.secrets import redact, secret_fragments

# What a driver error may echo from a connection string: never logged as is.
LEAKY = "hunter2-very-secret"


class Scripted(Probe):
    """Answers from a script: a number is a value to export, an exception is raised."""

    specs = (catalog.NEGATIVE_INVENTORY_SKUS,)

    def __init__(self, script: Iterable[float | BaseException], **kwargs: float) -> None:
        super().__init__("scripted", interval=kwargs.get("interval", 15.0), timeout=5.0)
        self.script = list(script)
        self.runs = 0

    async def run(self) -> tuple[Metric, ...]:
        step = self.script[self.runs]
        self.runs += 1
        if isinstance(step, BaseException):
            raise step
        return (family(catalog.NEGATIVE_INVENTORY_SKUS, [((), step)]),)


class Hangs(Probe):
    """Never answers: only its timeout ends a run."""

    async def run(self) -> tuple[Metric, ...]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def no_database() -> ProbeRunner:
    return ProbeRunner(parse_config("server: {port: 19464}\n", environ={}))


def samples(runner: ProbeRunner) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in runner.collect()
        for s in f.samples
    }


UP = catalog.PROBE_UP.name
LAST = catalog.PROBE_LAST_SUCCESS.name
NEGATIVE = catalog.NEGATIVE_INVENTORY_SKUS.name


async def test_a_good_run_exports_its_families_and_health() -> None:
    runner = no_database()
    assert samples(runner) == {}  # nothing has run yet, and no leader series
    result = await runner.run_once(Scripted([4.0]))

    assert result.up
    assert result.error is None
    assert result.last_success is not None
    seen = samples(runner)
    assert seen[(UP, (("probe", "scripted"),))] == 1
    assert seen[(LAST, (("probe", "scripted"),))] == result.last_success
    assert seen[(NEGATIVE, ())] == 4
    assert (catalog.PROBE_DURATION.name, (("probe", "scripted"),)) in seen
    assert runner.results == {"scripted": result}


async def test_a_failed_run_drops_the_figures_and_keeps_the_last_success() -> None:
    runner = no_database()
    probe = Scripted([4.0, ConnectionError(f"connect to postgresql://app:{LEAKY}@db failed")])
    good = await runner.run_once(probe)
    bad = await runner.run_once(probe)

    assert not bad.up
    assert bad.families == ()
    assert bad.last_success == good.last_success
    assert bad.error is not None
    assert bad.error.startswith("ConnectionError: connect to")
    seen = samples(runner)
    assert seen[(UP, (("probe", "scripted"),))] == 0
    assert seen[(LAST, (("probe", "scripted"),))] == good.last_success
    assert (NEGATIVE, ()) not in seen  # nothing stale


async def test_a_probe_that_never_succeeded_has_no_last_success() -> None:
    runner = no_database()
    result = await runner.run_once(Scripted([ProbeUnavailableError("down")]))
    assert result == ProbeResult(
        up=False, duration=result.duration, last_success=None, error="ProbeUnavailableError: down"
    )
    seen = samples(runner)
    assert seen[(UP, (("probe", "scripted"),))] == 0
    assert not any(name == LAST for name, _ in seen)


async def test_a_hung_probe_ends_at_its_timeout() -> None:
    runner = no_database()
    probe = Hangs("hangs", interval=15.0, timeout=0.01)
    result = await runner.run_once(probe)
    assert not result.up
    assert result.error == "timed out after 10ms"
    assert samples(runner)[(UP, (("probe", "hangs"),))] == 0


class SlowToCancel(Probe):
    """Hangs, and when cancelled takes ``cleanup`` seconds to end (as a driver waiting for
    the answer to a cancel request from a silent server); ``ended`` once it has."""

    def __init__(self, cleanup: float, **kwargs: float) -> None:
        super().__init__("slow_to_cancel", interval=15.0, timeout=kwargs.get("timeout", 0.05))
        self.cleanup = cleanup
        self.ended = asyncio.Event()

    async def run(self) -> tuple[Metric, ...]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(self.cleanup)
            self.ended.set()
            raise
        raise AssertionError("unreachable")


async def test_a_run_is_given_up_on_at_its_timeout_not_when_its_clean_up_ends() -> None:
    runner = no_database()
    probe = SlowToCancel(cleanup=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await runner.run_once(probe)
    assert loop.time() - started < 0.4  # the timeout (50 ms), not the clean-up (500 ms)
    assert (result.up, result.error) == (False, "timed out after 50ms")
    assert not probe.ended.is_set()
    # The next run does not start beside the one still ending: it waits for it within its
    # own timeout, then says why it could not run.
    again = await runner.run_once(probe)
    assert again.error == "the previous run, given up on at its timeout, is still ending"
    await runner.stop()  # waits for the run given up on
    assert probe.ended.is_set()


async def test_cancellation_passes_through_run_once() -> None:
    runner = no_database()
    task = asyncio.create_task(runner.run_once(Hangs("hangs", interval=15.0, timeout=60.0)))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runner.results == {}


async def test_failures_are_logged_once_and_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = parse_config("server: {port: 19464}\n", environ={})
    runner = ProbeRunner(config, error_log_interval=3600.0)
    failure = ConnectionError("connection refused")
    probe = Scripted([failure, failure, 1.0])
    with caplog.at_level(logging.INFO, logger="stocksentry.exporter.probes"):
        for _ in range(3):
            await runner.run_once(probe)
    messages = [r.getMessage() for r in caplog.records]
    # One line for the first failure (the second is within the interval), one at recovery.
    assert messages == [
        "probe scripted failed: ConnectionError: connection refused",
        "probe scripted recovered after 2 failed runs",
    ]


async def test_runner_life_cycle_without_a_database(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    runner = ProbeRunner(parse_config("server: {port: 19464}\n", environ={}), registry=registry)
    with caplog.at_level(logging.INFO, logger="stocksentry.exporter.probes"):
        async with runner:
            assert not runner.is_leader
            assert runner.probes == ()
            assert runner.index_advice is None
        await runner.stop()  # idempotent
    assert "no database section: no database probes" in [r.getMessage() for r in caplog.records]
    assert [m.name for m in runner.describe()] == [
        catalog.PROBE_UP.name,
        catalog.PROBE_DURATION.name,
        catalog.PROBE_LAST_SUCCESS.name,
    ]
    assert registry.get_sample_value(UP, {"probe": "x"}) is None

    # The aiohttp cleanup_ctx form: start before the yield, stop after it.
    generator = no_database().cleanup_ctx(object())
    await generator.__anext__()
    with pytest.raises(StopAsyncIteration):
        await generator.__anext__()


# --- the contract's helpers ----------------------------------------------------------------


def test_backoff_doubles_with_jitter_up_to_the_maximum_and_resets() -> None:
    random.seed(7)
    now = [1000.0]
    backoff = Backoff(initial=0.5, maximum=4.0, clock=lambda: now[0])
    assert backoff.wait_time() == 0

    delays = [backoff.failed() for _ in range(6)]
    for delay, nominal in zip(delays, (0.5, 1.0, 2.0, 4.0, 4.0, 4.0), strict=True):
        assert 0.8 * nominal <= delay <= nominal
    assert backoff.failures == 6
    assert backoff.wait_time() == pytest.approx(delays[-1])
    now[0] += delays[-1] / 2
    assert backoff.wait_time() == pytest.approx(delays[-1] / 2)
    now[0] += delays[-1]
    assert backoff.wait_time() == 0

    backoff.succeeded()
    assert backoff.failures == 0
    assert 0.4 <= backoff.failed() <= 0.5


def test_backoff_lets_one_attempt_out_at_a_time_while_the_source_is_down() -> None:
    now = [1000.0]
    backoff = Backoff(initial=0.5, maximum=4.0, clock=lambda: now[0])
    # Healthy: attempts run side by side.
    with backoff.attempt("database"), backoff.attempt("database"):
        pass
    with pytest.raises(OSError, match="refused"), backoff.attempt("database"):
        raise OSError("refused")
    now[0] += 1.0  # past the backoff
    # Down: a second attempt meanwhile fails at once instead of opening a socket.
    with (
        backoff.attempt("database"),
        pytest.raises(ProbeUnavailableError, match="another attempt is under way"),
        backoff.attempt("database"),
    ):
        raise AssertionError("unreachable")
    assert backoff.failures == 0  # the first one succeeded
    with backoff.attempt("database"), backoff.attempt("database"):
        pass


def test_error_log_rate_limits_per_probe_and_blanks_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    log = ErrorLog(
        logging.getLogger("test.probes"), interval=60.0, secrets=[LEAKY], clock=lambda: now[0]
    )
    with caplog.at_level(logging.INFO, logger="test.probes"):
        blanked = log.failed("a", f"auth failed for {LEAKY}")
        now[0] = 30.0
        log.failed("a", "again")
        log.failed("b", "other probe")  # its own budget
        now[0] = 61.0
        log.failed("a", "still")
        log.recovered("a")
        log.recovered("a")  # only once
        log.recovered("never-failed")
    assert [r.getMessage() for r in caplog.records] == [
        f"probe a failed: {blanked}",
        "probe b failed: other probe",
        "probe a failed: still (1 more failures since the last message)",
        "probe a recovered after 3 failed runs",
    ]
    assert blanked == redact(f"auth failed for {LEAKY}", [LEAKY])
    assert LEAKY not in blanked
    assert LEAKY not in log.clean(f"x {LEAKY} y")
    assert all(r.probe in ("a", "b") for r in caplog.records)


def test_error_log_blanks_every_form_of_a_url_s_password() -> None:
    url = "postgresql://app:s%40cret@db/shop"
    assert secret_fragments(url) == (url, "s%40cret", "s@cret")
    log = ErrorLog(logging.getLogger("test.probes"), secrets=secret_fragments(url))
    assert log.failed("negative_stock", f"cannot use {url}: bad s@cret") == (
        "cannot use ***: bad ***"
    )


def test_describe_error() -> None:
    assert describe_error(TimeoutError(), timeout=5.0) == "timed out after 5s"
    assert describe_error(TimeoutError("slow")) == "TimeoutError: slow"
    assert describe_error(ValueError()) == "ValueError"
    deadlock = RuntimeError("deadlock\n  detected")
    deadlock.sqlstate = "40P01"  # type: ignore[attr-defined]
    assert describe_error(deadlock) == "RuntimeError (SQLSTATE 40P01): deadlock detected"
    long = describe_error(ValueError("x" * 1000))
    assert len(long) == len("ValueError: ") + 300
    assert long.endswith("...")


def test_family_builds_gauges_and_counters_only() -> None:
    gauge = family(catalog.OVERSOLD_UNITS, [(("EGG-01",), 3.0)])
    assert (gauge.type, gauge.samples[0].labels, gauge.samples[0].value) == (
        "gauge",
        {"sku": "EGG-01"},
        3.0,
    )
    assert family(catalog.DB_DEADLOCKS).type == "counter"
    with pytest.raises(ValueError, match="probes export gauges and counters"):
        family(catalog.RESERVATION_DURATION)
    assert repr(Scripted([], interval=90.0)) == "<Scripted scripted every 1m30s>"


def test_duplicate_orders_without_a_key_column_refuses_rather_than_export_zero() -> None:
    from stocksentry.exporter.probes.db import DuplicateOrdersProbe
    from stocksentry.exporter.probes.pool import Pool
    from stocksentry.instrumentation.guard import LabelGuard

    # The loader switches the probe off for such a schema; built by hand, it must not run
    # and say 0 duplicate keys forever.
    config = parse_config(
        "database:\n  url: postgresql://u@127.0.0.1:1/x\n"
        "schema:\n  orders:\n    external_ref: null\n    idempotency_key: null\n"
    )
    with pytest.raises(ValueError, match="needs external_ref or idempotency_key"):
        DuplicateOrdersProbe(config, Pool(config.database), LabelGuard(10))
