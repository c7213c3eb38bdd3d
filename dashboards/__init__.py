"""stocksentry's Grafana dashboards, built from code with grafana-foundation-sdk.

``python dashboards/build.py`` writes one JSON file per dashboard beside this package;
``python dashboards/build.py --check`` exits 1 when a committed file is stale. Metric
names come from :mod:`stocksentry.instrumentation.catalog`, never retyped, so a rename
breaks the build instead of leaving an empty panel.

Modules: :mod:`.promql` composes the queries, :mod:`.panels` the panels every dashboard
shares (datasource, variables, runbook links), one module per dashboard
(:mod:`.overview`, :mod:`.sku`, :mod:`.exporter`), :mod:`.lint` checks the JSON.
"""
