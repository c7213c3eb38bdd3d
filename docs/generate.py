"""Rebuild the generated artefacts (``make generate``); ``--check`` fails when one is stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import config_reference  # beside this script
from stocksentry.exporter.contract.spec import contract_json
from stocksentry.instrumentation import catalog

ROOT = Path(__file__).resolve().parents[1]


def artefacts() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    head = (ROOT / "docs" / "metrics.md.head").read_text()
    config_page = ROOT / "docs" / "exporter-config.md"
    return {
        ROOT / "docs" / "metrics.md": head + catalog.markdown_table(),
        # The key tables between the page's GENERATED markers come from the config model.
        config_page: config_reference.replace_blocks(config_page.read_text()),
        # The metric contract for apps in other languages (`stocksentry check-metrics`).
        ROOT / "docs" / "metric-contract.json": contract_json(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args()
    stale = []
    for path, text in artefacts().items():
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(path.relative_to(ROOT))
        else:
            path.write_text(text)
            print(f"generate: wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"generate: stale, run `make generate`: {', '.join(map(str, stale))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
