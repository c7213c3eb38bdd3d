"""Probes of the app's own bookkeeping on MySQL/MariaDB: expired reservations still held,
the outbox lag."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric
from stocksentry.instrumentation import catalog

from ...config import ExporterConfig
from ...invariants import quote
from ..base import family
from .common import MyDbProbe, ident, number
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
    """``stock_outbox_pending_events`` and ``stock_outbox_lag_seconds`` (oldest pending age)."""

    specs = (catalog.OUTBOX_PENDING, catalog.OUTBOX_LAG)

    def __init__(self, config: ExporterConfig, pool: MyPool) -> None:
        super().__init__("outbox", config.probes.outbox, pool)
        b = config.schema.outbox
        if b is None:
            raise ValueError("the outbox probe needs schema.outbox")
        created = quote(b.created_at, "mysql")
        self._sql = (
            "SELECT count(*),"  # noqa: S608 - quoted identifiers
            f" coalesce(timestampdiff(MICROSECOND, min({created}), now(6)), 0) / 1000000"
            f" FROM {ident(b.table)} WHERE {quote(b.published_at, 'mysql')} IS NULL"
        )

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        pending, lag = await session.one(self._sql)
        return (
            family(catalog.OUTBOX_PENDING, [((), number(pending))]),
            family(catalog.OUTBOX_LAG, [((), max(0.0, number(lag)))]),
        )
