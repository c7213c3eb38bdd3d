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
from ..base import DialectProbes
from ..base import build_db_probes as build_enabled
from .backlog import ExpiredReservationsProbe, OutboxProbe
from .common import MyDbProbe
from .custom import CustomSqlProbe
from .indexes import check_indexes, expected_indexes
from .invariants import DuplicateOrdersProbe, NegativeStockProbe
from .oversold import OversoldProbe
from .pool import MyPool, MySession, connect_session
from .server import DeadlocksProbe, LockWaitersProbe, LongTransactionsProbe

__all__ = [
    "PROBES",
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


#: This dialect's probe classes, for the shared builder.
PROBES: DialectProbes[MyDbProbe] = DialectProbes(
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


def build_db_probes(config: ExporterConfig, pool: MyPool, guard: LabelGuard) -> list[MyDbProbe]:
    """The enabled database probes of ``config`` on MySQL/MariaDB (cache drift is built by the
    runner)."""
    return build_enabled(config, pool, guard, PROBES)
