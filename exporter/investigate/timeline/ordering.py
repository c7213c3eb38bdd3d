"""Putting the events of several inputs in timestamp order, in bounded memory."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain

from .limits import DEFAULT_REORDER_WINDOW, REORDER_BUFFER
from .model import Event


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

    def _reorder(self, stream: Iterable[Event]) -> Iterator[Event]:
        # Lines already in order (nearly all) wait in a FIFO run; only lines older than the
        # newest one seen go through the heap. Out comes the older head of the two (the
        # earlier line on a tie), once it is `window` seconds older than the newest line,
        # or when too many wait; the end of the stream (None) lets all out.
        run: deque[Event] = deque()
        heap: list[tuple[float, int, Event]] = []
        newest = -math.inf
        window, buffer = self.window, self.buffer
        for event in chain(stream, (None,)):
            if event is None:
                newest = math.inf
            elif event.ts >= newest:
                run.append(event)
                newest = event.ts
            else:
                heapq.heappush(heap, (event.ts, event.lineno, event))
            while run or heap:
                from_heap = bool(heap) and (not run or heap[0][:2] < (run[0].ts, run[0].lineno))
                head = heap[0][2] if from_heap else run[0]
                if head.ts > newest - window and len(run) + len(heap) <= buffer:
                    break
                yield heapq.heappop(heap)[2] if from_heap else run.popleft()

    def __iter__(self) -> Iterator[Event]:
        parts = [self._reorder(stream) for stream in self.streams]
        newest = -math.inf
        for event in heapq.merge(*parts, key=_order_key):
            if event.ts < newest:
                self.late += 1
            else:
                newest = event.ts
            yield event
