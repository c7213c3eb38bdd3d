"""Probes of the app's own bookkeeping on MySQL/MariaDB: expired reservations still held,
the outbox lag and its stuck events (the families and the log line of :mod:`..families`,
shared with PostgreSQL)."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ...invariants import quote
from ..base import family
from ..families import OutboxStuck, OutboxStuckLog, outbox_families
from .common import MyDbProbe, ident, interval_us, number
from .pool import MyPool, MySession

__all__ = ["ExpiredReservationsProbe", "OutboxProbe", "held_predicate"]


def held_predicate(config: ExporterConfig) -> tuple[str, dict[str, Any]]:
    """The predicate of a reservation that still holds its stock, and its parameters."""
    r = config.schema.reservations
    assert r is not None  # noqa: S101 - callers checked
    if r.status is not None:
        names = [f"held{i}" for i in range(len(r.held_statuses))]
        marks = ", ".join(f"%({n})s" for n in names)
        return (
            f"{quote(r.status, 'mysql')} IN ({marks})",
            dict(zip(names, r.held_statuses, strict=True)),
        )
    assert r.released_at is not None  # noqa: S101 - the config sets one of the two
    return f"{quote(r.released_at, 'mysql')} IS NULL", {}


class ExpiredReservationsProbe(MyDbProbe):
    """``stock_reservations_expired_unreleased``: past ``expires_at``, still holding stock."""

    specs = (catalog.RESERVATIONS_EXPIRED_UNRELEASED,)

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        super().__init__("expired_reservations", config.probes.expired_reservations, pool)
        r = config.schema.reservations
        if r is None:
            raise ValueError("the expired_reservations probe needs schema.reservations")
        held, self._params = held_predicate(config)
        self._sql = (
            f"SELECT count(*) FROM {ident(r.table)}"  # noqa: S608 - quoted identifiers
            f" WHERE {quote(r.expires_at, 'mysql')} < now(6) AND {held}"
        )

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        (count,) = await session.one(self._sql, self._params or None)
        return (family(catalog.RESERVATIONS_EXPIRED_UNRELEASED, [((), number(count))]),)


class OutboxProbe(MyDbProbe):
    """``stock_outbox_pending_events``, ``stock_outbox_lag_seconds`` (oldest pending age),
    ``stock_outbox_stuck_events`` (pending beyond ``probes.outbox.max_publish_latency``)
    and that latency itself (the alert's threshold), as on PostgreSQL.

    One statement on the index ``outbox(published_at, created_at)``: the pending rows are
    its ``published_at IS NULL`` range, ordered by ``created_at``, so the oldest one's id
    is that range's first entry (``schema.outbox.id`` mapped). While events are stuck it
    logs ``outbox stuck``
    (:class:`~stocksentry.exporter.probes.families.OutboxStuckLog`).
    """

    specs = (
        catalog.OUTBOX_PENDING,
        catalog.OUTBOX_LAG,
        catalog.OUTBOX_STUCK,
        catalog.OUTBOX_MAX_PUBLISH_LATENCY,
    )

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        settings = config.probes.outbox
        super().__init__("outbox", settings, pool)
        b = config.schema.outbox
        if b is None:
            raise ValueError("the outbox probe needs schema.outbox")
        self.max_publish_latency = settings.max_publish_latency
        self._params = {"latency": interval_us(settings.max_publish_latency)}
        self.stuck_log = OutboxStuckLog(max_publish_latency=settings.max_publish_latency)
        table, created = ident(b.table), quote(b.created_at, "mysql")
        published = quote(b.published_at, "mysql")
        oldest_id = (
            f", (SELECT {quote(b.id, 'mysql')} FROM {table}"  # noqa: S608 - quoted identifiers
            f" WHERE {published} IS NULL ORDER BY {created}, {quote(b.id, 'mysql')} LIMIT 1)"
            if b.id is not None
            else ", NULL"
        )
        # now(6) is the statement's start, the same for every row (PostgreSQL's probe takes
        # clock_timestamp(), which moves: the difference is the statement's own run time).
        self._sql = (
            "SELECT count(*),"  # noqa: S608 - quoted identifiers, values as parameters
            f" coalesce(timestampdiff(MICROSECOND, min({created}), now(6)), 0) / 1000000,"
            f" coalesce(sum({created} < now(6) - INTERVAL %(latency)s MICROSECOND), 0)"
            f"{oldest_id} FROM {table} WHERE {published} IS NULL"
        )

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        pending, lag, stuck_count, oldest_id = await session.one(self._sql, self._params)
        stuck = OutboxStuck(
            count=int(number(stuck_count)),
            oldest_id=oldest_id if number(stuck_count) else None,
            oldest_age=max(0.0, number(lag)),
        )
        self.stuck_log.observe(stuck)
        return outbox_families(
            number(pending), number(lag), stuck, max_publish_latency=self.max_publish_latency
        )
