"""The web config loader on hostile YAML: a WebConfig or one bounded WebConfigError line."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from fuzzing import any_text, assert_one_line, examples, hostile_text
from hypothesis import given
from hypothesis import strategies as st
from stocksentry.exporter.webconfig import WebConfig, WebConfigError, parse_web_config

_EMPTY_DIR = Path(tempfile.mkdtemp(prefix="stocksentry-fuzz-web-"))

_KEYS = {
    "tls_server_config": [
        "cert_file",
        "key_file",
        "client_auth_type",
        "client_ca_file",
        "min_version",
        "max_version",
        "cipher_suites",
        "curve_preferences",
        "prefer_server_cipher_suites",
        "client_allowed_sans",
    ],
    "http_server_config": ["http2", "headers"],
    "basic_auth_users": ["alice", "bob", "", "a:b"],
}
_HEADERS = [
    "Strict-Transport-Security",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
]
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.sampled_from(
        [
            "TLS12",
            "TLS13",
            "TLS10",
            "RequireAndVerifyClientCert",
            "NoClientCert",
            "deny",
            "nosniff",
            "$2b$10$" + "a" * 53,
            "$2y$04$" + "./" * 26 + "z",
            "cert.pem",
            "",
        ]
    ),
    any_text.map(lambda t: t[:80]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(_HEADERS), inner, max_size=3)
    ),
    max_leaves=8,
)
# Unknown keys: short ones, and long ones with line breaks and control characters, which
# an error line must cut and escape.
_short_names = st.one_of(
    st.text("abcdefghijklmnopqrstuvwxyz_-:.0123456789", max_size=30),
    st.text("ab\r\n\u2028\x00\t:", min_size=1, max_size=3000),
)


@st.composite
def _web_config(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for section, keys in _KEYS.items():
        if not draw(st.booleans()):
            continue
        body: dict[str, Any] = {}
        for key in draw(st.lists(st.sampled_from(keys), max_size=len(keys), unique=True)):
            if key == "headers":
                body[key] = draw(st.dictionaries(st.sampled_from(_HEADERS), _scalars, max_size=3))
            else:
                body[key] = draw(_values)
        if draw(st.integers(0, 4)) == 0:
            body[draw(_short_names)] = draw(_values)
        out[section] = draw(st.one_of(st.just(body), _values)) if draw(st.booleans()) else body
    if draw(st.integers(0, 6)) == 0:
        out[draw(_short_names)] = draw(_values)
    return out


def _parse(text: str) -> None:
    try:
        config = parse_web_config(text, source="web.yml", base_dir=_EMPTY_DIR)
    except WebConfigError as exc:
        assert_one_line(str(exc))
    else:
        assert isinstance(config, WebConfig)


@examples(1000)
@given(hostile_text)
def test_web_config_text_gives_a_config_or_one_error_line(text: str) -> None:
    _parse(text)


@examples(300)
@given(_web_config())
def test_structured_web_config_gives_a_config_or_one_error_line(config: dict[str, Any]) -> None:
    _parse(yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
