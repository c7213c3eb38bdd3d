"""How a reservation ended: the outcome names and the classification of exceptions.

``ConflictReason`` and ``Outcome`` are the catalog's (:mod:`.catalog`), defined there once.
"""

from __future__ import annotations

from collections.abc import Iterator

from . import catalog
from .catalog import ConflictReason, Outcome

# SQLSTATEs that mean the database refused the reservation rather than failed: a deadlock,
# a serialization failure, a lock that could not be had in time.
SQLSTATE_REASONS: dict[str, ConflictReason] = {  # also read by the SQLAlchemy listeners
    "40P01": "deadlock",
    "40001": "serialization_failure",
    "55P03": "lock_timeout",
}

# The same refusals on MySQL and MariaDB, by server error number (PyMySQL, aiomysql,
# mysqlclient and asyncmy carry it as ``args[0]``; MySQL Connector and MariaDB Connector as
# ``errno``). Checked before any SQLSTATE: MySQL gives a deadlock SQLSTATE 40001, which on
# PostgreSQL is a serialization failure.
MYSQL_ERRNO_REASONS: dict[int, ConflictReason] = {
    1213: "deadlock",  # ER_LOCK_DEADLOCK: InnoDB rolled the whole transaction back
    1205: "lock_timeout",  # ER_LOCK_WAIT_TIMEOUT: innodb_lock_wait_timeout; MariaDB's NOWAIT
    3572: "lock_timeout",  # ER_LOCK_NOWAIT: MySQL 8's NOWAIT found the row locked
}
# Top-level packages of the MySQL drivers whose errors carry the error number.
_MYSQL_DRIVERS = frozenset({"pymysql", "aiomysql", "MySQLdb", "asyncmy", "mysql", "mariadb"})


