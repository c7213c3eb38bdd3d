"""The MySQL and MariaDB probes, their small connection pool, and the index check.

The same probes, figures and config as :mod:`stocksentry.exporter.probes.postgres`, chosen
by the database URL's scheme (``mysql://``, ``mariadb://``, ``mysql+aiomysql://`` ...):

- :mod:`.pool`: the read-only READ COMMITTED sessions (aiomysql) and :class:`MyPool`;
- :mod:`.common`: :class:`MyDbProbe` and the invariant statements as PyMySQL SQL;
- :mod:`.invariants`: negative stock, duplicate orders per key; :mod:`.oversold`: oversold
  units, incrementally, with this dialect's horizon (``information_schema.innodb_trx``);
- :mod:`.server`: lock waiters, deadlocks, long transactions;
- :mod:`.backlog`: expired reservations still held, the outbox lag;
- :mod:`.custom`: the operator's own SQL; :mod:`.cache`: cache_drift's database read;
- :mod:`.indexes`: the indexes the probes expect, and how to add a missing one;
- leader election with ``GET_LOCK`` is in :mod:`stocksentry.exporter.probes.election`.

Example::

    pool = MyPool(config.database)
    probe = NegativeStockProbe(config, pool)
    families = await probe.run()      # stock_negative_inventory_skus / _units / _sku_units
    await pool.close()
"""

from __future__ import annotations

from stocksentry.instrumentation.guard import LabelGuard

from ...config import ExporterConfig
from .backlog import ExpiredReservationsProbe, OutboxProbe
from .common import MyDbProbe
from .custom import CustomSqlProbe
from .indexes import check_indexes, expected_indexes
from .invariants import DuplicateOrdersProbe, NegativeStockProbe
from .oversold import OversoldProbe
from .pool import MyPool, MySession, connect_session
from .server import DeadlocksProbe, LockWaitersProbe, LongTransactionsProbe

__all__ = [
    "CustomSqlProbe",
    "DeadlocksProbe",
    "DuplicateOrdersProbe",
    "ExpiredReservationsProbe",
    "LockWaitersProbe",
    "LongTransactionsProbe",
    "MyDbProbe",
    "MyPool",
    "MySession",
    "NegativeStockProbe",
    "OutboxProbe",
    "OversoldProbe",
    "build_db_probes",
    "check_indexes",
    "connect_session",
    "expected_indexes",
]


def build_db_probes(config: ExporterConfig, pool: MyPool, guard: LabelGuard) -> list[MyDbProbe]:
    """The enabled database probes of ``config`` on MySQL/MariaDB."""
    p = config.probes
    probes: list[MyDbProbe] = []
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
