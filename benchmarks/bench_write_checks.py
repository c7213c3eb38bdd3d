"""What the SQLAlchemy integration's optional UPDATE checks cost (fencing, negative writes).

Two modes:

- ``lite --config NAME --n N``: N reservations (the guarded ``UPDATE … RETURNING`` and an
  ``INSERT``, one transaction each) on in-memory SQLite, for counting instructions under
  callgrind; run it at two values of N and divide the difference by the statements.
  ``NAME`` is ``bare`` (no integration), ``off`` (neither check: ``negative_writes=False``),
  ``default`` (``negative_writes=True``, the default) or ``all`` (``fencing`` and
  ``read_back_stock`` on the table as well).
- ``pg --dsn URL``: on a throw-away PostgreSQL database, the median microseconds of one
  unguarded relative decrement (``SET s = s - 1 WHERE sku = …``) without and with
  ``read_back_stock`` (its extra ``SELECT``), and of the same with ``RETURNING`` without and
  with ``negative_writes`` (reading the returned row in place), in rotating rounds.

Example::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p \\
        .venv/bin/python benchmarks/bench_write_checks.py lite --config off --n 400
    .venv/bin/python benchmarks/bench_write_checks.py pg
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import Sentry
from stocksentry.instrumentation.sqlalchemy import instrument_sqlalchemy

RESERVE = sa.text(
    "UPDATE products SET available_stock = available_stock - :qty"
    " WHERE sku = :sku AND available_stock >= :qty RETURNING available_stock"
)
ORDER = sa.text("INSERT INTO orders (sku, qty) VALUES (:sku, :qty)")
DECREMENT = sa.text("UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku")
DECREMENT_RETURNING = sa.text(
    "UPDATE products SET available_stock = available_stock - 1 WHERE sku = :sku"
    " RETURNING available_stock"
)
SCHEMA = (
    "CREATE TABLE products (id INTEGER PRIMARY KEY, sku TEXT UNIQUE NOT NULL,"
    " available_stock INTEGER NOT NULL, fence_token BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL)",
    "INSERT INTO products (id, sku, available_stock) VALUES (1, 'EGG-01', 1000000000)",
)


def configure(engine: sa.Engine, config: str) -> None:
    if config == "bare":
        return
    sentry = Sentry(registry=CollectorRegistry(), log=False, trace=False)
    # "default" passes no option at all: the same run works on an older version.
    options: dict[str, Any] = {} if config == "default" else {"negative_writes": config != "off"}
    if config == "all":
        options.update(fencing={"products": "fence_token"}, read_back_stock=True)
    instrument_sqlalchemy(engine, sentry=sentry, **options)


def run_lite(config: str, n: int) -> None:
    engine = sa.create_engine("sqlite://")
    conn = engine.connect()  # kept: the in-memory database lives in this connection
    with conn.begin():
        for statement in SCHEMA:
            conn.exec_driver_sql(statement)
    configure(engine, config)
    params = {"sku": "EGG-01", "qty": 1}
    for _ in range(n):
        with conn.begin():
            conn.execute(RESERVE, params)
            conn.execute(ORDER, params)
    conn.close()
    engine.dispose()


@contextmanager
def temporary_database(dsn: str) -> Iterator[str]:
    server = sa.create_engine(dsn, isolation_level="AUTOCOMMIT")
    name = f"stocksentry_bench_wc_{uuid.uuid4().hex[:10]}"
    with server.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(dsn).set(database=name).render_as_string(hide_password=False)
    finally:
        with server.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        server.dispose()


def time_block(op: Callable[[], None], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        op()
    return (time.perf_counter() - start) / n


def run_pg(dsn: str, repeats: int, n: int) -> dict[str, float]:
    cases: dict[str, tuple[sa.TextClause, dict[str, Any]]] = {
        "decrement": (DECREMENT, {"negative_writes": False}),
        "decrement+read_back": (DECREMENT, {"read_back_stock": True}),
        "returning": (DECREMENT_RETURNING, {"negative_writes": False}),
        "returning+negative_writes": (DECREMENT_RETURNING, {"negative_writes": True}),
    }
    with temporary_database(dsn) as url:
        setup = sa.create_engine(url)
        with setup.begin() as conn:
            for ddl in SCHEMA:
                conn.exec_driver_sql(ddl.replace("INTEGER PRIMARY KEY", "BIGINT PRIMARY KEY"))
        setup.dispose()
        ops: dict[str, Callable[[], None]] = {}
        conns: list[sa.Connection] = []
        engines: list[sa.Engine] = []
        for name, (statement, options) in cases.items():
            engine = sa.create_engine(url)
            instrument_sqlalchemy(
                engine,
                sentry=Sentry(registry=CollectorRegistry(), log=False, trace=False),
                **options,
            )
            conn = engine.connect()
            conn.begin()  # one long transaction: the figure is the statement's, no COMMIT
            engines.append(engine)
            conns.append(conn)

            def op(conn: sa.Connection = conn, statement: sa.TextClause = statement) -> None:
                result = conn.execute(statement, {"sku": "EGG-01"})
                if result.returns_rows:
                    result.all()  # the app fetches the returned row, as an app would

            ops[name] = op
        # The four connections update one row: each its own transaction would wait for the
        # others' row lock, so they take turns, one committed block each.
        blocks: dict[str, list[float]] = {name: [] for name in ops}
        names = list(ops)
        try:
            for round_no in range(repeats):
                k = round_no % len(names)
                for name in [*names[k:], *names[:k]]:
                    conn = conns[names.index(name)]
                    blocks[name].append(time_block(ops[name], n))
                    conn.commit()
                    conn.begin()
        finally:
            for conn in conns:
                conn.close()
            for engine in engines:
                engine.dispose()
    return {name: statistics.median(values) * 1e6 for name, values in blocks.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="mode", required=True)
    lite = sub.add_parser("lite")
    lite.add_argument("--config", choices=("bare", "off", "default", "all"), required=True)
    lite.add_argument("--n", type=int, default=400)
    pg = sub.add_parser("pg")
    pg.add_argument("--dsn", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    pg.add_argument("--repeats", type=int, default=15)
    pg.add_argument("--n", type=int, default=200)
    args = parser.parse_args(argv)
    if args.mode == "lite":
        run_lite(args.config, args.n)
        return 0
    figures = run_pg(args.dsn, args.repeats, args.n)
    for name, us in figures.items():
        print(f"{name:28} {us:8.1f} µs per statement (median of {args.repeats} blocks)")
    added = figures["decrement+read_back"] - figures["decrement"]
    print(f"read-back SELECT adds      {added:8.1f} µs")
    print(
        "RETURNING peek adds        "
        f"{figures['returning+negative_writes'] - figures['returning']:8.1f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
