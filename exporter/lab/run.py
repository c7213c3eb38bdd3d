"""Running the lab: :func:`run_lab` sets up the database, Redis and the instrumentation,
then runs every configured strategy in turn."""

from __future__ import annotations

import contextlib
import importlib.util
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, start_http_server
from sqlalchemy.engine import Engine
from stocksentry.instrumentation import Sentry

from .config import REDIS_STRATEGIES, STOCK_TABLE, LabConfig, LabError, StrategyResult, sku_for
from .driver import delete_redis_keys, run_strategy
from .progress import ProgressSink
from .report import describe_database, describe_redis
from .shop import LabRun, connect_and_prepare, create_engine, first_line, normalize_url


@contextlib.contextmanager
def _json_logs_to(path: str | None) -> Iterator[bool]:
    """Send the JSON log lines to ``path`` for the block (structlog's process-wide
    configuration is put back afterwards); yields whether it logs."""
    if path is None:
        yield False
        return
    import structlog
    from stocksentry.instrumentation.logs import configure_logging

    try:
        stream = Path(path).open("w", encoding="utf-8")  # noqa: SIM115 - closed in finally
    except OSError as exc:
        raise LabError(f"cannot write log file {path}: {exc.strerror or exc}") from exc
    previous = structlog.get_config()
    try:
        # No stdlib bridge: the lab leaves the process's logging handlers alone.
        configure_logging("INFO", stream=stream, bridge_stdlib=False)
        yield True
    finally:
        structlog.configure(**previous)
        stream.close()


def run_lab(
    config: LabConfig,
    *,
    registry: CollectorRegistry | None = None,
    progress: ProgressSink | None = None,
    database: str | None = None,
    settle_s: float = 0.0,
) -> list[StrategyResult]:
    """Run every configured strategy in turn; one result each (a skipped one with the
    reason). ``database`` names the database in progress and errors; ``settle_s`` pauses
    after the counters are created at zero, so that a scraper sees them start there.
    """
    registry = registry if registry is not None else CollectorRegistry()
    names = config.strategy_names
    shown = database if database is not None else describe_database(config)
    run = uuid.uuid4().hex[:8]
    # Everything set up is undone in reverse order on the way out.
    with contextlib.ExitStack() as stack:
        if config.database_url is None:
            temp = tempfile.TemporaryDirectory(
                prefix="stocksentry-lab-", ignore_cleanup_errors=True
            )
            url = sa.make_url(f"sqlite:///{Path(stack.enter_context(temp)) / 'lab.db'}")
        else:
            url = normalize_url(config.database_url)
        engine = create_engine(url, config.concurrency, config.isolation_level)
        stack.callback(engine.dispose)
        connect_and_prepare(engine, shown, config.concurrency)
        # The lab's own reads (reset, samples, cache refresh, counts) go through a second,
        # uninstrumented engine: the SQL detector sees the strategies' statements only.
        side = create_engine(url, 3)
        stack.callback(side.dispose)
        if (
            config.redlock_impl == "pottery"
            and "redlock" in names
            and config.redis_url is not None
            and importlib.util.find_spec("pottery") is None
        ):
            raise LabError("the pottery Redlock needs pottery: pip install 'stocksentry[lab]'")
        needs_redis = config.contain or any(
            config.skip_reason(name) is None
            and (name in REDIS_STRATEGIES or name == "stale_cache" or config.stale_cache)
            for name in names
        )
        redis_client: Any = None
        if config.redis_url is not None and needs_redis:
            redis_client = connect_redis(config.redis_url)
            stack.callback(redis_client.close)
        skus = [sku_for(name) for name in names]
        if config.contain:
            from .contain import CONTAINED_SKU, clear_freezes, run_contained

            skus.append(CONTAINED_SKU)
            if redis_client is not None:
                clear_freezes(redis_client)
                stack.callback(clear_freezes, redis_client)
        if redis_client is not None:
            stack.callback(delete_redis_keys, redis_client, config.redis_prefix + run)
        if progress is not None:
            progress.start(shown)
        log = stack.enter_context(_json_logs_to(config.log_file))
        sentry = Sentry(registry=registry, promo_skus=skus, log=log, trace=False)
        undo_sql = instrument_lab_engine(engine, sentry)
        if undo_sql is not None:
            stack.callback(undo_sql)
        lab = LabRun(
            engine=engine,
            side=side,
            sentry=sentry,
            registry=registry,
            config=config,
            run=run,
            progress=progress,
            redis=redis_client,
            detector=undo_sql is not None,
        )
        prime_counters(sentry, names, skus)
        if settle_s > 0:
            time.sleep(settle_s)
        results = []
        for name in names:
            reason = config.skip_reason(name)
            if reason is not None:
                results.append(StrategyResult.skip(config, name, reason))
            else:
                results.append(run_strategy(lab, name))
        if config.contain:
            results.append(run_contained(lab))
        return results


def prime_counters(sentry: Sentry, names: tuple[str, ...], skus: list[str]) -> None:
    """Create the strategies' counter series at zero: a counter first seen at its final
    value has no ``increase()`` to Prometheus, and a short sale would pass unseen."""
    sentry.metrics.prime_tables([STOCK_TABLE])
    sentry.metrics.prime_skus(skus)
    for name in names:
        if name in REDIS_STRATEGIES:
            sentry.metrics.prime_lock(name)


def instrument_lab_engine(engine: Engine, sentry: Sentry) -> Callable[[], None] | None:
    """Watch the engine with the SQLAlchemy integration (it counts the unsafe
    read-modify-writes); returns its undo, or ``None`` when it is not installed."""
    try:
        from stocksentry.instrumentation.sqlalchemy import (
            StockTable,
            instrument_sqlalchemy,
            uninstrument_sqlalchemy,
        )
    except ImportError:
        return None
    stock_table = StockTable(stock_column="available_stock", key_columns=("id", "sku"))
    instrument_sqlalchemy(
        engine, sentry=sentry, stock_tables={STOCK_TABLE: stock_table}, spans="off"
    )
    return lambda: uninstrument_sqlalchemy(engine)


def connect_redis(url: str) -> Any:
    """A reached Redis client, or a :class:`LabError` naming the URL without its password."""
    try:
        import redis
    except ImportError as exc:
        raise LabError(
            f"--redis needs the redis package ({exc.name or exc}): pip install 'stocksentry[lab]'"
        ) from exc
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)
        client.ping()
    except (redis.RedisError, ValueError, OSError) as exc:
        shown = describe_redis(url)
        raise LabError(f"cannot connect to Redis {shown}: {first_line(exc)}") from exc
    return client


@contextlib.contextmanager
def serve_metrics(registry: CollectorRegistry, port: int) -> Iterator[int]:
    """Serve ``registry`` on 127.0.0.1 for the block; yields the bound port."""
    try:
        server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    except OSError as exc:
        raise LabError(
            f"cannot serve /metrics on 127.0.0.1:{port}: {exc.strerror or exc}"
        ) from exc
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
