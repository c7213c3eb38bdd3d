"""The detectors and the cause each finding names (see docs/timeline.md, "The detectors").

Events come in timestamp order (:class:`~.ordering.OrderedEvents`) and each detector keeps
only compact per-SKU state (:class:`~.selling.SkuState`).
"""

from __future__ import annotations

import functools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from .incidents import (
    KEY_ROLES,
    Check,
    Duplicate,
    Incident,
    LockExpiry,
    LockLine,
    NegativeStock,
    Overwrite,
    SameFrom,
    SoldBeyond,
    StaleRead,
    UnsafeWrite,
    Write,
)
from .limits import (
    DEFAULT_LIMIT,
    DEFAULT_REORDER_WINDOW,
    MAX_GROUPS,
    MAX_KEYS,
    OPEN_CHECKS,
    RECENT_FROMS,
)
from .model import (
    AVAILABLE,
    ERROR,
    FROM,
    HELD_S,
    INVENTORY_NEGATIVE_EVENT,
    LOCK,
    LOCK_EXPIRED_EVENT,
    LOCK_EXPIRED_REASON,
    LOCK_NOT_OWNED_EVENT,
    NEGATIVE_STOCK,
    ORDER_PAID_EVENT,
    PAID,
    PAYMENT_CALLBACK_EVENT,
    REASON,
    RESULT,
    RMW_CODE,
    RMW_KEY,
    RMW_REASON,
    STOCK,
    STOCK_CHECK_EVENT,
    STOCK_UPDATE_EVENT,
    SUCCESS,
    TO,
    TTL_S,
    UNSAFE_RMW_EVENT,
    Event,
    Report,
    TimeFormat,
    summarise,
)
from .ordering import OrderedEvents
from .selling import SkuState, as_int, truthy
from .times import format_time

#: The lock events that tell of a lease running out (the SQL detector's only with its
#: "lock expired" reason), and how many of them are kept per request.
_LOCK_EVENTS = frozenset({LOCK_EXPIRED_EVENT, LOCK_NOT_OWNED_EVENT, UNSAFE_RMW_EVENT})
_LOCK_LINES = 3


