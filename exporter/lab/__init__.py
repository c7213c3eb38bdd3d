"""The flash-sale lab behind ``stocksentry demo``.

Many buyers try to reserve one unit each of a small stock, all at once, under several
checkout strategies. Every reservation is recorded through the public instrumentation API
(:class:`~stocksentry.instrumentation.Sentry`), and at the end the lab counts the truth in
the database with SQL and compares it with the metric totals: the unsafe strategies
oversell or drive stock negative, and the metrics say so.

Each strategy gets its own product row (sku ``LAB-<STRATEGY>``) in the common
``products / orders / order_items`` layout. The strategies, unsafe first: ``unsafe``
(read, then write a value computed in Python), ``check_then_decrement`` (read, then an
unguarded relative decrement), ``naive_lock`` (a Redis ``SET NX PX`` lock with a TTL
shorter than the work and a naive ``DEL``), ``atomic`` (one conditional ``UPDATE``),
``for_update`` (``SELECT ... FOR UPDATE``, or ``BEGIN IMMEDIATE`` on SQLite) and
``redlock`` (an owned Redis lock with a token, jittered retries and a compare-and-delete
release: the lab's own, or pottery's Redlock). The two Redis strategies need
``redis_url``; without it they are reported as skipped.

Options cut across strategies: ``retries`` (a share of buyers submit the same intent
twice; with ``idempotency`` the second submit is answered from the stored result and
counted as a replay, without it the intent is reserved twice: duplicate orders per key),
and ``stale_cache`` (the availability decision is read from a cache refreshed late; a
cached "available" that the database contradicts is a stale hit). The lab engine is
instrumented with stocksentry's SQLAlchemy integration when it is installed, which counts
the unsafe read-modify-writes per strategy.

One module per role; this package re-exports the public names and loads a module only
when one of its names is first used, so ``stocksentry --help`` (which needs only
:mod:`.names` and :mod:`.cli`) does not load SQLAlchemy:

- :mod:`.names`: the strategy names (no dependency at all);
- :mod:`.config`: :class:`LabConfig`, :class:`LabError`, :class:`StrategyResult`;
- :mod:`.progress`: live progress; :mod:`.shop`: schema, engine, product rows;
- :mod:`.naive_lock`: the naive ``SET NX`` Redis lock; :mod:`.strategies`;
- :mod:`.driver`: the threaded sale; :mod:`.readback`: metrics and SQL figures read back;
- :mod:`.run`: :func:`run_lab`; :mod:`.report_text` and :mod:`.report_html`;
- :mod:`.cli`: the ``demo`` subcommand.

The lab needs the ``lab`` extra (``pip install 'stocksentry[lab]'``).

Example::

    from stocksentry.exporter.lab import LabConfig, format_report, run_lab

    for result in run_lab(LabConfig(buyers=200, stock=20, strategies=("unsafe", "atomic"))):
        print(result.strategy, result.sold, result.oversold, result.consistent)

    # Every strategy, the Redis locks included; a fifth of the buyers resubmit, unprotected.
    config = LabConfig(redis_url="redis://127.0.0.1:6379/0", retries=0.2, idempotency=False)
    print(format_report(config, run_lab(config)))

Adding a strategy is one function in :mod:`.strategies` and its name in
:data:`STRATEGY_NAMES`; it must mark the reservation with ``success`` or ``conflict``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import (
        CACHE_NAME,
        IDEMPOTENT_OPERATION,
        LOCK_RETRY_S,
        LOCK_WAIT_S,
        REDLOCK_MIN_TTL_S,
        STOCK_TABLE,
        DbFigures,
        LabConfig,
        LabError,
        StrategyResult,
    )
    from .driver import SAMPLE_INTERVAL_S, resubmits
    from .naive_lock import SetNxLock
    from .names import REDIS_STRATEGIES, SKIPPED_WITHOUT_REDIS, STRATEGY_NAMES, sku_for
    from .progress import PROGRESS_INTERVAL_S, Progress, ProgressSink, StderrProgress
    from .report_html import format_html
    from .report_text import (
        caught_lines,
        describe_database,
        describe_redis,
        format_report,
        format_table,
        info_lines,
    )
    from .run import instrument_lab_engine, run_lab, serve_metrics
    from .shop import (
        SQLITE_BUSY_TIMEOUT_S,
        Buyer,
        Shop,
        idempotency_keys,
        metadata,
        normalize_url,
        order_items,
        orders,
        products,
    )
    from .strategies import STRATEGIES, Strategy

#: Public name -> the module (in this package) that defines it.
_HOMES: dict[str, str] = {
    **dict.fromkeys(
        (
            "CACHE_NAME",
            "IDEMPOTENT_OPERATION",
            "LOCK_RETRY_S",
            "LOCK_WAIT_S",
            "REDLOCK_MIN_TTL_S",
            "STOCK_TABLE",
            "DbFigures",
            "LabConfig",
            "LabError",
            "StrategyResult",
        ),
        "config",
    ),
    **dict.fromkeys(("SAMPLE_INTERVAL_S", "resubmits"), "driver"),
    "SetNxLock": "naive_lock",
    **dict.fromkeys(
        ("REDIS_STRATEGIES", "SKIPPED_WITHOUT_REDIS", "STRATEGY_NAMES", "sku_for"), "names"
    ),
    **dict.fromkeys(
        ("PROGRESS_INTERVAL_S", "Progress", "ProgressSink", "StderrProgress"), "progress"
    ),
    "format_html": "report_html",
    **dict.fromkeys(
        (
            "caught_lines",
            "describe_database",
            "describe_redis",
            "format_report",
            "format_table",
            "info_lines",
        ),
        "report_text",
    ),
    **dict.fromkeys(("instrument_lab_engine", "run_lab", "serve_metrics"), "run"),
    **dict.fromkeys(
        (
            "SQLITE_BUSY_TIMEOUT_S",
            "Buyer",
            "Shop",
            "idempotency_keys",
            "metadata",
            "normalize_url",
            "order_items",
            "orders",
            "products",
        ),
        "shop",
    ),
    **dict.fromkeys(("STRATEGIES", "Strategy"), "strategies"),
}

__all__ = [
    "CACHE_NAME",
    "IDEMPOTENT_OPERATION",
    "LOCK_RETRY_S",
    "LOCK_WAIT_S",
    "PROGRESS_INTERVAL_S",
    "REDIS_STRATEGIES",
    "REDLOCK_MIN_TTL_S",
    "SAMPLE_INTERVAL_S",
    "SKIPPED_WITHOUT_REDIS",
    "SQLITE_BUSY_TIMEOUT_S",
    "STOCK_TABLE",
    "STRATEGIES",
    "STRATEGY_NAMES",
    "Buyer",
    "DbFigures",
    "LabConfig",
    "LabError",
    "Progress",
    "ProgressSink",
    "SetNxLock",
    "Shop",
    "StderrProgress",
    "Strategy",
    "StrategyResult",
    "caught_lines",
    "describe_database",
    "describe_redis",
    "format_html",
    "format_report",
    "format_table",
    "idempotency_keys",
    "info_lines",
    "instrument_lab_engine",
    "metadata",
    "normalize_url",
    "order_items",
    "orders",
    "products",
    "resubmits",
    "run_lab",
    "serve_metrics",
    "sku_for",
]


def __getattr__(name: str) -> Any:
    # PEP 562: import the defining module on first use, then keep the name here.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
