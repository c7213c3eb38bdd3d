"""The README's quickstart prints what the README says; every Python block of the docs runs.

:mod:`doc_snippets` finds the ```python blocks of README.md, docs/ and alert_rules/README.md
and says how markers above a block change how it runs. Each block runs here with the unit
suite's service guard on; blocks marked ``integration`` run in
``tests/integration/test_doc_snippets.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_snippets import ROOT, Snippet, all_snippets, parse, run, show


def quickstart() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block in the quickstart"
    return match.group(1)


def test_quickstart_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", quickstart()],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    logs = [json.loads(line) for line in lines if line.startswith("{")]
    events = [(e["event"], e.get("request_id")) for e in logs]
    assert ("stock_check", "R1") in events
    assert ("stock_update", "R1") in events
    assert ("stock_update", "R2") in events
    update = next(e for e in logs if e["event"] == "stock_update" and e["request_id"] == "R1")
    assert (update["from"], update["to"], update["success"]) == (1, 0, True)
    assert update["idempotency_key"] == "key-1"
    assert update["sku"] == "EGG-01"
    for expected in (
        'stock_reservation_success_total{sku="EGG-01",strategy="atomic"} 1.0',
        'stock_reservation_conflict_total{reason="out_of_stock",sku="EGG-01"} 1.0',
        'stock_orders_paid_total{sku="EGG-01"} 1.0',
    ):
        assert expected in lines
        assert expected in (ROOT / "README.md").read_text()


# --- every Python block of the docs -----------------------------------------------------------

SNIPPETS = all_snippets()
#: How many blocks may be exempt from running: a few, each with its reason.
MAX_NO_RUN = 5


def _key(snippet: Snippet) -> tuple[str, str]:
    return (str(snippet.path.relative_to(ROOT)), snippet.first_line)


def test_there_are_snippets() -> None:
    assert len(SNIPPETS) >= 15, [s.where for s in SNIPPETS]
    keys = [_key(s) for s in SNIPPETS]
    assert len(keys) == len(set(keys)), "two blocks of one file start with the same line"


@pytest.mark.parametrize(
    "snippet",
    [s for s in SNIPPETS if s.marker != "no-run" and not s.needs_services],
    ids=lambda s: s.where,
)
def test_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    done = run(snippet, tmp_path, guard=True)
    assert done.returncode == 0, show(snippet, done)


def test_no_run_blocks_are_few_give_a_reason_and_compile() -> None:
    exempt = [s for s in SNIPPETS if s.marker == "no-run"]
    assert len(exempt) <= MAX_NO_RUN, [s.where for s in exempt]
    for snippet in exempt:
        assert snippet.reason, f"{snippet.where}: say why it does not run"
        compile(snippet.script, snippet.where, "exec")


def test_markers() -> None:
    path = ROOT / "docs" / "example.md"
    text = (
        "```python\nx = 1\n```\n\n<!-- snippet: continues -->\n```python\nprint(x)\n```\n"
        "<!-- snippet: no-run it waits for a signal -->\n```python\nwait()\n```\n"
        "- item\n\n  <!-- snippet: integration -->\n  ```python\n  import redis\n  ```\n"
    )
    found = parse(path, text)
    assert [(s.marker, s.reason, s.code) for s in found] == [
        ("", "", "x = 1\n"),
        ("continues", "", "print(x)\n"),
        ("no-run", "it waits for a signal", "wait()\n"),
        ("integration", "", "import redis\n"),
    ]
    assert found[1].script == "x = 1\nprint(x)\n"
    assert [s.line for s in found] == [1, 6, 10, 16]


def test_snippets_run_with_the_guard_on(tmp_path: Path) -> None:
    (snippet,) = parse(
        ROOT / "docs" / "example.md",
        "```python\nimport socket\n\n"
        "socket.create_connection(('127.0.0.1', 5432), timeout=1)\n```\n",
    )
    done = run(snippet, tmp_path, guard=True)
    assert done.returncode == 1
    assert "ServiceUsedInUnitTest" in done.stderr
