"""One full pass of the oversold probe's rolling recount on a shop of real size.

Run as ``python benchmarks/bench_recount.py`` (1M products by default; ``--keep`` keeps the
generated shop for the next run, as ``bench_scale.py`` does, whose generator it shares).
The pass is the probe's own statement (:meth:`InvariantSql.paid_units_chunk`), one chunk
after the other over every product, each chunk the size the probe gives it at the
example config's ``recount_period`` and ``interval`` (:func:`chunk_size`). It prints::

    bench recount products=1000000 orders=1000000 period_s=1800 interval_s=15 chunk=8334
        chunks=120 pass_s=… max_chunk_ms=… median_chunk_ms=… share_of_interval=…

``pass_s`` is the database time of the whole pass (what a restart costs, spread over
``recount_period``); ``share_of_interval`` the median chunk's time over the probe's
interval, the share of its runs the recount takes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stocksentry.exporter.invariants import InvariantSql
from stocksentry.exporter.probes.soldtotals import chunk_size

from benchmarks.bench_probes import on_postgresql
from benchmarks.bench_scale import DEFAULT_DSN, example_config, scale_database


def recount_pass(url: str) -> None:
    """Run one pass and print its figures."""
    config = example_config(url)
    settings = config.probes.oversold
    sql = InvariantSql(config.schema, "postgresql")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM products").fetchone()
        products = int(str(row[0])) if row is not None else 0
        row = conn.execute("SELECT count(*) FROM orders").fetchone()
        orders = int(str(row[0])) if row is not None else 0
        chunk = chunk_size(products, settings.recount_period, settings.interval)
        end = datetime.now(UTC)
        after: object | None = None
        times: list[float] = []
        while True:
            query = sql.paid_units_chunk(after=after, limit=chunk, end=end)
            started = time.perf_counter()
            rows = conn.execute(query.text("pyformat"), query.params).fetchall()
            times.append(time.perf_counter() - started)
            if len(rows) < chunk:
                break
            after = rows[-1][0]
    median = statistics.median(times)
    print(
        f"bench recount products={products} orders={orders}"
        f" period_s={settings.recount_period:g} interval_s={settings.interval:g} chunk={chunk}"
        f" chunks={len(times)} pass_s={sum(times):.1f} max_chunk_ms={max(times) * 1000:.0f}"
        f" median_chunk_ms={median * 1000:.0f}"
        f" share_of_interval={median / settings.interval:.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--products", type=int, default=1_000_000)
    parser.add_argument("--orders", type=int, default=1_000_000)
    parser.add_argument(
        "--keep", action="store_true", help="keep the generated shop and re-use a kept one"
    )
    args = parser.parse_args()

    def work() -> None:
        with scale_database(args.dsn, args.products, args.orders, keep=args.keep) as url:
            recount_pass(url)

    return on_postgresql(work)


if __name__ == "__main__":
    sys.exit(main())