class ReservationConflict(Exception):
    """Raise inside a reservation to end it as a conflict; it is re-raised unchanged.

    Example::

        with reservation("EGG-01", strategy="atomic"):
            if rows == 0:
                raise ReservationConflict("out_of_stock")
    """

    def __init__(self, reason: ConflictReason, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason: ConflictReason = reason


class SkuFrozen(ReservationConflict):
    """Raised by ``reservation()`` on entry when its SKU is frozen (``configure(freeze=...)``):
    the block never runs, so the app has not touched the stock. Counted as conflict reason
    ``frozen``; ``freeze_reason``, ``source`` (``person`` or ``alert``) and ``since`` (Unix
    seconds) come from the freeze.

    Example::

        try:
            with reservation("EGG-01") as r:
                ...
        except SkuFrozen as frozen:
            return 409, f"{frozen.sku} is paused: {frozen.freeze_reason}"
    """

    def __init__(self, sku: str, freeze_reason: str, source: str, since: float) -> None:
        super().__init__("frozen", f"SKU {sku!r:.80} is frozen ({source}): {freeze_reason:.200}")
        self.sku = sku
        self.freeze_reason = freeze_reason
        self.source = source
        self.since = since


def driver_errors(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it wraps, outermost first: SQLAlchemy's ``orig``, else the
    ``__cause__`` (the asyncpg adapter's wrapping), at most four deep.

    Example::

        >>> wrapped = RuntimeError("outer")
        >>> wrapped.__cause__ = ValueError("inner")
        >>> [type(e).__name__ for e in driver_errors(wrapped)]
        ['RuntimeError', 'ValueError']
    """
    depth = 0
    while exc is not None and depth < 4:
        yield exc
        exc = getattr(exc, "orig", None) or exc.__cause__
        depth += 1


def sqlstate_of(exc: BaseException | None) -> str | None:
    """The SQLSTATE of a driver error (``sqlstate``, or psycopg2's ``pgcode``), also
    through SQLAlchemy's and the adapters' wrapping; ``None`` when there is none.

    Example::

        >>> class DriverError(Exception):
        ...     sqlstate = "40P01"
        >>> wrapped = RuntimeError("outer")
        >>> wrapped.__cause__ = DriverError()
        >>> sqlstate_of(wrapped)
        '40P01'
    """
    for error in driver_errors(exc):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(state, str):
            return state
    return None


def mysql_errno_of(exc: BaseException | None) -> int | None:
    """The MySQL / MariaDB server error number of a driver error, also through SQLAlchemy's
    wrapping; ``None`` when there is none (or the error is not a MySQL driver's).

    Example::

        >>> import pymysql
        >>> mysql_errno_of(pymysql.err.OperationalError(1213, "Deadlock found"))
        1213
    """
    for error in driver_errors(exc):
        if type(error).__module__.partition(".")[0] not in _MYSQL_DRIVERS:
            continue
        number = getattr(error, "errno", None)
        if not isinstance(number, int) and error.args:
            number = error.args[0]
        if isinstance(number, int) and not isinstance(number, bool):
            return number
    return None


def refusal_of(exc: BaseException | None) -> tuple[ConflictReason, str] | None:
    """The concurrency refusal a driver error is, and its code as the database gives it:
    ``("deadlock", "40P01")`` on PostgreSQL, ``("deadlock", "1213")`` on MySQL / MariaDB
    (the server error number, as OpenTelemetry's ``db.response.status_code`` has it);
    ``None`` for any other error.

    Example::

        >>> import pymysql
        >>> refusal_of(pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"))
        ('lock_timeout', '1205')
    """
    number = mysql_errno_of(exc)
    if number is not None:
        reason = MYSQL_ERRNO_REASONS.get(number)
        return (reason, str(number)) if reason is not None else None
    state = sqlstate_of(exc)
    if state is not None:
        found = SQLSTATE_REASONS.get(state)
        if found is not None:
            return found, state
    return None


def status_code_of(exc: BaseException | None) -> str | None:
    """The database's own code of a driver error: the SQLSTATE, or on MySQL / MariaDB the
    server error number (OpenTelemetry's ``db.response.status_code``); else ``None``.

    Example::

        >>> import pymysql
        >>> status_code_of(pymysql.err.OperationalError(1146, "Table 't' doesn't exist"))
        '1146'
    """
    number = mysql_errno_of(exc)
    return str(number) if number is not None else sqlstate_of(exc)


# Client libraries' "the lock was not had" errors, by module and class name: importing
# redis or pottery here would make them dependencies of every install. redis-py's
# LockNotOwnedError (a LockError subclass) is not among them: it is raised by a release or
# an extension of a lock that expired, after the work under it was done.
_LOCK_REFUSALS = frozenset(
    {("redis.exceptions", "LockError"), ("pottery.exceptions", "QuorumNotAchieved")}
)


def _is_lock_refusal(exc: BaseException) -> bool:
    kind = type(exc)
    return (kind.__module__, kind.__name__) in _LOCK_REFUSALS


def classify_exception(exc: BaseException) -> Outcome:
    """The outcome a reservation ended by ``exc`` gets.

    :class:`ReservationConflict` gives its reason (so does the lock wrappers'
    ``LockNotAcquired``, one of them); a distributed lock a client library refused —
    redis-py's ``LockError`` from an acquire, pottery's ``QuorumNotAchieved`` — gives
    ``lock_not_acquired``; a driver error carrying SQLSTATE 40P01, 40001 or 55P03
    (psycopg, asyncpg, psycopg2, also wrapped by SQLAlchemy) gives ``deadlock``,
    ``serialization_failure`` or ``lock_timeout``; a MySQL / MariaDB error 1213 or 1205
    (3572, MySQL 8's ``NOWAIT``) gives ``deadlock`` or ``lock_timeout``; SQLite's
    "database is locked" gives ``lock_timeout``; anything else is ``error``.

    Example::

        >>> classify_exception(ReservationConflict("out_of_stock"))
        'out_of_stock'
        >>> classify_exception(KeyError("sku"))
        'error'
    """
    if isinstance(exc, ReservationConflict):
        return exc.reason if exc.reason in catalog.CONFLICT_REASONS else "error"
    if _is_lock_refusal(exc):
        return "lock_not_acquired"
    refusal = refusal_of(exc)
    if refusal is not None:
        return refusal[0]
    for error in driver_errors(exc):
        if type(error).__name__ == "OperationalError" and "database is locked" in str(error):
            return "lock_timeout"
    return "error"


# The HTTP exceptions of the major web frameworks, by top-level package and class name (a
# subclass matches through its MRO): importing the frameworks here would make them
# dependencies of every install. The status is read from ``status_code`` (Starlette and
# FastAPI, aiohttp, Django REST framework, Sanic, Tornado, Litestar, Falcon 4), ``code``
# (Werkzeug / Flask) or ``status`` (Falcon's "409 Conflict"); Django's own answers carry no
# status and are listed with theirs.
HTTP_ANSWER_CLASSES: frozenset[tuple[str, str]] = frozenset(
    {
        ("starlette", "HTTPException"),
        ("fastapi", "HTTPException"),
        ("werkzeug", "HTTPException"),
        ("aiohttp", "HTTPException"),
        ("rest_framework", "APIException"),
        ("sanic", "SanicException"),
        ("tornado", "HTTPError"),
        ("litestar", "HTTPException"),
        ("falcon", "HTTPError"),
    }
)
_DJANGO_ANSWERS: dict[str, int] = {
    "Http404": 404,
    "PermissionDenied": 403,
    "SuspiciousOperation": 400,
    "BadRequest": 400,
}


def http_status_of(exc: BaseException) -> int | None:
    """The HTTP status of a web framework's HTTP exception (:data:`HTTP_ANSWER_CLASSES`,
    Django's ``Http404``, ``PermissionDenied``, ``SuspiciousOperation``, ``BadRequest``),
    found by class name so that no framework is imported; ``None`` for any other exception.

    Example::

        >>> class HTTPException(Exception):
        ...     status_code = 409
        >>> HTTPException.__module__ = "starlette.exceptions"
        >>> http_status_of(HTTPException())
        409
    """
    for kind in type(exc).__mro__:
        package = kind.__module__.partition(".")[0]
        if package == "django" and kind.__name__ in _DJANGO_ANSWERS:
            return _DJANGO_ANSWERS[kind.__name__]
        if (package, kind.__name__) not in HTTP_ANSWER_CLASSES:
            continue
        for name in ("status_code", "code", "status"):
            status = getattr(exc, name, None)
            if isinstance(status, str):
                head = status.partition(" ")[0]
                status = int(head) if head.isdigit() else None
            if isinstance(status, int) and not isinstance(status, bool):
                return status
        return None
    return None


def is_answer(exc: BaseException, declared: tuple[type[BaseException], ...] = ()) -> bool:
    """Whether ``exc`` is the app answering the buyer rather than failing: an instance of
    one of the ``declared`` types (``conflict_on=``), or a web framework's HTTP exception
    with a 4xx status (:func:`http_status_of`). A 5xx HTTP exception is a failure.

    Example::

        >>> class SoldOut(Exception):
        ...     pass
        >>> is_answer(SoldOut(), (SoldOut,)), is_answer(KeyError("sku"))
        (True, False)
    """
    if declared and isinstance(exc, declared):
        return True
    status = http_status_of(exc)
    return status is not None and 400 <= status < 500
