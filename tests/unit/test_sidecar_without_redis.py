"""An install without the redis package (the `exporter` extra brings it; a hand-made
environment may not) starts the sidecar, and says why cache drift is off; switching it on
without redis is one clear line.

Each case runs in a fresh interpreter whose `sys.meta_path` refuses `redis` (and
SQLAlchemy, which no sidecar module needs), as on a machine where they are not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

BLOCKER = textwrap.dedent(
    """
    import sys

    BLOCKED = ("redis", "sqlalchemy")

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    """
)


def run(body: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = BLOCKER + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_sidecar_modules_import_and_build_without_redis():
    done = run(
        """
        import sys
        from stocksentry.exporter import cli, sidecar, server, webconfig, basicauth
        from stocksentry.exporter.config import parse_config
        from stocksentry.exporter.probes import ProbeRunner

        config = parse_config(
            "database: {url: 'postgresql://stocksentry@db.invalid/shop'}\\n"
            "sku_guard: {promo_skus: [EGG-01]}\\n",
            environ={},
        )
        runner = ProbeRunner(config)
        assert not config.probes.cache_drift.enabled
        assert "probe cache_drift is off: there is no redis section" in config.notes
        loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("redis", "sqlalchemy"))
        print("loaded:", loaded, [p.name for p in runner._db_probes][:2])
        """
    )
    assert done.returncode == 0, done.stderr
    assert "loaded: [] ['negative_stock', 'duplicate_orders']" in done.stdout


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "exporter" / "config.example.yaml"
URLS = {
    "STOCKSENTRY_DATABASE_URL": "postgresql://stocksentry@db.invalid/shop",
    "STOCKSENTRY_REDIS_URL": "redis://cache.invalid:6379/0",
}


def test_the_example_config_runs_without_redis_and_says_why():
    """The redis: section of the example turns cache_drift off, with the reason."""
    done = run(
        """
        import sys
        from stocksentry.exporter.config import load_config
        from stocksentry.exporter.probes import ProbeRunner

        config = load_config(sys.argv[1], environ=dict(zip(sys.argv[2::2], sys.argv[3::2])))
        assert config.redis is not None
        assert not config.probes.cache_drift.enabled
        runner = ProbeRunner(config)
        print("\\n".join(config.notes))
        print("probes:", ",".join(p.name for p in runner._db_probes))
        print("loaded:", sorted(m for m in sys.modules if m.partition(".")[0] == "redis"))
        """,
        str(EXAMPLE),
        *[part for item in URLS.items() for part in item],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "probe cache_drift is off: the redis package is not installed "
        "(pip install 'stocksentry[exporter]')",
        "probes: negative_stock,oversold,duplicate_orders,lock_waiters,deadlocks,"
        "long_transactions,expired_reservations,outbox,recent_paid_orders",
        "loaded: []",
    ]


def test_cache_drift_switched_on_without_redis_is_one_clear_line(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "database:\n  url: postgresql://stocksentry@db.invalid/shop\n"
        "sku_guard:\n  promo_skus: [EGG-01]\n"
        "redis:\n  url: redis://cache.invalid:6379/0\n"
        "probes:\n  cache_drift:\n    enabled: true\n"
    )
    done = run(
        """
        import sys
        from stocksentry.exporter.cli import main
        sys.exit(main(["check-config", sys.argv[1]]))
        """,
        str(path),
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("stocksentry")
    assert line.endswith(
        f"{path}:9: probes.cache_drift.enabled: cannot be true: the redis package is not "
        "installed (pip install 'stocksentry[exporter]')"
    )


def test_a_runner_given_redis_settings_without_redis_says_why():
    done = run(
        """
        import dataclasses
        from stocksentry.exporter.config import RedisConfig, parse_config
        from stocksentry.instrumentation.secrets import Secret
        from stocksentry.exporter.probes import ProbeRunner

        config = parse_config(
            "database: {url: 'postgresql://stocksentry@db.invalid/shop'}\\n"
            "sku_guard: {promo_skus: [EGG-01]}\\n",
            environ={},
        )
        # Built by hand, past the loader's check.
        redis = RedisConfig(url=Secret("redis://cache.invalid:6379/0"))
        probes = dataclasses.replace(
            config.probes,
            cache_drift=dataclasses.replace(config.probes.cache_drift, enabled=True),
        )
        try:
            ProbeRunner(dataclasses.replace(config, redis=redis, probes=probes))
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "the redis: section needs the redis package: pip install 'stocksentry[exporter]'\n"
    )
