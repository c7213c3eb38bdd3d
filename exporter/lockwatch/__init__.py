"""The Redis lock watcher: lock leases followed through keyspace notifications.

For apps that run no stocksentry code (any language): the sidecar follows the lock keys
of ``lock_watch`` in the exporter config and exports the Python lock wrapper's metrics,
so the same alerts and panels work. See docs/lockwatch.md.

The tracker (:mod:`.tracker`) and the patterns (:mod:`.patterns`) need no Redis; the
watcher (:mod:`.watcher`) needs the redis package, imported only from there.
"""

from __future__ import annotations

from .notifications import REQUIRED_FLAGS, missing_flags
from .patterns import LockPatterns
from .tracker import LeaseTracker

__all__ = ["REQUIRED_FLAGS", "LeaseTracker", "LockPatterns", "missing_flags"]
