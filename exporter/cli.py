"""The ``stocksentry`` command line.

One subcommand per function: ``_add_<name>`` declares its arguments and ``_cmd_<name>``
runs it. Subcommands import their heavy dependencies (SQLAlchemy, aiohttp) only when they
run, so ``stocksentry --help`` stays fast and works without the optional extras.

Exit status: 0 when the command did its job, 1 when it found stocksentry itself at fault
(``demo``: metric totals that disagree with the database), 2 for bad arguments or an
unusable environment (unreachable database, busy port), 130 when interrupted.

Example::

    stocksentry demo                       # the flash-sale lab on a temporary SQLite file
    stocksentry demo --database postgresql://postgres@127.0.0.1:5432/lab --format json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING, TextIO

from .reconcile import add_reconcile_parser
from .timeline import add_timeline_parser

if TYPE_CHECKING:
    from .lab import StrategyResult

PROG = "stocksentry"
EXIT_OK = 0
EXIT_INCONSISTENT = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# Kept in step with lab.STRATEGIES by a unit test; listing them here keeps SQLAlchemy out
# of parser construction.
_STRATEGY_HELP = "unsafe, check_then_decrement, naive_lock, atomic, for_update, redlock"

Handler = Callable[[argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Run the ``stocksentry`` command line; returns the exit status.

    Bad arguments end in argparse's usage error (``SystemExit(2)``).

    Example::

        raise SystemExit(main(["demo", "--buyers", "200"]))
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Observability for double-selling in flash sales.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, title="commands"
    )
    _add_demo(commands)
    _add_exporter(commands)
    _add_check_config(commands)
    add_timeline_parser(commands)
    add_reconcile_parser(commands)
    return parser


def _version() -> str:
    try:
        return metadata.version("stocksentry")
    except metadata.PackageNotFoundError:
        return "unknown"


# --- argument types ------------------------------------------------------------------------


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    # `not value >= 0` also refuses NaN.
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = _int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value}")
    return value


def _strategy_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("empty strategy list")
    try:
        from .lab import STRATEGIES
    except ImportError:
        # Without SQLAlchemy the demo command reports the missing extra itself.
        return names
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {', '.join(map(repr, unknown))}"
            f" (choose from {', '.join(STRATEGIES)})"
        )
    return names


# --- exporter and check-config ----------------------------------------------------------


def _add_exporter(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    exporter = commands.add_parser(
        "exporter",
        help="run the sidecar: /metrics, /healthz, /readyz and the background probes",
        description=(
            "Serve /metrics (the app's multiprocess metrics merged with the probes' "
            "figures), /healthz and /readyz, and run the database and Redis probes in the "
            "background. A bad config prints one line naming file, line and key, exit 2."
        ),
    )
    exporter.add_argument(
        "--config", required=True, metavar="FILE", help="the exporter's YAML config"
    )
    exporter.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="TLS and basic auth, in the Prometheus exporters' web-config format "
        "(overrides server.web_config_file)",
    )
    exporter.set_defaults(handler=_cmd_exporter, parser=exporter)


def _cmd_exporter(args: argparse.Namespace) -> int:
    from .sidecar import run_exporter

    return run_exporter(args.config, web_config_file=args.web_config_file)


def _add_check_config(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    check = commands.add_parser(
        "check-config",
        help="validate an exporter config (and its web config) without starting",
        description="Validate an exporter config; exit 0 when usable, 2 with one line if not.",
    )
    check.add_argument("file", metavar="FILE", help="the exporter's YAML config")
    check.set_defaults(handler=_cmd_check_config, parser=check)


def _cmd_check_config(args: argparse.Namespace) -> int:
    from .sidecar import check_config

    return check_config(args.file)


# --- demo ----------------------------------------------------------------------------------


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    demo.add_argument(
        "--database",
        metavar="URL",
        help="SQLAlchemy URL of a scratch database, where the lab creates and rewrites "
        "products, orders and order_items rows of its LAB-* SKUs (postgresql:// uses "
        "psycopg 3); default: a temporary SQLite file, removed at the end",
    )
    demo.add_argument(
        "--buyers",
        type=_int_at_least(1),
        default=500,
        metavar="N",
        help="buyers per strategy (500)",
    )
    demo.add_argument(
        "--stock",
        type=_int_at_least(0),
        default=100,
        metavar="N",
        help="units on sale per strategy (100)",
    )
    demo.add_argument(
        "--concurrency",
        type=_int_at_least(1),
        default=50,
        metavar="N",
        help="buyer threads, and database connections (50)",
    )
    demo.add_argument(
        "--work-ms",
        type=_non_negative_float,
        default=5.0,
        metavar="MS",
        help="the app's work between reading and writing the stock, in ms (5)",
    )
    demo.add_argument(
        "--strategy",
        type=_strategy_list,
        action="append",
        metavar="NAME[,NAME...]",
        help=f"strategies to run, repeatable or comma-separated: {_STRATEGY_HELP} (default: all)",
    )
    demo.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="report format on stdout (table)",
    )
    demo.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve the lab's /metrics on 127.0.0.1:PORT while it runs",
    )
    demo.add_argument(
        "--linger",
        type=_non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="keep serving /metrics this long after the report (needs --metrics-port)",
    )
    demo.add_argument(
        "--log-file",
        metavar="PATH",
        help="write the instrumentation's JSON log lines (stock_check, stock_update...) here",
    )
    demo.add_argument(
        "--redis",
        metavar="URL",
        help="Redis for the lock strategies naive_lock and redlock (their keys start with "
        "stocksentry-lab: and are deleted at the end); without it they are skipped",
    )
    demo.add_argument(
        "--lock-ttl-ms",
        type=_positive_float,
        metavar="MS",
        help="TTL of naive_lock's SET NX lock, in ms (default: 80%% of --work-ms, so the "
        "lock expires under its holder as in the seeds: a 5 s lock around 6 s of work)",
    )
    demo.add_argument(
        "--redlock-impl",
        choices=("lab", "pottery"),
        default="lab",
        help="redlock's owned lock: the lab's compare-and-delete lock, or pottery's Redlock "
        "(pip install pottery; slower with many threads) (lab)",
    )
    demo.add_argument(
        "--retries",
        type=_share,
        default=0.0,
        metavar="SHARE",
        help="share of buyers (0 to 1, or a percentage) who submit the same intent twice (0)",
    )
    demo.add_argument(
        "--idempotency",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="answer a resubmitted intent from its stored result by idempotency key; "
        "--no-idempotency reserves it again: duplicate orders per key (on)",
    )
    demo.add_argument(
        "--stale-cache",
        action="store_true",
        help="decide availability from a cache refreshed late (a Redis key with --redis, "
        "else in memory) and count the stale hits",
    )
    demo.add_argument(
        "--cache-refresh-ms",
        type=_positive_float,
        default=50.0,
        metavar="MS",
        help="how often --stale-cache refreshes the cached stock, in ms (50)",
    )
    demo.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML report (tables and inline SVG charts)",
    )
    demo.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    demo.set_defaults(handler=_cmd_demo, parser=demo)


def _positive_float(text: str) -> float:
    value = _non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _share(text: str) -> float:
    percent = text.strip().endswith("%")
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a share: {text!r}") from None
    if percent:
        value /= 100
    # `not 0 <= value` also refuses NaN.
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (or 0% and 100%), got {text}")
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.parser
    if args.linger and args.metrics_port is None:
        parser.error("--linger needs --metrics-port")
    try:
        from prometheus_client import CollectorRegistry

        from . import lab
    except ImportError as exc:
        return _fail(
            f"needs SQLAlchemy ({exc.name or exc} is missing): pip install 'stocksentry[exporter]'"
        )

    strategies = tuple(dict.fromkeys(name for group in args.strategy or () for name in group))
    config = lab.LabConfig(
        database_url=args.database,
        buyers=args.buyers,
        stock=args.stock,
        concurrency=args.concurrency,
        work_ms=args.work_ms,
        strategies=strategies,
        log_file=args.log_file,
        redis_url=args.redis,
        lock_ttl_ms=args.lock_ttl_ms,
        redlock_impl=args.redlock_impl,
        retries=args.retries,
        idempotency=args.idempotency,
        stale_cache=args.stale_cache,
        cache_refresh_ms=args.cache_refresh_ms,
    )
    err = sys.stderr
    registry = CollectorRegistry()
    try:
        # Parse the URL before binding a port: a bad URL is one line, not a traceback.
        lab.describe_database(config)
        server: contextlib.AbstractContextManager[int | None] = (
            lab.serve_metrics(registry, args.metrics_port)
            if args.metrics_port is not None
            else contextlib.nullcontext()
        )
        with server as port:
            header = (
                (f"serving lab metrics at http://127.0.0.1:{port}/metrics",)
                if port is not None
                else ()
            )
            progress = None if args.quiet else lab.StderrProgress(err, header=header)
            results = lab.run_lab(config, registry=registry, progress=progress)
            if args.format == "json":
                print(json.dumps([r.to_dict() for r in results], indent=2))
            else:
                print(lab.format_report(config, results))
            sys.stdout.flush()
            if args.report is not None:
                _write_report(args.report, lab.format_html(config, results))
            status = _judge(results, err)
            if port is not None and args.linger > 0:
                if not args.quiet:
                    _say(
                        err,
                        f"lingering {args.linger:g} s: http://127.0.0.1:{port}/metrics "
                        "(Ctrl-C to stop)",
                    )
                _linger(args.linger)
    except lab.LabError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        # On a terminal the cursor may sit at the end of a progress line.
        _say(err, ("\n" if _isatty(err) else "") + "stocksentry demo: interrupted")
        return EXIT_INTERRUPTED
    return status


def _write_report(path: str, page: str) -> None:
    from .lab import LabError

    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(page)
    except OSError as exc:
        raise LabError(f"cannot write report {path}: {exc.strerror or exc}") from exc


def _linger(seconds: float) -> None:
    # Lingering is a courtesy to scrapers; stopping it early is not a failure.
    with contextlib.suppress(KeyboardInterrupt):
        time.sleep(seconds)


def _judge(results: list[StrategyResult], err: TextIO) -> int:
    status = EXIT_OK
    for result in results:
        if result.errors:
            _say(
                err,
                f"stocksentry demo: warning: {result.strategy}: {result.errors} buyers failed"
                f" ({result.first_error})",
            )
        if not result.consistent:
            status = EXIT_INCONSISTENT
            for mismatch in result.mismatches:
                _say(
                    err,
                    f"stocksentry demo: METRICS DO NOT MATCH THE DATABASE ({result.strategy}):"
                    f" {mismatch}",
                )
    return status


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _say(stream: TextIO, line: str) -> None:
    stream.write(line + "\n")
    stream.flush()


def _fail(message: str, command: str = "demo") -> int:
    _say(sys.stderr, f"{PROG} {command}: error: {message}")
    return EXIT_USAGE
