"""The Redis lock watcher: lock leases followed through keyspace notifications.

For apps that run no stocksentry code (any language): the sidecar follows the lock keys
of ``lock_watch`` in the exporter config and exports the Python lock wrapper's metrics,
so the same alerts and panels work. See docs/lockwatch.md.

:mod:`.tracker`, :mod:`.patterns` and :mod:`.notifications` need no Redis; the watcher
(:mod:`.watcher`) needs the redis package, imported only from there.
"""
