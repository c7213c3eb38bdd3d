"""The ``stocksentry`` command line: argument errors end in argparse's usage error (exit 2)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from stocksentry.exporter import cli
from stocksentry.exporter.commandline import report_error
from stocksentry.exporter.lab.config import STRATEGY_NAMES


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: stocksentry")
    return err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["demo", "--buyers", "0"], "argument --buyers: must be between 1 and 100000, got 0"),
        (["demo", "--buyers", "many"], "argument --buyers: not a whole number: 'many'"),
        (["demo", "--stock", "-1"], "argument --stock: must be between 0 and 1000000, got -1"),
        (["demo", "--concurrency", "0"], "argument --concurrency: must be between 1 and 256"),
        (["demo", "--work-ms", "-1"], "argument --work-ms: must be a number between 0 and 10000"),
        (["demo", "--work-ms", "nan"], "argument --work-ms: must be a number between 0 and 10000"),
        (["demo", "--work-ms", "inf"], "argument --work-ms: must be a number between 0 and 10000"),
        (["demo", "--metrics-port", "70000"], "argument --metrics-port: not a TCP port"),
        (["demo", "--strategy", "yolo"], "unknown strategy 'yolo' (choose from unsafe,"),
        (["demo", "--strategy", "atomic,yolo"], "unknown strategy 'yolo'"),
        (["demo", "--strategy", ","], "argument --strategy: empty strategy list"),
        (["demo", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["demo", "--linger", "5"], "--linger needs --metrics-port"),
        (["demo", "--linger", "soon", "--metrics-port", "0"], "argument --linger: not a number"),
        (["demo", "--no-such-option"], "unrecognized arguments: --no-such-option"),
        (["demo", "--retries", "1.5"], "argument --retries: must be between 0 and 1"),
        (["demo", "--retries", "120%"], "argument --retries: must be between 0 and 1"),
        (["demo", "--retries", "some"], "argument --retries: not a share: 'some'"),
        (["demo", "--lock-ttl-ms", "0"], "argument --lock-ttl-ms: must be a number between 1 and"),
        (["demo", "--cache-refresh-ms", "0"], "argument --cache-refresh-ms: must be a number"),
        (["demo", "--redlock-impl", "etcd"], "argument --redlock-impl: invalid choice: 'etcd'"),
        # The upper bounds that keep a run on one laptop.
        (["demo", "--buyers", "100001"], "argument --buyers: must be between 1 and 100000"),
        (["demo", "--concurrency", "257"], "argument --concurrency: must be between 1 and 256"),
        (["demo", "--work-ms", "10001"], "argument --work-ms: must be a number between 0 and"),
        (["demo", "--linger", "3601", "--metrics-port", "0"], "argument --linger: must be a"),
        # The values a hostile-input run used: each refused in one line, nothing started.
        (["demo", "--buyers", "1e12"], "argument --buyers: not a whole number: '1e12'"),
        (["demo", "--buyers", "9" * 400], "argument --buyers: must be between 1 and 100000"),
        (["demo", "--work-ms", "1e12"], "argument --work-ms: must be a number between 0 and"),
        (["demo", "--stock", "1e30"], "argument --stock: not a whole number: '1e30'"),
        (["demo", "--concurrency", "100000"], "argument --concurrency: must be between 1 and"),
    ],
)
def test_bad_arguments_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(argv, capsys)
    assert message in err
    assert "Traceback" not in err


def test_strategies_parse_repeatable_and_comma_separated() -> None:
    args = cli.build_parser().parse_args(
        ["demo", "--strategy", "atomic, unsafe", "--strategy", "atomic"]
    )
    assert args.strategy == [["atomic", "unsafe"], ["atomic"]]


def test_demo_defaults() -> None:
    args = cli.build_parser().parse_args(["demo"])
    assert (args.buyers, args.stock, args.concurrency, args.work_ms) == (500, 100, 50, 5.0)
    assert (args.database, args.strategy, args.format) == (None, None, "table")
    assert (args.metrics_port, args.linger, args.log_file, args.quiet) == (None, 0.0, None, False)
    assert (args.redis, args.lock_ttl_ms, args.redlock_impl) == (None, None, "lab")
    assert (args.retries, args.idempotency, args.stale_cache) == (0.0, True, False)
    assert (args.cache_refresh_ms, args.report) == (50.0, None)


def test_lab_options_parse() -> None:
    args = cli.build_parser().parse_args(
        ["demo", "--retries", "20%", "--no-idempotency", "--stale-cache", "--lock-ttl-ms", "2.5"]
    )
    assert (args.retries, args.idempotency, args.stale_cache) == (0.2, False, True)
    assert args.lock_ttl_ms == 2.5


def test_help_lists_every_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    # The help text names the strategies from the one list the lab runs them from.
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"{', '.join(STRATEGY_NAMES)} (default: all)" in help_text
    for name in STRATEGY_NAMES:
        assert name in help_text


def test_help_gives_every_numeric_range(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "buyers per strategy, 1..100000 (500)",
        "units on sale per strategy, 0..1000000 (100)",
        "database connections, 1..256 (50)",
        "in ms, 0..10000 (5)",
        "0..65535",
        "0..3600 (0)",
        "in ms, 1..60000 (default: 80% of --work-ms",
        "0..1 or 0%..100% (0)",
        "in ms, 1..60000 (50)",
    ):
        assert shown in help_text, shown


def test_the_lab_runs_the_strategies_the_parser_knows() -> None:
    from stocksentry.exporter.lab.strategies import STRATEGIES

    assert tuple(STRATEGIES) == STRATEGY_NAMES


def test_a_command_error_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stocksentry.exporter import sidecar
    from stocksentry.exporter.commandline import CommandError

    def refuse(path: str) -> int:
        raise CommandError(f"{path}: cannot read\n(second line folded)")

    monkeypatch.setattr(sidecar, "check_config", refuse)
    assert cli.main(["check-config", "missing.yaml"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    line = "stocksentry check-config: error: missing.yaml: cannot read (second line folded)"
    assert err == line + "\n"


def test_ctrl_c_is_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from stocksentry.exporter import sidecar

    def interrupted(path: str) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(sidecar, "check_config", interrupted)
    assert cli.main(["check-config", "any.yaml"]) == 130
    assert capsys.readouterr().err == "stocksentry check-config: interrupted\n"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("stocksentry ")


def test_importing_the_cli_stays_light() -> None:
    code = (
        "import sys, stocksentry.exporter, stocksentry.exporter.cli as c\n"
        "c.build_parser()\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in"
        " {'sqlalchemy', 'aiohttp', 'psycopg', 'prometheus_client'})\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_lab_modules_doctests_pass() -> None:
    import doctest

    from stocksentry.exporter.lab import config, driver

    for module in (config, driver):
        result = doctest.testmod(module)
        assert result.failed == 0, module.__name__
        assert result.attempted > 0, module.__name__


#: Runs the command line in a fresh interpreter where the named top-level modules cannot be
#: imported, as in an install without the extra that brings them.
WITHOUT = """
import importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Missing())
from stocksentry.exporter.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize(
    ("blocked", "argv", "extra", "named"),
    [
        ("yaml", ["exporter", "--config", "nowhere.yaml"], "exporter", "yaml"),
        ("yaml", ["check-config", "nowhere.yaml"], "exporter", "yaml"),
        ("sqlalchemy", ["reconcile", "--database", "sqlite:///x.db"], "reconcile", "sqlalchemy"),
        ("rich,pgserver", ["demo"], "lab", "pgserver, rich"),
        ("yaml", ["drill", "--config", "drill.yaml", "--yes"], "drill", "yaml"),
        ("redis", ["frozen"], "redis", "redis"),
        ("redis", ["freeze", "EGG-01", "--reason", "x"], "redis", "redis"),
    ],
)
def test_a_missing_extra_is_one_line_and_exit_2_before_any_work(
    blocked: str, argv: list[str], extra: str, named: str, tmp_path: object
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT, blocked, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=str(tmp_path),
    )
    command = argv[0]
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"stocksentry {command}: error: {named} not installed: this command needs the"
        f" {extra} extra, pip install 'stocksentry[{extra}]'\n"
    )


def test_report_error_cuts_a_long_message_to_one_bounded_line() -> None:
    out = io.StringIO()
    report_error("check-config", "x " * 1000, out)
    assert out.getvalue() == f"stocksentry check-config: error: {'x ' * 498}x...\n"
