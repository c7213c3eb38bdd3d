"""TLS for ``/metrics``: the ``tls_server_config`` of the web config and its SSL context.

:mod:`stocksentry.exporter.webconfig` reads and checks the section into a
:class:`TLSServerConfig`; :func:`server_context` turns it into the server's
:class:`ssl.SSLContext`, loading the certificate, key and CA files.

Example::

    context = server_context(config.tls, fail)   # fail(key, problem) raises
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, NoReturn, Protocol, cast, get_args

from yaml.nodes import Node, ScalarNode

from .config.yamlsource import Entry, is_null
from .inputs import TLS_FILE_LIMIT, InputFileError, check_regular_file, shorten

__all__ = [
    "CIPHER_SUITES",
    "TLS13_SUITES",
    "TLS_VERSIONS",
    "ClientAuthType",
    "SectionReader",
    "TLSServerConfig",
    "TLSVersionName",
    "read_tls",
    "server_context",
]

TLSVersionName = Literal["TLS12", "TLS13"]
ClientAuthType = Literal["NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"]

TLS_VERSIONS: Final[dict[str, ssl.TLSVersion]] = {
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
VERIFY_MODES: Final[dict[str, ssl.VerifyMode]] = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}

# Go's names (crypto/tls, what exporter-toolkit configs contain) of the TLS 1.2 suites
# that OpenSSL still offers, with OpenSSL's names. RC4 and 3DES suites are left out: they
# are broken, and OpenSSL 3 no longer builds them by default.
CIPHER_SUITES: Final[dict[str, str]] = {
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
TLS13_SUITES: Final = frozenset(
    {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
)


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


class SectionReader(Protocol):
    """The node helpers of the web config's parser that the TLS section is read with."""

    def fail(self, node: Node | None, key: str, problem: str) -> NoReturn: ...
    def mapping(self, node: Node, key: str) -> dict[str, Entry]: ...
    def check_keys(
        self, entries: Mapping[str, Entry], prefix: str, known: tuple[str, ...]
    ) -> None: ...
    def path(self, node: Node, key: str) -> Path: ...
    def choice(self, node: Node, key: str, choices: tuple[str, ...], note: str = "") -> str: ...
    def string_list(self, node: Node, key: str) -> list[tuple[Node, str]]: ...
    def boolean(self, node: Node, key: str) -> bool: ...


