"""The field specs of the config model: what a dataclass field of a section is.

:func:`key` and the other field functions below put a spec in a field's metadata;
:func:`specs` reads them back in field order, for the loader, the docs and the chart's schema.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .kinds import Kind

#: The keys a secret URL may come from, in the order the docs give them.
URL_KEYS: Final = ("url_env", "url_file", "url")
_METADATA: Final = "stocksentry.config"


@dataclass(frozen=True, slots=True)
class Key:
    """A YAML key: its kind, its doc, and where its default comes from when not written.

    ``inherit`` names another key (dotted path) whose value is the default, as
    ``probes.defaults.interval`` is for every probe; ``computed`` builds the default from
    the section's other values; ``default_doc`` is how the docs show such a default.
    """

    kind: Kind
    doc: str
    required: bool = False
    inherit: str | None = None
    computed: Callable[[Mapping[str, Any]], Any] | None = None
    default_doc: str | None = None


@dataclass(frozen=True, slots=True)
class Section:
    """A nested section of class ``cls``; ``optional``: ``None`` when left out, and
    ``many``: a list of them."""

    cls: type
    doc: str
    optional: bool = False
    many: bool = False


@dataclass(frozen=True, slots=True)
class UrlKeys:
    """A secret URL given by exactly one of :data:`URL_KEYS`; the section's field
    ``url_source`` records where it came from."""

    schemes: tuple[str, ...]
    what: str
    doc: str
    accept_conninfo: bool = False


@dataclass(frozen=True, slots=True)
class Derived:
    """A field the loader computes; not a key of the file."""

    doc: str


Spec = Key | Section | UrlKeys


def key(default: Any, kind: Kind, doc: str, **options: Any) -> Any:
    """A field for a YAML key with a default; ``options`` as for :class:`Key`."""
    return field(default=default, metadata={_METADATA: Key(kind, doc, **options)})


def required(kind: Kind, doc: str) -> Any:
    """A field for a YAML key that must be written."""
    return field(metadata={_METADATA: Key(kind, doc, required=True)})


def computed(kind: Kind, doc: str, build: Callable[[Mapping[str, Any]], Any], shown: str) -> Any:
    """A field for a YAML key whose default ``build`` makes from the section's values."""
    return field(metadata={_METADATA: Key(kind, doc, computed=build, default_doc=shown)})


def section(cls: type, doc: str, *, optional: bool = False) -> Any:
    """A field for a nested section (``None`` when ``optional`` and left out)."""
    spec = Section(cls, doc, optional=optional)
    if optional:
        return field(default=None, metadata={_METADATA: spec})
    return field(default_factory=cls, metadata={_METADATA: spec})


def sections(cls: type, doc: str) -> Any:
    """A field for a list of sections (a tuple, empty by default)."""
    return field(default=(), metadata={_METADATA: Section(cls, doc, many=True)})


def url_keys(schemes: tuple[str, ...], what: str, doc: str, **options: Any) -> Any:
    """The (required) field of a secret URL read from :data:`URL_KEYS`."""
    return field(metadata={_METADATA: UrlKeys(schemes, what, doc, **options)})


def redis_url(doc: str) -> Any:
    """The field of a Redis URL: ``redis://``, ``rediss://`` or ``unix://``."""
    return url_keys(("redis", "rediss", "unix"), "Redis", doc)


def derived(default: Any, doc: str) -> Any:
    """A field the loader fills in."""
    return field(default=default, metadata={_METADATA: Derived(doc)})


def specs(cls: type) -> list[tuple[str, Spec]]:
    """The fields of section ``cls`` that the file writes, in order, with their specs."""
    fields = ((item.name, item.metadata.get(_METADATA)) for item in dataclasses.fields(cls))
    return [(name, spec) for name, spec in fields if isinstance(spec, Key | Section | UrlKeys)]


def key_names(cls: type) -> tuple[str, ...]:
    """The YAML keys section ``cls`` accepts, in documentation order."""
    names: list[str] = []
    for name, spec in specs(cls):
        names.extend(URL_KEYS if isinstance(spec, UrlKeys) else (name,))
    return tuple(names)


def field_default(cls: type, name: str) -> Any:
    """The dataclass default of field ``name`` of ``cls`` (``MISSING`` when none)."""
    (item,) = (item for item in dataclasses.fields(cls) if item.name == name)
    return item.default if item.default_factory is dataclasses.MISSING else item.default_factory()