class _Analyser:
    def __init__(
        self,
        *,
        limit: int,
        max_groups: int,
        skus: frozenset[str] | None,
        order: str | None,
        request: str | None,
        max_keys: int,
    ) -> None:
        self.max_groups = max_groups
        self.sku_filter = skus
        self.order_filter = order
        self.request_filter = request
        self.report = Report(keys_limit=max_keys, limit=limit)
        self.state: dict[str, SkuState] = {}
        #: (SKU, code) -> the SQL detector's unsafe read-modify-writes there.
        self.unsafe: dict[tuple[str | None, str], UnsafeWrite] = {}
        #: (SKU, restock count) where the SQL detector saw a computed value written, and
        #: where the checks fit relative decrements (see SkuState.relative).
        self.computed: set[tuple[str, int]] = set()
        self.relative: set[tuple[str | None, int]] = set()
        #: Ordered, so that the oldest open window is dropped in O(1) (``popitem``).
        self.checks: OrderedDict[tuple[str, str], Check] = OrderedDict()
        #: "<role letter><SKU's number>:<key>" -> the first write with that key (packed,
        #: see :meth:`Write.pack`, unless it names an order), or the duplicate; the oldest
        #: forgotten beyond ``max_keys``.
        self.keys: OrderedDict[str, str | Write | Duplicate] = OrderedDict()
        #: Each SKU's number in those keys, as text (``""``: no SKU).
        self.sku_tags: dict[str | None, str] = {None: ""}
        #: The inputs' names and numbers, so that a packed write names its input by number.
        self.source_numbers: dict[str, int] = {}
        self.keep_orders = order is not None
        self.incidents: list[Incident] = []
        self.order_requests: set[str] = set()
        #: The first and the last dated time seen (their days, at the end, say whether
        #: the report shows dates).
        self.min_ts = math.inf
        self.max_ts = -math.inf
        #: Request -> what the log said of its lock running out (bounded like ``checks``).
        #: Each line with the SKU it named (``None``: a lock event without one).
        self.locks: OrderedDict[str, list[tuple[str | None, LockLine]]] = OrderedDict()
        #: The detector of each event name.
        self.detector_of: Callable[[str], Callable[[Event], None] | None] = {
            STOCK_CHECK_EVENT: self._stock_check,
            STOCK_UPDATE_EVENT: self._stock_update,
            PAYMENT_CALLBACK_EVENT: self._paid,
            ORDER_PAID_EVENT: self._paid,
            INVENTORY_NEGATIVE_EVENT: self._inventory_negative,
            **dict.fromkeys(_LOCK_EVENTS, self._lock),
        }.get

    # --- per event ---

    def feed(self, event: Event) -> None:
        """Run the event's detector, and keep it in its SKU's and order's timelines."""
        if self.sku_filter is not None and event.sku not in self.sku_filter:
            return
        report = self.report
        report.events += 1
        if event.dated and event.has_time:
            ts = event.ts
            if ts > self.max_ts:
                self.max_ts = ts
            if ts < self.min_ts:
                self.min_ts = ts
        detector = self.detector_of(event.name)
        if detector is not None:
            report.stock_events += 1
            detector(event)
        wanted = self.request_filter
        if wanted is not None and wanted not in (
            event.request_id,
            event.idempotency_key,
            event.request,
        ):
            return
        order = self.order_filter
        if order is not None:
            if event.order_id != order:
                return
            if event.request is not None:
                self.order_requests.add(event.request)
        if event.sku is not None:
            self._group(report.skus, report.skus_more, event.sku, event)
        if event.order_id is not None:
            self._group(report.orders, report.orders_more, event.order_id, event)

    def _inventory_negative(self, event: Event) -> None:
        stock = as_int(event.fields.get(NEGATIVE_STOCK))
        if stock is not None and stock < 0:
            self._below(event, stock)

    def _group(
        self, groups: dict[str, list[Event]], more: dict[str, int], key: str, event: Event
    ) -> None:
        rows = groups.get(key)
        if rows is None:
            if self.max_groups and len(groups) >= self.max_groups:
                self.report.ungrouped_events += 1
                return
            rows = groups[key] = []
        limit = self.report.limit
        if limit and len(rows) >= limit:
            more[key] = more.get(key, 0) + 1
        else:
            rows.append(event)

    def _sku(self, sku: str) -> SkuState:
        state = self.state.get(sku)
        if state is None:
            state = self.state[sku] = SkuState()
        return state

    def _stock_check(self, event: Event) -> None:
        sku = event.sku
        if sku is None:
            return
        fields = event.fields
        available = as_int(fields[AVAILABLE] if AVAILABLE in fields else fields.get(STOCK))
        if available is not None and available < 0:
            self._below(event, available)
        request = event.request
        state = self.state.get(sku)
        if available is not None:
            if state is None:
                state = self.state[sku] = SkuState()
            top = state.top
            if top is None or available > top:
                state.top = available
            elif state.lost:
                # Only an epoch with a lost update needs its checks weighed.
                state.check(available, request, event.ts)
        last = state.last if state is not None else None
        if request is not None:
            if last is not None and last.name == request and last.ts == event.ts:
                # The request's own write, logged in the same instant: no window to open.
                return
            checks = self.checks
            key = (sku, request)
            checks.pop(key, None)
            checks[key] = Check(available, event.ts, event.source, event.lineno)
            if len(checks) > OPEN_CHECKS:
                checks.popitem(last=False)
        if (
            state is None
            or last is None
            or available is None
            or last.to is None
            or available == last.to
            or (request is not None and last.name == request)
            or event.ts == last.ts
        ):
            # Same value, own write, or a tie: a read logged in the same instant as the
            # write is not ordered against it by the log, so it is not called stale.
            return
        # Older means on the side the write came from (above it, for a sale); a value on
        # the other side is newer: a write whose line has not been read yet.
        decreasing = last.frm is None or last.frm >= last.to
        if (available > last.to) != decreasing:
            return
        incident = state.stale
        if incident is None:
            incident = state.stale = StaleRead(sku, last)
            self.incidents.append(incident)
        incident.keep(incident.reads, (request, available, event.ts, event.line, event.order_id))

    def _stock_update(self, event: Event) -> None:
        sku = event.sku
        if sku is None:
            return
        fields = event.fields
        request = event.request
        check = self.checks.pop((sku, request), None) if request is not None else None
        success = truthy(fields.get(SUCCESS))
        if success is None:
            success = REASON not in fields and ERROR not in fields
        if not success:
            return
        frm, to = as_int(fields.get(FROM)), as_int(fields.get(TO))
        if frm is None and check is not None:
            frm = check.available
        order_id = event.order_id if self.keep_orders else None
        write = Write(request, frm, to, event.ts, event.source, event.lineno, order_id)
        state = self._sku(sku)
        if to is not None and to < 0:
            self._below(event, to)
        if event.idempotency_key is not None:
            self._count("R", event.idempotency_key, sku, write)
        if event.payment_reference is not None:
            self._count("r", event.payment_reference, sku, write)

        group: SameFrom | None = None
        if frm is not None:
            top = state.top
            if top is None or frm > top:
                state.top = top = frm
            froms = state.froms
            seen = froms.pop(frm, None)
            if seen is None:
                froms[frm] = write
                if len(froms) > RECENT_FROMS:
                    del froms[next(iter(froms))]
            elif isinstance(seen, SameFrom):
                seen.add(write)
                froms[frm] = group = seen
            elif seen.same_record(write):
                froms[frm] = seen
                return
            else:
                group = SameFrom(sku, frm, seen, write)
                group.epoch = state.epoch
                self.incidents.append(group)
                froms[frm] = group
            if group is not None and to is not None:
                state.lost[to] = group
            if to is not None:
                if to > frm:
                    # A restock: values below it may legitimately be written from again,
                    # and a stock below zero after it is another oversell.
                    if state.relative:
                        self.relative.add((sku, state.epoch))
                    state.restock(to)
                elif to < frm:
                    sold = state.sold = state.sold + frm - to
                    if sold > top:
                        beyond = state.sold_past(sku, write)
                        if beyond is not None:
                            self.incidents.append(beyond)

        last = state.last
        if last is not None and frm is not None and to is not None and last.to is not None:
            chained_before = last.frm is not None and to == last.frm and frm != last.to
            if (
                group is None
                and check is not None
                and last.name != request
                and last.ts >= check.ts
                and frm != last.to
                and not chained_before
            ):
                overwrite = Overwrite(sku, last, write, check)
                overwrite.epoch = state.epoch
                self.incidents.append(overwrite)
                state.lost[to] = overwrite
            if chained_before:
                # Logged after a write that started from its result: the later state stays.
                return
        state.last = write
        state.stale = None

    def _below(self, event: Event, value: int) -> None:
        """Evidence that the stock of the event's SKU went below zero."""
        sku = event.sku
        if sku is None:
            return
        state = self._sku(sku)
        incident = state.negative
        if incident is None:
            incident = state.negative = NegativeStock(sku, state.epoch)
            self.incidents.append(incident)
        incident.add(event.request, value, event.ts, event.line, event.order_id)

    def _lock(self, event: Event) -> None:
        """Remember what the log says of a request's lock running out under it; the SQL
        detector's unsafe read-modify-write is also a finding of its own."""
        request = event.request
        if event.name == UNSAFE_RMW_EVENT:
            self._unsafe(event)
        if request is None:
            return
        fields = event.fields
        lock = fields.get(LOCK)
        name = f"the lock {lock}" if isinstance(lock, str) and lock else "its lock"
        if event.name == LOCK_EXPIRED_EVENT:
            held, ttl = fields.get(HELD_S), fields.get(TTL_S)
            text = f"{name} expired while {request} held it"
            if isinstance(held, int | float) and isinstance(ttl, int | float):
                text += f" (held {held:g} s, ttl {ttl:g} s)"
        elif event.name == LOCK_NOT_OWNED_EVENT:
            text = f"{request} released {name}, no longer its own"
        else:
            reason = fields.get(RMW_REASON)
            if not isinstance(reason, str) or LOCK_EXPIRED_REASON not in reason:
                return
            text = f"{request} wrote under {name}: {reason}"
        locks = self.locks
        lines = locks.pop(request, None) or []
        if len(lines) < _LOCK_LINES:
            lines.append((event.sku, (event.ts, event.line, text)))
        locks[request] = lines
        if len(locks) > OPEN_CHECKS:
            locks.popitem(last=False)

    def _unsafe(self, event: Event) -> None:
        fields = event.fields
        sku = event.sku
        if sku is None:
            key = fields.get(RMW_KEY)
            sku = key if isinstance(key, str) else None
        code = fields.get(RMW_CODE)
        where = code if isinstance(code, str) and code else "code not logged"
        incident = self.unsafe.get((sku, where))
        if incident is None:
            incident = self.unsafe[(sku, where)] = UnsafeWrite(sku, where[:200])
            self.incidents.append(incident)
        incident.keep(incident.lines, (event.request, event.ts, event.line))
        if sku is not None:
            self.computed.add((sku, self._sku(sku).epoch))

    def _paid(self, event: Event) -> None:
        """An order paid: a payment callback that took the money, or ``order_paid``."""
        callback = event.name == PAYMENT_CALLBACK_EVENT
        if callback and event.fields.get(RESULT) != PAID:
            return
        order_id = event.order_id
        name = event.request_id or event.idempotency_key or event.trace_id or order_id
        if not self.keep_orders:
            order_id = None
        write = Write(name, None, None, event.ts, event.source, event.lineno, order_id)
        sku = event.sku
        if event.payment_reference is not None:
            self._count("P" if callback else "O", event.payment_reference, sku, write)
        if event.idempotency_key is not None:
            self._count("p" if callback else "o", event.idempotency_key, sku, write)

    def _count(self, role: str, value: str, sku: str | None, write: Write) -> None:
        """Remember the first write of ``value`` (an idempotency key or payment reference,
        by ``role``: see ``KEY_ROLES``) on ``sku``; open or extend a duplicate after it."""
        tag = self.sku_tags.get(sku)
        if tag is None:
            tag = self.sku_tags[sku] = str(len(self.sku_tags))
        key = f"{role}{tag}:{value}"
        # Up to max_keys first writes are held, and most are never looked at again: one
        # string each (a write naming an order, for --order, stays a tuple).
        packed: str | Write = write
        if write.name is not None and write.order_id is None:
            numbers = self.source_numbers
            packed = write.pack(numbers.setdefault(write.source, len(numbers)))
        keys = self.keys
        first = keys.get(key)
        if first is None:
            keys[key] = packed
            if len(keys) > self.report.keys_limit:
                keys.popitem(last=False)
                self.report.keys_forgotten += 1
            return
        if isinstance(first, Duplicate):
            first.add(write)
            return
        if isinstance(first, str):
            first = Write.unpack(first, list(self.source_numbers))
        if not first.same_record(write):
            kind, action, how = KEY_ROLES[role]
            incident = Duplicate(sku, f"{kind}={value} {action}", how, first, write)
            self.incidents.append(incident)
            keys[key] = incident

    # --- the end ---

    def finish(self) -> Report:
        report = self.report
        # Floor division keeps the order of the times: the days of the first and the last.
        min_day, max_day = self.min_ts // 86400, self.max_ts // 86400
        report.show_date = max_day > min_day
        if max_day == min_day:
            report.day = time.strftime("%Y-%m-%d", time.gmtime(min_day * 86400))
        fmt: TimeFormat = functools.partial(
            format_time, dated=max_day >= min_day, with_date=report.show_date
        )
        findings = [incident.finding(fmt) for incident in self._causes()]
        if self.request_filter is not None:
            findings = [f for f in findings if self.request_filter in f.requests]
        if self.order_filter is not None:
            order, related = self.order_filter, self.order_requests
            findings = [f for f in findings if order in f.orders or related & set(f.requests)]
        report.findings = findings
        report.summary = summarise(findings, fmt)
        return report

    def _causes(self) -> list[Incident]:
        """The incidents, each under its cause.

        A lost update on a SKU that was oversold before the next restock (its stock went
        below zero, or its writes sold more than the stock read) is the oversell's
        (:class:`NegativeStock`, :class:`SoldBeyond`), shown where the first of them was,
        unless the log shows a computed value written over another (a later read of the
        value it wrote, an unsafe read-modify-write of the SKU). A lost update one of
        whose writers logged its lock running out is a lock expiry.
        """
        relative = self.relative
        relative.update((sku, state.epoch) for sku, state in self.state.items() if state.relative)
        computed = self.computed
        negatives: dict[tuple[str | None, int], NegativeStock] = {}
        lost: set[tuple[str | None, int]] = set()
        for incident in self.incidents:
            key = (incident.sku, incident.epoch)
            if isinstance(incident, SoldBeyond):
                continue
            if isinstance(incident, NegativeStock):
                negatives[key] = incident
            elif isinstance(incident, SameFrom | Overwrite):
                lost.add(key)
        hidden: set[int] = set()
        for incident in self.incidents:
            if isinstance(incident, SoldBeyond):
                key = (incident.sku, incident.epoch)
                if key in negatives or (key in lost and key not in relative):
                    # The same oversell with its stock seen below zero; or lost updates,
                    # whose units are the ones sold past the stock.
                    hidden.add(id(incident))
                else:
                    negatives[key] = incident
        shown: set[int] = set(hidden)
        out: list[Incident] = []
        for incident in self.incidents:
            if isinstance(incident, SameFrom | Overwrite):
                key = (incident.sku, incident.epoch)
                negative = negatives.get(key)
                overwrote = incident.confirmed or key in computed
                if negative is not None and not (overwrote and key in relative):
                    negative.absorbed.append(incident)
                    incident = negative
                else:
                    locks = self._lock_lines(incident)
                    if locks:
                        incident = LockExpiry(incident, locks)
            if id(incident) not in shown:
                shown.add(id(incident))
                out.append(incident)
        return out

    def _lock_lines(self, incident: SameFrom | Overwrite) -> list[LockLine]:
        locks = self.locks
        lines: list[LockLine] = []
        sku = incident.sku
        for name in dict.fromkeys(write.name for write in incident.participants()):
            if name is not None and name in locks:
                # A request id of another SKU's lock (another file's R1) is another request.
                lines.extend(line for where, line in locks[name] if where in (None, sku))
        return lines


