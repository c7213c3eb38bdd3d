"""``probes.custom``: the operator's own read-only SQL, exported as a gauge."""

from __future__ import annotations

from prometheus_client.core import Metric
from psycopg import sql
from stocksentry.instrumentation.guard import LabelGuard

from ...config import CustomProbe, ProbeSettings
from ..base import CustomRows
from .common import DbProbe, number
from .pool import Conn, PgPool

__all__ = ["CustomSqlProbe"]


class CustomSqlProbe(DbProbe):
    """A ``probes.custom`` entry: its SQL's rows exported as one gauge.

    The SQL runs wrapped as ``SELECT * FROM (<sql>) AS q`` through the extended protocol,
    so it is one read-only query and nothing else. Each row gives one sample: the value
    from ``value_column`` (rows where it is null are skipped), labels from
    ``label_columns`` (a ``sku`` label goes through the SKU guard, others are sanitised);
    rows with the same labels are summed; past ``max_series`` label sets the rest are
    dropped with a warning.
    """

    def __init__(self, custom: CustomProbe, pool: PgPool, guard: LabelGuard) -> None:
        super().__init__(
            custom.name,
            ProbeSettings(True, custom.interval, custom.timeout, custom.statement_timeout),
            pool,
        )
        self.custom = custom
        self.rows = CustomRows(custom, guard, name=custom.name, number=number)
        self.spec = self.rows.spec
        self.specs = (self.spec,)
        self._sql = sql.SQL("SELECT * FROM ({}\n) AS stocksentry_custom").format(
            sql.SQL(custom.sql)
        )

    async def run(self) -> tuple[Metric, ...]:
        # The SQL may take session-level advisory locks, which outlive the transaction:
        # released after each run, so a pooled session never keeps one.
        return await self.pool.read(
            self.query, release_locks=True, statement_timeout=self.statement_timeout
        )

    async def query(self, conn: Conn) -> tuple[Metric, ...]:
        # prepare=True forces the extended protocol: one statement, no "; COMMIT; ...".
        cursor = await conn.execute(self._sql, prepare=True)
        columns = [c.name for c in cursor.description or ()]
        return self.rows.export(columns, await cursor.fetchall())
