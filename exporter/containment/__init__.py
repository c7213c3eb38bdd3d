"""Containment in the sidecar and on the command line: per-SKU freezes.

:mod:`.cli` holds ``stocksentry freeze / unfreeze / frozen``; :mod:`.webhook` the
Alertmanager webhook and :mod:`.collector` the ``stocksentry_sku_frozen`` gauge the sidecar
reads from Redis. The contract itself is the instrumentation's
(:mod:`stocksentry.instrumentation.freeze`), the one a checkout honours.
"""
