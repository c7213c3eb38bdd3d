"""Hostile config input: nothing the exporter config or the web config holds or names can
crash ``check-config``, hang it or grow it.

Classes (issue 19): unbounded reads (a config path, a ``url_file``, a web config or a TLS
file that is a FIFO, a device or too big), quadratic loading in ``promo_skus``, and
error lines that echo a huge or control-character key whole.

Time and memory bounds are asserted with resource limits in a child process (RLIMIT_CPU,
RLIMIT_AS), never with wall-clock comparisons; the ``timeout=`` of a child is only a
safety net, so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stocksentry.exporter.config import ConfigError, load_config, parse_config
from stocksentry.exporter.inputs import CONFIG_LIMIT, URL_FILE_LIMIT, WEB_CONFIG_LIMIT
from stocksentry.exporter.webconfig import WebConfigError, load_web_config, parse_web_config

#: A safety net only: the commands below answer at once; a hang would fail, not block.
SAFETY_TIMEOUT = 120


def check_config(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stocksentry.exporter", "check-config", str(path)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT,
        check=False,
    )


def assert_one_error_line(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("stocksentry check-config: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    for part in parts:
        assert part in result.stderr


# --- unbounded reads ------------------------------------------------------------------------


def test_a_url_file_that_is_a_fifo_without_writer_does_not_hang_check_config(
    tmp_path: Path,
) -> None:
    os.mkfifo(tmp_path / "db-url")
    config = tmp_path / "c.yaml"
    config.write_text("database:\n  url_file: db-url\n")
    result = check_config(config, tmp_path)
    assert_one_error_line(
        result, "c.yaml:2: database.url_file: cannot read", "it is a FIFO (named pipe)"
    )


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("/dev/zero", "it is a character device, not a regular file"),
        ("/dev/urandom", "it is a character device, not a regular file"),
        ("/", "it is a directory, not a regular file"),
    ],
)
def test_a_url_file_that_is_a_device_or_directory_is_refused(
    tmp_path: Path, target: str, problem: str
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"database:\n  url_file: {target}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value) == f"{config}:2: database.url_file: cannot read {target}: {problem}"


def test_a_url_file_over_64_kib_is_refused(tmp_path: Path) -> None:
    (tmp_path / "db-url").write_text("postgresql://db/shop?x=" + "a" * URL_FILE_LIMIT)
    config = tmp_path / "c.yaml"
    config.write_text("database:\n  url_file: db-url\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert "is larger than the limit of 64 KiB" in str(caught.value)
    # Never the URL: it may be a secret.
    assert "postgresql" not in str(caught.value)


def not_a_small_file(path: Path, kind: str, limit: int, limit_text: str) -> tuple[Path, str]:
    """``path`` made a file of ``kind`` (``too-big``: a regular file over ``limit`` bytes):
    the path to read, and the problem the reader must name."""
    if kind == "fifo":
        os.mkfifo(path)
        return path, "it is a FIFO (named pipe), not a regular file"
    if kind == "device":
        return Path("/dev/zero"), "it is a character device, not a regular file"
    if kind == "directory":
        path.mkdir()
        return path, "it is a directory, not a regular file"
    path.write_bytes(b"# padding\n" * (limit // 10 + 1))
    return path, f"it is larger than the limit of {limit_text}"


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "too-big"])
def test_a_config_path_that_is_not_a_small_regular_file_exits_2(tmp_path: Path, kind: str) -> None:
    path, problem = not_a_small_file(tmp_path / "c.yaml", kind, CONFIG_LIMIT, "4 MiB")
    result = check_config(path, tmp_path)
    assert_one_error_line(result, f"{path}: cannot read the file: {problem}")


@pytest.mark.parametrize("kind", ["fifo", "device", "too-big"])
def test_a_web_config_that_is_not_a_small_regular_file_is_one_error(
    tmp_path: Path, kind: str
) -> None:
    path, problem = not_a_small_file(tmp_path / "web.yml", kind, WEB_CONFIG_LIMIT, "1 MiB")
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    assert str(caught.value).startswith(f"{path}: (file): cannot read: {problem}")


def test_a_web_config_named_by_check_config_as_a_fifo_exits_2(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "web.yml")
    config = tmp_path / "c.yaml"
    config.write_text("server:\n  web_config_file: web.yml\n")
    result = check_config(config, tmp_path)
    assert_one_error_line(result, "web_config_file")


@pytest.mark.parametrize("name", ["cert_file", "key_file"])
def test_a_tls_file_that_is_a_fifo_is_refused_before_openssl_reads_it(
    tmp_path: Path, name: str
) -> None:
    for file in ("server.crt", "server.key"):
        (tmp_path / file).write_text("not a certificate\n")
    fifo = tmp_path / ("server.crt" if name == "cert_file" else "server.key")
    fifo.unlink()
    os.mkfifo(fifo)
    path = tmp_path / "web.yml"
    path.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n")
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    assert caught.value.key == f"tls_server_config.{name}"
    assert caught.value.line == (2 if name == "cert_file" else 3)
    assert "it is a FIFO (named pipe), not a regular file" in str(caught.value)


def test_a_client_ca_that_is_a_device_is_refused(tmp_path: Path) -> None:
    for file in ("server.crt", "server.key"):
        (tmp_path / file).write_text("x\n")
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: /dev/zero\n"
    )
    with pytest.raises(WebConfigError) as caught:
        load_web_config(path)
    assert caught.value.key == "tls_server_config.client_ca_file"
    assert "it is a character device" in str(caught.value)


# --- loading time is linear in promo_skus -----------------------------------------------------


def _limits(cpu_seconds: int, memory: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return apply


def _load_in_child(path: Path, cpu_seconds: int, memory: int) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        "from stocksentry.exporter.config import load_config\n"
        "config = load_config(sys.argv[1])\n"
        "print(len(config.sku_guard.promo_skus))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(path)],
        preexec_fn=_limits(cpu_seconds, memory),
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT * 3,
        check=False,
    )


def _promo_config(path: Path, count: int) -> None:
    with path.open("w") as out:
        out.write("sku_guard:\n  promo_skus:\n")
        out.writelines(f"    - SKU-{i:08d}\n" for i in range(count))


def test_100k_promo_skus_load_within_a_cpu_and_memory_limit(tmp_path: Path) -> None:
    # Loading was quadratic (a duplicate check against a list): 100k SKUs took over 35 s
    # of CPU. Linear, they take about 3 s; 20 s of CPU and 1 GiB of address space are
    # far above that and far below the quadratic cost.
    path = tmp_path / "c.yaml"
    _promo_config(path, 100_000)
    result = _load_in_child(path, cpu_seconds=20, memory=1024 * 1024 * 1024)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "100000\n"


def test_a_config_of_the_maximum_size_loads_in_bounded_time(tmp_path: Path) -> None:
    # The largest config the 4 MiB limit lets through: about 220k promo SKUs.
    path = tmp_path / "c.yaml"
    count = (CONFIG_LIMIT - 40) // len("    - SKU-00000000\n")
    _promo_config(path, count)
    assert path.stat().st_size <= CONFIG_LIMIT
    result = _load_in_child(path, cpu_seconds=40, memory=1024 * 1024 * 1024)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == f"{count}\n"


def test_a_duplicate_promo_sku_is_still_found_at_its_line() -> None:
    skus = "".join(f"    - SKU-{i}\n" for i in range(1000)) + "    - SKU-7\n"
    with pytest.raises(ConfigError) as caught:
        parse_config("sku_guard:\n  promo_skus:\n" + skus, "c.yaml")
    assert str(caught.value) == (
        'c.yaml:1003: sku_guard.promo_skus[1000]: duplicate value "SKU-7"'
    )


# --- error lines: keys and values cut and escaped --------------------------------------------


def _parse_config(text: str) -> object:
    return parse_config(text, "c.yaml")


def _parse_web_config(text: str) -> object:
    return parse_web_config(text, source="web.yml")


@pytest.mark.parametrize(
    ("parse", "text", "prefix", "fragment"),
    [
        (
            _parse_config,
            "sku_guard:\n  ? {key}\n  : 1\n",
            "c.yaml:2: sku_guard.",
            "…: unknown key (expected one of: ",
        ),
        (_parse_web_config, "? {key}\n: 1\n", "web.yml:1: ", "unknown key"),
    ],
    ids=["config", "web-config"],
)
def test_a_100k_character_unknown_key_is_cut_in_the_error(
    parse: Callable[[str], object], text: str, prefix: str, fragment: str
) -> None:
    with pytest.raises((ConfigError, WebConfigError)) as caught:
        parse(text.replace("{key}", "k" * 100_000))
    message = str(caught.value)
    assert len(message) < 400
    assert message.startswith(prefix + "k" * 100)
    assert fragment in message


def test_a_huge_value_is_cut_in_the_error() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f'server:\n  port: "{"9" * 100_000}"\n', "c.yaml")
    message = str(caught.value)
    assert len(message) < 400
    assert message.endswith('got "' + "9" * 80 + '"…')


def test_control_characters_in_an_echoed_key_are_escaped() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config('server:\n  "evil\\e[2J\\0\\x85\\u2028": 1\n', "c.yaml")
    message = str(caught.value)
    assert message.isprintable()
    assert message.startswith("c.yaml:2: server.evil\\x1b[2J\\x00\\x85\\u2028: unknown key")


def test_control_characters_in_an_echoed_value_are_escaped() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config('server:\n  port: "1\\e]0;pwned\\a"\n', "c.yaml")
    message = str(caught.value)
    assert message.isprintable()
    assert "\x1b" not in message


def test_a_huge_web_config_value_is_cut_and_escaped() -> None:
    text = (
        "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n"
        f'  min_version: "\\e[2J{"x" * 100_000}"\n'
    )
    with pytest.raises(WebConfigError) as caught:
        parse_web_config(text, source="web.yml")
    message = str(caught.value)
    assert len(message) < 400
    assert message.isprintable()
    assert message.endswith("…")


def test_a_control_character_in_a_web_config_user_name_is_escaped() -> None:
    with pytest.raises(WebConfigError) as caught:
        parse_web_config('basic_auth_users:\n  "a:\\e[2J": x\n', source="web.yml")
    assert str(caught.value).isprintable()


_KEYS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=3000)


@pytest.mark.parametrize(
    ("parse", "text"),
    [(_parse_config, 'server:\n  ? "{key}"\n  : 1\n'), (_parse_web_config, '? "{key}"\n: 1\n')],
    ids=["config", "web-config"],
)
@settings(max_examples=60, deadline=None)
@given(_KEYS)
def test_any_unknown_key_gives_one_short_printable_error_line(
    parse: Callable[[str], object], text: str, key: str
) -> None:
    quoted = key.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c.isprintable() else f"\\U{ord(c):08x}" for c in quoted)
    try:
        parse(text.replace("{key}", escaped))
    except (ConfigError, WebConfigError) as exc:
        message = str(exc)
    else:
        return  # a key of the section, spelled by chance
    assert len(message) <= 1000
    assert message.isprintable()
