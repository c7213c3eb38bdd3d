"""What the listeners need to know per database: isolation levels and MySQL's row counts
(no SQLAlchemy and no driver import: the listeners pass the dialect's name and cursor)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: SQLAlchemy dialect names of MySQL and MariaDB (``mysql+pymysql://`` on a MariaDB server
#: is still ``mysql``; ``mariadb+pymysql://`` is ``mariadb``).
MYSQL_DIALECTS = frozenset({"mysql", "mariadb"})

# The isolation levels at which a plain read and a computed write in one transaction cannot
# lose an update, by dialect. PostgreSQL aborts the write with 40001 when the row changed
# after the snapshot. InnoDB's REPEATABLE READ does not: a plain SELECT reads the snapshot,
# the UPDATE writes over the latest committed row, and the update in between is lost; only
# SERIALIZABLE, which turns every plain SELECT of a transaction into a locking read
# (LOCK IN SHARE MODE), keeps it.
_LOSSLESS_LEVELS: dict[str, frozenset[str]] = {
    "postgresql": frozenset({"REPEATABLE READ", "SERIALIZABLE"}),
    "mysql": frozenset({"SERIALIZABLE"}),
    "mariadb": frozenset({"SERIALIZABLE"}),
}


def lossless_levels(dialect_name: str) -> frozenset[str]:
    """The isolation levels of ``dialect_name`` at which a read-then-write in one
    transaction cannot lose an update (empty: none is known to).

    Example::

        >>> sorted(lossless_levels("postgresql")), sorted(lossless_levels("mysql"))
        (['REPEATABLE READ', 'SERIALIZABLE'], ['SERIALIZABLE'])
    """
    return _LOSSLESS_LEVELS.get(dialect_name, frozenset())


# CLIENT_FOUND_ROWS of the MySQL client protocol: affected rows = matched rows.
_FOUND_ROWS = 2
# The info text the server sends with an UPDATE's OK packet, whatever the flag.
_MATCHED = re.compile(rb"Rows matched: (\d+)")


def mysql_matched_rows(cursor: Any) -> int:
    """How many rows an ``UPDATE`` that reported ``rowcount`` 0 matched, on MySQL / MariaDB.

    Without ``CLIENT.FOUND_ROWS`` (set by SQLAlchemy's dialects, not by a ``creator=``
    connection) the driver counts *changed* rows: an update to the value the row has
    reports 0 though it matched. The server's info text (``Rows matched: 1  Changed: 0``)
    says it either way; without it, 0 is believed only when the flag is set, else -1.

    Example::

        >>> class Result:
        ...     message = b"(Rows matched: 1  Changed: 0  Warnings: 0"
        >>> class Cursor:
        ...     _result = Result()
        >>> mysql_matched_rows(Cursor())
        1
    """
    # Private names, for want of public ones: SQLAlchemy's asyncio adapter keeps the
    # driver's own cursor as _cursor, and PyMySQL / aiomysql keep the server's info text
    # only on the cursor's _result (there is no accessor for it).
    raw = getattr(cursor, "_cursor", cursor)
    message = getattr(getattr(raw, "_result", None), "message", None)
    if isinstance(message, bytes):
        found = _MATCHED.search(message)
        if found is not None:
            return int(found.group(1))
    flag = getattr(getattr(raw, "connection", None), "client_flag", None)
    if isinstance(flag, int) and flag & _FOUND_ROWS:
        return 0
    return -1


def zero_rows_check(dialect_name: str) -> Callable[[Any], int] | None:
    """What turns an ``UPDATE``'s reported 0 rows into the rows it matched, for
    ``dialect_name``; ``None`` where the driver's 0 already means none matched.

    Example::

        >>> zero_rows_check("postgresql") is None, zero_rows_check("mariadb") is not None
        (True, True)
    """
    return mysql_matched_rows if dialect_name in MYSQL_DIALECTS else None
