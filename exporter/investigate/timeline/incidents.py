"""Incidents: findings being built while the events stream by, rendered at the end.

Each detector of :mod:`.analysis` keeps only compact per-SKU state (:class:`Write`,
:class:`Check`) and opens an incident when it sees one; later events of the same
incident join it (up to :data:`~.model.FINDING_PARTICIPANTS`), and :meth:`Incident.finding`
writes the :class:`~.model.Finding` once the times can be formatted for the whole report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from .limits import FINDING_PARTICIPANTS
from .model import Finding, FindingKind, TimeFormat


class Write(NamedTuple):
    """A successful stock write (or a paid order), as little as the detectors need.

    The first writes remembered per idempotency key are held as one string each
    (:meth:`pack`), a fraction of the memory of the tuple and its values.
    """

    name: str | None
    frm: int | None
    to: int | None
    ts: float
    source: str
    lineno: int
    order_id: str | None

    @property
    def line(self) -> str:
        """Where it was logged, as ``source:lineno``."""
        return f"{self.source}:{self.lineno}"

    @property
    def qty(self) -> int:
        """The units the write took: ``from - to`` of a sale, else one."""
        frm, to = self.frm, self.to
        return frm - to if frm is not None and to is not None and frm > to else 1

    def pack(self, source_number: int) -> str:
        """The write as text, its source given by number (see :meth:`unpack`).

        ``repr()`` of a float reads back as the very same float; the name goes last, so
        that whatever it holds (spaces too) comes back whole. The order is not packed.
        """
        frm = "" if self.frm is None else self.frm
        to = "" if self.to is None else self.to
        return f"{self.ts!r} {source_number} {self.lineno} {frm} {to} {self.name}"

    @classmethod
    def unpack(cls, packed: str, sources: Sequence[str]) -> Write:
        """The write :meth:`pack` made ``packed`` of, ``sources`` naming its source.

        Example::

            >>> write = Write("R 1", 3, None, 0.1, "a.log", 7, None)
            >>> Write.unpack(write.pack(0), ["a.log"]) == write
            True
        """
        ts, number, lineno, frm, to, name = packed.split(" ", 5)
        return cls(
            name,
            int(frm) if frm else None,
            int(to) if to else None,
            float(ts),
            sources[int(number)],
            int(lineno),
            None,
        )

    def same_record(self, other: Write) -> bool:
        """Whether ``other`` is this very record seen again."""
        # The same line delivered twice (log shipper retry, overlapping rotated files).
        return (
            self.name == other.name
            and self.ts == other.ts
            and self.frm == other.frm
            and self.to == other.to
        )


class Check(NamedTuple):
    """A request's ``stock_check``: the value it read, opening its check-to-write window."""

    available: int | None
    ts: float
    source: str
    lineno: int

    @property
    def line(self) -> str:
        """Where it was logged, as ``source:lineno``."""
        return f"{self.source}:{self.lineno}"


def _names(names: Sequence[str], extra: int = 0) -> str:
    shown = list(names[:5])
    rest = len(names) - len(shown) + extra
    if rest:
        return f"{', '.join(shown)} and {rest} more"
    if len(shown) == 1:
        return shown[0]
    return f"{', '.join(shown[:-1])} and {shown[-1]}"


def _join_times(stamps: Sequence[float], fmt: TimeFormat, extra: int = 0) -> str:
    """``10:00:00.120/.121``: later times drop the part they share with the one before."""
    parts: list[str] = []
    previous = ""
    for ts in stamps[:5]:
        text = fmt(ts)
        dot = text.find(".")
        if previous and dot > 0 and text[:dot] == previous[:dot]:
            parts.append(text[dot:])
        else:
            parts.append(text)
        previous = text
    rest = len(stamps) - len(parts) + extra
    return "/".join(parts) + (f" (+{rest} more)" if rest else "")


def _unique(values: Iterable[str | None]) -> list[str]:
    return list(dict.fromkeys(value for value in values if value is not None))


