"""The ``notify-keyspace-events`` flags the watcher needs, checked and (if allowed) set.

The watcher needs keyspace notifications (``K``) of generic commands (``g``), string
commands (``$``) and expiries (``x``): ``Kg$x``; ``A`` covers the last three.

Example::

    >>> missing_flags("")
    'Kg$x'
    >>> missing_flags("AK"), missing_flags("Ex")
    ('', 'Kg$')
    >>> missing_flags("Ex" + missing_flags("Ex"))
    ''
"""

from __future__ import annotations

from typing import Final

#: The flags the watcher needs.
REQUIRED_FLAGS: Final = "Kg$x"
_ALL_ALIAS: Final = "g$lshzxetd"


def missing_flags(current: str) -> str:
    """The flags of :data:`REQUIRED_FLAGS` that ``current`` lacks, in that order."""
    have = set(current)
    if "A" in have:
        have.update(_ALL_ALIAS)
    return "".join(flag for flag in REQUIRED_FLAGS if flag not in have)


def refused_hint(missing: str | None) -> str:
    """What to tell the operator when the watcher may not (or cannot) set the flags."""
    what = f"the flags {missing!r}" if missing else f"at least {REQUIRED_FLAGS!r}"
    return (
        f"set notify-keyspace-events to include {what} on the Redis server (redis.conf, "
        "CONFIG SET, or the parameter group of a managed Redis), or allow "
        "lock_watch.configure_notifications"
    )
