"""The docs' Python blocks marked ``<!-- snippet: integration -->`` run against the services.

:mod:`doc_snippets` finds them; the unit suite runs every other block
(``tests/unit/test_readme.py``). A block reads the services' URLs from the variables a
reader would set, ``DATABASE_URL`` and ``REDIS_URL``, with a local default it shows
(``os.environ.get("REDIS_URL", "redis://localhost:6379/0")``); this module sets them, and
``STOCKSENTRY_TEST_PG`` / ``STOCKSENTRY_TEST_REDIS``, to the services of the suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from doc_snippets import ROOT, all_snippets, parse, run, show
from services import PG_SERVER, REDIS_URL

pytestmark = pytest.mark.integration

SNIPPETS = [s for s in all_snippets() if s.needs_services]


@pytest.fixture
def service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The services' URLs, for the snippet's interpreter, under the names the docs use."""
    monkeypatch.setenv("STOCKSENTRY_TEST_PG", PG_SERVER)
    monkeypatch.setenv("STOCKSENTRY_TEST_REDIS", REDIS_URL)
    monkeypatch.setenv("DATABASE_URL", PG_SERVER)
    monkeypatch.setenv("REDIS_URL", REDIS_URL)


@pytest.mark.usefixtures("service_env")
def test_integration_snippets_run(tmp_path: Path) -> None:
    """Every block marked ``integration`` (none may be, so one test runs them all)."""
    failures = []
    for snippet in SNIPPETS:
        done = run(snippet, tmp_path, guard=False)
        if done.returncode != 0:
            failures.append(show(snippet, done))
    assert failures == []


@pytest.mark.usefixtures("service_env")
def test_an_integration_snippet_reaches_the_services(tmp_path: Path) -> None:
    (snippet,) = parse(
        ROOT / "docs" / "example.md",
        "<!-- snippet: integration -->\n```python\nimport os\nimport psycopg\nimport redis\n\n"
        'assert redis.Redis.from_url(os.environ["STOCKSENTRY_TEST_REDIS"]).ping()\n'
        'with psycopg.connect(os.environ["STOCKSENTRY_TEST_PG"]) as conn:\n'
        '    print(conn.execute("SELECT 1").fetchone()[0])\n```\n',
    )
    assert snippet.needs_services
    done = run(snippet, tmp_path, guard=False)
    assert (done.returncode, done.stdout) == (0, "1\n"), show(snippet, done)
    assert os.environ["STOCKSENTRY_TEST_PG"] == PG_SERVER


@pytest.mark.usefixtures("service_env")
def test_integration_snippets_see_the_docs_variables(tmp_path: Path) -> None:
    (snippet,) = parse(
        ROOT / "docs" / "example.md",
        "<!-- snippet: integration -->\n```python\nimport os\n\n"
        'print(os.environ["DATABASE_URL"], os.environ["REDIS_URL"])\n```\n',
    )
    done = run(snippet, tmp_path, guard=False)
    assert (done.returncode, done.stdout) == (0, f"{PG_SERVER} {REDIS_URL}\n"), show(snippet, done)