class Incident:
    """A finding being built while the stream goes on; rendered at the end."""

    kind: FindingKind = "lost_update"

    def __init__(self, sku: str | None) -> None:
        self.sku = sku
        self.dropped = 0
        #: The SKU's restock count when the incident opened: a lost update and a stock
        #: below zero between the same two restocks are one oversell (see NegativeStock).
        self.epoch = 0
        #: For a lost update: the log shows a computed value written over another (a later
        #: read of the value it wrote, the SQL detector's unsafe read-modify-write).
        self.confirmed = False

    def keep(self, items: list[Any], item: object) -> None:
        """Add ``item`` to ``items`` up to ``FINDING_PARTICIPANTS``; count the others."""
        if len(items) < FINDING_PARTICIPANTS:
            items.append(item)
        else:
            self.dropped += 1

    def seen_after(self, name: str | None, ts: float) -> None:
        """Another request read, after this lost update's writes, the value it wrote: the
        computed value stayed written, so the writes overwrote each other."""
        writes = self.participants()
        if ts > max(write.ts for write in writes) and all(w.name != name for w in writes):
            self.confirmed = True

    def finding(self, fmt: TimeFormat) -> Finding:
        """The finding, its times written with ``fmt``."""
        raise NotImplementedError

    def participants(self) -> list[Write]:
        raise NotImplementedError

    def units(self) -> int:
        """The units of stock the incident is about (0: none sold wrongly)."""
        return 0

    def stamps(self) -> list[float]:
        """The times of its evidence."""
        return [write.ts for write in self.participants()]

    def _make(
        self,
        requests: list[str],
        detail: str,
        lines: list[str],
        more_orders: Iterable[str | None] = (),
        *,
        fmt: TimeFormat,
    ) -> Finding:
        orders = _unique([*(write.order_id for write in self.participants()), *more_orders])
        stamps = self.stamps()
        span = (min(stamps), max(stamps)) if stamps else None
        return Finding(
            self.kind,
            self.sku,
            requests,
            detail,
            lines,
            tuple(orders),
            self.units(),
            fmt(span[0]) if span else None,
            fmt(span[1]) if span else None,
            span,
        )


class _Writes(Incident):
    """An incident made of writes: the first two, then each new one up to
    ``FINDING_PARTICIPANTS`` (a line read twice, as from two copies of a log, is kept once)."""

    def __init__(self, sku: str | None, first: Write, second: Write) -> None:
        super().__init__(sku)
        self.writes = [first, second]

    def add(self, write: Write) -> None:
        if not any(write.same_record(old) for old in self.writes[-4:]):
            self.keep(self.writes, write)

    def participants(self) -> list[Write]:
        return self.writes

    def units(self) -> int:
        # Each write after the first sold a unit the stock never lost (a lost update), or
        # took its units (or its payment) once more (a duplicate execution).
        return sum(write.qty for write in self.writes[1:]) + self.dropped


class SameFrom(_Writes):
    """A lost update: writes on one SKU that all started from the same old value."""

    kind: FindingKind = "lost_update"

    def __init__(self, sku: str, frm: int, first: Write, second: Write) -> None:
        super().__init__(sku, first, second)
        self.frm = frm

    def finding(self, fmt: TimeFormat) -> Finding:
        writes = self.writes
        names = [write.name or "?" for write in writes]
        word = "both" if len(writes) + self.dropped == 2 else "all"
        targets = _unique(str(write.to) for write in writes if write.to is not None)
        wrote = f"from={self.frm}"
        if len(targets) == 1:
            wrote += f" to={targets[0]}"
        elif targets:
            wrote += f" (to={', '.join(targets)})"
        detail = (
            f"{_names(names, self.dropped)} {word} wrote {wrote} at "
            f"{_join_times([write.ts for write in writes], fmt, self.dropped)}"
        )
        return self._make(_unique(names), detail, [write.line for write in writes], fmt=fmt)


class Overwrite(Incident):
    """A lost update: a write over another request's write that its writer never read."""

    kind: FindingKind = "lost_update"

    def __init__(self, sku: str, previous: Write, write: Write, check: Check) -> None:
        super().__init__(sku)
        self.previous = previous
        self.write = write
        self.check = check

    def participants(self) -> list[Write]:
        return [self.previous, self.write]

    def finding(self, fmt: TimeFormat) -> Finding:
        previous, write, check = self.previous, self.write, self.check
        who, other = write.name or "?", previous.name or "?"
        read = f"available={check.available}" if check.available is not None else "the stock"
        detail = (
            f"{who} wrote from={write.frm} to={write.to} at {fmt(write.ts)} over {other}'s "
            f"write to={previous.to} at {fmt(previous.ts)}, which came after {who} read "
            f"{read} at {fmt(check.ts)}"
        )
        return self._make(
            _unique([other, who]), detail, [check.line, previous.line, write.line], fmt=fmt
        )

    def units(self) -> int:
        return self.previous.qty

    def stamps(self) -> list[float]:
        return [self.check.ts, self.previous.ts, self.write.ts]


