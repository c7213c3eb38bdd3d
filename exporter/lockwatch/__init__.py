"""The Redis lock watcher: lock leases followed through keyspace notifications, for apps
that run no stocksentry code (docs/lockwatch.md). Only :mod:`.watcher` needs redis."""
