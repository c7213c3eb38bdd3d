"""Database URLs given on the command line: parsed once, shown without their password.

The lab and ``stocksentry reconcile`` both take ``--database URL``. A plain
``postgresql://`` URL gets the psycopg 3 driver, and what is printed back never holds a
password: what counts as one, and how it is masked, is decided by
:mod:`stocksentry.instrumentation.secrets`; a string SQLAlchemy cannot parse (a libpq
``key=value`` list, say) is not echoed at all, since no mask can be sure to find the
password in it.

Example::

    url = parse_url("postgresql://shop:secret@db/shop")   # postgresql+psycopg://...
    shown("postgresql://shop:secret@db/shop")              # 'postgresql+psycopg://shop:***@db/shop'
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from stocksentry.instrumentation.secrets import mask_url, redact, secret_fragments

__all__ = ["UNPARSEABLE", "parse_url", "password", "scrub", "shown"]

#: What is shown for a database string that is not a URL.
UNPARSEABLE = "the given database"


def parse_url(text: str) -> URL:
    """The SQLAlchemy URL of ``text``; ``postgresql://`` and ``postgres://`` get psycopg 3.

    Raises :class:`ValueError` (whose message never quotes ``text``) when it is not a URL.
    """
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise ValueError("not a database URL like postgresql://user@host:5432/shop") from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def shown(text: str) -> str:
    """``text`` as it may be printed: password masked, password query options dropped.

    Example::

        >>> shown("postgresql://u:hunter2@db/shop?sslmode=require&password=hunter2")
        'postgresql+psycopg://u:***@db/shop?sslmode=require'
    """
    try:
        url = parse_url(text)
    except ValueError:
        return UNPARSEABLE
    masked = mask_url(url.render_as_string(hide_password=False))
    return UNPARSEABLE if masked is None else masked


def password(text: str) -> str | None:
    """The password in ``text``'s user part; ``None`` when there is none (see :func:`scrub`
    to blank every secret of a URL out of a message)."""
    try:
        return parse_url(text).password or None
    except ValueError:
        return None


def scrub(message: str, text: str) -> str:
    """``message`` (a driver's error, say) without any secret of the database URL ``text``.

    Example::

        >>> scrub("auth failed for hunter2", "postgresql://u@db/x?password=hunter2")
        'auth failed for ***'
    """
    return redact(message, secret_fragments(text))
