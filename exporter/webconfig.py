"""TLS and basic auth for ``/metrics``, from a web config file in the exporters' format.

The file is the one the Prometheus exporters read with ``--web.config.file``
(prometheus/exporter-toolkit). :func:`load_web_config` checks it completely at start:
every problem is a one-line :class:`WebConfigError` naming the file, line and key.
docs/exporter-server.md lists what differs from exporter-toolkit on purpose.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Final, NoReturn, TypeVar, get_args

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from .config.yamlsource import (
    TAG_BOOL,
    TAG_STR,
    KeyProblem,
    YamlSyntaxError,
    compose,
    is_null,
    line_of,
    mapping_entries,
    scalar_value,
)
from .inputs import (
    ECHO_LIMIT,
    WEB_CONFIG_LIMIT,
    InputFileError,
    escape,
    read_text_bounded,
    shorten,
)
from .tlsconfig import (
    CIPHER_SUITES,
    TLS13_SUITES,
    TLS_VERSIONS,
    ClientAuthType,
    TLSServerConfig,
    TLSVersionName,
    server_context,
)

__all__ = [
    "HTTPServerConfig",
    "WebConfig",
    "WebConfigError",
    "load_web_config",
    "parse_web_config",
]

_S = TypeVar("_S", bound=str)

# The headers exporter-toolkit lets a config add, and the values it restricts.
_HEADERS: Final[tuple[str, ...]] = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)
_HEADER_VALUES: Final[dict[str, tuple[str, ...]]] = {
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
}

# Known in exporter-toolkit, refused here with the reason (better than ignoring them).
_UNSUPPORTED: Final[dict[str, str]] = {
    "tls_server_config.cert": "inline certificates are not supported; use cert_file",
    "tls_server_config.key": "inline keys are not supported (secrets come from files); "
    "use key_file",
    "tls_server_config.client_ca": "inline CAs are not supported; use client_ca_file",
    "tls_server_config.client_allowed_sans": "not supported by stocksentry",
    "tls_server_config.curve_preferences": "not supported by stocksentry "
    "(OpenSSL's defaults apply)",
    "rate_limit": "not supported by stocksentry",
}

# The sections and their keys: those of the dataclass each is read into.
_SECTIONS: Final[dict[str, tuple[str, ...]]] = {
    "tls_server_config": tuple(f.name for f in fields(TLSServerConfig)),
    "http_server_config": ("http2", "headers"),
    "basic_auth_users": (),
}

# $2a$/$2b$/$2y$, a two-digit cost, 22 characters of salt and 31 of hash.
_BCRYPT_HASH: Final = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


class WebConfigError(ValueError):
    """A web config that cannot be used; ``str()`` is one line naming file, line and key.

    Example::

        >>> try:
        ...     parse_web_config("tls_server_config:\\n  min_version: TLS11\\n")
        ... except WebConfigError as exc:
        ...     print(exc.key, exc.line)
        tls_server_config.min_version 2
    """

    def __init__(self, source: str, line: int | None, key: str, problem: str) -> None:
        self.source = source
        self.line = line
        self.key = key
        self.problem = problem
        # Keys and values come from the file: cut and escaped, so that a 100k-character
        # key or a control character never makes the error line long or many lines.
        shown = shorten(source, 200)
        where = f"{shown}:{line}" if line is not None else shown
        super().__init__(shorten(f"{where}: {shorten(key, 120)}: {escape(problem)}", 1000))


@dataclass(frozen=True, slots=True)
class HTTPServerConfig:
    """``http_server_config``: extra response headers (``http2`` has no effect here)."""

    http2: bool = True
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A parsed web config; build it with :func:`load_web_config` or :func:`parse_web_config`.

    Example::

        >>> config = parse_web_config("basic_auth_users: {}\\n")
        >>> config.tls is None, dict(config.basic_auth_users)
        (True, {})
    """

    tls: TLSServerConfig | None = None
    http: HTTPServerConfig = field(default_factory=HTTPServerConfig)
    #: User name -> bcrypt hash (bytes, as ``bcrypt.checkpw`` takes it).
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict)
    source: str = "<web config>"
    #: Line of each key path, so that errors found later (a certificate that does not
    #: load) still name their line.
    lines: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server ``SSLContext`` for ``tls_server_config``, or None without TLS;
        :class:`WebConfigError` when a file cannot be loaded or OpenSSL refuses a cipher."""
        if self.tls is None:
            return None
        return server_context(self.tls, self._fail)

    @property
    def requires_client_cert(self) -> bool:
        """Whether every client must present a certificate the CA verifies."""
        return self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"

    @property
    def authenticates(self) -> bool:
        """Whether the metrics ask who is asking: basic auth or verified client certificates."""
        return bool(self.basic_auth_users) or self.requires_client_cert

    def describe(self) -> str:
        """What protects the listener, in words: TLS or not, client certificates, basic auth.

        Example::

            >>> parse_web_config("basic_auth_users: {}\\n").describe()
            'plain HTTP, no authentication'
        """
        tls = self.tls
        if tls is None:
            parts = ["plain HTTP"]
        else:
            clients = tls.client_auth_type
            parts = [
                f"TLS ({tls.min_version}-{tls.max_version})",
                "no client certificates"
                if clients == "NoClientCert"
                else f"client certificates: {clients}",
            ]
        users = len(self.basic_auth_users)
        if users:
            parts.append(f"basic auth ({users} user{'s' if users != 1 else ''})")
        elif not self.requires_client_cert:
            parts.append("no authentication")
        return ", ".join(parts)

    def _fail(self, key: str, problem: str) -> NoReturn:
        raise WebConfigError(self.source, self.lines.get(key), key, problem)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read, validate and return the web config at ``path``; also loads its TLS files.

    Relative file names are relative to the config file's directory, as in
    exporter-toolkit. Every problem is a :class:`WebConfigError`.
    """
    source = os.fspath(path)
    try:
        text = read_text_bounded(path, limit=WEB_CONFIG_LIMIT, what="the web config")
    except InputFileError as exc:
        raise WebConfigError(source, None, "(file)", f"cannot read: {exc.problem}") from None
    config = parse_web_config(text, source=source, base_dir=Path(path).resolve().parent)
    # Load the certificate now: a bad one must stop the start, not the first handshake.
    config.ssl_context()
    return config


