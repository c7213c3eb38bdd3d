"""The flash-sale lab behind ``stocksentry demo`` (docs/demo.md): many buyers at once
under each checkout strategy, through the public instrumentation API; at the end the
database's truth, counted by SQL, is compared with the metric totals. Needs the ``lab``
extra.
"""
