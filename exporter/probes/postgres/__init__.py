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
from .backlog import ExpiredReservationsProbe, OutboxProbe
from .common import DbProbe, ident, quoted_name
from .custom import CustomSqlProbe
from .indexes import IndexAdvice, check_indexes, expected_indexes
from .invariants import DuplicateOrdersProbe, NegativeStockProbe
from .oversold import OversoldProbe
from .pool import Conn, PgPool, connect
from .server import DeadlocksProbe, LockWaitersProbe, LongTransactionsProbe

__all__ = [
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


def build_db_probes(config: ExporterConfig, pool: PgPool, guard: LabelGuard) -> list[DbProbe]:
    """The enabled database probes of ``config`` (cache drift is built by the runner)."""
    p = config.probes
    probes: list[DbProbe] = []
    if p.negative_stock.enabled:
        probes.append(NegativeStockProbe(config, pool, guard))
    if p.oversold.enabled:
        probes.append(OversoldProbe(config, pool, guard))
    if p.duplicate_orders.enabled:
        probes.append(DuplicateOrdersProbe(config, pool, guard))
    if p.lock_waiters.enabled:
        probes.append(LockWaitersProbe(config, pool))
    if p.deadlocks.enabled:
        probes.append(DeadlocksProbe(config, pool))
    if p.long_transactions.enabled:
        probes.append(LongTransactionsProbe(config, pool))
    if p.expired_reservations.enabled:
        probes.append(ExpiredReservationsProbe(config, pool))
    if p.outbox.enabled:
        probes.append(OutboxProbe(config, pool))
    probes.extend(CustomSqlProbe(custom, pool, guard) for custom in p.custom)
    return probes
