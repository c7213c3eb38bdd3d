"""Background probes of the sidecar: the database, the stock cache, and their health.

:class:`ProbeRunner` runs each enabled probe on its own schedule and is a prometheus_client
collector whose ``collect()`` reads the last results only. The database probes
(:mod:`.db`, one class each for every dialect) leave what differs between PostgreSQL and
MySQL/MariaDB to :mod:`.dialects`; :mod:`.redis` holds the cache-drift probe,
:mod:`.election` the leader election.

Example::

    from prometheus_client import CollectorRegistry
    from stocksentry.exporter.config import load_config
    from stocksentry.exporter.probes import ProbeRunner

    registry = CollectorRegistry()
    async with ProbeRunner(load_config("config.yaml"), registry=registry) as runner:
        ...   # serve registry on /metrics
"""

from __future__ import annotations

from .base import Probe, ProbeResult
from .indexes import IndexAdvice, check_indexes
from .runner import ProbeRunner

__all__ = [
    "IndexAdvice",
    "Probe",
    "ProbeResult",
    "ProbeRunner",
    "check_indexes",
]
