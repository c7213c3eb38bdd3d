"""Background probes of the sidecar: the database, the stock cache, and their health.

:class:`ProbeRunner` is the entry point: it runs each enabled probe on its own schedule
and is a prometheus_client collector whose ``collect()`` reads the last results only.

- :mod:`.base`: the probe contract, results, backoff, rate-limited error logs;
- :mod:`.db`: the database probes (one class each for every dialect); :mod:`.indexes`: the
  indexes they expect;
- :mod:`.dialects`: what differs between PostgreSQL (:mod:`.pg`) and MySQL/MariaDB
  (:mod:`.my`), chosen by the database URL's scheme; :mod:`.pool`: their sessions' pool;
- :mod:`.redis`: the cache-drift probe;
- :mod:`.election`: the leader election (an advisory lock, or ``GET_LOCK`` on MySQL);
- :mod:`.runner`: :class:`ProbeRunner`.

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
