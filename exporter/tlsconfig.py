"""TLS for ``/metrics``: the web config's :class:`TLSServerConfig` and its SSL context."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, NoReturn

from .inputs import TLS_FILE_LIMIT, InputFileError, check_regular_file, shorten

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
    """``tls_server_config``; paths are absolute (resolved against the config's folder)."""

    cert_file: Path
    key_file: Path
    client_auth_type: ClientAuthType = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: TLSVersionName = "TLS12"
    max_version: TLSVersionName = "TLS13"
    #: Go names, in preference order; empty: OpenSSL's defaults.
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True


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
