"""Secrets and their redaction: the one place that decides what must never be shown.

Everything in stocksentry that hides a secret comes here: the log redactor (which keys
are secret, card numbers and bearer tokens inside text), the exporter's config (a
:class:`Secret` never prints itself; a literal URL may not carry a password), the probes'
error lines (the fragments of a connection URL blanked out of a driver's message) and the
command line (a database URL shown without its password). Standard library only, so the
light instrumentation core can use it.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import parse_qs, unquote, urlsplit

SECRET_WORDS: Final[frozenset[str]] = frozenset(
    {
        "password",
        "passwd",
        "secret",
        "token",
        "authorization",
        "cookie",
        "api_key",
        "apikey",
        "card_number",
        "cvv",
    }
)
"""Words that make a key secret, compared case-insensitively, also inside a longer key
(``access_token``, ``client_secret``, ``X-Api-Key``): secrets come with prefixes."""

REDACTED: Final = "[REDACTED]"
"""What a log shows instead of the value of a secret key."""


def is_secret_key(key: str) -> bool:
    """Whether the value under ``key`` is secret by its name alone.

    Example::

        >>> is_secret_key("access_token"), is_secret_key("sku")
        (True, False)
    """
    lowered = key.lower().replace("-", "_")
    return any(word in lowered for word in SECRET_WORDS)


class Secret:
    """A secret string that never shows itself in ``repr()``, ``str()`` or f-strings
    (``Secret('***')``); :meth:`reveal` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret value; pass it straight to the client library, never to a log."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(self._value)


# --- connection strings --------------------------------------------------------------------

# A libpq key=value connection string's password, quoted or not.
_CONNINFO_PASSWORD: Final = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_CONNINFO_HAS_PASSWORD: Final = re.compile(r"(?:^|\s)password\s*=", re.IGNORECASE)


def url_has_password(url: str) -> bool:
    """Whether the connection string ``url`` (a URL or a libpq ``key=value`` list) holds a
    password; an unparseable URL counts as holding one, since it cannot be checked.

    Example::

        >>> url_has_password("redis://cache:6379/0"), url_has_password("host=db password=x")
        (False, True)
    """
    if "://" not in url:
        return bool(_CONNINFO_HAS_PASSWORD.search(url))
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return True
    return bool(password) or any("pass" in key.lower() for key in parse_qs(parts.query))


