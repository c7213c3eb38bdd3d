"""The exporter's config: one clear error per malformed file, defaults, secrets kept secret."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from stocksentry.exporter.config import (
    DEFAULT_ADVISORY_LOCK_KEY,
    ConfigError,
    ExporterConfig,
    load_config,
    parse_config,
)
from stocksentry.instrumentation.secrets import Secret

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "exporter" / "config.example.yaml"

PASSWORD = "hunter2-Zq9"  # noqa: S105 - a fake secret the tests look for in messages
DB_URL = f"postgresql://shop:{PASSWORD}@db.internal:5432/shop"
REDIS_URL = f"redis://:{PASSWORD}@cache.internal:6379/0"
ENV = {"STOCKSENTRY_DATABASE_URL": DB_URL, "STOCKSENTRY_REDIS_URL": REDIS_URL}

DB = "database:\n  url_env: STOCKSENTRY_DATABASE_URL\n"
NO_USER = "stocksentry-no-such-user"


def parse(text: str, environ: dict[str, str] | None = None) -> ExporterConfig:
    return parse_config(
        textwrap.dedent(text), "config.yaml", environ=ENV if environ is None else environ
    )


# (id, YAML, line, dotted key path, a fragment of the message)
MALFORMED = [
    ("unknown-top-key", "serverr: {}\n", 1, "serverr", 'unknown key (did you mean "server"?)'),
    (
        "unknown-nested-key",
        DB + "probes:\n  oversold:\n    intervall: 5s\n",
        5,
        "probes.oversold.intervall",
        'did you mean "interval"?',
    ),
    (
        "unknown-key-no-close-match",
        "server:\n  colour: blue\n",
        2,
        "server.colour",
        "expected one of: listen_address, port, web_config_file, multiprocess_dir",
    ),
    (
        "port-not-a-number",
        "server:\n  port: high\n",
        2,
        "server.port",
        'expected a whole number, got "high"',
    ),
    (
        "port-out-of-range",
        "server:\n  port: 99999\n",
        2,
        "server.port",
        "must be at most 65535, got 99999",
    ),
    (
        # A hex int past Python's int-to-text digit limit: quoted as written.
        "port-huge-hex",
        "server:\n  port: 0x" + "f" * 4000 + "\n",
        2,
        "server.port",
        "must be at most 65535, got 0xfff",
    ),
    ("port-is-a-float", "server:\n  port: 80.5\n", 2, "server.port", "expected a whole number"),
    ("section-is-a-list", "server:\n  - port\n", 2, "server", "expected a mapping, got a list"),
    (
        "bad-duration",
        DB + "probes:\n  oversold:\n    interval: fast\n",
        5,
        "probes.oversold.interval",
        'expected a duration like "5s", "500ms" or "1m" (or a number of seconds), got "fast"',
    ),
    (
        "negative-interval",
        "probes:\n  defaults:\n    interval: -5\n",
        3,
        "probes.defaults.interval",
        "must not be negative, got -5",
    ),
    (
        # An int too large for a float: one line, not an OverflowError.
        "huge-integer-interval",
        "probes:\n  defaults:\n    interval: 1" + "0" * 400 + "\n",
        3,
        "probes.defaults.interval",
        'must be at most 1h, got "1000',
    ),
    (
        "negative-duration-string",
        DB + "probes:\n  negative_stock:\n    timeout: -1s\n",
        5,
        "probes.negative_stock.timeout",
        'got "-1s"',
    ),
    (
        "zero-timeout",
        DB + "probes:\n  negative_stock:\n    timeout: 0s\n",
        5,
        "probes.negative_stock.timeout",
        "must be greater than zero",
    ),
    (
        "milliseconds-written-as-seconds",
        DB + "  statement_timeout: 2000\n",
        3,
        "database.statement_timeout",
        "must be at most 10m, got 33m20s",
    ),
    (
        "bad-table-identifier",
        "schema:\n  products:\n    table: products; DROP TABLE\n",
        3,
        "schema.products.table",
        '"products; DROP TABLE" is not a plain SQL identifier',
    ),
    (
        "three-part-table-name",
        "schema:\n  orders:\n    table: a.b.c\n",
        3,
        "schema.orders.table",
        "optionally schema-qualified",
    ),
    (
        "bad-column-identifier",
        "schema:\n  orders:\n    status: status--x\n",
        3,
        "schema.orders.status",
        '"status--x" is not a plain SQL identifier',
    ),
    (
        "missing-env-var",
        "database:\n  url_env: SHOP_DB_URL\n",
        2,
        "database.url_env",
        "environment variable SHOP_DB_URL is not set or empty",
    ),
    (
        "unreadable-url-file",
        "database:\n  url_file: /nonexistent/stocksentry/db-url\n",
        2,
        "database.url_file",
        "cannot read /nonexistent/stocksentry/db-url: No such file or directory",
    ),
    (
        "url-file-is-a-directory",
        "database:\n  url_file: /\n",
        2,
        "database.url_file",
        "cannot read /: it is a directory, not a regular file",
    ),
    (
        "literal-url-with-password",
        f"database:\n  url: {DB_URL}\n",
        2,
        "database.url",
        "the URL carries a password; put the URL in an environment variable (url_env) "
        "or a file (url_file) instead",
    ),
    (
        "literal-conninfo-with-password",
        f"database:\n  url: host=db user=shop password={PASSWORD}\n",
        2,
        "database.url",
        "carries a password",
    ),
    (
        "literal-redis-url-with-password",
        f"redis:\n  url: {REDIS_URL}\n",
        2,
        "redis.url",
        "carries a password",
    ),
    (
        "password-in-query-string",
        f"database:\n  url: postgresql://db/shop?password={PASSWORD}\n",
        2,
        "database.url",
        "carries a password",
    ),
    (
        "two-url-sources",
        "database:\n  url: postgresql://db/shop\n  url_env: STOCKSENTRY_DATABASE_URL\n",
        3,
        "database.url_env",
        "give only one of url_env, url_file and url (found url, url_env)",
    ),
    (
        "no-url-source",
        "database:\n  statement_timeout: 1s\n",
        2,
        "database",
        "one of url_env, url_file or url is required",
    ),
    (
        "env-var-is-not-a-postgres-url",
        "database:\n  url_env: STOCKSENTRY_REDIS_URL\n",
        2,
        "database.url_env",
        "environment variable STOCKSENTRY_REDIS_URL does not hold a PostgreSQL, MySQL or "
        "MariaDB URL",
    ),
    (
        # One slash short: not a libpq key=value string either, however many `=` it holds.
        "url-with-a-broken-scheme",
        'database:\n  url: "postgres:/db?sslmode=disable"\n',
        2,
        "database.url",
        "the URL does not hold a PostgreSQL, MySQL or MariaDB URL",
    ),
    (
        "url-with-a-scheme-misspelt",
        'database:\n  url: "mysql:/shop?charset=utf8mb4"\n',
        2,
        "database.url",
        "the URL does not hold a PostgreSQL, MySQL or MariaDB URL",
    ),
    (
        # A MySQL URL's options are checked at load, not at each connect.
        "mysql-url-with-an-unknown-option",
        'database:\n  url: "mysql://db/shop?sslca=/etc/ca.pem"\n',
        2,
        "database.url",
        "the URL: the MySQL URL has an unknown option 'sslca'",
    ),
    (
        "mysql-url-with-a-missing-tls-file",
        'database:\n  url: "mariadb://db/shop?ssl_ca=/nonexistent/stocksentry/ca.pem"\n',
        2,
        "database.url",
        "the URL: the MySQL URL option ssl_ca: no such file or directory",
    ),
    ("yaml-syntax-error", "server:\n  port: [1, 2\nprobes: {}\n", 3, "", "invalid YAML"),
    ("yaml-bad-indentation", "server:\n  port: 1\n bad: 2\n", 3, "", "invalid YAML"),
    ("two-documents", "server: {}\n---\nprobes: {}\n", 2, "", "expected a single document"),
    ("empty-file", "", 1, "", "the file is empty"),
    ("comments-only", "# nothing here\n", 1, "", "the file is empty"),
    (
        "list-instead-of-mapping",
        "- server\n- probes\n",
        1,
        "",
        "expected a mapping at the top level, got a list",
    ),
    (
        "scalar-instead-of-mapping",
        "just text\n",
        1,
        "",
        'expected a mapping at the top level, got "just text"',
    ),
    (
        "bad-enum",
        DB + "schema:\n  products:\n    allocation: initial_stock\n"
        "probes:\n  oversold:\n    scope: some\n",
        8,
        "probes.oversold.scope",
        'expected one of "all", "promo", got "some"',
    ),
    (
        "bad-bool",
        DB + "  leader_election: maybe\n",
        3,
        "database.leader_election",
        'expected true or false, got "maybe"',
    ),
    ("duplicate-key", "server:\n  port: 1\n  port: 2\n", 3, "server.port", "duplicate key"),
    (
        "advisory-key-beyond-int64",
        DB + "  advisory_lock_key: 9223372036854775808\n",
        3,
        "database.advisory_lock_key",
        "must be at most 9223372036854775807",
    ),
    (
        "probe-enabled-without-its-column",
        DB + "probes:\n  oversold:\n    enabled: true\n",
        5,
        "probes.oversold.enabled",
        "cannot be true: schema.products.allocation is not mapped",
    ),
    (
        "probe-enabled-without-a-database",
        "probes:\n  negative_stock:\n    enabled: true\n",
        3,
        "probes.negative_stock.enabled",
        "cannot be true: there is no database section",
    ),
    (
        "custom-metric-collides-with-catalog",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: stock_inventory_negative_skus\n",
        7,
        "probes.custom[0].metric",
        '"stock_inventory_negative_skus" collides with the catalog metric '
        "stock_inventory_negative_skus",
    ),
    (
        "custom-metric-collides-with-a-counter-sample",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: stock_orders_paid\n",
        7,
        "probes.custom[0].metric",
        "collides with the catalog metric stock_orders_paid_total",
    ),
    (
        "custom-metric-reserved-prefix",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: stocksentry_mine\n",
        7,
        "probes.custom[0].metric",
        "the prefixes stock_ and stocksentry_ are reserved",
    ),
    (
        "custom-metric-bad-name",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: shop-metric\n",
        7,
        "probes.custom[0].metric",
        '"shop-metric" is not a metric name',
    ),
    (
        "custom-without-sql",
        DB + "probes:\n  custom:\n    - name: mine\n      metric: shop_mine\n",
        5,
        "probes.custom[0].sql",
        "is required",
    ),
    (
        "custom-named-like-a-builtin",
        DB + "probes:\n  custom:\n    - name: oversold\n      sql: SELECT 1 AS value\n"
        "      metric: shop_mine\n",
        5,
        "probes.custom[0].name",
        '"oversold" is the name of a built-in probe',
    ),
    (
        "custom-label-is-the-value",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: shop_mine\n      label_columns: [sku, value]\n",
        8,
        "probes.custom[0].label_columns[1]",
        "the value column cannot also be a label",
    ),
    (
        "custom-sql-of-two-statements",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value; SELECT 2\n"
        "      metric: shop_mine\n",
        6,
        "probes.custom[0].sql",
        "must be one statement: a `;` outside a string ends it",
    ),
    (
        "custom-is-not-a-list",
        DB + "probes:\n  custom:\n    name: mine\n",
        5,
        "probes.custom",
        "expected a list, got a mapping",
    ),
    (
        "key-template-without-sku",
        "redis:\n  url: redis://cache:6379/0\n  key_template: 'stock:{id}'\n",
        3,
        "redis.key_template",
        'must contain "{sku}" exactly once',
    ),
    (
        "promo-skus-not-a-list",
        "sku_guard:\n  promo_skus: EGG-01\n",
        2,
        "sku_guard.promo_skus",
        'expected a list, got "EGG-01"',
    ),
    (
        "duplicate-promo-sku",
        "sku_guard:\n  promo_skus: [EGG-01, EGG-02, EGG-01]\n",
        2,
        "sku_guard.promo_skus[2]",
        'duplicate value "EGG-01"',
    ),
    (
        "reservations-released-and-status",
        "schema:\n  reservations:\n    released_at: released_at\n    status: status\n"
        "    held_statuses: [HELD]\n",
        3,
        "schema.reservations.released_at",
        "give either released_at or status with held_statuses, not both",
    ),
    (
        "reservations-status-without-held-statuses",
        "schema:\n  reservations:\n    status: state\n",
        3,
        "schema.reservations.held_statuses",
        "is required with status",
    ),
    (
        "web-config-file-missing",
        "server:\n  web_config_file: /nonexistent/web.yml\n",
        2,
        "server.web_config_file",
        "/nonexistent/web.yml is not a readable file",
    ),
    (
        "compaction-without-pid-checks",
        "server:\n  check_worker_pids: false\n  compact_dead_workers: true\n",
        3,
        "server.compact_dead_workers",
        "needs check_worker_pids: true",
    ),
    # Explicit tags reach the constructor with values it refuses.
    (
        "tagged-bool-not-a-bool",
        "server:\n  check_worker_pids: !!bool maybe\n",
        2,
        "server.check_worker_pids",
        'expected true or false, got "maybe"',
    ),
    (
        "tagged-int-not-a-number",
        "server:\n  port: !!int abc\n",
        2,
        "server.port",
        'expected a whole number, got "abc"',
    ),
    (
        "binary-int-without-digits",
        "server:\n  port: 0b_\n",
        2,
        "server.port",
        'expected a whole number, got "0b_"',
    ),
    (
        "tagged-float-duration-not-a-number",
        "probes:\n  defaults:\n    interval: !!float abc\n",
        3,
        "probes.defaults.interval",
        'expected a duration like "5s", "500ms" or "1m" (or a number of seconds), got "abc"',
    ),
    (
        "tagged-int-duration-not-a-number",
        "probes:\n  defaults:\n    timeout: !!int 5s\n",
        3,
        "probes.defaults.timeout",
        'got "5s"',
    ),
    # The one duration grammar (Prometheus's): whole numbers inside a string.
    (
        "fraction-inside-a-duration-string",
        DB + "probes:\n  negative_stock:\n    timeout: 1.5s\n",
        5,
        "probes.negative_stock.timeout",
        'expected a duration like "5s", "500ms" or "1m" (or a number of seconds), got "1.5s"',
    ),
    (
        "units-out-of-order",
        DB + "probes:\n  negative_stock:\n    interval: 30s1m\n",
        5,
        "probes.negative_stock.interval",
        'got "30s1m"',
    ),
    (
        "window-beyond-its-maximum",
        DB + "probes:\n  duplicate_orders:\n    window: 5w\n",
        5,
        "probes.duplicate_orders.window",
        "must be at most 4w3d, got 5w",
    ),
    (
        "held-statuses-without-status",
        "schema:\n  reservations:\n    held_statuses: [HELD]\n",
        3,
        "schema.reservations.held_statuses",
        "needs status as well",
    ),
    (
        "two-custom-probes-with-one-name",
        DB + "probes:\n  custom:\n"
        "    - {name: mine, sql: SELECT 1 AS value, metric: shop_a}\n"
        "    - {name: mine, sql: SELECT 1 AS value, metric: shop_b}\n",
        6,
        "probes.custom[1].name",
        'another custom probe is named "mine"',
    ),
    (
        "custom-label-reserved-by-prometheus",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: shop_mine\n      label_columns: [__name__]\n",
        8,
        "probes.custom[0].label_columns[0]",
        '"__name__" is not a label name',
    ),
    (
        "non-string-key",
        "server:\n  8080: port\n",
        2,
        "server",
        'keys must be plain names, got "8080"',
    ),
    (
        "empty-application-name",
        DB + "  application_name: '  '\n",
        3,
        "database.application_name",
        "must not be empty",
    ),
    (
        "quantity-constant-other-than-1",
        "schema:\n  order_items:\n    quantity: 2\n",
        3,
        "schema.order_items.quantity",
        "expected a column name or 1 (one unit per row), got 2",
    ),
    (
        "quantity-not-a-name",
        "schema:\n  order_items:\n    quantity: 1.5\n",
        3,
        "schema.order_items.quantity",
        "expected a string",
    ),
    (
        "probe-timeout-longer-than-its-interval",
        DB + "probes:\n  oversold:\n    interval: 5s\n    timeout: 30s\n",
        6,
        "probes.oversold.timeout",
        "30s is longer than the probe's interval (5s); give it at most the interval",
    ),
    (
        "probe-timeout-longer-than-the-default-interval",
        DB + "probes:\n  defaults:\n    interval: 10s\n  deadlocks:\n    timeout: 1m\n",
        7,
        "probes.deadlocks.timeout",
        "1m is longer than the probe's interval (10s)",
    ),
    (
        "custom-timeout-longer-than-its-interval",
        DB + "probes:\n  custom:\n    - name: mine\n      sql: SELECT 1 AS value\n"
        "      metric: shop_mine\n      interval: 1s\n      timeout: 2s\n",
        9,
        "probes.custom[0].timeout",
        "2s is longer than the probe's interval (1s)",
    ),
    # Paths whose "~user" cannot be expanded, or that the OS cannot take.
    (
        "multiprocess-dir-home-of-no-user",
        f"server:\n  multiprocess_dir: ~{NO_USER}/metrics\n",
        2,
        "server.multiprocess_dir",
        f'cannot expand "~{NO_USER}/metrics"',
    ),
    (
        "web-config-file-home-of-no-user",
        f"server:\n  web_config_file: ~{NO_USER}/web.yml\n",
        2,
        "server.web_config_file",
        f'cannot expand "~{NO_USER}/web.yml"',
    ),
    (
        "url-file-home-of-no-user",
        f"database:\n  url_file: ~{NO_USER}/db-url\n",
        2,
        "database.url_file",
        f'cannot expand "~{NO_USER}/db-url"',
    ),
    (
        "url-file-with-nul",
        'database:\n  url_file: "db\\0url"\n',
        2,
        "database.url_file",
        "must not contain a NUL character",
    ),
    (
        "multiprocess-dir-with-nul",
        'server:\n  multiprocess_dir: "metrics\\0"\n',
        2,
        "server.multiprocess_dir",
        "must not contain a NUL character",
    ),
]


@pytest.mark.parametrize(
    ("text", "line", "path", "fragment"),
    [pytest.param(*case[1:], id=case[0]) for case in MALFORMED],
)
def test_a_malformed_config_gives_one_clear_error(text, line, path, fragment):
    with pytest.raises(ConfigError) as caught:
        parse(text)
    error = caught.value
    message = str(error)
    assert (error.line, error.path) == (line, path), message
    prefix = f"config.yaml:{line}: {path}: " if path else f"config.yaml:{line}: "
    assert message.startswith(prefix), message
    assert fragment in message
    assert "\n" not in message
    assert PASSWORD not in message
    assert "Traceback" not in message


def test_there_are_at_least_twenty_malformed_cases():
    assert len(MALFORMED) >= 20
    assert len({case[0] for case in MALFORMED}) == len(MALFORMED)


def test_deeply_nested_yaml_is_one_error_not_a_recursion_error():
    with pytest.raises(ConfigError) as caught:
        parse_config("[" * 10_000 + "]" * 10_000, "config.yaml")
    assert str(caught.value) == "config.yaml: invalid YAML: nested too deeply"


def test_a_secret_is_not_echoed_when_its_variable_holds_something_else():
    environ = {"DB": f"mssql://shop:{PASSWORD}@db/shop"}
    with pytest.raises(ConfigError) as caught:
        parse("database:\n  url_env: DB\n", environ)
    assert str(caught.value) == (
        "config.yaml:2: database.url_env: environment variable DB does not hold a "
        "PostgreSQL, MySQL or MariaDB URL (postgresql://, postgres://, mysql:// or mariadb://...)"
    )


@pytest.mark.parametrize(
    ("url", "dialect"),
    [
        ("postgresql://shop@db/shop", "postgresql"),
        ("host=db dbname=shop", "postgresql"),
        ("mysql://shop@db:3306/shop", "mysql"),
        ("mariadb://shop@db/shop", "mysql"),
        ("mysql+aiomysql://shop@db/shop", "mysql"),
    ],
)
def test_the_dialect_comes_from_the_url(url, dialect):
    config = parse("database:\n  url_env: DB\n", {"DB": url})
    assert config.database is not None
    assert config.database.dialect == dialect


def test_a_literal_mysql_url_with_a_password_is_refused_unechoed():
    with pytest.raises(ConfigError) as caught:
        parse(f"database:\n  url: mysql://shop:{PASSWORD}@db/shop\n")
    assert PASSWORD not in str(caught.value)
    assert str(caught.value).startswith("config.yaml:2: database.url: the URL carries a password")


def test_mysql_runs_cache_drift_and_custom_sql_as_postgresql_does():
    redis = "redis:\n  url: redis://cache:6379/0\n"
    custom = "probes:\n  custom:\n    - {name: c, sql: SELECT 1 AS value, metric: shop_c}\n"
    config = parse(
        DB + redis + "sku_guard:\n  promo_skus: [EGG-01]\n" + custom,
        {"STOCKSENTRY_DATABASE_URL": f"mysql://shop:{PASSWORD}@db/shop"},
    )
    assert config.probes.cache_drift.enabled
    assert [c.name for c in config.probes.custom] == ["c"]


def test_a_literal_url_that_is_not_a_string_is_not_echoed():
    with pytest.raises(ConfigError) as caught:
        parse("database:\n  url: [a, b]\n")
    assert str(caught.value) == "config.yaml:2: database.url: expected a string, got a list"


def test_the_example_config_loads_as_is():
    config = load_config(EXAMPLE, environ=ENV)
    assert config.source == str(EXAMPLE)
    assert config.notes == ()
    assert config.database is not None
    assert config.database.url.reveal() == DB_URL
    assert config.database.url_source == "env STOCKSENTRY_DATABASE_URL"
    assert config.database.statement_timeout == 2.0
    assert config.database.lock_timeout == 0.2
    assert config.database.advisory_lock_key == DEFAULT_ADVISORY_LOCK_KEY
    assert config.redis is not None
    assert config.redis.url.reveal() == REDIS_URL
    assert config.redis.key("EGG-01") == "stock:EGG-01"
    assert config.schema.products.allocation == "initial_stock"
    assert config.sku_guard.promo_skus == ("EGG-01", "EGG-02")
    assert all(settings.enabled for settings in config.probes.builtin().values())
    assert config.probes.deadlocks.interval == 30.0
    assert config.probes.negative_stock.interval == 15.0
    assert [c.metric for c in config.probes.custom] == ["shop_recent_paid_orders"]


def test_the_example_config_needs_its_environment_variables():
    with pytest.raises(ConfigError) as caught:
        load_config(EXAMPLE, environ={})
    assert "environment variable STOCKSENTRY_DATABASE_URL is not set or empty" in str(caught.value)
    assert caught.value.path == "database.url_env"


def test_defaults_of_an_empty_mapping():
    config = parse("{}\n", environ={})
    assert config.server.listen_address == "0.0.0.0"  # noqa: S104 - the documented default
    assert config.server.port == 19464
    assert config.server.multiprocess_dir is None
    assert config.sku_guard.max_skus == 100
    assert config.database is None
    assert config.redis is None
    assert config.schema.products.stock == "available_stock"
    assert config.schema.orders.paid_statuses == ("PAID", "PROCESSING", "COMPLETED")
    # No database: every probe is off, and there is nothing to explain.
    assert not any(s.enabled for s in config.probes.builtin().values())
    assert config.notes == ()


def test_defaults_with_a_database():
    config = parse(DB)
    assert config.database is not None
    assert config.database.leader_election is True
    assert config.database.connect_timeout == 5.0
    probes = config.probes
    assert (probes.duplicate_orders.window, probes.long_transactions.threshold) == (3600.0, 30.0)
    assert (probes.lock_waiters.interval, probes.lock_waiters.timeout) == (15.0, 5.0)
    on = {name for name, s in probes.builtin().items() if s.enabled}
    assert on == {
        "negative_stock",
        "duplicate_orders",
        "lock_waiters",
        "deadlocks",
        "long_transactions",
    }
    assert config.notes == (
        "probe oversold is off: schema.products.allocation is not mapped (without it only "
        "negative stock is visible: a lost update from 1 to 0 twice leaves the stock at 0)",
        "probe expired_reservations is off: schema.reservations is not mapped",
        "probe outbox is off: schema.outbox is not mapped",
        "probe cache_drift is off: there is no redis section",
    )


def test_secrets_stay_out_of_repr_and_str():
    config = load_config(EXAMPLE, environ=ENV)
    for text in (repr(config), str(config), repr(config.database), f"{config.redis}"):
        assert PASSWORD not in text
        assert "db.internal" not in text
        assert "Secret('***')" in text
    secret = Secret(DB_URL)
    assert (repr(secret), str(secret), f"{secret}") == ("Secret('***')",) * 3
    assert secret == Secret(DB_URL)
    assert secret != Secret("other")


def test_url_file_is_read_relative_to_the_config(tmp_path):
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "db").write_text(DB_URL + "\n")
    (tmp_path / "config.yaml").write_text("database:\n  url_file: secrets/db\n")
    config = load_config(tmp_path / "config.yaml", environ={})
    assert config.database is not None
    assert config.database.url.reveal() == DB_URL
    assert config.database.url_source == f"file {tmp_path / 'secrets' / 'db'}"


def test_an_empty_url_file_is_refused(tmp_path):
    (tmp_path / "db").write_text("\n")
    with pytest.raises(ConfigError) as caught:
        parse(f"database:\n  url_file: {tmp_path / 'db'}\n")
    assert str(caught.value) == f"config.yaml:2: database.url_file: {tmp_path / 'db'} is empty"


def test_a_literal_url_without_password_is_accepted():
    config = parse("database:\n  url: postgresql://stocksentry@db:5432/shop\n", environ={})
    assert config.database is not None
    assert config.database.url.reveal() == "postgresql://stocksentry@db:5432/shop"
    assert config.database.url_source == "literal"


def test_a_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing)
    assert str(caught.value) == f"{missing}: cannot read the file: No such file or directory"
    assert caught.value.line is None


def test_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"server:\n  listen_address: caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}:2: the file is not UTF-8 text"


def test_multiprocess_dir_defaults_to_the_environment(tmp_path):
    config = parse("{}\n", environ={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert config.server.multiprocess_dir == tmp_path
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR names"):
        parse("{}\n", environ={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "absent")})


def test_an_explicit_null_turns_an_optional_column_off():
    config = parse(DB + "schema:\n  orders:\n    external_ref: null\n    idempotency_key: key\n")
    assert config.schema.orders.external_ref is None
    assert config.schema.orders.idempotency_key == "key"
    assert config.probes.duplicate_orders.enabled


def test_custom_probe_defaults_come_from_probes_defaults():
    config = parse(
        DB + "probes:\n  defaults: {interval: 1m, timeout: 10s}\n  custom:\n"
        "    - {name: mine, sql: 'SELECT 1 AS value;', metric: shop_mine}\n"
    )
    (custom,) = config.probes.custom
    assert (custom.interval, custom.timeout) == (60.0, 10.0)
    assert custom.sql == "SELECT 1 AS value"  # the trailing ; would break the wrapper
    assert (custom.value_column, custom.label_columns, custom.max_series) == ("value", (), 100)
    assert custom.help == "Custom probe mine."


@pytest.mark.parametrize(
    ("sql", "one_statement"),
    [
        ("SELECT ';' AS value", True),
        ("SELECT 'it''s; fine' AS value, `a;b` AS c -- why; because", True),
        ("SELECT 1 AS value /* a; b */", True),
        ("SELECT 1 AS value; SELECT 2", False),
        # Closing the probe's wrapper and smuggling more statements in.
        (
            "SELECT 1 AS value) AS x; SET SESSION TRANSACTION READ WRITE; COMMIT;"
            " DELETE FROM order_items; SELECT * FROM (SELECT 1 AS value",
            False,
        ),
        (
            "SELECT 1 AS value) AS x; DELETE FROM order_items; SELECT * FROM (SELECT 1 AS value",
            False,
        ),
        # A second statement where MySQL reads a backslash escape or a # comment differently.
        ("SELECT 'a\\'; DELETE FROM orders; SELECT '' AS value", False),
        ("SELECT 1 AS value # it's\n; DELETE FROM orders; SELECT '", False),
        ("SELECT 1 AS value --x'\n; DELETE FROM orders; SELECT '", False),
        # MySQL runs what /*! ... */ holds.
        ("SELECT 1 AS value /*! ; DELETE FROM orders */", False),
    ],
)
def test_custom_sql_is_one_statement_however_a_server_reads_it(sql, one_statement):
    document = (
        DB + f"probes:\n  custom:\n    - {{name: mine, sql: {json.dumps(sql)}, metric: m}}\n"
    )
    if one_statement:
        assert parse(document).probes.custom[0].sql == sql
    else:
        with pytest.raises(ConfigError, match="must be one statement"):
            parse(document)


def test_numeric_skus_are_kept_as_written():
    config = parse("sku_guard:\n  promo_skus: [12345, 007]\n", environ={})
    assert config.sku_guard.promo_skus == ("12345", "007")


def test_durations_take_days_and_fractional_numbers():
    config = parse(
        DB + "probes:\n  duplicate_orders:\n    window: 1d\n"
        "  negative_stock:\n    timeout: 1500ms\n    interval: 1.5\n"
        "  deadlocks:\n    interval: 1m30s\n"
    )
    assert config.probes.duplicate_orders.window == 86400.0
    assert config.probes.negative_stock.timeout == 1.5
    assert config.probes.negative_stock.interval == 1.5
    assert config.probes.deadlocks.interval == 90.0


def test_probes_defaults_are_inherited_and_kept():
    config = parse(DB + "probes:\n  defaults: {interval: 1m}\n  oversold: {timeout: 2s}\n")
    assert config.probes.defaults.interval == 60.0
    assert config.probes.negative_stock.interval == 60.0
    assert (config.probes.oversold.interval, config.probes.oversold.timeout) == (60.0, 2.0)


def test_reservations_with_a_status_column():
    config = parse(DB + "schema:\n  reservations: {status: state, held_statuses: [HELD, 7]}\n")
    reservations = config.schema.reservations
    assert reservations is not None
    assert (reservations.status, reservations.released_at) == ("state", None)
    assert reservations.held_statuses == ("HELD", "7")
    assert config.probes.expired_reservations.enabled
    mapped = parse(DB + "schema:\n  reservations: {}\n").schema.reservations
    assert mapped is not None
    assert (mapped.released_at, mapped.status) == ("released_at", None)


def test_a_control_character_is_one_line_with_its_line():
    with pytest.raises(ConfigError) as caught:
        parse("server:\n  port: 1\n  listen_address: 'a\x00b'\n")
    assert str(caught.value) == (
        "config.yaml:3: invalid YAML: unacceptable character #x0000: "
        "special characters are not allowed"
    )


def test_the_package_names_import():
    from stocksentry.exporter import config as package
    from stocksentry.exporter.config import (
        BUILTIN_PROBES,
        ELECTION_PROBE,
        ProbeSettings,
        SchemaConfig,
    )
    from stocksentry.exporter.durations import format_duration, parse_duration

    assert BUILTIN_PROBES[0] == "negative_stock"
    assert BUILTIN_PROBES[-1] == "cache_drift"
    assert ELECTION_PROBE == "leader_election"
    assert ProbeSettings(True, 1.0, 2.0).timeout == 2.0
    assert SchemaConfig().orders.external_ref == "external_ref"
    assert (parse_duration("1d"), format_duration(90)) == (86400.0, "1m30s")
    assert set(package.__all__) <= set(dir(package))
