"""stocksentry's sidecar side and the ``stocksentry`` command line.

``stocksentry.exporter.cli`` is the command line (``stocksentry`` or
``python -m stocksentry.exporter``); ``stocksentry.exporter.lab`` is the flash-sale lab
behind ``stocksentry demo``. This package imports nothing at import time: each module
pulls in its own dependencies (SQLAlchemy, aiohttp) from the ``exporter`` extra, so
importing the package stays cheap.

Example::

    from stocksentry.exporter.cli import main

    main(["demo", "--buyers", "200", "--stock", "20"])
"""
