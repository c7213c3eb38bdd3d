"""``probes.custom`` on MySQL/MariaDB: the operator's own read-only SQL, exported as a gauge."""

from __future__ import annotations

from prometheus_client.core import Metric
from stocksentry.instrumentation.guard import LabelGuard

from ...config import CustomProbe, ProbeSettings
from ..base import CustomRows
from .common import MyDbProbe, number
from .pool import MyPool, MySession

__all__ = ["CustomSqlProbe"]


class CustomSqlProbe(MyDbProbe):
    """A ``probes.custom`` entry on MySQL/MariaDB: its SQL's rows exported as one gauge.

    The SQL runs wrapped as ``SELECT * FROM (<sql>) AS stocksentry_custom`` in the read-only
    transaction of a read-only session, so it is one query and writes nothing: PyMySQL
    does not ask for multiple statements (a ``; DELETE ...`` is a syntax error), a derived
    table cannot hold a data-changing statement, and ``START TRANSACTION READ ONLY``
    refuses writes. It is sent without parameters, so a ``%`` in it stays as written.
    Named locks (``GET_LOCK``) it may take are released after each run. The rows become
    samples as on PostgreSQL (:class:`~stocksentry.exporter.probes.base.CustomRows`).
    """

    def __init__(self, custom: CustomProbe, pool: MyPool, guard: LabelGuard) -> None:
        super().__init__(
            custom.name,
            ProbeSettings(True, custom.interval, custom.timeout, custom.statement_timeout),
            pool,
        )
        self.custom = custom
        self.rows = CustomRows(custom, guard, name=custom.name, number=number)
        self.spec = self.rows.spec
        self.specs = (self.spec,)
        # The operator's own SQL, by design; it runs read-only (see above).
        self._sql = f"SELECT * FROM ({custom.sql}\n) AS stocksentry_custom"  # noqa: S608

    async def run(self) -> tuple[Metric, ...]:
        return await self.pool.read(
            self.query, release_locks=True, statement_timeout=self.statement_timeout
        )

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        async with session.conn.cursor() as cursor:
            await cursor.execute(self._sql)
            columns = [str(c[0]) for c in cursor.description or ()]
            rows = await cursor.fetchall()
        return self.rows.export(columns, rows)
