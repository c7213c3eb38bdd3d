"""Probes of the app's own bookkeeping: expired reservations still held, the outbox lag."""

from __future__ import annotations

from prometheus_client.core import Metric
from psycopg import sql
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ..base import family
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
    """``stock_outbox_pending_events`` and ``stock_outbox_lag_seconds`` (oldest pending age)."""

    specs = (catalog.OUTBOX_PENDING, catalog.OUTBOX_LAG)

    def __init__(self, config: ExporterConfig, pool: PgPool) -> None:
        super().__init__("outbox", config.probes.outbox, pool)
        b = config.schema.outbox
        if b is None:
            raise ValueError("the outbox probe needs schema.outbox")
        self._sql = sql.SQL(
            "SELECT count(*),"
            " coalesce(extract(epoch FROM clock_timestamp() - min({created_at})), 0)"
            " FROM {table} WHERE {published_at} IS NULL"
        ).format(
            created_at=sql.Identifier(b.created_at),
            table=ident(b.table),
            published_at=sql.Identifier(b.published_at),
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        pending, lag = await one_row(conn, self._sql)
        return (
            family(catalog.OUTBOX_PENDING, [((), number(pending))]),
            family(catalog.OUTBOX_LAG, [((), max(0.0, number(lag)))]),
        )
