"""Probes of the app's own bookkeeping: expired reservations still held, the outbox lag."""

from __future__ import annotations

import datetime as dt

from prometheus_client.core import Metric
from psycopg import sql
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ..base import family
from ..families import OutboxStuck, OutboxStuckLog, outbox_families
from .common import DbProbe, ident, in_list, number, one_row
from .pool import Conn, PgPool

__all__ = ["ExpiredReservationsProbe", "OutboxProbe", "held_predicate"]


class ExpiredReservationsProbe(DbProbe):
    """``stock_reservations_expired_unreleased``: past ``expires_at``, still holding stock."""

    specs = (catalog.RESERVATIONS_EXPIRED_UNRELEASED,)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("expired_reservations", config.probes.expired_reservations, pool)
        r = config.schema.reservations
        if r is None:
            raise ValueError("the expired_reservations probe needs schema.reservations")
        self._sql = sql.SQL(
            "SELECT count(*) FROM {table} WHERE {expires_at} < now() AND {held}"
        ).format(
            table=ident(r.table),
            expires_at=sql.Identifier(r.expires_at),
            held=held_predicate(config),
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        (count,) = await one_row(conn, self._sql)
        return (family(catalog.RESERVATIONS_EXPIRED_UNRELEASED, [((), number(count))]),)


def held_predicate(config: ExporterConfig) -> sql.Composable:
    """The predicate of a reservation that still holds its stock."""
    r = config.schema.reservations
    assert r is not None  # noqa: S101 - callers checked
    if r.status is not None:
        return sql.SQL("{} IN ({})").format(sql.Identifier(r.status), in_list(r.held_statuses))
    assert r.released_at is not None  # noqa: S101 - the config sets one of the two
    return sql.SQL("{} IS NULL").format(sql.Identifier(r.released_at))


class OutboxProbe(DbProbe):
    """``stock_outbox_pending_events``, ``stock_outbox_lag_seconds`` (oldest pending age),
    ``stock_outbox_stuck_events`` (pending beyond ``probes.outbox.max_publish_latency``)
    and that latency itself (the alert's threshold).

    While events are stuck it logs ``outbox stuck`` with their count and the oldest one's
    id and age (:class:`~stocksentry.exporter.probes.families.OutboxStuckLog`).
    """

    specs = (
        catalog.OUTBOX_PENDING,
        catalog.OUTBOX_LAG,
        catalog.OUTBOX_STUCK,
        catalog.OUTBOX_MAX_PUBLISH_LATENCY,
    )

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        settings = config.probes.outbox
        super().__init__("outbox", settings, pool)
        b = config.schema.outbox
        if b is None:
            raise ValueError("the outbox probe needs schema.outbox")
        self.max_publish_latency = settings.max_publish_latency
        self._latency = dt.timedelta(seconds=settings.max_publish_latency)
        self.stuck_log = OutboxStuckLog(max_publish_latency=settings.max_publish_latency)
        # The oldest pending event's id, through the index on created_at when there is one.
        oldest_id = (
            sql.SQL(
                ", (SELECT {id} FROM {table} WHERE {published_at} IS NULL"
                " ORDER BY {created_at}, {id} LIMIT 1)"
            )
            if b.id is not None
            else sql.SQL(", NULL")
        )
        self._sql = sql.SQL(
            "SELECT count(*),"
            " coalesce(extract(epoch FROM clock_timestamp() - min({created_at})), 0),"
            " count(*) FILTER (WHERE {created_at} < clock_timestamp() - %(latency)s){oldest_id}"
            " FROM {table} WHERE {published_at} IS NULL"
        ).format(
            created_at=sql.Identifier(b.created_at),
            table=ident(b.table),
            published_at=sql.Identifier(b.published_at),
            oldest_id=oldest_id.format(
                id=sql.Identifier(b.id or "id"),
                table=ident(b.table),
                published_at=sql.Identifier(b.published_at),
                created_at=sql.Identifier(b.created_at),
            ),
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        pending, lag, stuck_count, oldest_id = await one_row(
            conn, self._sql, {"latency": self._latency}
        )
        stuck = OutboxStuck(
            count=int(number(stuck_count)),
            oldest_id=oldest_id if number(stuck_count) else None,
            oldest_age=max(0.0, number(lag)),
        )
        self.stuck_log.observe(stuck)
        return outbox_families(
            number(pending), number(lag), stuck, max_publish_latency=self.max_publish_latency
        )
