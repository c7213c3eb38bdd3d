"""Live progress of a lab run: a bar per strategy on a terminal, one line elsewhere."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TextIO

#: How often live progress is refreshed.
PROGRESS_INTERVAL_S = 0.1
#: The terminal width the lab's output keeps within.
WIDTH = 80


@dataclass(frozen=True, slots=True)
class Progress:
    strategy: str
    done: int
    total: int
    sold: int
    conflicts: int
    errors: int
    elapsed_s: float


class ProgressSink(Protocol):
    """``start`` once the database is ready, then per strategy ``update`` now and then and
    ``finish`` at its end."""

    def start(self, database: str) -> None: ...

    def update(self, progress: Progress) -> None: ...

    def finish(self, progress: Progress) -> None: ...


class LiveProgress:
    """One progress bar per strategy (rich) on a TTY; elsewhere one line per finished
    strategy, so logs do not fill with redraws. :meth:`close` gives the terminal back."""

    def __init__(
        self,
        stream: TextIO,
        strategies: Sequence[str],
        *,
        total: int,
        header: Sequence[str] = (),
        title: str = "flash-sale lab",
        unit: str = "buyers",
    ) -> None:
        self._stream = stream
        self._title = title
        self._unit = unit
        self._header = tuple(header)
        try:
            self._tty = stream.isatty()
        except (AttributeError, ValueError):
            self._tty = False
        if not self._tty:
            return
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn
        from rich.progress import Progress as Bars

        self._console = Console(file=stream, width=min(WIDTH, Console(file=stream).width))
        self._bars = Bars(
            TextColumn("{task.description:<20}"),
            BarColumn(bar_width=20),
            TextColumn("{task.completed:>5.0f}/{task.total:<5.0f}"),
            TextColumn("{task.fields[sold]}"),
            TextColumn("{task.fields[secs]}"),
            console=self._console,
            transient=False,
            refresh_per_second=8,
        )
        self._tasks = {
            name: self._bars.add_task(name, total=total, start=False, sold="", secs="")
            for name in strategies
        }

    def start(self, database: str) -> None:
        # Written only once the database answered, so a failed connection stays one line.
        lines = (*self._header, f"{self._title} on {database}:")
        if not self._tty:
            self._stream.write("".join(line + "\n" for line in lines))
            self._stream.flush()
            return
        for line in lines:
            self._console.print(line, soft_wrap=True, highlight=False)
        self._bars.start()

    def update(self, p: Progress) -> None:
        if not self._tty:
            return
        task = self._tasks[p.strategy]
        self._bars.start_task(task)
        sold, secs = f"sold {p.sold:>5}", f"{p.elapsed_s:5.1f} s"
        self._bars.update(task, total=p.total, completed=p.done, sold=sold, secs=secs)

    def finish(self, p: Progress) -> None:
        if self._tty:
            self.update(p)
            self._bars.stop_task(self._tasks[p.strategy])
            return
        self._stream.write(
            f"{p.strategy:<20} {p.done:>{len(str(p.total))}}/{p.total} {self._unit}"
            f" sold {p.sold:<5} conflicts {p.conflicts:<5} {p.elapsed_s:5.1f} s"
            f" errors {p.errors}\n"
        )
        self._stream.flush()

    def close(self) -> None:
        if self._tty:
            self._bars.stop()
