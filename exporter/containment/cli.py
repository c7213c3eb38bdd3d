"""``stocksentry freeze``, ``unfreeze`` and ``frozen``: a person's hand on the freeze.

Where the freezes live comes from ``--redis-url``, else ``$STOCKSENTRY_FREEZE_REDIS_URL``,
else the ``containment`` section of ``--config FILE`` (the exporter's, so the command and
the sidecar use one Redis, key template and channel). This module loads only the standard
library; redis-py is imported when a command runs.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..commandline import CommandError, ExitCode, Subcommands, duration_in, say
from . import scrub

__all__ = ["REDIS_URL_ENV", "add_parsers"]

REDIS_URL_ENV: Final = "STOCKSENTRY_FREEZE_REDIS_URL"


def add_parsers(commands: Subcommands) -> None:
    """Add ``freeze``, ``unfreeze`` and ``frozen`` to the ``stocksentry`` parser."""
    freeze = commands.add_parser(
        "freeze",
        help="freeze a SKU: checkouts honouring the freeze refuse it",
        description=(
            "Freeze SKU: every checkout that honours the freeze contract (docs/containment.md) "
            "refuses it from the moment its view sees the change, in about a millisecond. "
            "A person's freeze replaces an alert's and is never lifted by an alert."
        ),
    )
    freeze.add_argument("sku", metavar="SKU", help="the SKU to freeze")
    freeze.add_argument("--reason", required=True, help="why: shown to on-call and in logs")
    freeze.add_argument(
        "--ttl",
        type=duration_in(1, 30 * 86400),
        metavar="DURATION",
        help="lift the freeze by itself after this (e.g. 30m); default: until unfrozen",
    )
    freeze.add_argument("--by", help="who freezes (default: the login name of this shell)")
    _target(freeze, _freeze)

    unfreeze = commands.add_parser(
        "unfreeze",
        help="lift a SKU's freeze (a person's or an alert's)",
        description="Lift the freeze of SKU, whoever set it; checkout resumes.",
    )
    unfreeze.add_argument("sku", metavar="SKU", help="the SKU to unfreeze")
    _target(unfreeze, _unfreeze)

    frozen = commands.add_parser(
        "frozen",
        help="list the frozen SKUs with reasons, ages and sources",
        description=(
            "List every frozen SKU: who froze it (person or alert), why, how long ago and "
            "when it lifts by itself. Exit 3 when Redis cannot be read (never an empty list)."
        ),
    )
    frozen.add_argument("--format", choices=("text", "json"), default="text")
    _target(frozen, _frozen)


def _target(parser: argparse.ArgumentParser, handler: Callable[[argparse.Namespace], int]) -> None:
    """Where the freezes live, for each command, and the command's ``handler``."""
    parser.set_defaults(handler=handler)
    group = parser.add_argument_group("where the freezes live")
    group.add_argument(
        "--redis-url",
        metavar="URL",
        help=f"the Redis of the freezes (default: ${REDIS_URL_ENV}, else --config's)",
    )
    group.add_argument(
        "--config",
        metavar="FILE",
        help="the exporter's YAML config: its containment section (URL, key template, channel)",
    )
    group.add_argument("--key-template", help="the freeze key (default stocksentry:freeze:{sku})")
    group.add_argument("--channel", help="the change channel (default stocksentry:freeze)")


@dataclass(frozen=True, slots=True)
class Target:
    """The Redis, key template and channel a command works on."""

    url: str
    key_template: str
    channel: str


