"""``stocksentry reconcile``: moved to :mod:`stocksentry.exporter.investigate.reconcile`.

This module keeps the old import path working: it re-exports that module's public names
(its ``__all__``), so the list is written once.
"""

from __future__ import annotations

from .investigate.reconcile import *  # noqa: F403 - the old path offers exactly the new names
from .investigate.reconcile import __all__ as __all__
