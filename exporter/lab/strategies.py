"""The checkout strategies, unsafe first, each one function ``(shop, reservation, buyer)``.

Adding a strategy is one function here and its name in
:data:`~stocksentry.exporter.lab.config.STRATEGY_NAMES` and :data:`STRATEGIES`; it must
mark the reservation with ``success`` or ``conflict``. docs/demo.md tells what each does
and what goes wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from stocksentry.instrumentation import Reservation
from stocksentry.instrumentation.locks import InstrumentedRedlock, LockNotAcquired

from .config import LOCK_RETRY_S, LOCK_WAIT_S
from .naive_lock import SetNxLock
from .shop import Buyer, Shop, select_stock

#: One buyer in this many of the ``deadlock`` scenario takes the locks in reverse order.
DEADLOCK_EVERY = 10


class Strategy(Protocol):
    """A checkout strategy: reserve ``shop.config.quantity`` for ``buyer`` and mark ``r``."""

    def __call__(self, shop: Shop, r: Reservation, buyer: Buyer, /) -> None: ...


def unsafe(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """Read-then-write: check a value read earlier, write a value computed in Python.

    Two buyers that read the same stock both write ``stock - qty``: one update is lost and
    one unit is sold twice.
    """
    available = _read_before_work(shop, r)
    if available is None:
        return
    with shop.engine.begin() as conn:
        computed = _write_computed(conn, shop, buyer, available)
    r.success(old_stock=available, new_stock=computed)


def _write_computed(conn: Connection, shop: Shop, buyer: Buyer, available: int) -> int:
    """Write ``available - qty`` as a value computed in Python, and the order."""
    computed = available - shop.config.quantity
    conn.execute(
        sa.text("UPDATE products SET available_stock = :computed WHERE sku = :sku"),
        {"computed": computed, "sku": shop.sku},
    )
    shop.insert_order(conn, buyer, computed)
    return computed


def _read_before_work(shop: Shop, r: Reservation) -> int | None:
    """Read the stock, do the app's work, then decide on the value read before it (the
    stale check of the unsafe strategies); ``None`` when refused as ``out_of_stock``."""
    available = shop.read_stock()
    r.stock_check(available)
    shop.work()
    if available < shop.config.quantity:
        r.conflict("out_of_stock")
        return None
    return available


def _in_stock(shop: Shop, r: Reservation, available: int) -> bool:
    """Record the stock seen; ``False``, marked ``out_of_stock``, when it is too little."""
    r.stock_check(available)
    if available < shop.config.quantity:
        r.conflict("out_of_stock")
        return False
    return True


def check_then_decrement(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """Check a value read earlier, then decrement relatively without a guard.

    No update is lost, but every buyer who passed the check decrements: stock goes below
    zero and each such write counts in ``stock_inventory_negative_total``.
    """
    if _read_before_work(shop, r) is None:
        return
    with shop.engine.begin() as conn:
        written = shop.decrement(conn)
        shop.insert_order(conn, buyer, written)
    r.success(old_stock=written + shop.config.quantity, new_stock=written)


def atomic(shop: Shop, r: Reservation, buyer: Buyer, event: bool = False) -> None:
    """The fix: one conditional ``UPDATE ... WHERE available_stock >= :qty`` and the order
    (and with ``event`` the order's outbox event, in the same transaction).

    The database checks and writes in one statement under the row lock; a buyer whose
    update matched no row is refused as ``out_of_stock``. Sells exactly the stock.
    """
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


def outbox(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The atomic update with the order's outbox event; the publisher that sends the
    events on stalls part-way (the driver's), so the outbox lag grows."""
    atomic(shop, r, buyer, event=True)


def naive_lock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The usual hotfix: ``SET lock token NX PX ttl``, the unsafe read-then-write, ``DEL``.

    The TTL is shorter than the work, as a 5 s lock taken around 6 s of work: the lock
    expires under its holder, a second buyer gets it and reads the same stock, and the
    first one's ``DEL`` deletes the second one's lock; :class:`SetNxLock` counts both.
    """
    try:
        with _set_nx_lock(shop, shop.config.naive_lock_ttl_s, "naive"):
            _locked_checkout(shop, r, buyer, lambda: True)
    except LockNotAcquired:
        r.conflict("lock_not_acquired")


def for_update(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """A transaction that locks the row first: ``SELECT ... FOR UPDATE``, check, write.

    The next buyer's ``SELECT ... FOR UPDATE`` waits for this transaction to end, so each
    one reads the stock the previous one wrote. On SQLite, which has no ``FOR UPDATE``,
    ``BEGIN IMMEDIATE`` takes the write lock before the read and the write is the relative
    decrement (the lock, not the statement, makes it safe). Sells exactly the stock.
    """
    if shop.is_sqlite:
        with shop.begin_immediate() as conn:
            available = select_stock(conn, shop.sku)
            if not _in_stock(shop, r, available):
                return
            shop.work()
            written = shop.decrement(conn)
            shop.insert_order(conn, buyer, written)
        r.success(old_stock=available, new_stock=written)
        return
    with shop.engine.begin() as conn:
        available = select_stock(conn, shop.sku, for_update=True)
        if not _in_stock(shop, r, available):
            return
        shop.work()
        computed = _write_computed(conn, shop, buyer, available)
    r.success(old_stock=available, new_stock=computed)


def redlock(shop: Shop, r: Reservation, buyer: Buyer) -> None:
    """The fix: an owned lock (token), retries with jitter, release only if owned.

    The lab's :class:`SetNxLock` with the compare-and-delete release, or pottery's
    ``Redlock`` (``redlock_impl``). The TTL is far above the work and the lock is extended
    (only while ours) before the write. Under it the checkout is the unsafe
    read-modify-write: the lock serialises the buyers, and the SQL detector, which sees
    it still valid at the write, does not count it.
    """
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
    """The lab's ``SET NX`` lock on the shop's key, waiting as every lock strategy does."""
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
    computed from the read, not a relative decrement: only the lock keeps it from losing
    an update."""
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
    """A bundle of two SKUs, locked with ``SELECT ... FOR UPDATE`` in opposite orders.

    Every tenth buyer takes the locks in reverse, with the app's work between the two:
    the database aborts one transaction of each cycle (SQLSTATE 40P01, InnoDB error 1213),
    counted as a ``deadlock`` conflict. The others sell the bundle: never oversold.
    """
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


#: Strategy name -> function, in the order of ``names.STRATEGY_NAMES`` (unsafe ones first).
#: The retry and stale-cache scenarios are the atomic update; the driver adds the
#: resubmits and the late cache around it.
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
    "outbox": outbox,
    "deadlock": deadlock,
}
