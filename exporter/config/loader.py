"""YAML text to the model: one generic walk over the field specs, then the rules.

:func:`build` reads any section class from its YAML node as its specs say. What relates
several keys or sections (a probe switched on without the table it reads, a custom metric
that collides with the catalog) is a rule in :data:`_RULES`, run once its section is read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

from stocksentry.instrumentation import catalog
from yaml.nodes import MappingNode, Node, SequenceNode

from ..commandline import installed
from ..durations import format_duration
from ..inputs import CONFIG_LIMIT, InputFileError, read_text_bounded
from .env import resolve_url
from .errors import CheckedMapping, ConfigError, Context, describe, join
from .model import (
    DatabaseConfig,
    ExporterConfig,
    RedisConfig,
    ReservationsTable,
    SchemaConfig,
    ServerConfig,
    SkuGuardConfig,
)
from .probing import BUILTIN_PROBES, ELECTION_PROBE, CustomProbe, ProbeSettings
from .specs import Key, Section, UrlKeys, field_default, key_names, specs
from .yamlsource import YamlSyntaxError, compose, is_null

# The prefixes of stocksentry's own metrics: a custom gauge may not use them, so it can
# never collide with a metric the catalog has or will have.
_RESERVED_PREFIXES: Final = ("stock_", "stocksentry_")

Rule = Callable[[Context, CheckedMapping, dict[str, Any]], None]
T = TypeVar("T")


def load_config(path: str | Path, *, environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """Load and validate the YAML file at ``path`` (a regular file of at most 4 MiB).

    Relative paths inside it are relative to its folder; ``environ`` defaults to
    ``os.environ``. Raises :class:`ConfigError`, and nothing else, for every problem.
    """
    text = read_config_text(path, "the config")
    return parse_config(text, str(path), environ=environ, base_dir=Path(path).parent)


def read_config_text(path: str | Path, what: str) -> str:
    """The text of the YAML file at ``path`` (a regular file of at most 4 MiB, UTF-8);
    raises :class:`ConfigError` naming the file (and the line of a bad byte)."""
    source = str(path)
    try:
        return read_text_bounded(path, limit=CONFIG_LIMIT, what=what)
    except InputFileError as exc:
        if exc.line is not None:
            raise ConfigError("the file is not UTF-8 text", source=source, line=exc.line) from None
        raise ConfigError(f"cannot read the file: {exc.problem}", source=source) from None


def parse_config(
    text: str,
    source: str = "<string>",
    *,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> ExporterConfig:
    """Validate a configuration given as YAML text; ``source`` names it in errors."""
    sections = ", ".join(key_names(ExporterConfig))
    empty = f"the file is empty; expected a mapping of sections ({sections})"
    return parse_document(ExporterConfig, text, source, environ, base_dir, empty)[1]


def parse_document(
    cls: type[T],
    text: str,
    source: str,
    environ: Mapping[str, str] | None,
    base_dir: Path | None,
    empty: str,
    required: tuple[str, ...] = (),
) -> tuple[Context, T]:
    """Section ``cls`` read from a YAML file given as text, with the checking context (for
    the checks that follow); raises :class:`ConfigError` on bad YAML, ``empty`` on an empty
    file, and "is required" at line 1 for a top-level key of ``required`` left out."""
    ctx = Context(
        source,
        os.environ if environ is None else environ,
        Path.cwd() if base_dir is None else base_dir,
    )
    try:
        root = compose(text)
    except YamlSyntaxError as exc:
        what = "; ".join(part for part in (exc.context, exc.problem) if part) or exc.kind
        raise ConfigError(f"invalid YAML: {what}", source=source, line=exc.line) from None
    if root is None or is_null(root):
        raise ConfigError(empty, source=source, line=1)
    for name in required:
        if isinstance(root, MappingNode) and not any(
            getattr(k, "value", None) == name for k, _ in root.value
        ):
            raise ConfigError("is required", source=source, line=1, path=name)
    config: T = build(ctx, cls, root, "")
    return ctx, config


# --- the generic walk ------------------------------------------------------------------------


def build(ctx: Context, cls: type, node: Node | None, path: str) -> Any:
    """An instance of section ``cls`` read from ``node`` (``None``: all defaults)."""
    mapping = CheckedMapping(ctx, node, path, key_names(cls))
    values: dict[str, Any] = {}
    for name, spec in specs(cls):
        child = join(path, name)
        if isinstance(spec, UrlKeys):
            values[name], values["url_source"] = resolve_url(ctx, mapping, spec)
        elif isinstance(spec, Section):
            sub = mapping.get(name)
            if spec.many:
                values[name] = () if sub is None else _many(ctx, spec.cls, sub, child)
            elif sub is None and spec.optional:
                values[name] = None
            else:
                values[name] = build(ctx, spec.cls, sub, child)
        else:
            values[name] = _key(ctx, cls, mapping, name, spec, child, values)
            ctx.values[child] = values[name]
    rule = _RULES.get(cls)
    if rule is not None:
        rule(ctx, mapping, values)
    return cls(**values)


def _key(
    ctx: Context,
    cls: type,
    mapping: CheckedMapping,
    name: str,
    spec: Key,
    path: str,
    values: Mapping[str, Any],
) -> Any:
    node = mapping.get(name)
    if node is not None:
        return spec.kind.read(ctx, node, path)
    if spec.kind.null_clears and name in mapping.entries:
        # An explicit null switches an optional column off even when it has a default.
        return None
    if spec.required:
        mapping.require(name)
    if spec.computed is not None:
        return spec.computed(values)
    if spec.inherit is not None:
        # The inherited key's section may be absent (no database: section): its default.
        return ctx.values.get(spec.inherit, field_default(cls, name))
    return field_default(cls, name)


def _many(ctx: Context, cls: type, node: Node, path: str) -> tuple[Any, ...]:
    if not isinstance(node, SequenceNode):
        ctx.fail(node, path, f"expected a list, got {describe(node)}")
    items: list[Any] = []
    for index, item in enumerate(node.value):
        ctx.earlier = items
        items.append(build(ctx, cls, item, f"{path}[{index}]"))
    ctx.earlier = []
    return tuple(items)


# --- the rules -------------------------------------------------------------------------------


def _server(ctx: Context, mapping: CheckedMapping, values: dict[str, Any]) -> None:
    from_env = ctx.environ.get("PROMETHEUS_MULTIPROC_DIR", "").strip()
    if mapping.get("multiprocess_dir") is None and from_env:
        if not Path(from_env).is_dir():
            message = f"PROMETHEUS_MULTIPROC_DIR names {from_env}, which is not a directory"
            ctx.fail(None, "server.multiprocess_dir", message)
        values["multiprocess_dir"] = Path(from_env)
    if values["compact_dead_workers"] and not values["check_worker_pids"]:
        # Without the app's PID namespace every pid looks dead: compaction would fold the
        # files of live workers.
        mapping.fail(
            "compact_dead_workers", "needs check_worker_pids: true (the app's PID namespace)"
        )


def _reservations(ctx: Context, mapping: CheckedMapping, values: dict[str, Any]) -> None:
    entries = mapping.entries
    if mapping.get("status") is not None:
        if mapping.get("released_at") is not None:
            mapping.fail(
                "released_at", "give either released_at or status with held_statuses, not both"
            )
        if not values["held_statuses"]:
            where = entries["held_statuses"].value if "held_statuses" in entries else None
            ctx.fail(
                where or entries["status"].key,
                join(mapping.path, "held_statuses"),
                "is required with status: the statuses of reservations still holding stock",
            )
        values["released_at"] = None
    elif mapping.get("held_statuses") is not None:
        mapping.fail("held_statuses", "needs status as well")


def _custom(ctx: Context, mapping: CheckedMapping, values: dict[str, Any]) -> None:
    earlier: list[CustomProbe] = list(ctx.earlier)
    path, name = join(mapping.path, "name"), values["name"]
    if name in BUILTIN_PROBES or name == ELECTION_PROBE:
        ctx.fail_at(path, f'"{name}" is the name of a built-in probe')
    if any(c.name == name for c in earlier):
        ctx.fail_at(path, f'another custom probe is named "{name}"')
    path, metric = join(mapping.path, "metric"), values["metric"]
    for spec in catalog.ALL:
        if metric in (spec.name, spec.base_name, *spec.sample_names):
            ctx.fail_at(path, f'"{metric}" collides with the catalog metric {spec.name}')
    if metric.startswith(_RESERVED_PREFIXES):
        ctx.fail_at(
            path,
            f'"{metric}": the prefixes stock_ and stocksentry_ are reserved for '
            "stocksentry's own metrics",
        )
    if any(c.metric == metric for c in earlier):
        ctx.fail_at(path, f'another custom probe exports "{metric}"')
    _timeout_within_interval(ctx, mapping.path, values["timeout"], values["interval"])
    for index, label in enumerate(values["label_columns"]):
        if label == values["value_column"]:
            item = mapping.entries["label_columns"].value.value[index]
            path = f"{join(mapping.path, 'label_columns')}[{index}]"
            ctx.fail(item, path, "the value column cannot also be a label")


def _timeout_within_interval(ctx: Context, path: str, timeout: float, interval: float) -> None:
    """A probe's own ``timeout`` may not outlast its interval (as Prometheus refuses a
    ``scrape_timeout`` above ``scrape_interval``): a run that slow would delay the next and
    the interval would be a promise not kept. One inherited from ``probes.defaults`` is
    left as it is (the probe's interval was set apart from it)."""
    written = ctx.nodes.get(join(path, "timeout"))
    if timeout > interval and written is not None and not is_null(written):
        ctx.fail_at(
            join(path, "timeout"),
            f"{format_duration(timeout)} is longer than the probe's interval "
            f"({format_duration(interval)}); give it at most the interval",
        )


def _exporter(ctx: Context, mapping: CheckedMapping, values: dict[str, Any]) -> None:
    """Switch off the probes whose prerequisites are missing, and say why."""
    database: DatabaseConfig | None = values["database"]
    schema: SchemaConfig = values["schema"]
    redis: RedisConfig | None = values["redis"]
    sku_guard: SkuGuardConfig = values["sku_guard"]
    probes = values["probes"]
    # Why a probe cannot run with this configuration; None when it can.
    missing: dict[str, str | None] = dict.fromkeys(
        BUILTIN_PROBES, "there is no database section" if database is None else None
    )
    if database is not None:
        if schema.products.allocation is None:
            missing["oversold"] = (
                "schema.products.allocation is not mapped (without it only negative stock "
                "is visible: a lost update from 1 to 0 twice leaves the stock at 0)"
            )
        if schema.orders.external_ref is None and schema.orders.idempotency_key is None:
            missing["duplicate_orders"] = (
                "neither schema.orders.external_ref nor schema.orders.idempotency_key is mapped"
            )
        if schema.reservations is None:
            missing["expired_reservations"] = "schema.reservations is not mapped"
        if schema.outbox is None:
            missing["outbox"] = "schema.outbox is not mapped"
        if redis is None:
            missing["cache_drift"] = "there is no redis section"
        elif not installed("redis"):
            # [exporter] brings redis; an install without it still runs the sidecar.
            missing["cache_drift"] = (
                "the redis package is not installed (pip install 'stocksentry[exporter]')"
            )
        elif not sku_guard.promo_skus:
            missing["cache_drift"] = "sku_guard.promo_skus is empty (it compares promo SKUs)"

    switched: dict[str, ProbeSettings] = {}
    for name in BUILTIN_PROBES:
        settings: ProbeSettings = getattr(probes, name)
        _timeout_within_interval(ctx, f"probes.{name}", settings.timeout, settings.interval)
        reason = missing[name]
        if reason is not None and settings.enabled:
            if not is_null(ctx.nodes.get(f"probes.{name}.enabled")):
                ctx.fail_at(f"probes.{name}.enabled", f"cannot be true: {reason}")
            if database is not None:
                ctx.notes.append(f"probe {name} is off: {reason}")
            switched[name] = settings = dataclasses.replace(settings, enabled=False)
    oversold = switched.get("oversold", probes.oversold)
    if oversold.scope == "promo" and oversold.enabled and not sku_guard.promo_skus:
        ctx.fail_at("probes.oversold.scope", "promo needs sku_guard.promo_skus")
    if probes.custom and database is None:
        ctx.fail_at("probes.custom", "custom probes need a database section")
    values["probes"] = dataclasses.replace(probes, **switched)
    for name in ("lock_watch", "containment"):
        if values.get(name) is not None and not installed("redis"):
            ctx.fail_at(name, "needs the redis package (pip install 'stocksentry[redis]')")
    values["source"] = ctx.source
    values["notes"] = tuple(ctx.notes)


_RULES: Final[dict[type, Rule]] = {
    ServerConfig: _server,
    ReservationsTable: _reservations,
    CustomProbe: _custom,
    ExporterConfig: _exporter,
}
