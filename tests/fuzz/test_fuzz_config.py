"""The exporter config loader on hostile YAML: a config or one bounded ConfigError line.

Two kinds of input: text of any shape (YAML-ish fragments, control characters, unicode),
and structured configs built from the model's own key lists with values of every kind,
so that the walk gets past the YAML parser into every section's readers and rules.
"""

from __future__ import annotations

import string
import tempfile
from pathlib import Path
from typing import Any

import yaml
from fuzzing import any_text, assert_one_line, examples, hostile_text
from hypothesis import given
from hypothesis import strategies as st
from stocksentry.exporter.config import ConfigError, ExporterConfig, parse_config
from stocksentry.exporter.config.specs import Section, UrlKeys, key_names, specs

# Where relative file names in a generated config resolve: an empty folder, so a
# generated url_file never reads anything of this machine.
_EMPTY_DIR = Path(tempfile.mkdtemp(prefix="stocksentry-fuzz-config-"))


def _parse(text: str) -> None:
    try:
        config = parse_config(text, "fuzz.yaml", environ={}, base_dir=_EMPTY_DIR)
    except ConfigError as exc:
        assert_one_line(str(exc))
    else:
        assert isinstance(config, ExporterConfig)


_yaml_bits = st.sampled_from(
    [
        "server:",
        "  port: ",
        "sku_guard:",
        "  promo_skus: [",
        "probes:",
        "  defaults: {interval: ",
        "database: {url_env: X}",
        "schema:",
        "- ",
        ": ",
        "? ",
        "!!python/object:os.system ",
        "!!bool ",
        "&a ",
        "*a",
        "<<: *a",
        "---",
        "...",
        "|",
        ">-",
        "%YAML 1.1",
        "'",
        '"',
        "{",
        "}",
        "[",
        "]",
        "\n",
        "\n  ",
        "\t",
        "\x00",
        "\x1b[31m",
        "\ufeff",
        "1e309",
        "0x",
        "0b_",
        "5s",
        "-1",
        "99999999999999999999",
        ".nan",
    ]
)
_yaml_ish = st.lists(st.one_of(_yaml_bits, any_text.map(lambda t: t[:40])), max_size=60).map(
    "".join
)


@examples(1000)
@given(st.one_of(hostile_text, _yaml_ish))
def test_config_text_gives_a_config_or_one_error_line(text: str) -> None:
    _parse(text)


# --- structured configs from the model's key lists -------------------------------------------

_names = st.one_of(
    st.text(string.ascii_letters + string.digits + "_-.", min_size=1, max_size=20),
    # Long unknown keys and ones with line breaks: an error line must cut and escape them.
    st.text("ab\r\n\u2028\t:", min_size=1, max_size=3000),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["5s", "1m30s", "0s", "10y", "1e3", "bogus", "", "all", "promo", "true"]),
    _names,
    any_text.map(lambda t: t[:80]),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(_names, inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def _section(draw: st.DrawFn, cls: type, depth: int = 0) -> dict[str, Any]:
    """A mapping of some of ``cls``'s keys (and sometimes an unknown one)."""
    out: dict[str, Any] = {}
    for name, spec in specs(cls):
        if not draw(st.booleans()):
            continue
        if isinstance(spec, Section) and depth < 4:
            if spec.many:
                out[name] = draw(st.lists(_section(spec.cls, depth + 1), max_size=3))
            else:
                out[name] = draw(_section(spec.cls, depth + 1))
        elif isinstance(spec, UrlKeys):
            # Never a real file or variable of this machine: the folder is empty, environ {}.
            for url_key in key_names(cls):
                if url_key.startswith("url") and draw(st.booleans()):
                    out[url_key] = draw(
                        st.one_of(
                            st.sampled_from(
                                [
                                    "postgresql://u@h/db",
                                    "postgresql://u:pw@h/db",
                                    "redis://h:6379/0",
                                    "missing.txt",
                                    "NOPE",
                                    "host=h dbname=d",
                                ]
                            ),
                            _scalars,
                        )
                    )
        else:
            out[name] = draw(_values)
    if draw(st.integers(0, 9)) == 0:
        out[draw(_names)] = draw(_values)
    return out


def _dump(config: dict[str, Any]) -> str:
    return yaml.safe_dump(config, allow_unicode=True, sort_keys=False)


@examples(400)
@given(_section(ExporterConfig))
def test_structured_config_gives_a_config_or_one_error_line(config: dict[str, Any]) -> None:
    _parse(_dump(config))
