"""The config model is the one source: docs tables, chart schema and example defaults agree.

The key reference of docs/exporter-config.md and the `config` part of the chart's
values.schema.json are generated from the model; these tests fail when either is stale.
exporter/config.example.yaml and the chart's values.yaml spell out defaults: every value
they state (except those their comments mark as an example) must be the model's default.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stocksentry.exporter.config import ExporterConfig, specs
from stocksentry.exporter.config.errors import Context
from stocksentry.exporter.config.yamlsource import (
    TAG_STR,
    compose,
    is_null,
    line_of,
    mapping_entries,
)
from yaml.nodes import MappingNode, Node, ScalarNode

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "exporter-config.md"
EXAMPLE = ROOT / "exporter" / "config.example.yaml"
VALUES = ROOT / "helm" / "stocksentry" / "values.yaml"
SCHEMA = ROOT / "helm" / "stocksentry" / "values.schema.json"


@pytest.fixture
def reference(monkeypatch: pytest.MonkeyPatch) -> Any:
    """docs/config_reference.py, the generator of the page's key tables."""
    monkeypatch.syspath_prepend(str(ROOT / "docs"))
    return importlib.import_module("config_reference")


def test_the_docs_key_reference_is_fresh(reference):
    text = PAGE.read_text()
    assert reference.replace_blocks(text) == text, "stale: run `python docs/generate.py`"


def test_every_generated_table_is_on_the_page(reference):
    names = {match.group(2) for match in reference.BLOCK.finditer(PAGE.read_text())}
    assert names == set(reference.blocks())


def test_an_unknown_block_is_an_error(reference):
    text = "<!-- BEGIN GENERATED config.nope (x) -->\n<!-- END GENERATED -->\n"
    with pytest.raises(KeyError, match=r"config\.nope"):
        reference.replace_blocks(text)


def test_the_charts_config_schema_is_fresh(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "helm"))
    sys.modules.pop("values_schema", None)
    import values_schema

    stored = json.loads(SCHEMA.read_text())["properties"]["config"]
    assert values_schema.config_schema() == stored, "stale: run `python helm/sync.py`"
    # Nothing the chart owns is in values: no server section, no URL key anywhere.
    assert "server" not in stored["properties"]
    text = json.dumps(stored)
    for key in specs.URL_KEYS:
        assert f'"{key}"' not in text


def test_every_key_of_the_model_is_documented_and_typed():
    def walk(cls: type) -> Iterator[tuple[str, specs.Key]]:
        for name, spec in specs.specs(cls):
            if isinstance(spec, specs.Section):
                yield from walk(spec.cls)
            elif isinstance(spec, specs.Key):
                yield name, spec

    for name, spec in walk(ExporterConfig):
        assert spec.doc, name
        assert spec.kind.type_doc(), name
        assert spec.kind.json_schema().get("type"), name


# --- stated defaults -------------------------------------------------------------------------


def _comments_above(lines: list[str], index: int) -> str:
    """The line's own comment and the comment lines right above it."""
    found = [lines[index].partition("#")[2]]
    while index > 0 and lines[index - 1].lstrip().startswith("#"):
        index -= 1
        found.append(lines[index])
    return " ".join(found)


def stated(node: Node, cls: type, path: str, lines: list[str]) -> Iterator[tuple[str, Any, Any]]:
    """(path, value as the loader reads it, model default) of every stated key."""
    assert isinstance(node, MappingNode), path
    ctx = Context("stated", {}, ROOT)
    known = dict(specs.specs(cls))
    for name, entry in mapping_entries(node).items():
        child = f"{path}.{name}" if path else name
        if "example" in _comments_above(lines, line_of(entry.key) - 1):
            continue
        spec = known.get(name)
        if spec is None:
            assert name in specs.URL_KEYS, f"{child}: not a key of the model"
            continue
        if isinstance(spec, specs.Section):
            if not spec.many and not is_null(entry.value):
                yield from stated(entry.value, spec.cls, child, lines)
            continue
        assert isinstance(spec, specs.Key), child
        default = specs.field_default(cls, name)
        value = entry.value
        if spec.kind.null_clears and (
            is_null(value)
            or (isinstance(value, ScalarNode) and value.tag == TAG_STR and value.value == "")
        ):
            # null in the file, "" in the chart (Helm drops nulls): not mapped.
            yield child, None, default
        elif not is_null(value):
            yield child, spec.kind.read(ctx, value, child), default


@pytest.mark.parametrize(("path", "section"), [(EXAMPLE, None), (VALUES, "config")])
def test_stated_values_are_the_models_defaults(path: Path, section: str | None):
    text = path.read_text()
    root = compose(text)
    assert root is not None
    if section is not None:
        root = mapping_entries(root)[section].value  # type: ignore[arg-type]
    checked = list(stated(root, ExporterConfig, "", text.splitlines()))
    wrong = [(key, value, default) for key, value, default in checked if value != default]
    assert wrong == []
    # The comparison saw the file: most of what it states is a default.
    assert len(checked) > 25, checked
