"""Compacting the files of dead workers into one file per type, safely against scrapes,
pid reuse and a compaction killed at any point (docs/exporter-server.md, "Dead workers'
files")."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, TypeVar

from stocksentry.instrumentation.mpexemplars import FILE_PREFIX, FILE_SUFFIX

from .exemplars import ExemplarEntries, exemplar_pid, merge_newest, read_exemplars, write_exemplars
from .files import (
    Entries,
    Key,
    SkipFile,
    SkipReason,
    Values,
    fold,
    parse_name,
    pid_alive,
    read_entries,
    write_entries,
)

#: Dead pids compacted per run at most (a run over 100 of them takes a few hundred ms).
MAX_PIDS: Final = 100
#: The "pid" of the compacted files: ``counter_compacted.db``.
COMPACTED: Final = "compacted"
LOCK_NAME: Final = ".stocksentry-compaction.lock"
#: Marks a renamed file of a dead pid: ``counter_12.staged-<token>.db``.
_STAGED: Final = ".staged-"
_STAGED_PID: Final = re.compile(r"[0-9]+\.staged-[0-9a-f]+\Z")
#: The key of the manifest entry in a compacted file: not JSON, so never a metric's.
_MANIFEST: Final = b"\x00stocksentry-compacted\x00"
#: Gauge modes folded with their rule; the other modes of a dead pid are dropped.
_FOLDED_MODES: Final = frozenset({"sum", "min", "max", "mostrecent"})
_T = TypeVar("_T")


def staged(pid: str) -> bool:
    """Whether ``pid`` (the pid part of a file name) is a renamed file of a dead pid."""
    return _STAGED_PID.match(pid) is not None


def manifest_of(entries: Entries) -> tuple[Entries, frozenset[str]]:
    """A compacted file's entries without its manifest, and the file names it folded."""
    names: frozenset[str] = frozenset()
    kept: Entries = []
    for entry in entries:
        raw = entry[0]
        if raw.startswith(_MANIFEST):
            try:
                listed = json.loads(raw[len(_MANIFEST) :].decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise SkipFile("corrupt", "compaction manifest is not UTF-8 JSON") from None
            if not (isinstance(listed, list) and all(isinstance(n, str) for n in listed)):
                raise SkipFile("corrupt", "compaction manifest is not a list of names")
            names = frozenset(listed)
        else:
            kept.append(entry)
    return kept, names


def _open_lock(directory: str) -> int:
    """The lock file's descriptor, the file created when missing."""
    return os.open(
        os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644
    )


@contextlib.contextmanager
def scrape_lock(directory: str) -> Iterator[None]:
    """A shared lock on the directory's compaction lock, for one scrape.

    Created when missing (so that a later compaction by another process is seen); in a
    directory this process cannot write and nobody has compacted, there is nothing to
    lock against, and the scrape goes on without.
    """
    try:
        fd = _open_lock(directory)
    except OSError:
        try:
            fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            yield
            return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)


@dataclass
class Compaction:
    """What one :func:`compact` did."""

    #: Dead pids whose files were compacted or dropped.
    pids: set[str] = field(default_factory=set)
    #: Files folded into a compacted file, and files (gauges) dropped.
    folded: int = 0
    dropped: int = 0
    #: Unreadable files of dead pids set aside as ``*.corrupt``, by reason.
    skipped: dict[SkipReason, int] = field(default_factory=dict)
    #: Pids found alive again after their files were renamed (reused), files put back.
    restored: int = 0
    #: False when another compaction held the lock, or the directory is not writable.
    ran: bool = True


