"""Database URLs: parsed once, their dialect and driver chosen, shown without password.

The dialect comes from the URL's scheme (:func:`dialect_of`). ``postgresql://`` gets
psycopg 3; ``mysql://`` / ``mariadb://`` get aiomysql in the sidecar's probes
(:func:`mysql_connect_args`) and PyMySQL where a SQLAlchemy engine is made of them: both
pure Python, raising the same ``pymysql.err`` classes. What is printed back never holds a
password (:mod:`stocksentry.instrumentation.secrets` decides what counts as one), and a
string SQLAlchemy cannot parse is not echoed at all (:func:`shown`'s example).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from stocksentry.instrumentation.secrets import mask_url, redact, secret_fragments

if TYPE_CHECKING:
    # SQLAlchemy only where a SQLAlchemy URL is made (parse_url, shown): the sidecar uses
    # dialect_of and mysql_connect_args, and installs no SQLAlchemy.
    from sqlalchemy.engine import URL

#: The schemes of a PostgreSQL URL (a libpq ``key=value`` string is PostgreSQL too).
POSTGRES_URL_SCHEMES: Final = (
    "postgresql",
    "postgres",
    "postgresql+psycopg",
    "postgresql+asyncpg",
)
#: The schemes of a MySQL or MariaDB URL (the probes use aiomysql whichever is named).
MYSQL_URL_SCHEMES: Final = (
    "mysql",
    "mariadb",
    "mysql+pymysql",
    "mysql+aiomysql",
    "mariadb+pymysql",
    "mariadb+aiomysql",
)
#: What is shown for a database string that is not a URL.
UNPARSEABLE = "the given database"

# Query options of a MySQL URL the probes' driver understands, and their types; any other
# is refused by name (a typo must not be ignored silently, e.g. a TLS option).
_MYSQL_OPTIONS: Final[dict[str, type]] = {
    "charset": str,
    "unix_socket": str,
    "ssl_ca": str,
    "ssl_cert": str,
    "ssl_key": str,
    "ssl_verify_cert": bool,
    "ssl_verify_identity": bool,
    "program_name": str,
}
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


def parse_url(text: str) -> URL:
    """The SQLAlchemy URL of ``text``; ``postgresql://`` and ``postgres://`` get psycopg 3.

    Raises :class:`ValueError` (whose message never quotes ``text``) when it is not a URL.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise ValueError("not a database URL like postgresql://user@host:5432/shop") from None
    # A plain mysql:// stays as written: the callers that make an engine of it give it
    # PyMySQL themselves, and the sidecar's probes take mysql_connect_args instead.
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def dialect_of(text: str) -> str | None:
    """``postgresql``, ``mysql``, ``mariadb`` (as written: the probes ask the server) or
    ``sqlite`` from the URL's scheme (a libpq ``key=value`` string is PostgreSQL), else
    ``None``.

    Example::

        >>> dialect_of("mysql+aiomysql://app@db/shop"), dialect_of("host=db dbname=shop")
        ('mysql', 'postgresql')
    """
    if "://" not in text:
        return "postgresql" if "=" in text else None
    scheme = text.split("://", 1)[0].lower()
    if scheme in POSTGRES_URL_SCHEMES:
        return "postgresql"
    if scheme in MYSQL_URL_SCHEMES:
        return scheme.partition("+")[0]
    if scheme.partition("+")[0] == "sqlite":
        return "sqlite"
    return None


def libpq_url(text: str) -> str:
    """A PostgreSQL URL as libpq reads it: a driver-qualified scheme (``postgresql+psycopg``,
    the app's SQLAlchemy URL) becomes ``postgresql``; a ``key=value`` string is unchanged.

    Example::

        >>> libpq_url("postgresql+asyncpg://app@db/shop")
        'postgresql://app@db/shop'
    """
    scheme, sep, rest = text.partition("://")
    if sep and "+" in scheme:
        return f"postgresql://{rest}"
    return text


def mysql_connect_args(text: str) -> dict[str, Any]:
    """The keyword arguments of ``aiomysql.connect`` / ``pymysql.connect`` for a MySQL or
    MariaDB URL, its query options included; :class:`ValueError` names a problem without
    quoting ``text`` or a value."""
    if dialect_of(text) not in ("mysql", "mariadb"):
        raise ValueError("not a MySQL or MariaDB URL (mysql://user@host:3306/shop)")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ValueError("the MySQL URL cannot be parsed (its host or port)") from None
    args: dict[str, Any] = {
        "host": unquote(parts.hostname or "localhost"),
        "port": port or 3306,
        "user": unquote(parts.username or "") or None,
        "password": unquote(parts.password or ""),
        "db": unquote(parts.path.lstrip("/")) or None,
    }
    tls: dict[str, Any] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        kind = _MYSQL_OPTIONS.get(name)
        if kind is None:
            raise ValueError(
                f"the MySQL URL has an unknown option {name[:40]!r}"
                f" (known: {', '.join(_MYSQL_OPTIONS)})"
            )
        parsed: Any = value
        if kind is bool:
            if value.lower() not in (*_TRUE, *_FALSE):
                raise ValueError(f"the MySQL URL option {name} takes true or false")
            parsed = value.lower() in _TRUE
        if name.startswith("ssl_"):
            tls[name.removeprefix("ssl_")] = parsed
        else:
            args[name] = parsed
    if tls:
        args["ssl"] = _tls_context(tls)
    return args


