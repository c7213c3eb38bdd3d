"""``python -m stocksentry.exporter``: the ``stocksentry`` command line."""

from __future__ import annotations

from .cli import main

raise SystemExit(main())
