"""The freeze check: what it adds to a reservation, and how stale the local view is.

Two lines on stdout::

    bench freeze check overhead_us=X reservation_us=Y reservation_delta_us=Z
    bench freeze staleness_ms median=M max=N changes=K

- ``check``: ``overhead_us`` is the check ``reservation()`` adds when nothing is frozen
  (``Sentry.freeze_view.frozen(sku)`` on a view connected to Redis and synced) less an
  empty call, per reservation, median over the rounds (goal: at most 1 µs);
  ``reservation_us`` a whole reservation on a Sentry configured with ``freeze=``, and
  ``reservation_delta_us`` that less the same reservation without it, paired round by
  round as in ``bench_floor.py`` (on a busy machine that difference is within the noise
  of a few µs either way, which is why the check is also timed on its own).
- ``staleness``: from ``freeze_sku`` returning (the script wrote the key and published the
  change) to the view answering ``frozen()``, over ``--changes`` freezes and unfreezes: the
  delay of the pub/sub path. A change message lost to a reconnect is caught by the next
  full read instead, so the bound then is ``resync_interval`` (5 s by default).

Needs Redis (``REDIS_URL``, default ``redis://127.0.0.1:6379/0``); its keys are
``stocksentry-bench:freeze:*``, deleted at the end. Run::

    python benchmarks/bench_freeze.py [--repeats 15] [--n 5000] [--changes 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis
from prometheus_client import CollectorRegistry
from stocksentry.instrumentation import FreezeSettings, FreezeView, Sentry
from stocksentry.instrumentation.freezeview import freeze_sku, unfreeze_sku

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_floor import SKU, paired_us, reservation_op, run_rounds

PREFIX = "stocksentry-bench:freeze:"


def staleness_ms(client: redis.Redis, settings: FreezeSettings, changes: int) -> list[float]:
    """Milliseconds from each change's script returning to the view showing it."""
    view = FreezeView(settings)
    view.start()
    if not view.wait_synced(10):
        raise SystemExit("bench freeze: the view could not read Redis")
    template, channel = settings.key_template, settings.channel
    delays = []
    try:
        for index in range(changes):
            sku = f"BENCH-{index % 10}"
            frozen = view.frozen(sku) is None
            start = time.perf_counter()
            if frozen:
                freeze_sku(
                    client,
                    sku,
                    reason="bench",
                    source="person",
                    key_template=template,
                    channel=channel,
                )
            else:
                unfreeze_sku(client, sku, source="person", key_template=template, channel=channel)
            while (view.frozen(sku) is not None) != frozen:
                if time.perf_counter() - start > 10:
                    raise SystemExit(f"bench freeze: change {index} not seen in 10 s")
            delays.append((time.perf_counter() - start) * 1000)
    finally:
        view.stop()
    return delays


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=200)
    args = parser.parse_args(argv)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    settings = FreezeSettings(url, key_template=PREFIX + "{sku}", channel=PREFIX + "changes")
    client = redis.Redis.from_url(url)
    plain = Sentry(registry=CollectorRegistry(), log=False, trace=False)
    guarded = Sentry(registry=CollectorRegistry(), log=False, trace=False, freeze=settings)
    try:
        view = guarded.freeze_view
        if view is None or not view.wait_synced(10):
            raise SystemExit("bench freeze: the view could not read Redis")

        def check() -> None:
            sentry_view = guarded.freeze_view
            if sentry_view is not None:
                sentry_view.frozen(SKU)

        def empty() -> None:
            sentry_view = guarded.freeze_view
            if sentry_view is not None:
                pass

        rounds = run_rounds(
            {
                "plain": reservation_op(plain),
                "guarded": reservation_op(guarded),
                "check": check,
                "empty": empty,
            },
            args.repeats,
            args.n,
        )
        guarded.close()
        delays = staleness_ms(client, settings, args.changes)
    finally:
        guarded.close()
        keys = list(client.scan_iter(match=PREFIX + "*"))
        if keys:
            client.delete(*keys)
        client.close()
    overhead = paired_us(rounds["check"], rounds["empty"])
    whole = statistics.median(rounds["guarded"]) * 1e6
    delta = paired_us(rounds["guarded"], rounds["plain"])
    print(
        f"bench freeze check overhead_us={overhead:.3f} reservation_us={whole:.3f}"
        f" reservation_delta_us={delta:.3f}"
    )
    print(
        f"bench freeze staleness_ms median={statistics.median(delays):.3f}"
        f" max={max(delays):.3f} changes={len(delays)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
