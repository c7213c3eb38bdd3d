"""``stocksentry reconcile``: moved to :mod:`stocksentry.exporter.investigate.reconcile`.

This module keeps the old import path working; it re-exports the public names.
"""

from __future__ import annotations

from .investigate.reconcile import (
    FINDING_KINDS,
    ReconcileError,
    Report,
    add_reconcile_parser,
    format_table,
    parse_since,
    reconcile,
    run_reconcile,
)

__all__ = [
    "FINDING_KINDS",
    "ReconcileError",
    "Report",
    "add_reconcile_parser",
    "format_table",
    "parse_since",
    "reconcile",
    "run_reconcile",
]
