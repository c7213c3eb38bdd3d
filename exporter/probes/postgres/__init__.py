"""The PostgreSQL probes, their small connection pool, and the index check.

One module per role:

- :mod:`.pool`: the read-only sessions and :class:`PgPool`;
- :mod:`.common`: :class:`DbProbe`, quoting and the invariant statements as psycopg SQL;
- :mod:`.invariants`: negative stock, duplicate orders per key, and :mod:`.oversold`:
  oversold units, incrementally (their SQL comes from :mod:`stocksentry.exporter.invariants`,
  shared with ``stocksentry reconcile``);
- :mod:`.server`: lock waiters, deadlocks, long transactions;
- :mod:`.backlog`: expired reservations still held, the outbox lag;
- :mod:`.custom`: the operator's own SQL;
- :mod:`.indexes`: the indexes the probes expect, and how to add a missing one.

Every probe query runs in a read-only transaction with ``statement_timeout`` and
``lock_timeout`` (see :mod:`.pool`). Table and column names come from the validated
``schema`` config and reach SQL only as quoted identifiers; status values only as
literals.

Example::

    pool = PgPool(config.database)
    probe = NegativeStockProbe(config, pool)
    families = await probe.run()      # stock_negative_inventory_skus / _units
    await pool.close()
"""

from __future__ import annotations

from stocksentry.instrumentation.guard import LabelGuard

from ...config import ExporterConfig
from ..base import DialectProbes
from ..base import build_db_probes as build_enabled
from .backlog import ExpiredReservationsProbe, OutboxProbe
from .common import DbProbe, ident, quoted_name
from .custom import CustomSqlProbe
from .indexes import IndexAdvice, check_indexes, expected_indexes
from .invariants import DuplicateOrdersProbe, NegativeStockProbe
from .oversold import OversoldProbe
from .pool import Conn, PgPool, connect
from .server import DeadlocksProbe, LockWaitersProbe, LongTransactionsProbe

__all__ = [
    "PROBES",
    "Conn",
    "CustomSqlProbe",
    "DbProbe",
    "DeadlocksProbe",
    "DuplicateOrdersProbe",
    "ExpiredReservationsProbe",
    "IndexAdvice",
    "LockWaitersProbe",
    "LongTransactionsProbe",
    "NegativeStockProbe",
    "OutboxProbe",
    "OversoldProbe",
    "PgPool",
    "build_db_probes",
    "check_indexes",
    "connect",
    "expected_indexes",
    "ident",
    "quoted_name",
]


#: This dialect's probe classes, for the shared builder.
PROBES: DialectProbes[DbProbe] = DialectProbes(
    negative_stock=NegativeStockProbe,
    oversold=OversoldProbe,
    duplicate_orders=DuplicateOrdersProbe,
    lock_waiters=LockWaitersProbe,
    deadlocks=DeadlocksProbe,
    long_transactions=LongTransactionsProbe,
    expired_reservations=ExpiredReservationsProbe,
    outbox=OutboxProbe,
    custom=CustomSqlProbe,
)


def build_db_probes(config: ExporterConfig, pool: PgPool, guard: LabelGuard) -> list[DbProbe]:
    """The enabled database probes of ``config`` on PostgreSQL (cache drift is built by the
    runner)."""
    return build_enabled(config, pool, guard, PROBES)
