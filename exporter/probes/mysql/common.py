"""What the MySQL/MariaDB probes share: the probe base class, values and statements.

Table and column names come from the validated ``schema`` config and reach SQL only
through :func:`stocksentry.exporter.invariants.quote` (backticks); values only as
parameters, which PyMySQL escapes on the client (it has no server-side binding), so the
invariant statements' constants cost nothing extra as parameters.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from prometheus_client.core import Metric

from ...config import ProbeSettings
from ...invariants import Query, quote
from ..base import Probe
from .pool import MyPool, MySession

__all__ = ["MyDbProbe", "ident", "interval_us", "number", "statement", "table_parts"]


def ident(name: str) -> str:
    """A validated, possibly schema-qualified name quoted with backticks."""
    return quote(name, "mysql")


def table_parts(name: str) -> tuple[str | None, str]:
    """``(schema, table)`` of a possibly schema-qualified name (``None``: the URL's)."""
    schema, _, table = name.rpartition(".")
    return (schema or None), table


def interval_us(seconds: float) -> int:
    """Seconds as whole microseconds, for ``INTERVAL %s MICROSECOND``."""
    return round(seconds * 1_000_000)


def statement(query: Query) -> tuple[str, dict[str, object] | None]:
    """An invariant :class:`~stocksentry.exporter.invariants.Query` as PyMySQL's SQL and
    parameters (``%(name)s``; ``None`` without any, so a ``%`` is then left as it is)."""
    params = query.params
    return query.text("pyformat"), (params or None)


def number(value: object) -> float:
    """A numeric column's value as a float; ``NULL`` (an empty aggregate) is 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool | int | float | Decimal):
        return float(value)
    if isinstance(value, bytes | str):
        # SHOW STATUS and some information_schema columns are text.
        return float(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


class MyDbProbe(Probe):
    """A probe whose :meth:`query` runs in the pool's read-only transaction."""

    def __init__(self, name: str, settings: ProbeSettings, pool: MyPool) -> None:
        super().__init__(name, interval=settings.interval, timeout=settings.timeout)
        self.pool = pool
        self.statement_timeout = settings.statement_timeout

    async def run(self) -> tuple[Metric, ...]:
        return await self.pool.read(self.query, statement_timeout=self.statement_timeout)

    async def query(self, session: MySession) -> tuple[Metric, ...]:
        """Observe once through ``session`` (already in a read-only transaction)."""
        raise NotImplementedError

    async def fetch(self, session: MySession, query: Query) -> list[tuple[Any, ...]]:
        """The rows of an invariant statement."""
        text, params = statement(query)
        return await session.rows(text, params)
