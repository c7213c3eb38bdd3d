"""The Authorization header of /metrics: aiohttp decodes it, the refusals stay ours."""

from __future__ import annotations

import base64

import bcrypt
import pytest
from stocksentry.exporter.basicauth import AUTH_REALM, BasicAuth, parse_basic


def header(raw: bytes, scheme: str = "Basic") -> str:
    return f"{scheme} {base64.b64encode(raw).decode()}"


def test_the_user_is_utf8_and_the_password_the_bytes_sent():
    assert parse_basic(header(b"prometheus:s3cret!")) == ("prometheus", b"s3cret!")
    assert parse_basic(header("jos\u00e9:p\u00e4ss".encode())) == (
        "jos\u00e9",
        "p\u00e4ss".encode(),
    )
    # A latin-1 client: the password bytes are compared as sent, not re-encoded.
    assert parse_basic(header(b"alice:p\xe4ss")) == ("alice", b"p\xe4ss")
    # The password may hold colons and be empty; only the first colon splits.
    assert parse_basic(header(b"alice:a:b")) == ("alice", b"a:b")
    assert parse_basic(header(b"alice:")) == ("alice", b"")
    assert parse_basic("basic " + base64.b64encode(b"a:b").decode()) == ("a", b"b")
    assert parse_basic("  " + header(b"a:b") + "  ") == ("a", b"b")


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "Basic",
        "Basic ",
        "Basic !!!not-base64",
        "Basic dXNlcg",  # bad padding
        header(b"no-colon"),
        header(b"caf\xe9:pw"),  # a user name that is not UTF-8
        header(b"a:b", scheme="Bearer"),
        "Basic d\u00e9XNlcjpw",  # not ASCII
    ],
)
def test_malformed_headers_are_refused(value):
    assert parse_basic(value) is None


async def test_check_runs_bcrypt_once_per_good_password():
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    auth = BasicAuth({"prometheus": hashed})
    assert auth.enabled
    assert auth.challenge == f'Basic realm="{AUTH_REALM}"'
    assert not await auth.check(None)
    assert not await auth.check(header(b"prometheus:wrong"))
    assert not await auth.check(header(b"mallory:pw"))
    before = auth.bcrypt_checks
    assert await auth.check(header(b"prometheus:pw"))
    assert await auth.check(header(b"prometheus:pw"))
    assert auth.bcrypt_checks == before + 1


async def test_no_users_means_no_authentication():
    auth = BasicAuth({})
    assert not auth.enabled
    assert await auth.check(None)


def test_loading_a_web_config_does_not_import_aiohttp() -> None:
    """check-config reads the web config: it stays free of the server's dependencies."""
    import subprocess
    import sys

    code = "import sys, stocksentry.exporter.webconfig; print('aiohttp' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


async def test_a_password_over_72_bytes_is_compared_on_its_first_72() -> None:
    """bcrypt hashes at most 72 bytes. As exporter-toolkit's Go bcrypt (and bcrypt 4)
    do, the bytes past the 72nd are ignored, whichever bcrypt is installed (bcrypt 5's
    checkpw would raise on them): a web config means the same here as for any exporter.
    Nothing raises, and failures are not cached."""
    exact = bytes(range(0x41, 0x41 + 26)) * 2 + b"0123456789abcdefghij"
    assert len(exact) == 72
    auth = BasicAuth({"prometheus": bcrypt.hashpw(exact, bcrypt.gensalt(rounds=4))})
    assert await auth.check(header(b"prometheus:" + exact))
    assert await auth.check(header(b"prometheus:" + exact + b"!"))
    before = auth.bcrypt_checks
    wrong = b"x" + exact[1:] + b"!"
    assert not await auth.check(header(b"prometheus:" + wrong))
    assert not await auth.check(header(b"prometheus:" + wrong))
    assert not await auth.check(header(b"mallory:" + exact + b"!"))  # the dummy hash
    assert auth.bcrypt_checks == before + 3


async def test_a_short_password_is_not_let_in_by_a_long_one() -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))
    auth = BasicAuth({"prometheus": hashed})
    long_password = b"pw" + b"x" * 71
    assert not await auth.check(header(b"prometheus:" + long_password))
    assert await auth.check(header(b"prometheus:pw"))
    # The success is what is cached; the long password still is not let in by it.
    assert not await auth.check(header(b"prometheus:" + long_password))
