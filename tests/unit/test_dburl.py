"""Database URLs from the command line are parsed once and never shown with a password."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
import trustme
from stocksentry.exporter.dburl import (
    UNPARSEABLE,
    dialect_of,
    mysql_connect_args,
    parse_url,
    scrub,
    shown,
)


@pytest.mark.parametrize(
    ("text", "driver"),
    [
        # Plain PostgreSQL gets psycopg.
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u@h/db", "postgresql+psycopg"),
        ("sqlite:///x.db", "sqlite"),
        # MySQL and MariaDB URLs stay as written for SQLAlchemy.
        ("mysql://u@h/db", "mysql"),
        ("mariadb://u@h/db", "mariadb"),
        ("mysql+aiomysql://u@h/db", "mysql+aiomysql"),
    ],
)
def test_parse_url_gives_sqlalchemy_its_driver(text: str, driver: str) -> None:
    assert parse_url(text).drivername == driver


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgresql://u:hunter2@h:5432/db", "postgresql+psycopg://u:***@h:5432/db"),
        ("postgresql://u@h/db?password=hunter2", "postgresql+psycopg://u@h/db"),
        ("host=h user=u password=hunter2", UNPARSEABLE),
        (
            "postgresql://u:hunter2@h/db?sslmode=require&sslpassword=hunter2",
            "postgresql+psycopg://u:***@h/db?sslmode=require",
        ),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("sqlite:////var/lib/shop.db", "sqlite:////var/lib/shop.db"),
    ],
)
def test_shown_never_holds_the_password(text: str, expected: str) -> None:
    assert shown(text) == expected


def test_unparseable_input_is_not_echoed() -> None:
    with pytest.raises(ValueError, match="not a database URL") as caught:
        parse_url("host=h password=hunter2")
    assert "hunter2" not in str(caught.value)


def test_scrub_blanks_every_secret_of_the_url() -> None:
    url = "postgresql://u:s%40cret@h/db?password=hunter2"
    message = "auth failed: s@cret / s%40cret / hunter2"
    assert scrub(message, url) == "auth failed: *** / *** / ***"


def test_demo_does_not_echo_an_unparseable_database() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stocksentry.exporter",
            "demo",
            "--database",
            "host=h password=hunter2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "hunter2" not in done.stdout + done.stderr


def test_docstring_examples() -> None:
    import doctest

    from stocksentry.exporter import dburl

    result = doctest.testmod(dburl)
    assert (result.failed, result.attempted) == (0, 4)


@pytest.mark.parametrize(
    ("text", "dialect"),
    [
        ("postgresql://u@h/db", "postgresql"),
        ("postgres://u@h/db", "postgresql"),
        ("host=h dbname=db", "postgresql"),
        ("mysql://u@h/db", "mysql"),
        ("mysql+pymysql://u@h/db", "mysql"),
        ("mariadb://u@h/db", "mariadb"),
        ("mariadb+aiomysql://u@h/db", "mariadb"),
        ("sqlite:///x.db", "sqlite"),
        ("mssql://u@h/db", None),
        ("not a url", None),
    ],
)
def test_the_dialect_of_a_url(text: str, dialect: str | None) -> None:
    assert dialect_of(text) == dialect


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mysql://u:hunter2@h:3306/db", "mysql://u:***@h:3306/db"),
        (
            "mariadb://u:hunter2@h/db?charset=utf8mb4",
            "mariadb://u:***@h/db?charset=utf8mb4",
        ),
        ("mysql+aiomysql://u:hunter2@h/db?password=hunter2", "mysql+aiomysql://u:***@h/db"),
    ],
)
def test_a_mysql_url_is_shown_without_its_password(text: str, expected: str) -> None:
    assert shown(text) == expected
    assert "hunter2" not in scrub(f"Access denied for {text} (hunter2)", text)


def test_mysql_connect_args_decode_the_url() -> None:
    args = mysql_connect_args(
        "mariadb+aiomysql://ap%40p:p%40ss@db.internal:3307/shop?charset=utf8mb4"
    )
    assert args == {
        "host": "db.internal",
        "port": 3307,
        "user": "ap@p",
        "password": "p@ss",
        "db": "shop",
        "charset": "utf8mb4",
    }
    assert mysql_connect_args("mysql://h")["port"] == 3306
    assert mysql_connect_args("mysql://u@h/db?unix_socket=/run/mysqld.sock")["unix_socket"] == (
        "/run/mysqld.sock"
    )


@pytest.mark.parametrize(
    "text",
    [
        "mysql://u:hunter2@h/db?passwd=hunter2",
        "mysql://u:hunter2@h/db?ssl_verify_cert=hunter2",
        "mysql://u:hunter2@h:notaport/db",
        "postgresql://u:hunter2@h/db",
    ],
)
def test_mysql_connect_args_refuse_without_echoing(text: str) -> None:
    with pytest.raises(ValueError, match="MySQL") as caught:
        mysql_connect_args(text)
    assert "hunter2" not in str(caught.value)


# --- TLS: the ssl_* options of a MySQL URL become the ssl.SSLContext aiomysql takes ------


@dataclass(frozen=True)
class _Pki:
    """A throwaway CA, the database server's certificate, and a client's as files."""

    ca: trustme.CA
    server: trustme.LeafCert
    ca_file: Path
    client_cert: Path
    client_key: Path


@pytest.fixture
def pki(tmp_path: Path) -> _Pki:
    # trustme (a dev dependency, built on cryptography) rather than an openssl binary:
    # nothing to find on PATH, the same certificates on every machine.
    ca = trustme.CA()
    client = ca.issue_cert("probe@stocksentry.example")
    pki = _Pki(
        ca=ca,
        server=ca.issue_cert("db.internal"),
        ca_file=tmp_path / "ca.pem",
        client_cert=tmp_path / "client.pem",
        client_key=tmp_path / "client.key",
    )
    ca.cert_pem.write_to_path(pki.ca_file)
    client.cert_chain_pems[0].write_to_path(pki.client_cert)
    client.private_key_pem.write_to_path(pki.client_key)
    return pki


def _url(**options: str | Path) -> str:
    """A MySQL URL with a password (which no error may show) and these query options."""
    return "mysql://probe:hunter2@db.internal:3306/shop?" + urlencode(
        {name: str(value) for name, value in options.items()}
    )


def _server(cert: trustme.LeafCert, client_ca: trustme.CA | None = None) -> ssl.SSLContext:
    """A database server's TLS end; with ``client_ca`` it demands a client certificate."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(server)
    if client_ca is not None:
        client_ca.configure_trust(server)
        server.verify_mode = ssl.CERT_REQUIRED
    return server


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str) -> ssl.SSLObject:
    """A TLS handshake between ``client`` (the context the URL gave) and ``server``, in
    memory: what the context does rather than what its attributes say, with no socket and
    no database. Returns the server's end; either end's TLS error passes through."""
    to_client, from_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    to_server, from_server = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(to_client, from_client, server_hostname=hostname)
    server_end = server.wrap_bio(to_server, from_server, server_side=True)
    done = {client_end: False, server_end: False}
    for _ in range(10):
        for end in (client_end, server_end):
            if not done[end]:
                try:
                    end.do_handshake()
                    done[end] = True
                except ssl.SSLWantReadError:
                    pass
        to_server.write(from_client.read())
        to_client.write(from_server.read())
        if all(done.values()):
            return server_end
    raise AssertionError("the in-memory TLS handshake did not finish")