class StaleRead(Incident):
    """Reads of a SKU that missed its latest write already logged."""

    kind: FindingKind = "stale_read"

    def __init__(self, sku: str, write: Write) -> None:
        super().__init__(sku)
        self.write = write
        self.reads: list[tuple[str | None, int, float, str, str | None]] = []

    def participants(self) -> list[Write]:
        return [self.write]

    def finding(self, fmt: TimeFormat) -> Finding:
        write, reads = self.write, self.reads
        names = [name or "?" for name, *_ in reads]
        values = _unique(str(available) for _, available, *_ in reads)
        what = "available=" + "/".join(values)
        verb = "read" if len(reads) + self.dropped == 1 else "all read"
        detail = (
            f"{_names(names, self.dropped)} {verb} {what} at "
            f"{_join_times([ts for _, _, ts, _, _ in reads], fmt, self.dropped)} after "
            f"{write.name or '?'} wrote to={write.to} at {fmt(write.ts)}"
        )
        return self._make(
            _unique([write.name, *names]),
            detail,
            [write.line, *(read[3] for read in reads)],
            (read[4] for read in reads),
            fmt=fmt,
        )

    def stamps(self) -> list[float]:
        return [self.write.ts, *(read[2] for read in self.reads)]


#: First letter of a key in the analyser's keys -> (key kind, action, how) of a
#: :class:`Duplicate` of it.
KEY_ROLES = {
    "R": ("idempotency_key", "reserved", ""),
    "r": ("payment_reference", "reserved", ""),
    "P": ("payment_reference", "paid", " (payment_callback result=paid)"),
    "p": ("idempotency_key", "paid", " (payment_callback result=paid)"),
    "O": ("payment_reference", "paid", " (order_paid)"),
    "o": ("idempotency_key", "paid", " (order_paid)"),
}


class Duplicate(_Writes):
    """One idempotency key or payment reference that reserved or paid more than once."""

    kind: FindingKind = "duplicate_execution"

    def __init__(self, sku: str | None, what: str, how: str, first: Write, second: Write) -> None:
        super().__init__(sku, first, second)
        self.what = what
        self.how = how

    def finding(self, fmt: TimeFormat) -> Finding:
        writes = self.writes
        count = len(writes) + self.dropped
        each = ", ".join(f"{write.name or '?'} at {fmt(write.ts)}" for write in writes[:5])
        if count > 5:
            each += f" and {count - 5} more"
        detail = f"{self.what} {count} times{self.how}: {each}"
        names = _unique(write.name for write in writes)
        return self._make(names, detail, [write.line for write in writes], fmt=fmt)


#: One line of evidence that the stock went below zero: who, the value, when, where, order.
Below = tuple[str | None, int, float, str, str | None]


class NegativeStock(Incident):
    """Oversell into negative stock: an ``inventory_negative`` line, or a write or a check
    below zero. The lost updates between the same two restocks were relative decrements
    and are folded in (:attr:`absorbed`); see docs/timeline.md."""

    kind: FindingKind = "oversell_negative_stock"

    def __init__(self, sku: str, epoch: int) -> None:
        super().__init__(sku)
        self.epoch = epoch
        self.below: list[Below] = []
        self.lowest = 0
        self.absorbed: list[SameFrom | Overwrite] = []

    def add(self, name: str | None, value: int, ts: float, line: str, order: str | None) -> None:
        self.lowest = min(self.lowest, value)
        self.keep(self.below, (name, value, ts, line, order))

    def participants(self) -> list[Write]:
        return [write for incident in self.absorbed for write in incident.participants()]

    def units(self) -> int:
        # Units sold beyond the stock there was.
        return -self.lowest

    def stamps(self) -> list[float]:
        return [*(below[2] for below in self.below), *(w.ts for w in self.participants())]

    def finding(self, fmt: TimeFormat) -> Finding:
        below = self.below
        names = [name or "?" for name, *_ in below]
        # Lines without a request (the SQL integration's, outside a request) name none.
        who = f"{_names(names, self.dropped)} at " if any(n for n, *_ in below) else ""
        count = len(below) + self.dropped
        detail = (
            f"the stock went below zero, down to {self.lowest}: "
            f"{count} {'line' if count == 1 else 'lines'} below zero ({who}"
            f"{_join_times([ts for _, _, ts, _, _ in below], fmt, self.dropped)})"
        )
        lines = [below_line for _, _, _, below_line, _ in below]
        writes = self.participants()
        if writes:
            unique = list({(w.name, w.ts, w.frm, w.to): w for w in writes}.values())
            froms = _unique(str(w.frm) for w in unique if w.frm is not None)
            start = f"from={'/'.join(froms)}" if froms else "from the stock they read"
            detail += (
                f"; {_names([w.name or '?' for w in unique])} wrote {start} at "
                f"{_join_times([w.ts for w in unique], fmt)}: relative decrements that each "
                "took a unit, not lost updates"
            )
            lines = _unique([*lines, *(w.line for w in unique)])
        requests = _unique([*(name for name, *_ in below), *(w.name for w in writes)])
        return self._make(requests, detail, lines, (b[4] for b in below), fmt=fmt)


