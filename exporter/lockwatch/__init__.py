"""The Redis lock watcher: lock leases followed through keyspace notifications.

For apps that run no stocksentry code (any language): the sidecar subscribes to the
keyspace notifications of the configured lock key patterns (``lock_watch`` in the
exporter config) and exports acquisitions, hold time over TTL, leases that expired instead
of being released and suspected releases of a lock not owned, under the same metric names
and labels as the Python lock wrapper, so the same alerts and panels work. See
docs/lockwatch.md.

The tracker (:mod:`.tracker`) and the patterns (:mod:`.patterns`) need no Redis; the
watcher (:mod:`.watcher`) needs the redis package, imported only from there.
"""

from __future__ import annotations

from .notifications import REQUIRED_FLAGS, missing_flags
from .patterns import LockPatterns
from .tracker import LeaseTracker

__all__ = ["REQUIRED_FLAGS", "LeaseTracker", "LockPatterns", "missing_flags"]
