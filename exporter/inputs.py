"""Reading the files the exporter is given, within bounds: nothing read can hang or grow it.

Config-like inputs must be regular files within a size limit per kind (docs/exporter-config.md,
"Files it reads"); log inputs (timeline) may also be FIFOs. A refusal is an
:class:`InputFileError` whose ``problem`` is one short line, which each caller words as its
own error.

Example::

    >>> shorten("a\\x00b" + "x" * 10, 8)
    'a\\\\x00bxx…'
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import BinaryIO, Final

#: The exporter config (``--config``, ``check-config``).
CONFIG_LIMIT: Final = 4 * 1024 * 1024
#: A ``url_file``: one database or Redis URL.
URL_FILE_LIMIT: Final = 64 * 1024
#: The web config (``web_config_file``, ``--web.config.file``).
WEB_CONFIG_LIMIT: Final = 1024 * 1024
#: Each TLS file a web config names (certificate, key, client CA bundle).
TLS_FILE_LIMIT: Final = 1024 * 1024
#: Characters of file text an error message echoes before it cuts with "…".
ECHO_LIMIT: Final = 80

_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class InputFileError(Exception):
    """A file that cannot be read within the rules; ``problem`` is one short line, and
    ``line`` that of the first bad byte of a text that is not UTF-8."""

    def __init__(self, path: str, what: str, problem: str, line: int | None = None) -> None:
        self.problem = problem
        self.line = line
        super().__init__(f"cannot read {what} {shorten(path, 200)}: {problem}")


def format_size(size: int) -> str:
    """``4 MiB``, ``64 KiB``, ``512 bytes``: how the limits are written in messages."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def _kind(mode: int) -> str | None:
    for test, name in _KINDS:
        if test(mode):
            return name
    return None


def _os_problem(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _open_nonblocking(path: str, what: str) -> tuple[int, os.stat_result]:
    """An fd opened without blocking (a FIFO with no writer opens at once), and its stat."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise InputFileError(path, what, _os_problem(exc)) from None
    except ValueError:
        # A NUL in the path: not a name the OS can open.
        raise InputFileError(path, what, "the path contains a NUL character") from None
    return fd, os.fstat(fd)


def _too_big(size: int, limit: int) -> str:
    return f"it is larger than the limit of {format_size(limit)} ({size} bytes)"


def read_bytes_bounded(path: str | os.PathLike[str], *, limit: int, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (claimed or
    read); :class:`InputFileError` for anything else and any OS error."""
    name = os.fspath(path)
    fd, info = _open_nonblocking(name, what)
    try:
        _check_regular(name, what, info, limit)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            # One byte past the limit tells a file that grew while read from one that fits.
            chunk = os.read(fd, min(1024 * 1024, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise InputFileError(name, what, _too_big(total, limit))
        return b"".join(chunks)
    except OSError as exc:
        raise InputFileError(name, what, _os_problem(exc)) from None
    finally:
        os.close(fd)


def read_text_bounded(path: str | os.PathLike[str], *, limit: int, what: str) -> str:
    """As :func:`read_bytes_bounded`, decoded; text that is not UTF-8 is an
    :class:`InputFileError` naming the line of the first bad byte."""
    raw = read_bytes_bounded(path, limit=limit, what=what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        problem = f"it is not UTF-8 text (line {line})"
        raise InputFileError(os.fspath(path), what, problem, line) from None


def check_regular_file(path: str | os.PathLike[str], *, limit: int, what: str) -> None:
    """Check, without reading it, that ``path`` is a regular file of at most ``limit``
    bytes: for files another library opens (OpenSSL's certificates)."""
    name = os.fspath(path)
    fd, info = _open_nonblocking(name, what)
    os.close(fd)
    _check_regular(name, what, info, limit)


def _check_regular(name: str, what: str, info: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _kind(info.st_mode) or "not a file"
        raise InputFileError(name, what, f"it is {kind}, not a regular file")
    if info.st_size > limit:
        raise InputFileError(name, what, _too_big(info.st_size, limit))


def open_log_input(path: str, *, what: str = "log input") -> BinaryIO:
    """Open a log input, a regular file or a FIFO, without blocking on the open (reads
    then wait for data as usual); directories, sockets and devices are refused."""
    fd, info = _open_nonblocking(path, what)
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        os.close(fd)
        kind = _kind(info.st_mode) or "not a file"
        raise InputFileError(path, what, f"it is {kind}, not a log file or a pipe")
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    return os.fdopen(fd, "rb")


def escape(text: str) -> str:
    """``text`` with every non-printable character written as ``\\xNN`` or ``\\uNNNN``: an
    error line stays one line, and no control sequence reaches the user's terminal."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
        for c in text
    )


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as an error message may echo it: escaped (:func:`escape`) and cut to
    ``limit`` characters with "…" (cut before escaping too, so a huge text costs no more)."""
    escaped = escape(text[: limit + 1])
    if len(text) > limit or len(escaped) > limit:
        return escaped[:limit] + "…"
    return escaped
