"""Edges of the exporter's core no other test reached: config values at their bounds, YAML
keys that only a rule relating two sections refuses, a package missing from the install,
the command line's one-line errors, durations and input files at their limits.

Every config error here is checked the way a user meets it: one line naming file, line
and key (and exit 2 through ``stocksentry check-config``).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from stocksentry.exporter import cli
from stocksentry.exporter.commandline import installed
from stocksentry.exporter.config import ConfigError, ExporterConfig, parse_config
from stocksentry.exporter.durations import parse_duration
from stocksentry.exporter.inputs import CONFIG_LIMIT, InputFileError, read_bytes_bounded
from stocksentry.exporter.server import buildinfo

# A database URL without a password (a literal url may carry none).
DB = "database:\n  url: postgresql://shop@db.internal:5432/shop\n"
REDIS = "redis:\n  url: redis://cache.internal:6379/0\n"
LOCK_WATCH = "lock_watch:\n  url: redis://cache.internal:6379/0\n"


def parse(text: str) -> ExporterConfig:
    return parse_config(textwrap.dedent(text), "config.yaml", environ={})


def refused(text: str, line: int, path: str) -> ConfigError:
    """The error refusing ``text``, which names the line and the key (``path``) given."""
    with pytest.raises(ConfigError) as caught:
        parse(text)
    error = caught.value
    assert (error.line, error.path) == (line, path)
    return error


# --- values at their bounds ----------------------------------------------------------------


def test_a_ratio_of_exactly_one_is_taken_and_zero_is_refused() -> None:
    config = parse(LOCK_WATCH + "  foreign_release_ratio: 1\n")
    assert config.lock_watch is not None
    assert config.lock_watch.foreign_release_ratio == 1.0
    assert isinstance(config.lock_watch.foreign_release_ratio, float)
    error = refused(
        LOCK_WATCH + "  foreign_release_ratio: 0\n", 3, "lock_watch.foreign_release_ratio"
    )
    assert "greater than 0 and at most 1, got" in error.message


def test_a_multiprocess_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "metrics.db"
    a_file.write_text("")
    error = refused(f"server:\n  multiprocess_dir: {a_file}\n", 2, "server.multiprocess_dir")
    assert str(error) == f"config.yaml:2: server.multiprocess_dir: {a_file} is not a directory"


@pytest.mark.parametrize("template", ["stock:{sku", "stock:{sku}}{"])
def test_a_key_template_with_an_unbalanced_brace_is_refused(template: str) -> None:
    # string.Formatter refuses the text outright (ValueError): one line, not a traceback.
    error = refused(DB + REDIS + f"  key_template: '{template}'\n", 5, "redis.key_template")
    assert 'must contain "{sku}" exactly once' in error.message


@pytest.mark.parametrize("sql", ["''", "' ; '", "';;'"])
def test_a_custom_probe_with_no_sql_is_refused(sql: str) -> None:
    text = (
        DB
        + "probes:\n  custom:\n    - name: mine\n      metric: shop_mine\n"
        + f"      sql: {sql}\n"
    )
    error = refused(text, 7, "probes.custom[0].sql")
    assert error.message == "must not be empty"


# --- rules relating two sections -----------------------------------------------------------


def test_two_custom_probes_exporting_one_metric_are_refused() -> None:
    error = refused(
        DB
        + "probes:\n  custom:\n"
        + "    - {name: one, metric: shop_stock, sql: SELECT 1 AS value}\n"
        + "    - {name: two, metric: shop_stock, sql: SELECT 2 AS value}\n",
        6,
        "probes.custom[1].metric",
    )
    assert 'another custom probe exports "shop_stock"' in error.message


def test_custom_probes_without_a_database_are_refused() -> None:
    error = refused(
        "probes:\n  custom:\n    - {name: one, metric: shop_x, sql: SELECT 1}\n",
        3,
        "probes.custom",
    )
    assert error.message == "custom probes need a database section"


def test_oversold_on_promo_scope_without_promo_skus_is_refused() -> None:
    text = DB + "schema:\n  products: {allocation: initial_stock}\n"
    error = refused(text + "probes:\n  oversold:\n    scope: promo\n", 7, "probes.oversold.scope")
    assert error.message == "promo needs sku_guard.promo_skus"
    # Without an allocation the probe is off anyway: nothing to refuse.
    parsed = parse(DB + "probes:\n  oversold:\n    scope: promo\n")
    assert not parsed.probes.oversold.enabled


def test_cache_drift_without_promo_skus_is_off_and_says_why() -> None:
    config = parse(DB + REDIS)
    assert not config.probes.cache_drift.enabled
    assert "probe cache_drift is off: sku_guard.promo_skus is empty" in " ".join(config.notes)
    # Asked for explicitly, it is an error at the key that asked.
    error = refused(
        DB + REDIS + "probes:\n  cache_drift:\n    enabled: true\n",
        7,
        "probes.cache_drift.enabled",
    )
    assert "cannot be true: sku_guard.promo_skus is empty" in error.message


def test_a_url_that_is_not_a_string_is_refused_without_echoing_it() -> None:
    # The URL key may hold a secret: even a value of the wrong type is not shown.
    error = refused("database:\n  url: 8675309\n", 2, "database.url")
    assert error.message == "expected a string, got a value (not shown)"
    assert "8675309" not in str(error)


# --- an install without the redis package --------------------------------------------------


@pytest.fixture
def without_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The redis package as an install without the [exporter] extra sees it: absent."""
    for name in [m for m in sys.modules if m == "redis" or m.startswith("redis.")]:
        monkeypatch.delitem(sys.modules, name)
    # None in sys.modules: find_spec answers None and an import fails, as when not installed.
    monkeypatch.setitem(sys.modules, "redis", None)