def resolve_target(args: argparse.Namespace) -> Target:
    """The :class:`Target` of a parsed command line; :class:`CommandError` when none."""
    from stocksentry.instrumentation.freeze import (
        DEFAULT_CHANNEL,
        DEFAULT_KEY_TEMPLATE,
        check_template,
    )

    url: str | None = args.redis_url or os.environ.get(REDIS_URL_ENV) or None
    template, channel = DEFAULT_KEY_TEMPLATE, DEFAULT_CHANNEL
    if args.config is not None:
        from ..config import ConfigError, load_config

        try:
            section = load_config(args.config).containment
        except (ConfigError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if section is None:
            raise CommandError(f"{args.config}: has no containment section")
        url = url or section.url.reveal()
        template, channel = section.key_template, section.channel
    if url is None:
        raise CommandError(
            f"where are the freezes? give --redis-url, ${REDIS_URL_ENV} or --config"
        )
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise CommandError("--redis-url: expected a redis://, rediss:// or unix:// URL")
    template = args.key_template or template
    try:
        check_template(template)
    except (TypeError, ValueError) as exc:
        raise CommandError(f"--key-template: {exc}") from None
    return Target(url, template, args.channel or channel)


def _sku_target(args: argparse.Namespace) -> Target:
    """The target of ``freeze``/``unfreeze``, once their SKU is one the contract takes."""
    from stocksentry.instrumentation.freeze import FreezeContractError, check_sku

    target = resolve_target(args)
    try:
        check_sku(args.sku)
    except FreezeContractError as exc:
        raise CommandError(f"SKU: {exc}") from None
    return target


def _freeze(args: argparse.Namespace) -> int:
    from stocksentry.instrumentation.freezeview import freeze_sku

    target = _sku_target(args)
    by = args.by if args.by is not None else _login()
    outcome, state = _call(
        target,
        lambda client: freeze_sku(
            client,
            args.sku,
            reason=args.reason,
            source="person",
            ttl=args.ttl,
            by=by,
            key_template=target.key_template,
            channel=target.channel,
        ),
    )
    lifts = "until unfrozen" if state.expires_at is None else f"for {_age(args.ttl)}"
    verb = "frozen" if outcome == "frozen" else "frozen again (replacing the earlier freeze)"
    say(sys.stdout, f"{args.sku}: {verb} {lifts}: {state.reason}")
    return ExitCode.OK


def _unfreeze(args: argparse.Namespace) -> int:
    from stocksentry.instrumentation.freezeview import unfreeze_sku

    target = _sku_target(args)
    outcome = _call(
        target,
        lambda client: unfreeze_sku(
            client,
            args.sku,
            source="person",
            key_template=target.key_template,
            channel=target.channel,
        ),
    )
    text = "unfrozen: checkout resumes" if outcome == "unfrozen" else "was not frozen"
    say(sys.stdout, f"{args.sku}: {text}")
    return ExitCode.OK


def _frozen(args: argparse.Namespace) -> int:
    from stocksentry.instrumentation.freezeview import read_frozen

    target = resolve_target(args)
    try:
        states = _call(target, lambda client: read_frozen(client, target.key_template))
    except CommandError as exc:
        # Not an all-clear: the list could not be read.
        say(sys.stderr, f"stocksentry frozen: cannot read the freezes: {exc}")
        return ExitCode.INCOMPLETE
    now = time.time()
    rows = sorted(states.values(), key=lambda s: s.at)
    if args.format == "json":
        body = [
            {
                "sku": s.sku,
                "source": s.source,
                "reason": s.reason,
                "by": s.by,
                "since": s.at,
                "age_seconds": round(max(0.0, now - s.at), 1),
                "expires_at": s.expires_at,
            }
            for s in rows
        ]
        say(sys.stdout, json.dumps({"frozen": body}, ensure_ascii=False))
        return ExitCode.OK
    if not rows:
        say(sys.stdout, "no SKU is frozen")
        return ExitCode.OK
    table = [("SKU", "SOURCE", "AGE", "LIFTS IN", "BY", "REASON")]
    for s in rows:
        lifts = "—" if s.expires_at is None else _age(max(0.0, s.expires_at - now))
        table.append((s.sku, s.source, _age(max(0.0, now - s.at)), lifts, s.by or "—", s.reason))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        say(sys.stdout, "  ".join([*cells, row[5]]).rstrip())
    return ExitCode.OK


def _call(target: Target, work: Any) -> Any:
    import redis
    from stocksentry.instrumentation.secrets import mask_url

    # Short timeouts: a person waits at a prompt.
    client = redis.Redis.from_url(target.url, socket_connect_timeout=3.0, socket_timeout=5.0)
    try:
        return work(client)
    except redis.RedisError as exc:
        shown = mask_url(target.url) or "<the Redis URL>"
        raise CommandError(f"Redis at {shown}: {scrub(exc, target.url)}") from None
    finally:
        client.close()


def _age(seconds: float) -> str:
    from ..durations import format_duration

    return format_duration(round(seconds))


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""
