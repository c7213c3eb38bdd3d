"""The investigation tools of the runbook: what happened, from the logs and the database.

- :mod:`.timeline` (``stocksentry timeline``): rebuilds per-SKU and per-order timelines
  from log lines and flags lost updates, duplicate executions and stale reads;
- :mod:`.reconcile` (``stocksentry reconcile``): checks the database's invariants
  (negative stock, oversold units, duplicate orders per key, paid orders without items)
  with the statements the sidecar's probes aggregate.

Both read only, and end with the exit codes of :mod:`stocksentry.exporter.commandline`:
1 when they found something, 0 when not, 2 on bad input, 130 when interrupted. Timeline
needs nothing beyond the core install; reconcile needs the ``[reconcile]`` extra.

Example::

    stocksentry timeline checkout.log --sku EGG-01
    stocksentry reconcile --database postgresql://postgres@127.0.0.1/shop --since 2h
"""