@pytest.mark.usefixtures("without_redis")
def test_without_the_redis_package_cache_drift_is_off_and_says_why() -> None:
    assert not installed("redis")
    config = parse(DB + REDIS + "sku_guard:\n  promo_skus: [EGG-01]\n")
    assert not config.probes.cache_drift.enabled
    assert any(
        "probe cache_drift is off: the redis package is not installed" in note
        for note in config.notes
    )


@pytest.mark.usefixtures("without_redis")
def test_without_the_redis_package_lock_watch_is_one_error() -> None:
    # The line of the section's value (where its keys start), as for every section rule.
    error = refused(LOCK_WATCH, 2, "lock_watch")
    assert "needs the redis package" in error.message


def test_installed_is_false_for_a_package_under_a_missing_parent() -> None:
    # find_spec imports the parent first and raises for a missing one: False, no traceback.
    assert installed("stocksentry_no_such_parent.child") is False


# --- the command line ----------------------------------------------------------------------


def test_a_command_whose_package_is_missing_says_which_extra_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    monkeypatch.setitem(
        cli.NEEDS, "check-config", ("exporter", ("yaml", "stocksentry_missing_pkg"))
    )
    assert cli.main(["check-config", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "stocksentry check-config: error: stocksentry_missing_pkg not installed: this "
        "command needs the exporter extra, pip install 'stocksentry[exporter]'\n"
    )


def test_a_module_missing_at_run_time_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # An import inside the handler fails (an install missing a dependency): exit 2, no
    # traceback, and the module's name with the extra that brings it.
    config = tmp_path / "config.yaml"
    config.write_text("{}\n")
    monkeypatch.setitem(sys.modules, "stocksentry.exporter.sidecar", None)
    # `from . import sidecar` finds the package's attribute first, once any test imported it.
    import stocksentry.exporter

    monkeypatch.delattr(stocksentry.exporter, "sidecar", raising=False)
    assert cli.main(["check-config", str(config)]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert err.startswith("stocksentry check-config: error: stocksentry.exporter.sidecar not")
    assert "pip install 'stocksentry[exporter]'" in err


def test_a_config_that_cannot_be_read_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # /proc/self/mem is a regular file whose read fails (EIO at address 0): an OS error
    # while reading, after every check on the open file passed.
    assert cli.main(["check-config", "/proc/self/mem"]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1
    assert err.startswith("stocksentry check-config: error: ")
    assert "/proc/self/mem" in err
    assert "Input/output error" in err


def test_an_os_error_while_reading_is_an_input_file_error() -> None:
    with pytest.raises(InputFileError) as caught:
        read_bytes_bounded("/proc/self/mem", limit=CONFIG_LIMIT, what="config")
    assert caught.value.problem == "Input/output error"


def test_version_and_revision_are_unknown_when_the_distribution_is_not_installed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Run from a source tree (PYTHONPATH) there is no installed distribution to ask.
    monkeypatch.setattr(buildinfo, "DISTRIBUTION", "stocksentry-not-installed")
    buildinfo.build_info.cache_clear()
    try:
        info = buildinfo.build_info()
    finally:
        buildinfo.build_info.cache_clear()
    assert info.version == "unknown"
    assert buildinfo.read_revision(tmp_path) == "unknown"  # no REVISION file there either
    monkeypatch.setattr(cli.metadata, "version", _not_installed)
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == "stocksentry unknown\n"


def _not_installed(name: str) -> str:
    from importlib import metadata

    raise metadata.PackageNotFoundError(name)


# --- durations -----------------------------------------------------------------------------


def test_an_int_too_large_for_a_float_is_not_a_duration() -> None:
    with pytest.raises(ValueError, match=r"^not a duration: too large$"):
        parse_duration(10**400)


def test_a_config_duration_too_large_for_a_float_is_one_line() -> None:
    error = refused(
        DB + "probes:\n  defaults:\n    interval: " + "9" * 400 + "\n",
        5,
        "probes.defaults.interval",
    )
    assert "must be at most" in error.message
    assert len(str(error)) < 400
