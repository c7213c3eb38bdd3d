"""The flash-sale lab behind ``stocksentry demo`` (see docs/demo.md).

Many buyers reserve one unit each of a small stock, all at once, under each checkout
strategy; every reservation goes through the public instrumentation API, and at the end
the lab counts the truth in the database with SQL and compares it with the metric
totals. It is used through ``stocksentry demo``; one module per role:
:mod:`.config` (the strategy names and settings, light enough for ``--help``),
:mod:`.shop`, :mod:`.strategies`, :mod:`.naive_lock`, :mod:`.driver`, :mod:`.readback`,
:mod:`.run`, :mod:`.embedded`, :mod:`.observe`, the reports and :mod:`.cli`.

The lab needs the ``lab`` extra (``pip install 'stocksentry[lab]'``).
"""

__all__: list[str] = []
