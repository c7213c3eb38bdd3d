"""The drill's YAML file, read through the exporter's config machinery (the same reader,
errors, ``schema`` mapping and secret URL keys). What only the drill has: the shop's HTTP
requests with their placeholders, what counts as a sale, the drill SKU and its stock."""

# ruff: noqa: RUF009 - the fields' metadata is built by calls (key(), section() ...), the
# way the exporter's config model declares its fields.

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from stocksentry.instrumentation.secrets import Secret
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..config import SchemaConfig
from ..config.errors import Context, describe
from ..config.kinds import (
    MINUTE,
    Bool,
    Choice,
    Duration,
    Integer,
    Kind,
    Text,
    TextList,
)
from ..config.loader import parse_document, read_config_text
from ..config.specs import derived, key, required, section, url_keys
from ..config.yamlsource import TAG_INT, TAG_STR
from ..dburl import MYSQL_URL_SCHEMES, POSTGRES_URL_SCHEMES
from . import SCENARIOS

__all__ = [
    "PLACEHOLDERS",
    "SCENARIOS",
    "CheckoutTarget",
    "DrillConfig",
    "DrillDatabase",
    "DrillSettings",
    "RequestSpec",
    "load_drill_config",
    "parse_drill_config",
    "scenario_problem",
    "url_problem",
]

#: The placeholders a request's URL, headers and body may hold.
PLACEHOLDERS: Final = ("sku", "qty", "request_id", "idempotency_key", "payment_reference", "n")
_PLACEHOLDER: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Values a request is checked with: the numbers as numbers, the rest as words.
_SAMPLE: Final = {**dict.fromkeys(PLACEHOLDERS, "x"), "qty": "1", "n": "1"}


def _unknown(text: str) -> str | None:
    """The first placeholder of ``text`` the drill does not know, if any."""
    return next((n for n in _PLACEHOLDER.findall(text) if n not in PLACEHOLDERS), None)


def _placeholders_known(ctx: Context, node: Node, path: str, text: str) -> None:
    name = _unknown(text)
    if name is not None:
        known = ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
        ctx.fail(node, path, f"unknown placeholder {{{name}}} (known: {known})")


def fill(text: str, values: Mapping[str, str], *, json_strings: bool = False) -> str:
    """``text`` with each known ``{placeholder}`` replaced by its value; with
    ``json_strings`` the value is escaped as inside a JSON string (a SKU with a quote)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            return match.group(0)
        value = values[name]
        return json.dumps(value)[1:-1] if json_strings else value

    return _PLACEHOLDER.sub(one, text)


def url_problem(value: str) -> str | None:
    """Why ``value`` is not an ``http://`` or ``https://`` URL with known placeholders;
    ``None`` when it is one."""
    unknown = _unknown(value)
    if unknown is not None:
        return f"unknown placeholder {{{unknown}}}"
    try:
        parts = urllib.parse.urlsplit(fill(value, _SAMPLE))
    except ValueError:  # an unclosed [IPv6 address
        return "expected an http:// or https:// URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected an http:// or https:// URL"
    try:
        parts.port  # noqa: B018 - raises ValueError on a port out of range
    except ValueError:
        return "not a valid port"
    try:
        # What the connection does with the name: an empty or 64+ character label fails
        # there, mid-drill, after the stock was set.
        parts.hostname.encode("idna")
    except UnicodeError:
        return "not a valid host name"
    return None


class HttpUrl(Kind):
    """An ``http://`` or ``https://`` URL, placeholders allowed in its path and query."""

    doc_type = "URL"

    def read(self, ctx: Context, node: Node, path: str) -> str:
        value = Text().read(ctx, node, path).strip()
        problem = url_problem(value)
        if problem is not None:
            ctx.fail(node, path, f"{problem}, got {describe(node)}")
        return value


class Headers(Kind):
    """A mapping of HTTP header names to values (placeholders allowed)."""

    doc_type = "mapping of header name to value"

    def read(self, ctx: Context, node: Node, path: str) -> tuple[tuple[str, str], ...]:
        if not isinstance(node, MappingNode):
            ctx.fail(
                node, path, f"expected a mapping of header names to values, got {describe(node)}"
            )
        headers: list[tuple[str, str]] = []
        for key_node, value_node in node.value:
            name = str(getattr(key_node, "value", ""))
            where = f"{path}.{name}"
            if not isinstance(key_node, ScalarNode) or not _HEADER_NAME.fullmatch(name):
                ctx.fail(key_node, path, f"not an HTTP header name: {describe(key_node)}")
            if name.lower() in ("host", "content-length", "transfer-encoding", "connection"):
                ctx.fail(key_node, where, "is set by the drill itself")
            value = Text(allow_numbers=True).read(ctx, value_node, where)
            if "\r" in value or "\n" in value:
                ctx.fail(value_node, where, "must be one line")
            _placeholders_known(ctx, value_node, where, value)
            headers.append((name, value))
        return tuple(headers)


