"""Putting the events of several inputs in timestamp order, in bounded memory."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from .limits import DEFAULT_REORDER_WINDOW, REORDER_BUFFER
from .model import Event

__all__ = ["OrderedEvents"]


def _order_key(event: Event) -> tuple[float, int, int]:
    return (event.ts, event.file_index, event.lineno)


class OrderedEvents:
    """Events of several inputs merged in timestamp order, in bounded memory.

    Each input is put back in order within ``window`` seconds (and at most
    ``buffer`` events held); inputs are then merged, ties going to the earlier input and
    line. An event that arrives later than that is passed on as soon as it is seen and
    counted in :attr:`late`.

    Example::

        >>> from stocksentry.exporter.investigate.timeline import read_events
        >>> a = read_events(["[10:00:02] k=1 b", "[10:00:01] k=1 a"], "a.log")
        >>> b = read_events(["[10:00:01.5] k=1 c"], "b.log", file_index=1)
        >>> [e.name for e in OrderedEvents([a, b])]
        ['a', 'c', 'b']
    """

    def __init__(
        self,
        streams: Sequence[Iterable[Event]],
        window: float = DEFAULT_REORDER_WINDOW,
        buffer: int = REORDER_BUFFER,
    ) -> None:
        self.streams = streams
        self.window = window
        self.buffer = max(buffer, 1)
        #: Events that came out of order by more than the window allowed.
        self.late = 0

    def _reorder(self, stream: Iterable[Event], *, count_late: bool) -> Iterator[Event]:
        # Lines already in order (nearly all) wait in a FIFO run; only lines older than the
        # newest one seen go through the heap. Out comes the smaller head of the two, once
        # it is `window` seconds older than the newest line, or when too many wait.
        # With `count_late` (a single input: no merge after this), the events that come
        # out older than one already out are counted here, saving a generator per event.
        run: deque[Event] = deque()
        heap: list[tuple[float, int, Event]] = []
        push, pop = heapq.heappush, heapq.heappop
        window, buffer = self.window, self.buffer
        newest = -math.inf
        # The newest timestamp passed on (only kept with count_late).
        out = -math.inf if count_late else math.inf
        waiting = 0
        for event in stream:
            ts = event.ts
            if ts >= newest:
                run.append(event)
                newest = ts
            else:
                push(heap, (ts, event.lineno, event))
            waiting += 1
            limit = newest - window
            if not heap:
                # Nothing out of order waits (nearly always): out of the run, in order,
                # what is old enough or beyond the buffer.
                while run and (waiting > buffer or run[0].ts <= limit):
                    head = run.popleft()
                    waiting -= 1
                    head_ts = head.ts
                    if head_ts >= out:
                        out = head_ts
                    elif count_late:
                        self.late += 1
                    yield head
                continue
            while waiting:
                if heap:
                    head_ts, head_line, head = heap[0]
                    if run:
                        first = run[0]
                        if first.ts < head_ts or (
                            first.ts == head_ts and first.lineno < head_line
                        ):
                            head, head_ts = first, first.ts
                else:
                    head = run[0]
                    head_ts = head.ts
                if head_ts > limit and waiting <= buffer:
                    break
                if run and head is run[0]:
                    run.popleft()
                else:
                    pop(heap)
                waiting -= 1
                if head_ts >= out:
                    out = head_ts
                elif count_late:
                    self.late += 1
                yield head
        while run or heap:
            if heap and (not run or (heap[0][0], heap[0][1]) < (run[0].ts, run[0].lineno)):
                head = pop(heap)[2]
            else:
                head = run.popleft()
            if head.ts >= out:
                out = head.ts
            elif count_late:
                self.late += 1
            yield head

    def __iter__(self) -> Iterator[Event]:
        if len(self.streams) == 1:
            return self._reorder(self.streams[0], count_late=True)
        return self._merged()

    def _merged(self) -> Iterator[Event]:
        parts = [self._reorder(stream, count_late=False) for stream in self.streams]
        merged = heapq.merge(*parts, key=_order_key)
        newest = -math.inf
        for event in merged:
            ts = event.ts
            if ts < newest:
                self.late += 1
            else:
                newest = ts
            yield event
