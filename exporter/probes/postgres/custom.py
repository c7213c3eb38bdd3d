"""``probes.custom``: the operator's own read-only SQL, exported as a gauge."""

from __future__ import annotations

from prometheus_client.core import Metric
from psycopg import sql
from stocksentry.instrumentation.catalog import MetricSpec
from stocksentry.instrumentation.guard import LabelGuard, sanitize_label_value

from ...config import CustomProbe, ProbeSettings
from ..base import LOGGER, family
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
        self.spec = MetricSpec(
            custom.metric, "gauge", custom.help, custom.label_columns, source="probe"
        )
        self.specs = (self.spec,)
        self._guard = guard
        self._warned = False
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
        wanted = (self.custom.value_column, *self.custom.label_columns)
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise ValueError(
                f"the SQL returned no column {', '.join(missing)} (columns: {', '.join(columns)})"
            )
        value_at = columns.index(self.custom.value_column)
        label_at = [columns.index(c) for c in self.custom.label_columns]
        is_sku = [c == "sku" for c in self.custom.label_columns]
        samples: dict[tuple[str, ...], float] = {}
        for row in await cursor.fetchall():
            if row[value_at] is None:
                continue
            value = number(row[value_at])
            labels = tuple(
                self._guard("" if row[i] is None else str(row[i]))
                if sku
                else sanitize_label_value("" if row[i] is None else row[i])
                for i, sku in zip(label_at, is_sku, strict=True)
            )
            if labels not in samples and len(samples) >= self.custom.max_series:
                if not self._warned:
                    LOGGER.warning(
                        "custom probe %s returned more than %d label sets; the rest are dropped",
                        self.name,
                        self.custom.max_series,
                        extra={"probe": self.name},
                    )
                    self._warned = True
                continue
            samples[labels] = samples.get(labels, 0.0) + value
        return (family(self.spec, sorted(samples.items())),)