class _Compactor:
    def __init__(self, directory: str, check_key: Callable[[bytes], Key], max_pids: int) -> None:
        self.directory = directory
        self.max_pids = max_pids
        self.check_key = check_key
        self.result = Compaction()
        self.token = secrets.token_hex(6)

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(name))

    def set_aside(self, name: str, skip: SkipFile) -> None:
        """An unreadable file of a dead pid: renamed ``<its name>.corrupt``, counted once."""
        stem, staged_mark, rest = name.partition(_STAGED)
        original = stem + rest[rest.index(".") :] if staged_mark else name
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path(name), self.path(original + ".corrupt"))
        skipped = self.result.skipped
        skipped[skip.reason] = skipped.get(skip.reason, 0) + 1

    def read(self, name: str, reader: Callable[[str], _T]) -> _T | None:
        """``reader`` of one file; ``None`` when it is gone or unreadable (set aside)."""
        try:
            return reader(self.path(name))
        except FileNotFoundError:
            return None
        except SkipFile as skip:
            self.set_aside(name, skip)
            return None

    def checked_entries(self, path: str) -> Entries:
        entries = read_entries(path)
        for raw, _, _ in entries:
            self.check_key(raw)
        return entries

    def stage(self, dead: list[tuple[str, str]]) -> list[str]:
        """Rename the dead pids' files (name, pid) to names of their own; put back those
        of reused pids (docs: "Pid reuse"). The staged names, in the order given."""
        out: list[str] = []
        for name, pid in dead:
            stem, dot, suffix = name.rpartition(".")
            target = f"{stem}{_STAGED}{self.token}{dot}{suffix}"
            try:
                os.rename(self.path(name), self.path(target))
            except FileNotFoundError:
                continue
            if pid_alive(pid):
                # Reused since it was checked: its new worker may have this file open.
                try:
                    os.link(self.path(target), self.path(name))
                except FileExistsError:
                    pass  # the new worker made a file of its own: ours is the dead one's
                else:
                    os.unlink(self.path(target))
                    self.result.restored += 1
                    continue
            self.result.pids.add(pid)
            out.append(target)
        return out

    def compact_db(self, kind: tuple[str, str], staged_names: list[str]) -> None:
        """Fold ``staged_names`` (files of one type and mode) into the compacted file."""
        typ, mode = kind
        if typ == "gauge" and mode not in _FOLDED_MODES:
            for name in staged_names:
                self.remove(name)
                self.result.dropped += 1
            return
        final = f"{typ}_{mode}_{COMPACTED}.db" if mode else f"{typ}_{COMPACTED}.db"
        values: Values = {}
        # An unreadable compacted file is set aside, and started afresh.
        fold(values, mode, self.read(final, lambda path: manifest_of(read_entries(path))[0]) or [])
        folded: list[str] = []
        for name in staged_names:
            entries = self.read(name, self.checked_entries)
            if entries is not None:
                fold(values, mode, entries)
                folded.append(name)
        manifest = _MANIFEST + json.dumps(sorted(folded)).encode("utf-8")
        written = [(manifest, 0.0, 0.0), *((raw, v, ts) for raw, (v, ts) in values.items())]
        self.publish(final, folded, lambda path: write_entries(path, written))

    def compact_exemplars(self, staged_names: list[str]) -> None:
        """Keep the newest exemplar per sample of ``staged_names`` and the compacted file.

        Newest-wins is idempotent, so no manifest is needed: a file read both here and
        as itself (a compaction killed after its rename) gives the same exemplars.
        """
        final = f"{FILE_PREFIX}{COMPACTED}{FILE_SUFFIX}"
        merged: ExemplarEntries = {}
        folded: list[str] = []
        for name in (final, *staged_names):
            entries = self.read(name, read_exemplars)
            if entries is None:
                continue
            merge_newest(merged, entries)
            if name != final:
                folded.append(name)
        self.publish(final, folded, lambda path: write_exemplars(path, merged))

    def publish(self, final: str, folded: list[str], write: Callable[[str], None]) -> None:
        """Write ``final`` under a temporary name, rename it into place, then delete the
        ``folded`` files it now holds (nothing when none was folded)."""
        if not folded:
            return
        temporary = self.path(f".{final}.{self.token}.tmp")
        write(temporary)
        os.replace(temporary, self.path(final))
        with contextlib.suppress(OSError):
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for name in folded:
            self.remove(name)
        self.result.folded += len(folded)

    def run(self) -> None:
        with os.scandir(self.directory) as it:
            names = [entry.name for entry in it if entry.is_file(follow_symlinks=False)]
        # Left by a compaction that was killed: temporary files, and staged files (kept
        # by the compacted file's manifest when they are already in it).
        included: set[str] = set()
        for name in names:
            if name.endswith(".tmp") and name.startswith("."):
                self.remove(name)
            elif name.endswith(f"_{COMPACTED}.db"):
                with contextlib.suppress(FileNotFoundError, SkipFile):
                    included |= manifest_of(read_entries(self.path(name)))[1]
        leftovers: list[str] = []
        # The dead pids, at most max_pids of them per run: a scrape that compacts a
        # directory of a thousand dead workers at once would outlast its timeout.
        alive: dict[str, bool] = {}
        dead: list[tuple[str, str]] = []
        dead_pids = 0
        for name in names:
            if name.endswith(".db"):
                parsed = parse_name(name)
                pid = parsed.pid if parsed is not None else None
            else:
                pid = exemplar_pid(name)
            if pid is None:
                continue
            if staged(pid):
                if name in included:
                    self.remove(name)
                else:
                    leftovers.append(name)
                continue
            if not pid.isdigit():
                continue
            if pid not in alive:
                if dead_pids >= self.max_pids:
                    continue
                alive[pid] = pid_alive(pid)
                dead_pids += not alive[pid]
            if not alive[pid]:
                dead.append((name, pid))
        by_kind: dict[tuple[str, str], list[str]] = {}
        exemplar_files: list[str] = []
        for name in [*leftovers, *self.stage(dead)]:
            if not name.endswith(".db"):
                exemplar_files.append(name)
            elif (parsed := parse_name(name)) is not None:
                by_kind.setdefault((parsed.typ, parsed.mode), []).append(name)
        for kind, kind_names in by_kind.items():
            self.compact_db(kind, kind_names)
        if exemplar_files:
            self.compact_exemplars(exemplar_files)


def compact(
    directory: str | os.PathLike[str],
    check_key: Callable[[bytes], Key],
    *,
    max_pids: int = MAX_PIDS,
) -> Compaction:
    """Compact the files of at most ``max_pids`` dead pids of ``directory`` (the rest at
    the next call, so that one call stays short).

    ``check_key`` validates one key (raises :class:`SkipFile`); a file with a bad key is
    set aside like a torn one.
    """
    path = os.fspath(directory)
    try:
        fd = _open_lock(path)
    except OSError:
        return Compaction(ran=False)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another compaction holds it
            return Compaction(ran=False)
        if not os.access(path, os.W_OK):
            return Compaction(ran=False)
        compactor = _Compactor(path, check_key, max(max_pids, 1))
        compactor.run()
        return compactor.result
    finally:
        os.close(fd)