def read_tls(reader: SectionReader, node: Node) -> TLSServerConfig | None:
    """``tls_server_config`` read from ``node`` through ``reader``; ``None``: plain HTTP."""
    if is_null(node):
        return None
    entries = reader.mapping(node, "tls_server_config")
    prefix = "tls_server_config."
    reader.check_keys(
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

    def value(name: str) -> Node | None:
        entry = entries.get(name)
        return entry.value if entry is not None else None

    paths: dict[str, Path | None] = {}
    for name in ("cert_file", "key_file", "client_ca_file"):
        node_ = value(name)
        paths[name] = (
            None if node_ is None or is_null(node_) else reader.path(node_, prefix + name)
        )
    cert, key = paths["cert_file"], paths["key_file"]
    if cert is None and key is None:
        # exporter-toolkit serves plain HTTP for a TLS section without certificate;
        # anything else in it would then be silently ignored, so refuse that.
        others = [name for name in entries if name not in ("cert_file", "key_file")]
        if others:
            reader.fail(
                entries[others[0]].key,
                prefix + others[0],
                "needs cert_file and key_file (without them TLS is off)",
            )
        return None
    if cert is None or key is None:
        missing = "cert_file" if cert is None else "key_file"
        reader.fail(node, prefix + missing, f"missing: required with {_other_file(missing)}")

    auth: ClientAuthType = "NoClientCert"
    if (node_ := value("client_auth_type")) is not None:
        refused = ("RequestClientCert", "RequireAnyClientCert")
        if isinstance(node_, ScalarNode) and node_.value in refused:
            reader.fail(
                node_,
                prefix + "client_auth_type",
                f"{node_.value} accepts unverified certificates and is not supported; "
                "use RequireAndVerifyClientCert",
            )
        auth = cast(
            ClientAuthType,
            reader.choice(node_, prefix + "client_auth_type", get_args(ClientAuthType)),
        )
    ca = paths["client_ca_file"]
    if auth != "NoClientCert" and ca is None:
        reader.fail(
            node_ if node_ is not None else node,
            prefix + "client_ca_file",
            f"required when client_auth_type is {auth}",
        )
    if auth == "NoClientCert" and ca is not None:
        ca_node = entries["client_ca_file"].key
        reader.fail(
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
                reader.choice(
                    node_,
                    prefix + name,
                    get_args(TLSVersionName),
                    " (TLS 1.0 and 1.1 are not supported)",
                ),
            )
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        node_ = value("max_version") or value("min_version")
        reader.fail(node_, prefix + "max_version", "is lower than min_version")

    suites: list[str] = []
    if (node_ := value("cipher_suites")) is not None:
        for item, suite in reader.string_list(node_, prefix + "cipher_suites"):
            if suite in TLS13_SUITES:
                reader.fail(
                    item,
                    prefix + "cipher_suites",
                    f"{suite} is a TLS 1.3 suite; TLS 1.3 suites are not configurable",
                )
            if suite not in CIPHER_SUITES:
                reader.fail(
                    item,
                    prefix + "cipher_suites",
                    f"unknown or insecure cipher suite {suite[:80]!r} "
                    f"(supported: {', '.join(CIPHER_SUITES)})",
                )
            suites.append(suite)
        if suites and versions["min_version"] == "TLS13":
            reader.fail(
                node_,
                prefix + "cipher_suites",
                "has no effect with min_version TLS13 (TLS 1.3 suites are fixed)",
            )

    prefer = True
    if (node_ := value("prefer_server_cipher_suites")) is not None:
        prefer = reader.boolean(node_, prefix + "prefer_server_cipher_suites")

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


def _other_file(name: str) -> str:
    return "key_file" if name == "cert_file" else "cert_file"


def server_context(tls: TLSServerConfig, fail: Callable[[str, str], NoReturn]) -> ssl.SSLContext:
    """A server ``SSLContext`` for ``tls``; ``fail(key, problem)`` is called (and raises)
    when a certificate, key or CA file cannot be loaded or OpenSSL refuses the ciphers."""
    # OpenSSL opens these itself: checked first, so that a FIFO cannot block the start
    # and a device or a huge file cannot be read without end.
    files = (
        ("tls_server_config.cert_file", tls.cert_file, "the certificate"),
        ("tls_server_config.key_file", tls.key_file, "the key"),
        ("tls_server_config.client_ca_file", tls.client_ca_file, "the client CA file"),
    )
    for key, file, what in files:
        if file is None:
            continue
        try:
            check_regular_file(file, limit=TLS_FILE_LIMIT, what=what)
        except InputFileError as exc:
            fail(key, f"cannot read {what} {shorten(str(file), 200)}: {exc.problem}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    try:
        context.load_cert_chain(certfile=tls.cert_file, keyfile=tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        fail(
            "tls_server_config.cert_file",
            f"cannot load certificate {tls.cert_file} with key {tls.key_file}: {exc}",
        )
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            fail(
                "tls_server_config.client_ca_file",
                f"cannot load CA file {tls.client_ca_file}: {exc}",
            )
    context.verify_mode = VERIFY_MODES[tls.client_auth_type]
    if tls.cipher_suites:
        try:
            context.set_ciphers(":".join(CIPHER_SUITES[s] for s in tls.cipher_suites))
        except ssl.SSLError as exc:
            fail("tls_server_config.cipher_suites", f"refused by OpenSSL: {exc}")
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return context
