"""The fenced ```python blocks of the README and the docs, found and run as a reader would.

Every block runs as a script of its own (``python -c``) in an empty directory. A comment
just above the opening fence (the last non-blank line before it) changes that:

``<!-- snippet: no-run REASON -->``
    Only compiled, not run: for a block that cannot run on its own (it serves until
    SIGTERM, or shows a fragment of a larger program). The reason is required.
``<!-- snippet: continues -->``
    Runs after the file's previous block, in the same script, as the reader's session
    would go on.
``<!-- snippet: integration -->``
    Needs PostgreSQL or Redis: ``tests/integration/test_doc_snippets.py`` runs it, with
    ``DATABASE_URL`` and ``REDIS_URL`` (and ``STOCKSENTRY_TEST_PG``,
    ``STOCKSENTRY_TEST_REDIS``) set to the suite's services. A block reads them as a
    reader's program would, with a local default:
    ``os.environ.get("REDIS_URL", "redis://localhost:6379/0")``.

The unit suite runs the other blocks with the unit guard on (``tests/unit/service_guard``),
so a block that reaches a service fails there and must say ``integration``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The Markdown files whose Python blocks are run.
DOCUMENTS: tuple[Path, ...] = (
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "alert_rules" / "README.md",
)
TIMEOUT_S = 120.0

_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
_MARKER = re.compile(r"<!--\s*snippet:\s*(?P<kind>[\w-]+)\s*(?P<reason>.*?)\s*-->")
KINDS = frozenset({"no-run", "continues", "integration"})


@dataclass(frozen=True)
class Snippet:
    """One ```python block: where it is, its code, and its marker (``""`` for none)."""

    path: Path
    line: int
    code: str
    marker: str
    reason: str
    prelude: str
    """The code of the earlier blocks it continues, run first."""

    @property
    def where(self) -> str:
        """``file:line`` of the opening fence, relative to the repository."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def first_line(self) -> str:
        """The block's first non-blank line: how a reader names it."""
        return next(line for line in self.code.splitlines() if line.strip()).strip()

    @property
    def needs_services(self) -> bool:
        return self.marker == "integration"

    @property
    def script(self) -> str:
        return self.prelude + self.code


def _marker_above(text: str, start: int) -> tuple[str, str]:
    before = text[:start].rstrip().splitlines()
    last = before[-1].strip() if before else ""
    match = _MARKER.fullmatch(last)
    if match is None:
        return "", ""
    kind = match.group("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown snippet marker {kind!r}: use one of {sorted(KINDS)}")
    return kind, match.group("reason")


def snippets(path: Path) -> list[Snippet]:
    """The ```python blocks of ``path``, in order, with their markers resolved."""
    return parse(path, path.read_text(encoding="utf-8"))


def parse(path: Path, text: str) -> list[Snippet]:
    """The ```python blocks of ``text``, the content of ``path``."""
    found: list[Snippet] = []
    for match in _FENCE.finditer(text):
        indent = len(match.group("indent"))
        code = "\n".join(line[indent:] for line in match.group("body").splitlines()) + "\n"
        marker, reason = _marker_above(text, match.start())
        prelude = ""
        if marker == "continues":
            if not found:
                raise ValueError(f"{path.name}: the first block cannot continue another")
            prelude = found[-1].script
            if found[-1].needs_services:
                marker = "integration"
        line = text.count("\n", 0, match.start()) + 1
        found.append(Snippet(path, line, code, marker, reason, prelude))
    return found


def all_snippets() -> list[Snippet]:
    """Every block of :data:`DOCUMENTS`."""
    return [s for path in DOCUMENTS if path.is_file() for s in snippets(path)]


def run(snippet: Snippet, cwd: Path, *, guard: bool) -> subprocess.CompletedProcess[str]:
    """Run the snippet (after its prelude) in a fresh interpreter in ``cwd``.

    ``guard``: switch the unit suite's service guard on in the child first.
    """
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    script = snippet.script
    if guard:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "tests" / "unit"), *filter(None, [env.get("PYTHONPATH")])]
        )
        script = "import service_guard\nservice_guard.guard_this_process()\n" + script
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def show(snippet: Snippet, done: subprocess.CompletedProcess[str]) -> str:
    """A failure report: where the block is, its exit status and what it printed."""
    return (
        f"{snippet.where} exited {done.returncode}\n"
        f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
    )
