"""Database URLs given on the command line: parsed once, shown without their password.

The lab and ``stocksentry reconcile`` both take ``--database URL``. A plain
``postgresql://`` URL gets the psycopg 3 driver, and what is printed back never holds a
password: a string SQLAlchemy cannot parse (a libpq ``key=value`` list, say) is not echoed
at all, since no mask can be sure to find the password in it.

Example::

    url = parse_url("postgresql://shop:secret@db/shop")   # postgresql+psycopg://...
    shown("postgresql://shop:secret@db/shop")              # 'postgresql+psycopg://shop:***@db/shop'
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

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
    """``text`` as it may be printed: password masked, password query options dropped."""
    try:
        url = parse_url(text)
    except ValueError:
        return UNPARSEABLE
    if any("pass" in key.lower() for key in url.query):
        url = url.set(query={})
    return url.render_as_string(hide_password=True)


def password(text: str) -> str | None:
    """The password in ``text``, to scrub from driver messages; ``None`` when there is none."""
    try:
        return parse_url(text).password or None
    except ValueError:
        return None
