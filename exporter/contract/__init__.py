"""The language-neutral metric contract and its conformance check (``check-metrics``).

:mod:`.spec` builds the contract from the catalog (``docs/metric-contract.json``),
:mod:`.exposition` reads an exposition strictly and boundedly, :mod:`.check` compares the
two, :mod:`.command` is the subcommand. See docs/other-languages.md.
"""

from __future__ import annotations

from .command import add_check_metrics_parser

__all__ = ["add_check_metrics_parser"]
