"""TLS and basic auth for ``/metrics``, from a web config file in the exporters' format.

The file is the one the Prometheus exporters read with ``--web.config.file``
(prometheus/exporter-toolkit), so an SRE can reuse what they already run::

    tls_server_config:
      cert_file: server.crt            # relative paths: relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      min_version: TLS12               # TLS12 (default) or TLS13
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG

:func:`load_web_config` reads it into a :class:`WebConfig` and checks it completely at
start: unknown keys, values of the wrong type or outside their set, and certificate or
key files that do not load are one-line :class:`WebConfigError`\\ s naming the key and
the line, e.g. ``web.yml:7: tls_server_config.min_version: must be one of TLS12,
TLS13 (TLS 1.0 and 1.1 are not supported), got 'TLS11'``.

What differs from exporter-toolkit, on purpose:

- ``min_version`` and ``max_version`` accept only ``TLS12`` and ``TLS13``;
- ``client_auth_type`` accepts ``NoClientCert``, ``VerifyClientCertIfGiven`` and
  ``RequireAndVerifyClientCert`` (Python's ``ssl`` cannot ask for a certificate without
  verifying it, which is what ``RequestClientCert`` and ``RequireAnyClientCert`` do);
- inline ``cert``, ``key`` and ``client_ca`` are refused: secrets come from files;
- ``client_allowed_sans``, ``curve_preferences`` and ``rate_limit`` are refused as not
  supported rather than silently ignored;
- ``cipher_suites`` takes the Go names of the TLS 1.2 suites (TLS 1.3 suites are not
  configurable, as in Go) and maps them to OpenSSL's;
- ``http_server_config.http2`` is accepted and has no effect (aiohttp serves HTTP/1.1);
- the file is read once at start, not on every request: restart to rotate certificates.

As in exporter-toolkit, a ``tls_server_config`` without ``cert_file`` and ``key_file``
means plain HTTP; any other key in it is then an error, since it would do nothing.

Example::

    config = load_web_config("/etc/stocksentry/web.yml")
    ssl_context = config.ssl_context()          # None without tls_server_config
    auth = BasicAuth(config.basic_auth_users)   # empty: no authentication
    ok = await auth.check(request.headers.get("Authorization"))
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, NoReturn, cast, get_args

import yaml

__all__ = [
    "AUTH_REALM",
    "BasicAuth",
    "ClientAuthType",
    "HTTPServerConfig",
    "TLSServerConfig",
    "TLSVersionName",
    "WebConfig",
    "WebConfigError",
    "load_web_config",
    "parse_web_config",
]

#: The realm sent in ``WWW-Authenticate`` when credentials are missing or wrong.
AUTH_REALM: Final = "stocksentry"

TLSVersionName = Literal["TLS12", "TLS13"]
ClientAuthType = Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]

_TLS_VERSIONS: Final[dict[str, ssl.TLSVersion]] = {
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_VERIFY_MODES: Final[dict[str, ssl.VerifyMode]] = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

# Go's names (crypto/tls, what exporter-toolkit configs contain) of the TLS 1.2 suites
# that OpenSSL still offers, with OpenSSL's names. RC4 and 3DES suites are left out: they
# are broken, and OpenSSL 3 no longer builds them by default.
_CIPHER_SUITES: Final[dict[str, str]] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
_TLS13_SUITES: Final = frozenset(
    {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
)

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
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {key}: {problem}")


@dataclass(frozen=True, slots=True)
class TLSServerConfig:
    """``tls_server_config``: the server certificate, client verification, versions.

    Paths are absolute (resolved against the config file's directory when loaded).
    """

    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: TLSVersionName = "TLS12"
    max_version: TLSVersionName = "TLS13"
    #: Go names, in preference order; empty: OpenSSL's defaults.
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True


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
        """A server ``SSLContext`` for ``tls_server_config``, or None without TLS.

        Raises :class:`WebConfigError` (naming the key and line) when a certificate, key
        or CA file cannot be loaded or the cipher list is refused by OpenSSL.
        """
        tls = self.tls
        if tls is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _TLS_VERSIONS[tls.min_version]
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
        try:
            context.load_cert_chain(certfile=tls.cert_file, keyfile=tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            self._fail(
                "tls_server_config.cert_file",
                f"cannot load certificate {tls.cert_file} with key {tls.key_file}: {exc}",
            )
        if tls.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=tls.client_ca_file)
            except (OSError, ssl.SSLError) as exc:
                self._fail(
                    "tls_server_config.client_ca_file",
                    f"cannot load CA file {tls.client_ca_file}: {exc}",
                )
        context.verify_mode = _VERIFY_MODES[tls.client_auth_type]
        if tls.cipher_suites:
            try:
                context.set_ciphers(":".join(_CIPHER_SUITES[s] for s in tls.cipher_suites))
            except ssl.SSLError as exc:
                self._fail("tls_server_config.cipher_suites", f"refused by OpenSSL: {exc}")
        if tls.prefer_server_cipher_suites:
            context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        return context

    def _fail(self, key: str, problem: str) -> NoReturn:
        raise WebConfigError(self.source, self.lines.get(key), key, problem)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read, validate and return the web config at ``path``; also loads its TLS files.

    Relative file names in the config are relative to the config file's directory, as in
    exporter-toolkit. Every problem is a :class:`WebConfigError`.

    Example::

        config = load_web_config("/etc/stocksentry/web.yml")
    """
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WebConfigError(source, None, "(file)", f"cannot read: {exc}") from None
    config = parse_web_config(text, source=source, base_dir=Path(path).resolve().parent)
    # Load the certificate now: a bad one must stop the start, not the first handshake.
    config.ssl_context()
    return config


def parse_web_config(
    text: str, *, source: str = "<web config>", base_dir: Path | None = None
) -> WebConfig:
    """Parse web config YAML ``text``; file names resolve against ``base_dir`` (or cwd).

    Files are not opened here; :meth:`WebConfig.ssl_context` loads them.

    Example::

        >>> parse_web_config("").tls is None
        True
    """
    return _Parser(source, base_dir or Path.cwd()).parse(text)


# --- parsing ---------------------------------------------------------------------------------

_STR: Final = "tag:yaml.org,2002:str"
_BOOL: Final = "tag:yaml.org,2002:bool"
_NULL: Final = "tag:yaml.org,2002:null"


class _Parser:
    """Walks the composed YAML nodes, so every value keeps its line for the errors."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir
        self.lines: dict[str, int] = {}

    def fail(self, node: yaml.Node | None, key: str, problem: str) -> NoReturn:
        line = node.start_mark.line + 1 if node is not None else None
        raise WebConfigError(self.source, line, key, problem)

    def parse(self, text: str) -> WebConfig:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else None
            problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
            raise WebConfigError(self.source, line, "(yaml)", problem) from None
        except yaml.YAMLError as exc:
            raise WebConfigError(self.source, None, "(yaml)", " ".join(str(exc).split())) from None
        except RecursionError:
            # yaml.compose recurses once per nesting level: "[[[[..." thousands deep.
            raise WebConfigError(self.source, None, "(yaml)", "nested too deeply") from None
        if root is None or (root.tag == _NULL and isinstance(root, yaml.ScalarNode)):
            return WebConfig(source=self.source)
        sections = self.mapping(root, "(top level)")
        self.check_keys(
            sections, "", ("tls_server_config", "http_server_config", "basic_auth_users")
        )
        tls = http = users = None
        if (entry := sections.get("tls_server_config")) is not None:
            tls = self.tls(entry[1])
        if (entry := sections.get("http_server_config")) is not None:
            http = self.http(entry[1])
        if (entry := sections.get("basic_auth_users")) is not None:
            users = self.users(entry[1])
        return WebConfig(
            tls=tls,
            http=http or HTTPServerConfig(),
            basic_auth_users=users or {},
            source=self.source,
            lines=dict(self.lines),
        )

    # -- node helpers

    def mapping(self, node: yaml.Node, key: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        """Key -> (key node, value node); refuses non-mappings and duplicate keys."""
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, key, f"must be a mapping, got {_kind(node)}")
        result: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        prefix = f"{key}." if not key.startswith("(") else ""
        for key_node, value_node in node.value:
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == _STR):
                self.fail(
                    key_node,
                    f"{prefix}{getattr(key_node, 'value', '?')}",
                    f"keys must be strings, got {_kind(key_node)}",
                )
            name = str(key_node.value)
            path = f"{prefix}{name}"
            if name in result:
                self.fail(key_node, path, "duplicate key")
            self.lines[path] = key_node.start_mark.line + 1
            result[name] = (key_node, value_node)
        return result

    def check_keys(
        self,
        entries: Mapping[str, tuple[yaml.Node, yaml.Node]],
        prefix: str,
        known: tuple[str, ...],
    ) -> None:
        for name, (key_node, _) in entries.items():
            path = f"{prefix}{name}"
            if name in known:
                continue
            if path in _UNSUPPORTED:
                self.fail(key_node, path, _UNSUPPORTED[path])
            self.fail(key_node, path, f"unknown key (known: {', '.join(known)})")

    def scalar_str(self, node: yaml.Node, key: str, *, secret: bool = False) -> str:
        if not (isinstance(node, yaml.ScalarNode) and node.tag == _STR):
            self.fail(node, key, f"must be a string, got {_kind(node, secret=secret)}")
        return str(node.value)

    def is_null(self, node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == _NULL

    def boolean(self, node: yaml.Node, key: str) -> bool:
        if not (isinstance(node, yaml.ScalarNode) and node.tag == _BOOL):
            self.fail(node, key, f"must be true or false, got {_kind(node)}")
        value = str(node.value).lower()
        if value not in ("true", "yes", "on", "false", "no", "off"):
            # An explicit tag: "!!bool maybe" is not false.
            self.fail(node, key, f"must be true or false, got {_kind(node)}")
        return value in ("true", "yes", "on")

    def choice(self, node: yaml.Node, key: str, choices: tuple[str, ...], note: str = "") -> str:
        value = self.scalar_str(node, key)
        if value not in choices:
            self.fail(node, key, f"must be one of {', '.join(choices)}{note}, got {value!r}")
        return value

    def path(self, node: yaml.Node, key: str) -> Path:
        value = self.scalar_str(node, key)
        if not value:
            self.fail(node, key, "must not be empty")
        return (self.base_dir / value).resolve()

    def string_list(self, node: yaml.Node, key: str) -> list[tuple[yaml.Node, str]]:
        if self.is_null(node):
            return []
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, key, f"must be a list, got {_kind(node)}")
        return [(item, self.scalar_str(item, f"{key}[{i}]")) for i, item in enumerate(node.value)]

    # -- sections

    def tls(self, node: yaml.Node) -> TLSServerConfig | None:
        if self.is_null(node):
            return None
        entries = self.mapping(node, "tls_server_config")
        prefix = "tls_server_config."
        self.check_keys(
            entries,
            prefix,
            (
                "cert_file",
                "key_file",
                "client_auth_type",
                "client_ca_file",
                "min_version",
                "max_version",
                "cipher_suites",
                "prefer_server_cipher_suites",
            ),
        )

        def value(name: str) -> yaml.Node | None:
            entry = entries.get(name)
            return entry[1] if entry is not None else None

        paths: dict[str, Path | None] = {}
        for name in ("cert_file", "key_file", "client_ca_file"):
            node_ = value(name)
            paths[name] = (
                None if node_ is None or self.is_null(node_) else self.path(node_, prefix + name)
            )
        cert, key = paths["cert_file"], paths["key_file"]
        if cert is None and key is None:
            # exporter-toolkit serves plain HTTP for a TLS section without certificate;
            # anything else in it would then be silently ignored, so refuse that.
            others = [name for name in entries if name not in ("cert_file", "key_file")]
            if others:
                self.fail(
                    entries[others[0]][0],
                    prefix + others[0],
                    "needs cert_file and key_file (without them TLS is off)",
                )
            return None
        if cert is None or key is None:
            missing = "cert_file" if cert is None else "key_file"
            self.fail(node, prefix + missing, f"missing: required with {_other(missing)}")

        auth: ClientAuthType = "NoClientCert"
        if (node_ := value("client_auth_type")) is not None:
            refused = ("RequestClientCert", "RequireAnyClientCert")
            if isinstance(node_, yaml.ScalarNode) and node_.value in refused:
                self.fail(
                    node_,
                    prefix + "client_auth_type",
                    f"{node_.value} accepts unverified certificates and is not supported; "
                    "use RequireAndVerifyClientCert",
                )
            auth = cast(
                ClientAuthType,
                self.choice(node_, prefix + "client_auth_type", get_args(ClientAuthType)),
            )
        ca = paths["client_ca_file"]
        if auth != "NoClientCert" and ca is None:
            self.fail(
                node_ if node_ is not None else node,
                prefix + "client_ca_file",
                f"required when client_auth_type is {auth}",
            )
        if auth == "NoClientCert" and ca is not None:
            ca_node = entries["client_ca_file"][0]
            self.fail(
                ca_node,
                prefix + "client_ca_file",
                "set without client_auth_type: set client_auth_type to "
                "RequireAndVerifyClientCert (or remove client_ca_file)",
            )

        versions: dict[str, TLSVersionName] = {"min_version": "TLS12", "max_version": "TLS13"}
        for name in versions:
            if (node_ := value(name)) is not None:
                versions[name] = cast(
                    TLSVersionName,
                    self.choice(
                        node_,
                        prefix + name,
                        get_args(TLSVersionName),
                        " (TLS 1.0 and 1.1 are not supported)",
                    ),
                )
        if _TLS_VERSIONS[versions["min_version"]] > _TLS_VERSIONS[versions["max_version"]]:
            node_ = value("max_version") or value("min_version")
            self.fail(node_, prefix + "max_version", "is lower than min_version")

        suites: list[str] = []
        if (node_ := value("cipher_suites")) is not None:
            for item, suite in self.string_list(node_, prefix + "cipher_suites"):
                if suite in _TLS13_SUITES:
                    self.fail(
                        item,
                        prefix + "cipher_suites",
                        f"{suite} is a TLS 1.3 suite; TLS 1.3 suites are not configurable",
                    )
                if suite not in _CIPHER_SUITES:
                    self.fail(
                        item,
                        prefix + "cipher_suites",
                        f"unknown or insecure cipher suite {suite!r} "
                        f"(supported: {', '.join(_CIPHER_SUITES)})",
                    )
                suites.append(suite)
            if suites and versions["min_version"] == "TLS13":
                self.fail(
                    node_,
                    prefix + "cipher_suites",
                    "has no effect with min_version TLS13 (TLS 1.3 suites are fixed)",
                )

        prefer = True
        if (node_ := value("prefer_server_cipher_suites")) is not None:
            prefer = self.boolean(node_, prefix + "prefer_server_cipher_suites")

        return TLSServerConfig(
            cert_file=cert,
            key_file=key,
            client_auth_type=auth,
            client_ca_file=ca,
            min_version=versions["min_version"],
            max_version=versions["max_version"],
            cipher_suites=tuple(suites),
            prefer_server_cipher_suites=prefer,
        )

    def http(self, node: yaml.Node) -> HTTPServerConfig | None:
        if self.is_null(node):
            return None
        entries = self.mapping(node, "http_server_config")
        prefix = "http_server_config."
        self.check_keys(entries, prefix, ("http2", "headers"))
        http2 = True
        if (entry := entries.get("http2")) is not None:
            http2 = self.boolean(entry[1], prefix + "http2")
        headers: dict[str, str] = {}
        if (entry := entries.get("headers")) is not None and not self.is_null(entry[1]):
            header_entries = self.mapping(entry[1], prefix + "headers")
            self.check_keys(header_entries, prefix + "headers.", _HEADERS)
            for name, (_, value_node) in header_entries.items():
                key = f"{prefix}headers.{name}"
                if self.is_null(value_node):
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

    def users(self, node: yaml.Node) -> dict[str, bytes]:
        if self.is_null(node):
            return {}
        entries = self.mapping(node, "basic_auth_users")
        users: dict[str, bytes] = {}
        for name, (key_node, value_node) in entries.items():
            key = f"basic_auth_users.{name}"
            if not name or ":" in name:
                self.fail(key_node, key, "a user name must be non-empty and contain no ':'")
            # Never echo the value, even of the wrong type: it may be a plain password.
            hashed = self.scalar_str(value_node, key, secret=True)
            if not _BCRYPT_HASH.fullmatch(hashed):
                # Never echo the value: it may be a plain password put there by mistake.
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


def _kind(node: yaml.Node, *, secret: bool = False) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    tag = str(node.tag).rsplit(":", 1)[-1]
    if tag == "null":
        return "nothing (null)"
    if secret:
        # A local tag is text of the file too: "alice: !pa55word" tags an empty value.
        standard = str(node.tag).startswith("tag:yaml.org,2002:")
        return f"{tag if standard else 'a tagged'} value (not shown)"
    return f"{tag} {str(node.value)!r}"


def _other(name: str) -> str:
    return "key_file" if name == "cert_file" else "cert_file"


# --- basic auth ------------------------------------------------------------------------------


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, with a verified cache.

    bcrypt is slow on purpose (tens of milliseconds at cost 10), and Prometheus sends the
    same credentials every few seconds, so a successful check is remembered: the cache
    holds, per user, an HMAC of user and password under a key drawn at start (never the
    password, nor a plain hash of it that could be brute-forced offline), compared in
    constant time. Failed checks are not cached, so guessing always pays bcrypt. Unknown
    users are checked against a dummy hash, so the answer takes as long as for a known
    user and does not reveal which names exist. bcrypt runs in a thread so that a burst
    of bad credentials cannot stall the event loop (and the health checks).

    Example::

        auth = BasicAuth({"prometheus": b"$2b$10$..."})
        if not await auth.check(request.headers.get("Authorization")):
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": auth.challenge})
    """

    #: The ``WWW-Authenticate`` value for a 401.
    challenge: Final = f'Basic realm="{AUTH_REALM}"'

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._key = secrets.token_bytes(32)
        self._verified: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._dummy = b""
        self._bcrypt_checks = 0
        self._checkpw: Callable[[bytes, bytes], bool] = _refuse
        if self._users:
            import bcrypt

            self._checkpw = bcrypt.checkpw
            # Same cost as the configured hashes, so a miss costs what a hit does.
            cost = int(next(iter(self._users.values()))[4:6])
            self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(rounds=cost))

    @property
    def enabled(self) -> bool:
        """True when at least one user is configured (otherwise everything passes)."""
        return bool(self._users)

    @property
    def bcrypt_checks(self) -> int:
        """How many times bcrypt ran (cache misses); a steady scraper adds none."""
        with self._lock:
            return self._bcrypt_checks

    def _digest(self, user: str, password: bytes) -> bytes:
        return hmac.new(
            self._key, user.encode("utf-8") + b"\0" + password, hashlib.sha256
        ).digest()

    def verify(self, user: str, password: bytes) -> bool:
        """Check one user and password (blocking: may run bcrypt)."""
        if not self._users:
            return True
        digest = self._digest(user, password)
        with self._lock:
            cached = self._verified.get(user)
        if cached is not None and hmac.compare_digest(cached, digest):
            return True
        hashed = self._users.get(user)
        with self._lock:
            self._bcrypt_checks += 1
        try:
            ok = self._checkpw(password, hashed if hashed is not None else self._dummy)
        except ValueError:
            # bcrypt refuses passwords over 72 bytes: wrong by definition.
            ok = False
        if not ok or hashed is None:
            return False
        with self._lock:
            self._verified[user] = digest
        return True

    async def check(self, header: str | None) -> bool:
        """Check an ``Authorization`` header value; True when auth is off or it matches."""
        if not self._users:
            return True
        credentials = _parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        digest = self._digest(user, password)
        with self._lock:
            cached = self._verified.get(user)
        if cached is not None and hmac.compare_digest(cached, digest):
            # The common case, answered without leaving the event loop.
            return True
        return await asyncio.to_thread(self.verify, user, password)


def _refuse(password: bytes, hashed: bytes) -> bool:
    return False


def _parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """``Basic dXNlcjpwYXNz`` -> ("user", b"pass"); None when absent or malformed."""
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user_bytes, colon, password = decoded.partition(b":")
    if not colon:
        return None
    try:
        user = user_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return user, password