def analyse(
    events: Iterable[Event],
    *,
    limit: int = DEFAULT_LIMIT,
    skus: Iterable[str] | None = None,
    order: str | None = None,
    request: str | None = None,
    reorder_window: float | None = DEFAULT_REORDER_WINDOW,
    max_groups: int = MAX_GROUPS,
    max_keys: int = MAX_KEYS,
) -> Report:
    """Run the detectors over ``events`` and keep the timelines to show.

    Events are first put in timestamp order within ``reorder_window`` seconds (``None``:
    trust the order given, as :class:`OrderedEvents` output is). ``skus`` restricts the
    whole analysis to those SKUs; ``order`` and ``request`` keep only that order's or
    request's events in the timelines and only the findings that involve it. ``limit``
    events are kept per SKU and per order (0: all), for at most ``max_groups`` of each;
    the first use of at most ``max_keys`` idempotency keys and payment references is
    remembered for the duplicate-execution rule (the oldest are forgotten beyond that).

    Example::

        >>> log = [
        ...     '{"event": "stock_update", "sku": "A", "from": 3, "to": 2, "success": true,'
        ...     ' "idempotency_key": "K1", "request_id": "R1", "ts": "2026-11-29T10:00:00Z"}',
        ...     '{"event": "stock_update", "sku": "A", "from": 2, "to": 1, "success": true,'
        ...     ' "idempotency_key": "K1", "request_id": "R1b", "ts": "2026-11-29T10:00:02Z"}',
        ... ]
        >>> from stocksentry.exporter.investigate.timeline import read_events
        >>> report = analyse(read_events(log))
        >>> [(f.kind, f.requests) for f in report.findings]
        [('duplicate_execution', ['R1', 'R1b'])]
        >>> report.findings[0].detail
        'idempotency_key=K1 reserved 2 times: R1 at 10:00:00.000, R1b at 10:00:02.000'
    """
    analyser = _Analyser(
        limit=max(limit, 0),
        max_groups=max(max_groups, 0),
        skus=frozenset(skus) if skus is not None else None,
        order=order,
        request=request,
        max_keys=max(max_keys, 1),
    )
    ordered: Iterable[Event] = events
    if reorder_window is not None and not isinstance(events, OrderedEvents):
        ordered = OrderedEvents([events], reorder_window)
    feed = analyser.feed
    for event in ordered:
        feed(event)
    report = analyser.finish()
    if isinstance(ordered, OrderedEvents):
        report.late_events = ordered.late
    return report
