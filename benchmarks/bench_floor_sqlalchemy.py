"""What ``instrument_sqlalchemy`` adds per statement, against the floor of doing it by hand.

Three engines on in-memory SQLite run the same locking statement (the guarded stock
decrement) in blocks, rotated within each repeat so a change of machine speed hits all
three alike:

- ``bare``: no listener;
- ``floor``: a hand-written listener that times the statement and observes one cached
  prometheus_client histogram child (``--floor cursor``: the engine's
  ``before_cursor_execute`` / ``after_cursor_execute`` pair; ``--floor dialect``: one
  dialect ``do_execute`` listener that runs the statement itself, the dispatch the
  integration uses);
- ``ours``: ``instrument_sqlalchemy(spans="off")`` (its lock-wait observation, the
  classifier's cached route, the row-lock and conflict bookkeeping of a stock UPDATE).

``overhead_us`` = ours - bare, ``floor_us`` = floor - bare, per statement, medians over the
repeats of CPU time; ``ratio`` = overhead / floor.
Run: ``python benchmarks/bench_floor_sqlalchemy.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, Histogram
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy

DECREMENT = sa.text(
    "UPDATE products SET available_stock = available_stock - 1"
    " WHERE sku = :sku AND available_stock >= 1"
)
PARAMS = {"sku": "EGG-01"}


def make_engine() -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL,"
            " available_stock INTEGER NOT NULL)"
        )
        conn.exec_driver_sql(
            "INSERT INTO products (sku, available_stock) VALUES ('EGG-01', ?)", (10**12,)
        )
    return engine


def cursor_floor(engine: sa.Engine, child: Any) -> None:
    """Time each statement between the engine's cursor events; observe the child."""

    def before(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        context.stocksentry_t0 = time.perf_counter()

    def after(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        child.observe(time.perf_counter() - context.stocksentry_t0)

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)


def dialect_floor(engine: sa.Engine, child: Any) -> None:
    """Run each statement in the dialect's ``do_execute`` event, timed; observe the child."""

    def do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        t0 = time.perf_counter()
        cursor.execute(statement, parameters)
        child.observe(time.perf_counter() - t0)
        return True

    sa.event.listen(engine, "do_execute", do_execute)


def block(engine: sa.Engine, n: int) -> float:
    """CPU seconds per statement over ``n`` statements in one transaction (SQLite in
    memory runs in this process: its CPU time is the statement's cost, whatever the load
    of a shared machine)."""
    with engine.connect() as conn:
        started = time.process_time()
        for _ in range(n):
            conn.execute(DECREMENT, PARAMS)
        elapsed = time.process_time() - started
        conn.commit()
    return elapsed / n


def measure(floor: str, repeats: int, n: int) -> tuple[float, float]:
    """(overhead, floor) per statement in seconds, medians over ``repeats``."""
    engines = {name: make_engine() for name in ("bare", "floor", "ours")}
    histogram = Histogram(
        "bench_lock_wait_seconds", "by hand", ["table"], registry=CollectorRegistry()
    )
    setup: Callable[[sa.Engine, Any], None] = cursor_floor if floor == "cursor" else dialect_floor
    setup(engines["floor"], histogram.labels("products"))
    sentry = Sentry(registry=CollectorRegistry(), log=False, trace=False)
    instrument_sqlalchemy(engines["ours"], sentry=sentry, spans="off")
    for engine in engines.values():
        block(engine, n)  # warm up: classify, cache, fill the pool
    overheads: list[float] = []
    floors: list[float] = []
    order = list(engines)
    for i in range(repeats):
        rotated = order[i % 3 :] + order[: i % 3]
        took = {name: block(engines[name], n) for name in rotated}
        overheads.append(took["ours"] - took["bare"])
        floors.append(took["floor"] - took["bare"])
    for engine in engines.values():
        engine.dispose()
    return statistics.median(overheads), statistics.median(floors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=31)
    parser.add_argument("--n", type=int, default=2000, help="statements per block")
    parser.add_argument("--floor", choices=["cursor", "dialect", "both"], default="both")
    args = parser.parse_args()
    floors = ["dialect", "cursor"] if args.floor == "both" else [args.floor]
    # `sqlalchemy` is the floor the integration is judged by (one do_execute listener, the
    # dispatch it uses); the cursor-event pair is printed beside it under its own name.
    names = {"dialect": "sqlalchemy", "cursor": "sqlalchemy_cursor_events"}
    for floor in floors:
        overhead, by_hand = measure(floor, args.repeats, args.n)
        ratio = overhead / by_hand if by_hand > 0 else float("inf")
        print(
            f"bench floor {names[floor]} overhead_us={overhead * 1e6:.2f}"
            f" floor_us={by_hand * 1e6:.2f} ratio={ratio:.2f}"
        )


if __name__ == "__main__":
    main()