def test_no_ssl_option_means_no_ssl_argument() -> None:
    """Without an ssl_* option aiomysql gets no ``ssl``: TLS is the URL's choice."""
    assert "ssl" not in mysql_connect_args(_url())
    assert "ssl" not in mysql_connect_args(_url(charset="utf8mb4", program_name="probe"))


def test_any_ssl_option_turns_tls_on_fully_verified() -> None:
    """One ssl_* option is enough for a context; the ones not given keep verification on
    (against the system's CAs when there is no ssl_ca)."""
    context = mysql_connect_args(_url(ssl_verify_identity="true"))["ssl"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_ssl_ca_is_the_only_authority_trusted(pki: _Pki) -> None:
    context = mysql_connect_args(_url(ssl_ca=pki.ca_file))["ssl"]
    # The CA file replaces the system's store, and verification stays fully on.
    assert context.get_ca_certs(binary_form=True) == [
        ssl.PEM_cert_to_DER_cert(pki.ca.cert_pem.bytes().decode())
    ]
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    _handshake(context, _server(pki.server), "db.internal")
    # A server under another name is refused, and so is a certificate of another CA.
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(context, _server(pki.server), "other.internal")
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(context, _server(trustme.CA().issue_cert("db.internal")), "db.internal")


def test_ssl_verify_cert_false_verifies_nothing(pki: _Pki) -> None:
    context = mysql_connect_args(_url(ssl_verify_cert="false"))["ssl"]
    assert context.verify_mode == ssl.CERT_NONE
    assert not context.check_hostname
    # Any certificate under any name (the system store does not know the throwaway CA).
    _handshake(context, _server(pki.server), "other.internal")


def test_ssl_verify_identity_false_still_verifies_the_certificate(pki: _Pki) -> None:
    context = mysql_connect_args(_url(ssl_ca=pki.ca_file, ssl_verify_identity="false"))["ssl"]
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert not context.check_hostname
    # The name is not checked ...
    _handshake(context, _server(pki.server), "other.internal")
    # ... the chain is.
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(context, _server(trustme.CA().issue_cert("db.internal")), "db.internal")


@pytest.mark.parametrize(
    ("value", "verified"),
    [("1", True), ("TRUE", True), ("Yes", True), ("on", True), ("0", False), ("OFF", False)],
)
def test_ssl_booleans_take_the_usual_spellings(value: str, verified: bool) -> None:
    context = mysql_connect_args(_url(ssl_verify_cert=value))["ssl"]
    assert context.verify_mode == (ssl.CERT_REQUIRED if verified else ssl.CERT_NONE)


@pytest.mark.parametrize("name", ["ssl_verify_cert", "ssl_verify_identity"])
@pytest.mark.parametrize("value", ["hunter2", "", "2", "maybe"])
def test_a_bad_ssl_boolean_is_named_not_echoed(name: str, value: str) -> None:
    """The option is named, the value (here once the URL's password) is not quoted."""
    with pytest.raises(ValueError, match=f"^the MySQL URL option {name} takes") as caught:
        mysql_connect_args(_url(**{name: value}))
    assert str(caught.value) == f"the MySQL URL option {name} takes true or false"


def test_ssl_cert_and_key_are_the_chain_the_server_sees(pki: _Pki) -> None:
    args = mysql_connect_args(
        _url(ssl_ca=pki.ca_file, ssl_cert=pki.client_cert, ssl_key=pki.client_key)
    )
    server = _handshake(args["ssl"], _server(pki.server, client_ca=pki.ca), "db.internal")
    peer = server.getpeercert()
    assert peer is not None
    assert ("email", "probe@stocksentry.example") in peer["subjectAltName"]
    # Without them, a server that demands a client certificate gets none and refuses.
    without = mysql_connect_args(_url(ssl_ca=pki.ca_file))["ssl"]
    with pytest.raises(ssl.SSLError):
        _handshake(without, _server(pki.server, client_ca=pki.ca), "db.internal")


def test_ssl_cert_alone_may_hold_the_key_too(pki: _Pki, tmp_path: Path) -> None:
    """Without ssl_key the key is read from the ssl_cert file (load_cert_chain's rule)."""
    both = tmp_path / "both.pem"
    both.write_bytes(pki.client_key.read_bytes() + pki.client_cert.read_bytes())
    args = mysql_connect_args(_url(ssl_ca=pki.ca_file, ssl_cert=both))
    server = _handshake(args["ssl"], _server(pki.server, client_ca=pki.ca), "db.internal")
    assert server.getpeercert()


@pytest.mark.parametrize("option", ["ssl_ca", "ssl_cert", "ssl_key"])
def test_a_missing_tls_file_is_named_by_its_option(option: str, pki: _Pki, tmp_path: Path) -> None:
    """A URL problem, as the function promises (the probes report it as the URL's, the
    config refuses it at load): the option is named, neither path nor password shown."""
    files: dict[str, str | Path] = {"ssl_cert": pki.client_cert, "ssl_key": pki.client_key}
    files[option] = tmp_path / "absent.pem"
    which = "ssl_ca" if option == "ssl_ca" else "ssl_cert and ssl_key"
    message = f"the MySQL URL option {which}: no such file or directory"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        mysql_connect_args(_url(**files))


def test_a_key_that_is_not_the_certificates_is_refused(pki: _Pki, tmp_path: Path) -> None:
    other_key = tmp_path / "other.key"
    pki.ca.issue_cert("someone-else.example").private_key_pem.write_to_path(other_key)
    with pytest.raises(
        ValueError, match=r"^the MySQL URL option ssl_cert and ssl_key: "
    ) as caught:
        mysql_connect_args(_url(ssl_cert=pki.client_cert, ssl_key=other_key))
    assert "KEY_VALUES_MISMATCH" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert str(tmp_path) not in str(caught.value)


def test_a_file_that_is_no_certificate_is_refused(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(
        ValueError, match=r"^the MySQL URL option ssl_cert: not a usable"
    ) as caught:
        mysql_connect_args(_url(ssl_cert=garbage))
    assert "hunter2" not in str(caught.value)
    assert str(tmp_path) not in str(caught.value)


@pytest.mark.parametrize("option", ["ssl_ca", "ssl_cert", "ssl_key"])
def test_an_empty_tls_file_option_is_refused(option: str) -> None:
    """An empty ``ssl_ca=`` would silently trust the system's CAs instead."""
    with pytest.raises(ValueError, match=f"^the MySQL URL option {option} is empty$"):
        mysql_connect_args(_url(**{option: ""}))


def test_a_key_without_its_certificate_is_refused(pki: _Pki) -> None:
    """A key alone would be dropped: TLS without the client certificate meant."""
    with pytest.raises(ValueError, match=r"^the MySQL URL option ssl_key needs ssl_cert"):
        mysql_connect_args(_url(ssl_key=pki.client_key))


def test_checking_the_name_without_the_certificate_is_refused() -> None:
    with pytest.raises(ValueError, match="contradict each other"):
        mysql_connect_args(_url(ssl_verify_identity="true", ssl_verify_cert="false"))
    # Either one alone, or both off, is a choice the URL may make.
    assert mysql_connect_args(_url(ssl_verify_identity="false", ssl_verify_cert="false"))


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    pki: _Pki, tmp_path: Path
) -> None:
    """OpenSSL would otherwise prompt on the terminal, hanging a sidecar started by hand."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with pytest.raises(ValueError, match="holds an encrypted private key"):
        mysql_connect_args(_url(ssl_cert=pki.client_cert, ssl_key=encrypted))
