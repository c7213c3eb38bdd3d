"""Live progress of a lab run: :class:`Progress` snapshots and where they go.

Example::

    import sys

    run_lab(LabConfig(), progress=StderrProgress(sys.stderr))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TextIO

__all__ = ["PROGRESS_INTERVAL_S", "Progress", "ProgressSink", "StderrProgress"]

#: How often live progress is refreshed.
PROGRESS_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class Progress:
    """A live snapshot of one strategy's run, counted on the Python side."""

    strategy: str
    done: int
    total: int
    sold: int
    conflicts: int
    errors: int
    elapsed_s: float


class ProgressSink(Protocol):
    """Receives live progress.

    ``start`` once the database is reached and prepared, then per strategy ``update``
    every :data:`PROGRESS_INTERVAL_S` and ``finish`` at its end.
    """

    def start(self, database: str) -> None: ...

    def update(self, progress: Progress) -> None: ...

    def finish(self, progress: Progress) -> None: ...


class StderrProgress:
    """Progress on a terminal: one line per strategy, rewritten in place on a TTY.

    Not on a TTY (a pipe, a CI log) only the final line of each strategy is written, so
    logs do not fill with carriage returns.
    """

    def __init__(
        self, stream: TextIO, *, tty: bool | None = None, header: tuple[str, ...] = ()
    ) -> None:
        self.stream = stream
        self.header = header
        if tty is None:
            try:
                tty = stream.isatty()
            except (AttributeError, ValueError):
                tty = False
        self.tty = tty

    @staticmethod
    def line(p: Progress) -> str:
        """The text of one progress line: within 80 columns for the lab's strategy names,
        up to 999 buyers and 9 errors (the line written when no bars are drawn)."""
        return (
            f"{p.strategy:<20} {p.done:>{len(str(p.total))}}/{p.total} buyers"
            f" sold {p.sold:<5} conflicts {p.conflicts:<5} {p.elapsed_s:5.1f} s"
            f" errors {p.errors}"
        )

    def start(self, database: str) -> None:
        # Written only once the database answered, so a failed connection stays one line.
        for line in (*self.header, f"flash-sale lab on {database}:"):
            self.stream.write(line + "\n")
        self.stream.flush()

    def update(self, progress: Progress) -> None:
        if self.tty:
            # \x1b[K clears what a longer previous line left behind.
            self.stream.write("\r" + self.line(progress) + "\x1b[K")
            self.stream.flush()

    def finish(self, progress: Progress) -> None:
        prefix, suffix = ("\r", "\x1b[K\n") if self.tty else ("", "\n")
        self.stream.write(prefix + self.line(progress) + suffix)
        self.stream.flush()