class JsonBody(Kind):
    """A JSON document with placeholders: text, or a YAML mapping sent as JSON."""

    doc_type = "JSON text or mapping"

    def read(self, ctx: Context, node: Node, path: str) -> str:
        if isinstance(node, MappingNode | SequenceNode):
            ctx.fail(node, path, "write the body as JSON text (a YAML block scalar: body: |)")
        text = Text().read(ctx, node, path)
        _placeholders_known(ctx, node, path, text)
        try:
            json.loads(fill(text, _SAMPLE, json_strings=True))
        except ValueError as exc:
            ctx.fail(node, path, f"not JSON once its placeholders are filled: {exc}")
        return text


class StatusCodes(Kind):
    """A list of HTTP status codes, 100 to 599."""

    doc_type = "list of status codes"

    def read(self, ctx: Context, node: Node, path: str) -> tuple[int, ...]:
        if not isinstance(node, SequenceNode) or not node.value:
            ctx.fail(node, path, f"expected a list of status codes, got {describe(node)}")
        codes: list[int] = []
        for index, item in enumerate(node.value):
            where = f"{path}[{index}]"
            if not isinstance(item, ScalarNode) or item.tag not in (TAG_INT, TAG_STR):
                ctx.fail(item, where, f"expected a status code, got {describe(item)}")
            number = ScalarNode(TAG_INT, item.value, item.start_mark, item.end_mark)
            codes.append(Integer(100, 599).read(ctx, number, where))
        return tuple(codes)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One HTTP request of the shop: method, URL, headers and JSON body."""

    url: str = required(HttpUrl(), "the request's URL; placeholders allowed")
    method: str = key("POST", Choice(("GET", "POST", "PUT", "PATCH", "DELETE")), "the HTTP method")
    headers: tuple[tuple[str, str], ...] = key((), Headers(), "extra headers (placeholders)")
    body: str | None = key(None, JsonBody(), "the JSON body, with placeholders")

    def render(self, values: Mapping[str, str]) -> tuple[str, str, list[tuple[str, str]], bytes]:
        """``(method, url, headers, body)`` with the placeholders filled."""
        url = fill(self.url, {k: urllib.parse.quote(v, safe="") for k, v in values.items()})
        headers = [(name, fill(value, values)) for name, value in self.headers]
        body = b"" if self.body is None else fill(self.body, values, json_strings=True).encode()
        if self.body is not None and not any(n.lower() == "content-type" for n, _ in headers):
            headers.append(("Content-Type", "application/json"))
        return self.method, url, headers, body


@dataclass(frozen=True, slots=True)
class SuccessRule:
    """``target.success``: what makes a checkout response a sale."""

    status: tuple[int, ...] = key(
        (200, 201), StatusCodes(), "status codes of a successful checkout"
    )
    json_field: str | None = key(
        None,
        Text(),
        "a field of the JSON response (dotted path) that must also be true or non-empty",
    )


@dataclass(frozen=True, slots=True)
class AvailabilityRule:
    """``target.availability``: the request that shows the buyer whether the SKU is on sale."""

    request: RequestSpec = section(RequestSpec, "the availability request")
    json_field: str = key(
        "available", Text(), "field of its JSON response: true (or a number > 0) = available"
    )


@dataclass(frozen=True, slots=True)
class CheckoutTarget:
    """``target``: the shop's checkout and its other requests."""

    checkout: RequestSpec = section(RequestSpec, "the checkout request")
    success: SuccessRule = section(SuccessRule, "what counts as a sale")
    callback: RequestSpec | None = section(
        RequestSpec, "the payment callback ({payment_reference})", optional=True
    )
    availability: AvailabilityRule | None = section(
        AvailabilityRule, "what the shop shows the buyer", optional=True
    )
    reset: RequestSpec | None = section(
        RequestSpec,
        "the shop's own request that sets the drill SKU's stock (body: {sku}, {qty} = the "
        "stock); without it the drill writes the stock column through the schema mapping",
        optional=True,
    )
    timeout: float = key(10.0, Duration(maximum=10 * MINUTE), "the time a request may take")