def secret_fragments(url: str) -> tuple[str, ...]:
    """The strings to blank out of messages for the connection string ``url``: the whole
    string, and its password as written and decoded (what a server or driver echoes)."""
    fragments: list[str] = [url]
    password: str | None = None
    if "://" in url:
        try:
            parts = urlsplit(url)
            password = parts.password
            query = parts.query
        except ValueError:
            password, query = None, ""
        for part in query.split("&"):
            key, _, value = part.partition("=")
            if "pass" in key.lower() and value:
                fragments.extend((value, unquote(value)))
    else:
        match = _CONNINFO_PASSWORD.search(url)
        if match:
            password = match.group(1).strip("'")
    if password:
        fragments.extend((password, unquote(password)))
    return tuple(dict.fromkeys(f for f in fragments if f))


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret fragment replaced by ``***``, on one line.

    Example::

        >>> redact("auth failed for s3cret", ["s3cret"])
        'auth failed for ***'
    """
    # Longest first, so a URL is blanked whole before its password is looked for.
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return " ".join(text.split())


def mask_url(url: str) -> str | None:
    """``url`` as it may be printed: password as ``***``, password query options dropped;
    ``None`` for a string that is not a URL (a libpq list, say), which is never echoed
    since no mask can be sure to find the password in it.

    Example::

        >>> mask_url("postgresql://shop:secret@db/shop?sslmode=require")
        'postgresql://shop:***@db/shop?sslmode=require'
        >>> mask_url("sqlite:///:memory:")
        'sqlite:///:memory:'
    """
    if "://" not in url:
        return None
    try:
        parts = urlsplit(url)
        password = parts.password
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    netloc = parts.netloc
    if password is not None or "@" in netloc:
        user = parts.username or ""
        shown_host = host or ""
        if shown_host and ":" in shown_host:
            shown_host = f"[{shown_host}]"
        credentials = f"{user}:***" if password is not None else user
        netloc = f"{credentials}@{shown_host}" + (f":{port}" if port is not None else "")
    query = "&".join(
        part for part in parts.query.split("&") if part and "pass" not in part.lower()
    )
    # Put together by hand: urlunsplit() drops the "//" of an empty authority for schemes
    # it does not know, turning sqlite:///shop.db into sqlite:/shop.db.
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    if query:
        shown += f"?{query}"
    return shown + (f"#{parts.fragment}" if parts.fragment else "")


# --- secrets inside free text --------------------------------------------------------------

# One pass over a string finds both kinds of secret text:
# - a bearer credential, scheme kept, token dropped;
# - a card-number-like run: 13-19 digits, optionally separated by single spaces or dashes,
#   not glued to other letters/digits. It must start with 2-6 (the issuer ranges of the
#   card networks), which keeps 13-digit Unix-millisecond timestamps (starting with 1)
#   from being masked 1 time in 10 by the Luhn check alone.
SENSITIVE_TEXT: Final = re.compile(
    r"(?P<scheme>\bBearer)\s+[A-Za-z0-9\-._~+/]+=*"
    r"|(?<![0-9A-Za-z])(?P<card>[2-6](?:[ -]?[0-9]){12,18})(?![0-9A-Za-z])",
    re.IGNORECASE,
)
_SEPARATORS: Final = re.compile(r"[ -]")
#: Shorter strings cannot match: "Bearer x" has 8 characters, a card 13 digits.
MIN_SENSITIVE_LEN: Final = 8
_CARD_MIN_LEN: Final = 13


def _luhn_ok(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index & 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def mask_match(match: re.Match[str]) -> str:
    """The replacement for one :data:`SENSITIVE_TEXT` match (for ``re.sub``)."""
    scheme = match.group("scheme")
    if scheme is not None:
        return f"{scheme} {REDACTED}"
    text = match.group("card")
    digits = _SEPARATORS.sub("", text)
    if _luhn_ok(digits):
        return "****" + digits[-4:]
    # The run may be a card followed by more digit groups ("4111 1111 1111 1111 12"): try
    # the longest prefix that ends at a separator and still looks like a card number.
    for sep in reversed(list(_SEPARATORS.finditer(text))):
        head = _SEPARATORS.sub("", text[: sep.start()])
        if len(head) < 13:
            break
        if _luhn_ok(head):
            return "****" + head[-4:] + text[sep.start() :]
    return text


def scrub_text(text: str) -> str:
    """``text`` with Luhn-valid card numbers cut to their last four digits and the token of
    a ``Bearer`` credential replaced.

    Example::

        >>> scrub_text("Authorization: Bearer abc.def card 4111-1111-1111-1111")
        'Authorization: Bearer [REDACTED] card ****1111'
    """
    if len(text) < MIN_SENSITIVE_LEN:
        return text
    # Shorter than a card number: only a bearer credential can be there (most log values
    # are short, and this test is cheaper than the pattern's scan).
    if len(text) < _CARD_MIN_LEN and "bearer" not in text.lower():
        return text
    match = SENSITIVE_TEXT.search(text)
    if match is None:
        return text
    parts: list[str] = []
    done = 0
    while match is not None:
        replacement = mask_match(match)
        if match.group("card") is not None and replacement == match.group(0):
            # No card in this run: it may begin with a shorter group before the card
            # ("2024-01-05 4111 1111 1111 1111", "qty 2 4111..."), which re.sub would skip
            # with the run. Look again from the run's next group.
            sep = _SEPARATORS.search(text, match.start(), match.end())
            if sep is not None:
                match = SENSITIVE_TEXT.search(text, sep.end())
                continue
        parts += (text[done : match.start()], replacement)
        done = match.end()
        match = SENSITIVE_TEXT.search(text, done)
    parts.append(text[done:])
    return "".join(parts)
