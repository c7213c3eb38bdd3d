"""The checkout strategies, each one function ``(shop, reservation, buyer)`` that marks
the reservation ``success`` or ``conflict``; docs/demo.md tells what goes wrong in each."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from stocksentry.instrumentation import Reservation
from stocksentry.instrumentation.locks import InstrumentedRedlock, LockNotAcquired

from .config import LOCK_RETRY_S, LOCK_WAIT_S
from .naive_lock import SetNxLock
from .shop import Buyer, Shop, select_stock

#: One buyer in this many of the ``deadlock`` scenario takes the locks in reverse order.
DEADLOCK_EVERY = 10


#: A checkout strategy: reserve ``shop.config.quantity`` for ``buyer`` and mark ``r``.
Strategy = Callable[[Shop, Reservation, Buyer], None]


def unsafe(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """Read-then-write: check a value read earlier, write a value computed in Python."""
    available = shop.read_stock()
    if not _in_stock(shop, r, available, work=True):
        return
    with shop.engine.begin() as conn:
        computed = _write_computed(conn, shop, buyer, available)
    r.success(old_stock=available, new_stock=computed)


def _write_computed(conn: Connection, shop: Shop, buyer: Buyer, available: int) -> int:
    computed = available - shop.config.quantity
    conn.execute(
        sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
        {"computed": computed, "sku": shop.sku},
    )
    shop.insert_order(conn, buyer, computed)
    return computed


def _in_stock(shop: Shop, r: Reservation, available: int, *, work: bool = False) -> bool:
    """Record the stock seen; ``False``, marked ``out_of_stock``, when it is too little.
    ``work``: the unsafe strategies' stale check, decided after the work on the value
    read before it."""
    r.stock_check(available)
    if work:
        shop.work()
    if available < shop.config.quantity:
        r.conflict("out_of_stock")
        return False
    return True


def check_then_decrement(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """Check a value read earlier, then decrement relatively without a guard: no update
    is lost, but the stock goes below zero."""
    if not _in_stock(shop, r, shop.read_stock(), work=True):
        return
    with shop.engine.begin() as conn:
        written = shop.decrement(conn)
        shop.insert_order(conn, buyer, written)
    r.success(old_stock=written + shop.config.quantity, new_stock=written)


def atomic(shop: Shop, r: Reservation, buyer: Buyer, event: bool = False) -> None:
    """The fix: one conditional ``UPDATE ... WHERE available_stock >= :qty`` and the order
    (with ``event``, also its outbox event in the same transaction)."""
    # The same app work as the other strategies, so latencies compare like with like; it
    # happens before the transaction, as an app would price the cart before reserving.
    shop.work()
    with shop.engine.begin() as conn:
        written = shop.decrement_if_available(conn)
        if written is None:
            conn.rollback()
            r.conflict("out_of_stock")
            return
        order_id = shop.insert_order(conn, buyer, written)
        if event:
            shop.insert_outbox_event(conn, order_id)
    r.success(old_stock=written + shop.config.quantity, new_stock=written)


def naive_lock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The usual hotfix: ``SET lock token NX PX ttl``, the unsafe read-then-write, ``DEL``;
    the TTL is shorter than the work, so the lock expires under its holder."""
    try:
        with _set_nx_lock(shop, shop.config.naive_lock_ttl_s, "naive"):
            _locked_checkout(shop, r, buyer, lambda: True)
    except LockNotAcquired:
        r.conflict("lock_not_acquired")