@dataclass(frozen=True, slots=True)
class DrillDatabase:
    """``database``: the shop's database the verdicts are read from."""

    url: Secret = url_keys(
        (*POSTGRES_URL_SCHEMES, *MYSQL_URL_SCHEMES, "sqlite"),
        "PostgreSQL, MySQL, MariaDB or SQLite",
        "the shop's database URL",
    )
    url_source: str = derived("literal", "where the URL came from")


@dataclass(frozen=True, slots=True)
class DrillSettings:
    """``drill``: the SKU it sells, its stock, and how hard."""

    sku: str = required(Text(allow_numbers=True), "the one SKU the drill sells and resets")
    stock: int = key(10, Integer(1, 100_000), "units on sale in each scenario")
    requests: int = key(50, Integer(1, 100_000), "checkouts of the burst")
    concurrency: int = key(20, Integer(1, 1000), "checkouts released together")
    qty: int = key(1, Integer(1, 1000), "units per checkout")
    retry_intents: int = key(10, Integer(1, 10_000), "intents sent twice in the retry scenario")
    callbacks: int = key(5, Integer(1, 10_000), "payments called back twice")
    callback_after_checkout: bool = key(
        False,
        Bool(),
        "send each payment's checkout (same {payment_reference}) before its callbacks, for a "
        "shop whose callback pays an existing order",
    )
    scenarios: tuple[str, ...] = key(
        ("burst", "retry"), TextList(Choice(SCENARIOS), non_empty=True), "what to run"
    )
    stale_threshold: float = key(
        1.0,
        Duration(maximum=10 * MINUTE),
        "how long availability may still say available after the sell-out",
    )


@dataclass(frozen=True, slots=True)
class ObservabilityRule:
    """``observability``: the shop's monitoring, asked whether it saw the drill."""

    metrics_url: str | None = key(None, HttpUrl(), "the app's or sidecar's /metrics")
    prometheus_url: str | None = key(None, HttpUrl(), "Prometheus, for the alerts that fired")
    wait: float = key(30.0, Duration(maximum=10 * MINUTE), "how long to wait for an alert")


@dataclass(frozen=True, slots=True)
class DrillConfig:
    """The whole drill file."""

    target: CheckoutTarget = section(CheckoutTarget, "the shop's HTTP requests")
    database: DrillDatabase = section(DrillDatabase, "the database the verdicts are read from")
    schema: SchemaConfig = section(SchemaConfig, "the shop's tables, as the exporter maps them")
    drill: DrillSettings = section(DrillSettings, "what the drill sells")
    observability: ObservabilityRule = section(ObservabilityRule, "the shop's monitoring")
    confirm: bool = key(False, Bool(), "true: run without --yes (the drill writes to the shop)")
    source: str = derived("<string>", "the file")


def load_drill_config(path: str | Path) -> DrillConfig:
    """Load and check the drill file at ``path``; raises :class:`ConfigError` only."""
    text = read_config_text(path, "the drill file")
    return parse_drill_config(text, str(path), base_dir=Path(path).parent)


def parse_drill_config(
    text: str,
    source: str = "<string>",
    *,
    environ: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> DrillConfig:
    """Check a drill file given as text; ``source`` names it in errors."""
    empty = "the file is empty; expected target, database and drill"
    sections = ("target", "database", "drill")
    ctx, config = parse_document(DrillConfig, text, source, environ, base_dir, empty, sections)
    settings = config.drill
    if settings.concurrency > settings.requests:
        ctx.fail_at("drill.concurrency", "must not be above drill.requests")
    problem = scenario_problem(config)
    if problem is not None:
        ctx.fail_at("drill.scenarios", problem)
    return dataclasses.replace(config, source=source)


def scenario_problem(config: DrillConfig) -> str | None:
    """Why a chosen scenario cannot run with this file; ``None`` when all can."""
    wants = set(config.drill.scenarios)
    if "duplicate_callback" in wants and config.target.callback is None:
        return "duplicate_callback needs target.callback"
    if "stale_availability" in wants and config.target.availability is None:
        return "stale_availability needs target.availability"
    obs = config.observability
    if "observability" in wants and obs.metrics_url is None and obs.prometheus_url is None:
        return "observability needs observability.metrics_url or prometheus_url"
    return None
