"""The key reference of ``docs/exporter-config.md``, generated from the config model.

``generate.py`` fills every ``<!-- BEGIN GENERATED config.<path> -->`` block of the
page with the table :func:`blocks` gives for ``<path>``.
"""

from __future__ import annotations

import re
from typing import Final

from stocksentry.exporter.config.model import ExporterConfig
from stocksentry.exporter.config.probing import BUILTIN_PROBES, ProbeSettings
from stocksentry.exporter.config.specs import (
    URL_KEYS,
    Key,
    Section,
    UrlKeys,
    field_default,
    specs,
)

#: A generated block of the page; group 1 is its name (``config.server``).
BLOCK: Final = re.compile(
    r"(<!-- BEGIN GENERATED (config\.[a-z_.]+) [^>]*-->\n).*?(<!-- END GENERATED -->)",
    re.DOTALL,
)
_HEAD: Final = "| key | type | default | meaning |\n| --- | --- | --- | --- |\n"


def section_class(path: str) -> type:
    """The section class at dotted ``path`` of the config (``"schema.orders"``)."""
    cls: type = ExporterConfig
    for part in path.split("."):
        found = dict(specs(cls)).get(part)
        if not isinstance(found, Section):
            raise KeyError(f"no section {path!r} in the config model")
        cls = found.cls
    return cls


def _default(cls: type, name: str, spec: Key) -> str:
    if spec.default_doc is not None:
        return spec.default_doc
    if spec.required:
        return "required"
    default = field_default(cls, name)
    if default is None:
        return "none"
    shown = spec.kind.json_value(default)
    if isinstance(shown, bool):
        shown = "true" if shown else "false"
    elif isinstance(shown, list):
        shown = "[" + ", ".join(map(str, shown)) + "]"
    return f"`{shown}`"


def _rows(cls: type, *, only: tuple[str, ...] | None = None) -> list[str]:
    rows: list[str] = []
    for name, spec in specs(cls):
        if only is not None and name not in only:
            continue
        if isinstance(spec, UrlKeys):
            keys = " / ".join(f"`{k}`" for k in URL_KEYS)
            rows.append(f"| {keys} | see [Secrets](#secrets) | — (one required) | {spec.doc} |")
        elif isinstance(spec, Key):
            kind = spec.kind.type_doc()
            rows.append(f"| `{name}` | {kind} | {_default(cls, name, spec)} | {spec.doc} |")
    return rows


def markdown_table(cls: type) -> str:
    """The key table of section ``cls`` (its keys only, not its subsections)."""
    return _HEAD + "\n".join(_rows(cls)) + "\n"


def _probe_options() -> str:
    """The options a built-in probe adds to ``enabled`` / ``interval`` / ``timeout``."""
    common = dict(specs(ProbeSettings))
    rows: list[str] = []
    for probe in BUILTIN_PROBES:
        cls = section_class(f"probes.{probe}")
        # A common key a probe redefines (cache_drift's own interval) is listed too.
        own = tuple(name for name, spec in specs(cls) if common.get(name) is not spec)
        rows.extend(row.replace("| `", f"| `{probe}.", 1) for row in _rows(cls, only=own))
    return _HEAD + "\n".join(rows) + "\n"


def blocks() -> dict[str, str]:
    """Every generated block of the page, by name."""
    names = [
        name
        for name, spec in specs(ExporterConfig)
        if isinstance(spec, Section) and name not in ("schema", "probes")
    ]
    names += ["probes.defaults", "probes.custom"]
    names += [f"schema.{name}" for name, _ in specs(section_class("schema"))]
    found = {f"config.{name}": markdown_table(section_class(name)) for name in names}
    found["config.probes.settings"] = markdown_table(ProbeSettings)
    found["config.probes.options"] = _probe_options()
    return found


def replace_blocks(text: str) -> str:
    """``text`` with every generated block rewritten; an unknown block name is an error."""
    tables = blocks()

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in tables:
            raise KeyError(f"no generated block {name!r}; known: {', '.join(sorted(tables))}")
        return match.group(1) + tables[name] + match.group(3)

    return BLOCK.sub(fill, text)