def _tls_context(tls: dict[str, Any]) -> Any:
    """The ``ssl.SSLContext`` aiomysql takes, made of a MySQL URL's ``ssl_*`` options
    (without their prefix); :class:`ValueError` names the option, never a value."""
    import ssl

    for name in ("ca", "cert", "key"):
        if tls.get(name) == "":
            raise ValueError(f"the MySQL URL option ssl_{name} is empty")
    if "key" in tls and "cert" not in tls:
        # load_cert_chain reads the key with the certificate: a key alone would be dropped.
        raise ValueError("the MySQL URL option ssl_key needs ssl_cert, the client certificate")
    if tls.get("verify_identity") and tls.get("verify_cert") is False:
        raise ValueError(
            "the MySQL URL options ssl_verify_identity=true and ssl_verify_cert=false"
            " contradict each other: a host name is checked on a verified certificate"
        )
    try:
        context = ssl.create_default_context(cafile=tls.get("ca"))
    except OSError as exc:  # ssl.SSLError is one
        raise ValueError(f"the MySQL URL option ssl_ca: {_problem(exc)}") from None
    if "cert" in tls:
        try:
            context.load_cert_chain(tls["cert"], tls.get("key"), password=_no_passphrase)
        except OSError as exc:
            which = "ssl_cert and ssl_key" if "key" in tls else "ssl_cert"
            raise ValueError(f"the MySQL URL option {which}: {_problem(exc)}") from None
    if not tls.get("verify_identity", True):
        context.check_hostname = False
    if not tls.get("verify_cert", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _no_passphrase() -> str:
    # Without a password callback OpenSSL asks for the passphrase on the terminal, which
    # would hang a sidecar started by hand.
    raise ValueError(
        "the MySQL URL's ssl_key (or ssl_cert) holds an encrypted private key:"
        " give an unencrypted one, readable only by the exporter"
    )


def _problem(exc: OSError) -> str:
    """What went wrong loading a TLS file, without its path: the OS's words for a file
    that cannot be read, OpenSSL's for one that is no certificate or key."""
    import ssl

    if isinstance(exc, ssl.SSLError):
        return f"not a usable certificate or key ({exc.reason or exc.strerror})"
    return exc.strerror.lower() if exc.strerror else type(exc).__name__


def shown(text: str) -> str:
    """``text`` as it may be printed: password masked, password query options dropped.

    >>> shown("postgresql://u:hunter2@db/shop?sslmode=require&password=hunter2")
    'postgresql+psycopg://u:***@db/shop?sslmode=require'
    """
    try:
        url = parse_url(text)
    except ValueError:
        return UNPARSEABLE
    masked = mask_url(url.render_as_string(hide_password=False))
    return UNPARSEABLE if masked is None else masked


def scrub(message: str, text: str) -> str:
    """``message`` (a driver's error, say) without any secret of the database URL ``text``.

    >>> scrub("auth failed for hunter2", "postgresql://u@db/x?password=hunter2")
    'auth failed for ***'
    """
    return redact(message, secret_fragments(text))


#: The synchronous twin of each driver the exporter's URLs may name: reconcile runs on a
#: plain engine, where an asyncio driver fails at the first statement (MissingGreenlet).
#: A MySQL URL without a driver gets PyMySQL (the one the ``[reconcile]`` extra installs;
#: SQLAlchemy's default, mysqlclient, needs a C build).
_SYNC_DRIVERS: Final = {
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
    "mysql+aiomysql": "mysql+pymysql",
    "mariadb+aiomysql": "mariadb+pymysql",
    "postgresql+asyncpg": "postgresql+psycopg",
    "sqlite+aiosqlite": "sqlite",
}


def sync_url(url: URL) -> URL:
    """``url`` with a synchronous driver; a SQLite file opened read-only, so a wrong path
    fails instead of creating an empty database that holds every invariant."""
    url = url.set(drivername=_SYNC_DRIVERS.get(url.drivername, url.drivername))
    if url.drivername == "sqlite" and url.database not in (None, "", ":memory:"):
        query = {**url.query, "mode": "ro", "uri": "true"}
        url = url.set(database=f"file:{url.database}", query=query)
    return url
