"""Reading the files the exporter is given, within bounds: nothing read can hang or grow it.

Every file the exporter reads itself goes through here: the exporter config, a
``url_file`` (a database or Redis URL), the web config, and the timeline's log inputs.
The TLS certificate, key and CA files are read by OpenSSL; :func:`check_regular_file`
checks them first with the same rules.

The rules, one per class of hostile input:

- **Only regular files**, for every config-like input: a FIFO, a socket, a directory or
  a device (``/dev/zero``, a terminal) is refused with a message saying what it is. The
  file is opened with ``O_NONBLOCK``, so a FIFO with no writer is seen and refused at once
  instead of blocking ``open`` forever.
- **A size limit per kind of file** (checked on the size the file claims, then again on
  what is actually read, since a file may grow while it is read):

  ============================  ==========  ============================================
  file                          limit       why that much
  ============================  ==========  ============================================
  exporter config               4 MiB       about 200k promo SKUs; real ones are < 100 kB
  ``url_file``                  64 KiB      one URL, with room to spare
  web config                    1 MiB       a few users and headers
  TLS cert, key, client CA      1 MiB each  a CA bundle of every public root is ~220 kB
  ============================  ==========  ============================================

- **Log inputs** (timeline) may be big, and pipes are legitimate there: regular files
  and FIFOs are read (a FIFO is opened without blocking, then read normally, so an
  absent writer reads as an empty input); directories, sockets and devices are refused.
  Their bound is per line, in :mod:`stocksentry.exporter.investigate.timeline.limits`.

A refusal is an :class:`InputFileError` whose ``problem`` is one short line; each caller
words it as its own error (a :class:`~stocksentry.exporter.config.ConfigError`, a
``WebConfigError``, a timeline input error), which the command line prints as one line
with exit status 2.

:func:`shorten` is how error messages echo text taken from a file: control characters
escaped, at most 80 characters.

Example::

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
    ...     _ = f.write("server: {}\\n")
    >>> read_text_bounded(f.name, limit=CONFIG_LIMIT, what="config")
    'server: {}\\n'
    >>> os.unlink(f.name)
    >>> try:
    ...     read_text_bounded("/dev/null", limit=CONFIG_LIMIT, what="config")
    ... except InputFileError as exc:
    ...     exc.problem
    'it is a character device, not a regular file'
    >>> shorten("a\\x00b" + "x" * 10, 8)
    'a\\\\x00bxx…'
"""

from __future__ import annotations

import fcntl
import os
import stat
from typing import BinaryIO, Final

__all__ = [
    "CONFIG_LIMIT",
    "ECHO_LIMIT",
    "TLS_FILE_LIMIT",
    "URL_FILE_LIMIT",
    "WEB_CONFIG_LIMIT",
    "InputFileError",
    "check_regular_file",
    "escape",
    "format_size",
    "open_log_input",
    "read_bytes_bounded",
    "read_text_bounded",
    "shorten",
]

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
    """A file that cannot be read within the rules; ``problem`` is one short line.

    ``str()`` is ``cannot read <what> <path>: <problem>``.
    """

    def __init__(self, path: str, what: str, problem: str) -> None:
        self.path = path
        self.what = what
        self.problem = problem
        super().__init__(f"cannot read {what} {shorten(path, 200)}: {problem}")


def format_size(size: int) -> str:
    """``4 MiB``, ``64 KiB``, ``512 bytes``: how the limits are written in messages.

    Example::

        >>> format_size(4 * 1024 * 1024), format_size(65536), format_size(10)
        ('4 MiB', '64 KiB', '10 bytes')
    """
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
    try:
        return fd, os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise InputFileError(path, what, _os_problem(exc)) from None


def _too_big(size: int, limit: int) -> str:
    return f"it is larger than the limit of {format_size(limit)} ({size} bytes)"


def read_bytes_bounded(path: str | os.PathLike[str], *, limit: int, what: str) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Raises :class:`InputFileError` for anything but a regular file, a file larger than
    ``limit`` bytes (claimed or read), and any OS error; never blocks on a FIFO.
    """
    name = os.fspath(path)
    fd, info = _open_nonblocking(name, what)
    try:
        kind = _kind(info.st_mode)
        if kind is not None or not stat.S_ISREG(info.st_mode):
            raise InputFileError(name, what, f"it is {kind or 'not a file'}, not a regular file")
        if info.st_size > limit:
            raise InputFileError(name, what, _too_big(info.st_size, limit))
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
    """The UTF-8 text of the regular file at ``path``, at most ``limit`` bytes of it.

    As :func:`read_bytes_bounded`; text that is not UTF-8 is an :class:`InputFileError`
    naming the line of the first bad byte.
    """
    raw = read_bytes_bounded(path, limit=limit, what=what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputFileError(
            os.fspath(path), what, f"it is not UTF-8 text (line {line})"
        ) from None


def check_regular_file(path: str | os.PathLike[str], *, limit: int, what: str) -> None:
    """Check, without reading it, that ``path`` is a regular file of at most ``limit``
    bytes: for files another library opens (OpenSSL's certificates), which would block
    on a FIFO or read a device without end."""
    name = os.fspath(path)
    fd, info = _open_nonblocking(name, what)
    os.close(fd)
    kind = _kind(info.st_mode)
    if kind is not None or not stat.S_ISREG(info.st_mode):
        raise InputFileError(name, what, f"it is {kind or 'not a file'}, not a regular file")
    if info.st_size > limit:
        raise InputFileError(name, what, _too_big(info.st_size, limit))


def open_log_input(path: str, *, what: str = "log input") -> BinaryIO:
    """Open a log input for reading: a regular file or a FIFO, never blocking on open.

    A FIFO is opened with ``O_NONBLOCK`` (so a FIFO without a writer does not block the
    open), which is then cleared so that reads wait for data as usual. Directories,
    sockets and devices are refused: ``/dev/zero`` is not a log (read stdin with ``-``).
    """
    fd, info = _open_nonblocking(path, what)
    try:
        if not (stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            kind = _kind(info.st_mode) or "not a file"
            raise InputFileError(path, what, f"it is {kind}, not a log file or a pipe")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except OSError as exc:
        os.close(fd)
        raise InputFileError(path, what, _os_problem(exc)) from None
    except InputFileError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every non-printable character (NUL, ESC, line breaks, C1 codes,
    U+2028 ...) written as ``\\xNN`` or ``\\uNNNN``, so that an error line stays one
    line and no terminal control sequence from a file reaches the user's terminal.

    Example::

        >>> escape("a\\x1b[31mb")
        'a\\\\x1b[31mb'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as an error message may echo it: control and other non-printable
    characters (NUL, ESC, line breaks, C1 codes, U+2028) escaped as ``\\xNN``/``\\uNNNN``,
    and cut to ``limit`` characters with a trailing "…".

    The cut is made on the original text before escaping, then the escaped form is cut
    again, so a 100k-character key costs no more than ``limit`` characters of work to show.

    Example::

        >>> shorten("EGG-01"), shorten("x" * 100, 10), shorten("a\\nb")
        ('EGG-01', 'xxxxxxxxxx…', 'a\\\\x0ab')
    """
    escaped = escape(text[: limit + 1])
    if len(text) > limit or len(escaped) > limit:
        return escaped[:limit] + "…"
    return escaped