class SoldBeyond(NegativeStock):
    """Oversell: the writes of a SKU sold more units (``sold``) than the highest stock read
    since its last restock (``top``); the writes past it are the evidence (see
    :mod:`.selling`)."""

    def __init__(self, sku: str, epoch: int, top: int, write: Write) -> None:
        super().__init__(sku, epoch)
        self.top = top
        self.sold = 0
        self.writes = [write]

    def participants(self) -> list[Write]:
        return [*self.writes, *super().participants()]

    def units(self) -> int:
        return self.sold - self.top

    def stamps(self) -> list[float]:
        return [write.ts for write in self.participants()]

    def finding(self, fmt: TimeFormat) -> Finding:
        writes = self.writes
        count = len(writes) + self.dropped
        who = _names([w.name or "?" for w in writes], self.dropped)
        detail = (
            f"the writes sold {self.sold} units where the stock read was at most {self.top}: "
            f"{self.units()} more than there was, the last {count} "
            f"{'write' if count == 1 else 'writes'} ({who} at "
            f"{_join_times([w.ts for w in writes], fmt, self.dropped)}) past it"
        )
        absorbed = super().participants()
        if absorbed:
            froms = _unique(str(w.frm) for w in absorbed if w.frm is not None)
            detail += (
                f"; writes from one value (from={'/'.join(froms[:5])}) were relative "
                "decrements or lost updates: the log shows no computed value written over "
                "another"
            )
        lines = _unique(w.line for w in self.participants())
        return self._make(_unique(w.name for w in self.participants()), detail, lines, fmt=fmt)


class UnsafeWrite(Incident):
    """stocksentry's SQL integration logged ``unsafe_read_modify_write``: the app wrote
    the stock a value it computed from a read taken without a lock, at one place in its
    code. On its own it sells nothing; with two such writers, a lost update."""

    kind: FindingKind = "unsafe_read_modify_write"

    def __init__(self, sku: str | None, code: str) -> None:
        super().__init__(sku)
        self.code = code
        self.lines: list[tuple[str | None, float, str]] = []

    def participants(self) -> list[Write]:
        return []

    def stamps(self) -> list[float]:
        return [ts for _, ts, _ in self.lines]

    def finding(self, fmt: TimeFormat) -> Finding:
        names = _unique(name for name, _, _ in self.lines)
        count = len(self.lines) + self.dropped
        who = f" by {_names(names)}" if names else ""
        detail = (
            f"{count} {'write' if count == 1 else 'writes'} of a value computed from an "
            f"unlocked read ({self.code}){who} at "
            f"{_join_times([ts for _, ts, _ in self.lines], fmt, self.dropped)}"
        )
        return self._make(names, detail, [line for _, _, line in self.lines], fmt=fmt)


#: One line of evidence that a writer's lock ran out: when, where, and what it says.
LockLine = tuple[float, str, str]


class LockExpiry(Incident):
    """Lock expiry: a lost update (:class:`SameFrom` or :class:`Overwrite`, the effect) one
    of whose writers logged its lock running out (the cause; see docs/timeline.md)."""

    kind: FindingKind = "lock_expiry"

    def __init__(self, lost: SameFrom | Overwrite, locks: list[LockLine]) -> None:
        super().__init__(lost.sku)
        self.lost = lost
        self.locks = locks

    def participants(self) -> list[Write]:
        return self.lost.participants()

    def units(self) -> int:
        return self.lost.units()

    def stamps(self) -> list[float]:
        return [*self.lost.stamps(), *(ts for ts, _, _ in self.locks)]

    def finding(self, fmt: TimeFormat) -> Finding:
        lost = self.lost.finding(fmt)
        said = _unique(text for _, _, text in self.locks)
        what = "; ".join(said[:3]) + (f" (+{len(said) - 3} more)" if len(said) > 3 else "")
        detail = f"{what}, and the writes were lost updates: {lost.detail}"
        lines = _unique([*(line for _, line, _ in self.locks), *lost.lines])
        return self._make(lost.requests, detail, lines, fmt=fmt)
