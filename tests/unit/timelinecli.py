"""The ``stocksentry timeline`` command run in-process, as the timeline tests drive it."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from stocksentry.exporter.investigate.timeline import add_timeline_parser


def parse_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stocksentry")
    add_timeline_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["timeline", *argv])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The exit status, stdout and stderr of ``stocksentry timeline *argv``."""
    args = parse_args(*argv)
    status = args.func(args)
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """The status and the JSON report; nothing may be written to stderr."""
    status, out, err = run(capsys, *argv, "--format", "json")
    assert err == ""
    return status, json.loads(out)
