"""stocksentry's sidecar side and the ``stocksentry`` command line.

``config`` and ``sidecar`` (config in, sidecar out), ``server``, ``multiproc``, ``probes``
and ``lockwatch`` make the sidecar (the ``exporter`` extra); ``cli`` is the ``stocksentry``
dispatcher; ``lab`` is ``stocksentry demo``; ``investigate`` is ``stocksentry reconcile``
and ``stocksentry timeline``. This package imports nothing at import time, so
``stocksentry --help`` stays cheap.
"""
