"""The code location of a detection: the first frame that is the application's own."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
from types import FrameType

# The whole stocksentry.instrumentation package (the recording API, this integration):
# none of its frames is the application's.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DRIVER_PACKAGES = (
    "sqlalchemy",
    "psycopg",
    "psycopg2",
    "psycopg_pool",
    "asyncpg",
    "aiosqlite",
    "greenlet",
    "pymysql",
    "opentelemetry",
    "wrapt",
    "structlog",
)


@functools.lru_cache(maxsize=1)
def _libraries(loaded: tuple[bool, ...]) -> tuple[tuple[str, ...], ...]:
    """Folders whose frames are not application code: (drivers, SQLAlchemy and us; the
    site-packages; the stdlib). sysconfig.get_paths() costs ~0.2 ms: built once, again only
    when a driver loads."""
    paths = sysconfig.get_paths()

    def folders(*names: str) -> tuple[str, ...]:
        return tuple({os.path.abspath(paths[n]) + os.sep for n in names if n in paths})

    drivers = {_HERE + os.sep}
    for name in _DRIVER_PACKAGES:
        file = getattr(sys.modules.get(name), "__file__", None)
        if file:
            drivers.add(os.path.dirname(os.path.abspath(file)) + os.sep)
    return tuple(drivers), folders("purelib", "platlib"), folders("stdlib", "platstdlib")


def _first_app_frame(
    frame: FrameType | None, libraries: tuple[tuple[str, ...], ...]
) -> FrameType | None:
    drivers, site, stdlib = libraries
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<"):  # <frozen ...>, <string>: generated or bootstrap
            path = os.path.abspath(filename)
            # The stdlib folder may contain site-packages (Python installed without a
            # venv), where the application itself can live: site-packages is carved out.
            if not path.startswith(drivers) and (
                path.startswith(site) or not path.startswith(stdlib)
            ):
                return frame
        frame = frame.f_back
    return None


def app_location() -> tuple[str, str]:
    """``(file:line, function)`` of the first frame outside SQLAlchemy, drivers and stocksentry.

    Under an ``AsyncEngine`` the listener runs in a greenlet whose stack ends in SQLAlchemy;
    the application's coroutine is suspended in the parent greenlet, so its frames are
    searched next.
    """
    libraries = _libraries(tuple(name in sys.modules for name in _DRIVER_PACKAGES))
    # The caller's frame (not kept in a local: a frame holding itself is a cycle).
    frame = _first_app_frame(getattr(inspect.currentframe(), "f_back", None), libraries)
    if frame is None:
        greenlet = sys.modules.get("greenlet")
        parent = greenlet.getcurrent().parent if greenlet is not None else None
        while frame is None and parent is not None:
            frame = _first_app_frame(parent.gr_frame, libraries)
            parent = parent.parent
    if frame is None:
        return "unknown", "unknown"
    filename = frame.f_code.co_filename
    try:
        relative = os.path.relpath(filename)
        if not relative.startswith(".."):
            filename = relative
    except ValueError:  # another drive (Windows)
        pass
    return f"{filename}:{frame.f_lineno}", frame.f_code.co_name