def for_update(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """Lock the row first (``SELECT ... FOR UPDATE``), check, write. SQLite has no ``FOR
    UPDATE``: there ``BEGIN IMMEDIATE`` takes the write lock before the read."""
    sqlite = shop.engine.dialect.name == "sqlite"
    with shop.begin_immediate() if sqlite else shop.engine.begin() as conn:
        available = select_stock(conn, shop.sku, for_update=not sqlite)
        if not _in_stock(shop, r, available):
            return
        shop.work()
        if sqlite:
            written = shop.decrement(conn)
            shop.insert_order(conn, buyer, written)
        else:
            written = _write_computed(conn, shop, buyer, available)
    r.success(old_stock=available, new_stock=written)


def redlock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The fix: an owned lock (the lab's :class:`SetNxLock` or pottery's ``Redlock``), a
    TTL far above the work, extended only while ours before the write. Under it runs the
    unsafe read-modify-write: the lock alone serialises the buyers."""
    try:
        if shop.config.redlock_impl == "pottery":
            _with_pottery_redlock(shop, r, buyer)
        else:
            lock = _set_nx_lock(shop, shop.config.redlock_ttl_s, "owned")
            with lock:
                _locked_checkout(shop, r, buyer, lock.extend)
    except LockNotAcquired:
        r.conflict("lock_not_acquired")


def _set_nx_lock(shop: Shop, ttl: float, release: Literal["naive", "owned"]) -> SetNxLock:
    return SetNxLock(
        shop.redis,
        shop.lock_key,
        name=shop.lock_name,
        ttl=ttl,
        release=release,
        blocking_timeout=LOCK_WAIT_S,
        retry_delay=LOCK_RETRY_S,
        sentry=shop.sentry,
    )


def _locked_checkout(
    shop: Shop, r: Reservation, buyer: Buyer, still_ours: Callable[[], bool]
) -> None:
    """Under a lock: read, check, work, then (if the lock is still ours) write the value
    computed from the read: only the lock keeps it from losing an update."""
    available = shop.read_stock()
    if not _in_stock(shop, r, available):
        return
    shop.work()
    if not still_ours():
        r.conflict("lock_timeout")
        return
    with shop.engine.begin() as conn:
        computed = _write_computed(conn, shop, buyer, available)
    r.success(old_stock=available, new_stock=computed)


def _with_pottery_redlock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    from pottery import ExtendUnlockedLock, QuorumNotAchieved, Redlock

    lock = InstrumentedRedlock(
        Redlock(
            key=shop.lock_key,
            masters={shop.redis},
            auto_release_time=shop.config.redlock_ttl_s,
            context_manager_timeout=LOCK_WAIT_S,
        ),
        name=shop.lock_name,
        # pottery waits up to 0.2 s between attempts; the lab's work is milliseconds.
        retry_delay=2 * LOCK_RETRY_S,
        sentry=shop.sentry,
    )

    def still_ours() -> bool:
        try:
            lock.extend()
        except ExtendUnlockedLock:
            return False
        return True

    try:
        with lock:
            _locked_checkout(shop, r, buyer, still_ours)
    except QuorumNotAchieved as exc:
        raise LockNotAcquired(shop.lock_name, LOCK_WAIT_S) from exc


def deadlock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """A bundle of two SKUs locked ``FOR UPDATE``, every tenth buyer in reverse order:
    the database aborts one transaction of each cycle (a ``deadlock`` conflict)."""
    first, second = (shop.sku, shop.second_sku)
    if buyer.number % DEADLOCK_EVERY == 0:
        first, second = second, first
    with shop.engine.begin() as conn:
        stock = {first: select_stock(conn, first, for_update=True)}
        shop.work()
        stock[second] = select_stock(conn, second, for_update=True)
        if not _in_stock(shop, r, min(stock.values())):
            return
        written = {sku: shop.decrement(conn, sku) for sku in (shop.sku, shop.second_sku)}
        order_id = shop.insert_order(conn, buyer, written[shop.sku])
        shop.insert_item(conn, order_id, shop.second_product_id, written[shop.second_sku])
    r.success(old_stock=written[shop.sku] + shop.config.quantity, new_stock=written[shop.sku])


#: Strategy name -> function, in the order of ``STRATEGY_NAMES``. The retry and stale-cache
#: scenarios are the atomic update; the driver adds the resubmits and the late cache.
STRATEGIES: dict[str, Strategy] = {
    "unsafe": unsafe,
    "check_then_decrement": check_then_decrement,
    "naive_lock": naive_lock,
    "atomic": atomic,
    "for_update": for_update,
    "redlock": redlock,
    "retry_no_key": atomic,
    "retry_idempotent": atomic,
    "stale_cache": atomic,
    # The atomic update with the order's outbox event (the driver's publisher stalls).
    "outbox": functools.partial(atomic, event=True),
    "deadlock": deadlock,
}