def parse_web_config(
    text: str, *, source: str = "<web config>", base_dir: Path | None = None
) -> WebConfig:
    """Parse web config YAML ``text``; file names resolve against ``base_dir`` (or cwd).

    Files are not opened here; :meth:`WebConfig.ssl_context` loads them.
    """
    return _Parser(source, base_dir or Path.cwd()).parse(text)


class _Parser:
    """Walks the composed YAML nodes, so every value keeps its line for the errors."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir
        #: Line of each key read, by dotted path (kept by the :class:`WebConfig`).
        self.lines: dict[str, int] = {}

    def fail(self, node: Node | None, key: str, problem: str) -> NoReturn:
        """Fail at ``node``'s line, or without one at the line of the key ``key`` (read)."""
        line = self.lines.get(key) if node is None else line_of(node)
        raise WebConfigError(self.source, line, key, problem)

    def parse(self, text: str) -> WebConfig:
        try:
            root = compose(text)
        except YamlSyntaxError as exc:
            problem = " ".join(str(exc.problem or exc.context or exc.kind).split())
            raise WebConfigError(self.source, exc.line, "(yaml)", problem) from None
        if root is None or is_null(root):
            return WebConfig(source=self.source)
        given = self.mapping(root, "(top level)", tuple(_SECTIONS))
        return WebConfig(
            tls=self.tls(given.get("tls_server_config")),
            http=self.http(given.get("http_server_config")),
            basic_auth_users=self.users(given.get("basic_auth_users")),
            source=self.source,
            lines=dict(self.lines),
        )

    def mapping(
        self, node: Node, key: str, known: tuple[str, ...] | None = None
    ) -> dict[str, Node]:
        """The value nodes of a mapping node by key; refuses other nodes, duplicate keys and
        (when ``known`` is given) keys not in ``known``."""
        if not isinstance(node, MappingNode):
            self.fail(node, key, f"must be a mapping, got {_kind(node)}")
        prefix = f"{key}." if not key.startswith("(") else ""
        try:
            entries = mapping_entries(node)
        except KeyProblem as problem:
            path = f"{prefix}{problem.name}"
            if problem.reason == "duplicate":
                self.fail(problem.node, path, "duplicate key")
            self.fail(problem.node, path, f"keys must be strings, got {_kind(problem.node)}")
        for name, entry in entries.items():
            path = f"{prefix}{name}"
            self.lines[path] = line_of(entry.key)
            if known is not None and name not in known:
                unknown = f"unknown key (known: {', '.join(known)})"
                self.fail(entry.key, path, _UNSUPPORTED.get(path, unknown))
        return {name: entry.value for name, entry in entries.items()}

    def scalar_str(self, node: Node, key: str, *, secret: bool = False) -> str:
        if not (isinstance(node, ScalarNode) and node.tag == TAG_STR):
            self.fail(node, key, f"must be a string, got {_kind(node, secret=secret)}")
        return str(node.value)

    def boolean(self, node: Node | None, key: str, default: bool) -> bool:
        if node is None:
            return default
        if isinstance(node, ScalarNode) and node.tag == TAG_BOOL:
            try:
                return bool(scalar_value(node))
            except ValueError:
                pass  # an explicit tag: "!!bool maybe" is not false
        self.fail(node, key, f"must be true or false, got {_kind(node)}")

    def choice(self, node: Node, key: str, choices: tuple[_S, ...], note: str = "") -> _S:
        value = self.scalar_str(node, key)
        if value not in choices:
            self.fail(node, key, f"must be one of {', '.join(choices)}{note}, got {_quote(value)}")
        return value

    def http(self, node: Node | None) -> HTTPServerConfig:
        if node is None or is_null(node):
            return HTTPServerConfig()
        prefix = "http_server_config."
        given = self.mapping(node, "http_server_config", _SECTIONS["http_server_config"])
        http2 = self.boolean(given.get("http2"), prefix + "http2", True)
        headers: dict[str, str] = {}
        if (headers_node := given.get("headers")) is not None and not is_null(headers_node):
            for name, value_node in self.mapping(
                headers_node, prefix + "headers", _HEADERS
            ).items():
                key = f"{prefix}headers.{name}"
                if is_null(value_node):
                    continue
                value = self.scalar_str(value_node, key)
                allowed = _HEADER_VALUES.get(name)
                if allowed and value.lower() not in allowed:
                    self.fail(value_node, key, f"must be one of {', '.join(allowed)}")
                if "\n" in value or "\r" in value:
                    self.fail(value_node, key, "must be one line")
                if value:
                    # A blank value means "unset", as in exporter-toolkit.
                    headers[name] = value
        return HTTPServerConfig(http2=http2, headers=headers)

    def tls(self, node: Node | None) -> TLSServerConfig | None:
        """``tls_server_config``; ``None``: plain HTTP."""
        if node is None or is_null(node):
            return None
        prefix = "tls_server_config."
        given = self.mapping(node, "tls_server_config", _SECTIONS["tls_server_config"])

        def path(name: str) -> Path | None:
            value = given.get(name)
            if value is None or is_null(value):
                return None
            text = self.scalar_str(value, prefix + name)
            if not text:
                self.fail(value, prefix + name, "must not be empty")
            return (self.base_dir / text).resolve()

        cert, key, ca = path("cert_file"), path("key_file"), path("client_ca_file")
        if cert is None and key is None:
            # exporter-toolkit serves plain HTTP for a TLS section without certificate;
            # anything else in it would then be silently ignored, so refuse that.
            others = [name for name in given if name not in ("cert_file", "key_file")]
            if others:
                self.fail(
                    None,
                    prefix + others[0],
                    "needs cert_file and key_file (without them TLS is off)",
                )
            return None
        if cert is None or key is None:
            missing, other = (
                ("cert_file", "key_file") if cert is None else ("key_file", "cert_file")
            )
            self.fail(node, prefix + missing, f"missing: required with {other}")

        auth: ClientAuthType = "NoClientCert"
        if (auth_node := given.get("client_auth_type")) is not None:
            refused = ("RequestClientCert", "RequireAnyClientCert")
            if isinstance(auth_node, ScalarNode) and auth_node.value in refused:
                self.fail(
                    auth_node,
                    prefix + "client_auth_type",
                    f"{auth_node.value} accepts unverified certificates and is not supported; "
                    "use RequireAndVerifyClientCert",
                )
            auth = self.choice(auth_node, prefix + "client_auth_type", get_args(ClientAuthType))
        if auth != "NoClientCert" and ca is None:
            self.fail(
                auth_node or node,
                prefix + "client_ca_file",
                f"required when client_auth_type is {auth}",
            )
        if auth == "NoClientCert" and ca is not None:
            self.fail(
                None,
                prefix + "client_ca_file",
                "set without client_auth_type: set client_auth_type to "
                "RequireAndVerifyClientCert (or remove client_ca_file)",
            )

        versions: dict[str, TLSVersionName] = {"min_version": "TLS12", "max_version": "TLS13"}
        for name in versions:
            if (version_node := given.get(name)) is not None:
                versions[name] = self.choice(
                    version_node,
                    prefix + name,
                    get_args(TLSVersionName),
                    " (TLS 1.0 and 1.1 are not supported)",
                )
        if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
            at = given.get("max_version") or given.get("min_version")
            self.fail(at, prefix + "max_version", "is lower than min_version")

        suites: list[str] = []
        if (suites_node := given.get("cipher_suites")) is not None and not is_null(suites_node):
            key_name = prefix + "cipher_suites"
            if not isinstance(suites_node, SequenceNode):
                self.fail(suites_node, key_name, f"must be a list, got {_kind(suites_node)}")
            for i, item in enumerate(suites_node.value):
                suite = self.scalar_str(item, f"{key_name}[{i}]")
                if suite in TLS13_SUITES:
                    self.fail(
                        item,
                        key_name,
                        f"{suite} is a TLS 1.3 suite; TLS 1.3 suites are not configurable",
                    )
                if suite not in CIPHER_SUITES:
                    self.fail(
                        item,
                        key_name,
                        f"unknown or insecure cipher suite {suite[:80]!r} "
                        f"(supported: {', '.join(CIPHER_SUITES)})",
                    )
                suites.append(suite)
            if suites and versions["min_version"] == "TLS13":
                self.fail(
                    suites_node,
                    key_name,
                    "has no effect with min_version TLS13 (TLS 1.3 suites are fixed)",
                )

        return TLSServerConfig(
            cert_file=cert,
            key_file=key,
            client_auth_type=auth,
            client_ca_file=ca,
            min_version=versions["min_version"],
            max_version=versions["max_version"],
            cipher_suites=tuple(suites),
            prefer_server_cipher_suites=self.boolean(
                given.get("prefer_server_cipher_suites"),
                prefix + "prefer_server_cipher_suites",
                True,
            ),
        )

    def users(self, node: Node | None) -> dict[str, bytes]:
        if node is None or is_null(node):
            return {}
        users: dict[str, bytes] = {}
        for name, value_node in self.mapping(node, "basic_auth_users").items():
            key = f"basic_auth_users.{name}"
            if not name or ":" in name:
                self.fail(None, key, "a user name must be non-empty and contain no ':'")
            # Never echo the value, even of the wrong type: it may be a plain password.
            hashed = self.scalar_str(value_node, key, secret=True)
            if not _BCRYPT_HASH.fullmatch(hashed):
                self.fail(
                    value_node,
                    key,
                    "must be a bcrypt hash ($2a$, $2b$ or $2y$, cost 04-31, 60 characters), "
                    "e.g. from `htpasswd -nBC 10 '' | tr -d ':\\n'`",
                )
            users[name] = hashed.encode("ascii")
        if users:
            try:
                import bcrypt  # noqa: F401  (checked here so a missing package fails at start)
            except ImportError:
                self.fail(
                    node, "basic_auth_users", "needs the bcrypt package (pip install bcrypt)"
                )
        return users


def _kind(node: Node, *, secret: bool = False) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    tag = str(node.tag).rsplit(":", 1)[-1]
    if tag == "null":
        return "nothing (null)"
    if secret:
        # A local tag is text of the file too: "alice: !pa55word" tags an empty value.
        standard = str(node.tag).startswith("tag:yaml.org,2002:")
        return f"{tag if standard else 'a tagged'} value (not shown)"
    return f"{shorten(tag, 40)} {_quote(str(node.value))}"


def _quote(value: str) -> str:
    """A value from the file as a message shows it: ``repr``-quoted, cut with "…"."""
    return repr(value[:ECHO_LIMIT]) + ("…" if len(value) > ECHO_LIMIT else "")
