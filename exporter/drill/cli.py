"""``stocksentry drill``: the pre-sale drill against the shop's own checkout. Exit status:
0 every verdict passed, 1 a verdict failed, 2 bad input, 3 could not verify (never a
pass), 130 interrupted."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..commandline import CommandError, ExitCode, Subcommands, int_in, say
from . import SCENARIOS

if TYPE_CHECKING:
    from ..lab.progress import LiveProgress
    from .config import DrillConfig
    from .scenarios import Drill, ScenarioResult, Tick

__all__ = ["add_parser", "run_drill"]

#: The exit status of each overall verdict.
EXIT_STATUS = {"pass": ExitCode.OK, "fail": ExitCode.FINDINGS, "unverified": ExitCode.INCOMPLETE}


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    """Add the ``drill`` subcommand to the ``stocksentry`` parser."""
    parser = commands.add_parser(
        "drill",
        help="pre-sale drill: fire concurrent checkouts at the shop, judge by its database",
        description=(
            "Fire concurrent checkouts (released together by last-byte synchronisation) "
            "at the shop's own checkout over HTTP, then judge by its database: did the "
            "successes exceed the stock, is the final stock negative or inconsistent, "
            "was an intent ordered twice. It writes to the shop it is pointed at: it "
            "refuses to run without --yes (or confirm: true), touches only the drill SKU "
            "and restores its stock at the end. Exit status: 0 every verdict passed; "
            "1 a verdict failed; 2 bad input; 3 could not verify (not a pass)."
        ),
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the drill file (YAML)")
    parser.add_argument(
        "--yes", action="store_true", help="run: the drill sells the drill SKU in the shop"
    )
    parser.add_argument(
        "--checkout-url", metavar="URL", help="override target.checkout.url of the file"
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIOS,
        metavar="NAME",
        help="run this scenario (repeatable; overrides drill.scenarios): " + ", ".join(SCENARIOS),
    )
    parser.add_argument(
        "--engine",
        choices=("asyncio", "locust"),
        default="asyncio",
        help="who sends the burst: this process (asyncio, last-byte synchronised), or "
        "Locust's master and workers (locust, needs the drill extra)",
    )
    parser.add_argument(
        "--workers",
        type=int_in(1, 64),
        default=2,
        metavar="N",
        help="--engine locust: Locust workers started on this machine, 1..64 (2)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML here")
    parser.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write an HTML report (latency histogram, successes against the stock,"
        " the burst's timeline)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run_drill, parser=parser)
    return parser


def _load(args: argparse.Namespace) -> DrillConfig:
    import dataclasses

    from ..config import ConfigError
    from .config import load_drill_config, scenario_problem, url_problem

    try:
        config = load_drill_config(args.config)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    if args.checkout_url:
        url = args.checkout_url.strip()
        problem = url_problem(url)
        if problem is not None:
            raise CommandError(f"--checkout-url: {problem}, got {url[:200]!r}")
        checkout = dataclasses.replace(config.target.checkout, url=url)
        config = dataclasses.replace(
            config, target=dataclasses.replace(config.target, checkout=checkout)
        )
    if args.scenario:
        scenarios = tuple(dict.fromkeys(args.scenario))
        settings = dataclasses.replace(config.drill, scenarios=scenarios)
        config = dataclasses.replace(config, drill=settings)
        problem = scenario_problem(config)
        if problem is not None:
            raise CommandError(f"--scenario: {problem}")
    return config


def run_drill(args: argparse.Namespace) -> int:
    """Run ``stocksentry drill``; returns the exit status."""
    from .. import dburl

    config = _load(args)
    err = sys.stderr
    # What the drill names before it starts, and its reports after.
    target = {
        "checkout": f"{config.target.checkout.method} {config.target.checkout.url}",
        "database": dburl.shown(config.database.url.reveal()),
        "sku": config.drill.sku,
    }
    if not (args.yes or config.confirm):
        raise CommandError(
            f"refusing to run without --yes: the drill sells SKU {config.drill.sku} through"
            f" {target['checkout']} and writes its stock in {target['database']}"
        )
    from .truth import Shop, Unverifiable

    try:
        shop = Shop(config.database.url.reveal(), config.schema, config.drill.sku)
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if not args.quiet:
        import textwrap

        # Named before anything is written, so a wrong target is seen in time.
        for text in (
            f"stocksentry drill: target {target['checkout']}",
            f"stocksentry drill: database {target['database']}, SKU {config.drill.sku}",
        ):
            for line in textwrap.wrap(text, 80, subsequent_indent="    "):
                say(err, line)
    try:
        try:
            original = shop.find().stock
        except LookupError as exc:
            raise CommandError(str(exc)) from None
        except Unverifiable as exc:
            # Nothing sent, nothing written: every scenario unverified, in every report.
            from .scenarios import ScenarioResult

            say(err, f"stocksentry drill: cannot verify: {exc}")
            results = [
                ScenarioResult(name, unverified=str(exc)) for name in config.drill.scenarios
            ]
            restored = f"nothing was sent or written: {exc}"
        else:
            results, restored = _run(config, shop, original, args)
    finally:
        shop.close()
    return _report(results, target, restored, args)


def _run(
    config: DrillConfig, shop: Any, original: int, args: argparse.Namespace
) -> tuple[list[ScenarioResult], str]:
    import asyncio

    from .scenarios import Drill
    from .truth import Unverifiable

    engine = None
    if args.engine == "locust":
        if importlib.util.find_spec("locust") is None:
            raise CommandError("--engine locust needs locust: pip install 'stocksentry[drill]'")
        from .locust_engine import locust_burst

        engine = functools.partial(locust_burst, args.workers)
    progress = _progress(config, args)
    tick = progress[1] if progress is not None else None
    drill = Drill(config, shop, uuid.uuid4().hex[:8], tick=tick, engine=engine)
    try:
        results = asyncio.run(_scenarios(drill))
    finally:
        if progress is not None:
            progress[0].close()
        # The drill SKU's stock back as it was found, the way the scenarios set it.
        try:
            asyncio.run(drill.reset(original))
            restored = f"restored the stock of {shop.sku} to {original}"
        except Unverifiable as exc:
            restored = f"the stock of {shop.sku} could NOT be restored to {original}: {exc}"
    return results, restored


async def _scenarios(drill: Drill) -> list[ScenarioResult]:
    from .failures import duplicate_callback, stale_availability
    from .observability import Unreadable, observability, scrape
    from .scenarios import Drill, ScenarioResult
    from .truth import Unverifiable

    runs = {
        "burst": Drill.burst,
        "retry": Drill.retry,
        "duplicate_callback": duplicate_callback,
        "stale_availability": stale_availability,
        "observability": observability,
    }
    config = drill.config
    metrics_url = config.observability.metrics_url
    if "observability" in config.drill.scenarios and metrics_url is not None:
        # Before the first scenario: the counters the drill makes grow.
        with contextlib.suppress(Unreadable):
            drill.baseline = await scrape(metrics_url, config.target.timeout)
    for name in config.drill.scenarios:
        try:
            result = await runs[name](drill)
        except Unverifiable as exc:
            current = drill.current
            result = current if current and current.name == name else ScenarioResult(name)
            result.passed, result.failures, result.unverified = None, [], str(exc)
        drill.results.append(result)
    return drill.results


def _progress(config: DrillConfig, args: argparse.Namespace) -> tuple[LiveProgress, Tick] | None:
    """Live progress through the lab's bars, one per scenario; ``None`` when not shown."""
    if args.quiet or args.format == "json":
        return None
    from ..lab.progress import LiveProgress, Progress

    try:
        bars = LiveProgress(
            sys.stderr,
            config.drill.scenarios,
            total=config.drill.requests,
            title="stocksentry drill",
            unit="requests",
        )
    except ImportError:
        return None
    bars.start(config.drill.sku)
    began = time.perf_counter()

    def tick(name: str, done: int, total: int, successes: int) -> None:
        elapsed = time.perf_counter() - began
        snapshot = Progress(name, done, total, successes, done - successes, 0, elapsed)
        (bars.finish if done >= total else bars.update)(snapshot)

    return bars, tick


def _write(option: str, path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"{option}: cannot write {path}: {exc.strerror}") from exc


def _report(
    results: list[ScenarioResult],
    target: dict[str, str],
    restored: str,
    args: argparse.Namespace,
) -> int:
    from .report import format_json, format_junit, format_text, overall

    formatter = format_json if args.format == "json" else format_text
    sys.stdout.write(formatter(results, target=target, restored=restored))
    sys.stdout.flush()
    if args.junit:
        _write("--junit", args.junit, format_junit(results, target=target))
    if args.report:
        import shlex

        from .report_html import format_html

        page = format_html(
            results,
            target=target,
            restored=restored,
            command=shlex.join(["stocksentry", *sys.argv[1:]]),
        )
        _write("--report", args.report, page)
    if "NOT be restored" in restored:
        say(sys.stderr, f"stocksentry drill: warning: {restored}")
    return int(EXIT_STATUS[overall(results)])
