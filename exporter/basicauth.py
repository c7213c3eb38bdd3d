"""Basic auth for ``/metrics``: the ``Authorization: Basic`` header checked against bcrypt.

The users and their bcrypt hashes come from ``basic_auth_users`` of the web config. The
user name must be UTF-8; the password is compared as the bytes the client sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import threading
from collections.abc import Mapping
from typing import Final

#: The realm sent in ``WWW-Authenticate`` when credentials are missing or wrong.
AUTH_REALM: Final = "stocksentry"


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, with a verified cache.

    bcrypt is slow on purpose and Prometheus sends the same credentials every few seconds,
    so a success is remembered as an HMAC of user and password under a key drawn at start
    (never the password), compared in constant time; failures are not cached. Unknown
    users are checked against a dummy hash of the same cost, so timing does not reveal
    which names exist. bcrypt runs in a thread, off the event loop.

    Example::

        auth = BasicAuth({"prometheus": b"$2b$10$..."})
        ok = await auth.check(request.headers.get("Authorization"))
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
        if self._users:
            import bcrypt

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

    def _cached(self, user: str, digest: bytes) -> bool:
        with self._lock:
            cached = self._verified.get(user)
        return cached is not None and hmac.compare_digest(cached, digest)

    def _verify(self, user: str, password: bytes, digest: bytes) -> bool:
        """bcrypt for a cache miss (blocking); a success is cached under ``digest``."""
        if self._cached(user, digest):
            return True  # verified by a concurrent check meanwhile
        import bcrypt  # loaded by __init__ already, since there are users

        hashed = self._users.get(user)
        with self._lock:
            self._bcrypt_checks += 1
        try:
            # bcrypt reads at most 72 bytes of a password. exporter-toolkit (Go's bcrypt)
            # and bcrypt 4 ignore the rest, bcrypt 5 raises: the first 72 are compared,
            # so a web config means the same here as for other exporters, whichever
            # bcrypt is installed.
            ok = bcrypt.checkpw(password[:72], hashed if hashed is not None else self._dummy)
        except ValueError:
            ok = False  # a hash bcrypt cannot read matches nothing
        if not ok or hashed is None:
            return False
        with self._lock:
            self._verified[user] = digest
        return True

    async def check(self, header: str | None) -> bool:
        """Check an ``Authorization`` header value; True when auth is off or it matches."""
        if not self._users:
            return True
        credentials = parse_basic(header)
        if credentials is None:
            return False
        user, password = credentials
        message = user.encode("utf-8") + b"\0" + password
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        if self._cached(user, digest):
            return True  # the common case, answered without leaving the event loop
        return await asyncio.to_thread(self._verify, user, password, digest)


def parse_basic(header: str | None) -> tuple[str, bytes] | None:
    """``Basic dXNlcjpwYXNz`` -> ("user", b"pass"); None when absent or malformed.

    Decoded as latin-1, which gives back every byte the client sent.

    Example::

        >>> parse_basic("Basic dXNlcjpwYXNz")
        ('user', b'pass')
        >>> parse_basic("Bearer abc") is None
        True
    """
    if not header:
        return None
    try:
        # Imported here: loading a web config (check-config) must not pull in aiohttp.
        from aiohttp import BasicAuth as _Header

        auth = _Header.decode(header.strip(), encoding="latin-1")
        user = auth.login.encode("latin-1").decode("utf-8")
    except ValueError:
        # Not Basic, not base64, no colon, or a user name that is not UTF-8
        # (UnicodeError is a ValueError).
        return None
    return user, auth.password.encode("latin-1")
