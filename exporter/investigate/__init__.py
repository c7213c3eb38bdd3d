"""The investigation tools of the runbook: what happened, from the logs and the database.

:mod:`.timeline` (``stocksentry timeline``) rebuilds per-SKU and per-order timelines from
log lines and names the cause of each double-sell; :mod:`.reconcile` (``stocksentry
reconcile``) checks the database's invariants with the statements the sidecar's probes
aggregate. Both read only; reconcile needs the ``[reconcile]`` extra.
"""
