"""What ``stocksentry reconcile`` audits: its ``--since`` instant, as the database's
session compares it, and its ``--sku`` as the report may print it.

A MySQL / MariaDB ``DATETIME`` has no time zone: the shop's ``NOW()`` writes the wall
clock of its session's time zone. An instant is therefore sent as the wall clock of the
audit session's time zone (:func:`session_moment`), which a ``TIMESTAMP`` column reads
right too; PostgreSQL converts a ``timestamptz`` parameter itself.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING

from ..commandline import CommandError
from ..durations import parse_duration
from ..inputs import shorten

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


_HAS_UNIT = re.compile(r"[0-9]+[a-z]")
#: The characters of a SKU echoed in a report line (longer ones are cut with "…").
SKU_SHOWN = 80


class ReconcileError(CommandError):
    """Bad input or an unusable database; ``str()`` is the one line to print."""


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """A point in time from an ISO-8601 timestamp or a duration ago.

    Durations are those of :mod:`stocksentry.exporter.durations`, Prometheus's (``90m``,
    ``1h30m``, ``1d``); naive timestamps are taken as UTC. Raises :class:`ReconcileError`
    for anything else, and for a duration that reaches before year 1.

    Example::

        >>> now = datetime(2026, 11, 29, 12, tzinfo=UTC)
        >>> parse_since("1h30m", now=now).isoformat()
        '2026-11-29T10:30:00+00:00'
        >>> parse_since("2026-11-29T10:00:00Z").isoformat()
        '2026-11-29T10:00:00+00:00'
    """
    stripped = text.strip()
    if _HAS_UNIT.match(stripped):
        try:
            seconds = parse_duration(stripped)
        except ValueError as exc:
            raise ReconcileError(f"--since: {exc}") from None
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        except OverflowError:
            raise ReconcileError(f"--since: {text[:40]!r} reaches before year 1") from None
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise ReconcileError(
            f"--since: expected an ISO-8601 time or a duration like 2h or 1m30s, got {text[:40]!r}"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def session_moment(conn: Connection, moment: datetime) -> datetime:
    """``moment`` as the wall clock of ``conn``'s MySQL / MariaDB session time zone
    (naive): what a ``DATETIME`` the shop's ``NOW()`` wrote is compared with. The
    session's offset is the server's own (``NOW()`` against ``UTC_TIMESTAMP()``), so a
    server (or ``init_command``) at ``+09:00`` is read at ``+09:00``."""
    from sqlalchemy import text

    offset = conn.execute(text("SELECT TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())")).scalar()
    # Whole minutes: the two clocks are read in one statement, but stay safe from a tick.
    minutes = round(int(offset or 0) / 60)
    zone = timezone(timedelta(minutes=minutes))
    return moment.astimezone(zone).replace(tzinfo=None)


def shown_sku(sku: str) -> str:
    """``--sku`` as a report line may print it: control characters and newlines escaped,
    at most :data:`SKU_SHOWN` characters.

    Example::

        >>> print(shown_sku("EGG-01\\nverdict: every invariant holds"))
        EGG-01\\x0averdict: every invariant holds
    """
    return shorten(sku, SKU_SHOWN)
