"""How a reservation ended: the classification of exceptions into the catalog's outcomes."""

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
    """Raise inside a reservation to end it as a conflict (``reason``); it is re-raised
    unchanged."""

    def __init__(self, reason: ConflictReason, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason: ConflictReason = reason


class SkuFrozen(ReservationConflict):
    """Raised by ``reservation()`` on entry when its SKU is frozen (``configure(freeze=...)``):
    the block never runs, so the app has not touched the stock. Counted as conflict reason
    ``frozen``; ``freeze_reason``, ``source`` (``person`` or ``alert``) and ``since`` (Unix
    seconds) come from the freeze (docs/containment.md)."""

    def __init__(self, sku: str, freeze_reason: str, source: str, since: float) -> None:
        super().__init__("frozen", f"SKU {sku!r:.80} is frozen ({source}): {freeze_reason:.200}")
        self.sku = sku
        self.freeze_reason = freeze_reason
        self.source = source
        self.since = since


def driver_errors(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors it wraps, outermost first: SQLAlchemy's ``orig``, else the
    ``__cause__`` (the asyncpg adapter's wrapping), at most four deep."""
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
    wrapping; ``None`` when there is none (or the error is not a MySQL driver's)."""
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
    """The concurrency refusal a driver error is, and its code (:func:`status_code_of`):
    ``("deadlock", "40P01")`` on PostgreSQL, ``("deadlock", "1213")`` on MySQL / MariaDB;
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
    state = sqlstate_of(exc) or ""
    found = SQLSTATE_REASONS.get(state)
    return (found, state) if found is not None else None


def status_code_of(exc: BaseException | None) -> str | None:
    """The database's own code of a driver error: the SQLSTATE, or on MySQL / MariaDB the
    server error number (OpenTelemetry's ``db.response.status_code``); else ``None``."""
    number = mysql_errno_of(exc)
    return str(number) if number is not None else sqlstate_of(exc)


# Client libraries' "the lock was not had" errors, by module and class name: importing
# redis or pottery here would make them dependencies of every install. redis-py's
# LockNotOwnedError (a LockError subclass) is not among them: it is raised by a release or
# an extension of a lock that expired, after the work under it was done.
_LOCK_REFUSALS = frozenset(
    {("redis.exceptions", "LockError"), ("pottery.exceptions", "QuorumNotAchieved")}
)


def classify_exception(exc: BaseException) -> Outcome:
    """The outcome a reservation ended by ``exc`` gets.

    :class:`ReservationConflict` (the lock wrappers' ``LockNotAcquired`` is one) gives its
    reason; redis-py's ``LockError`` and pottery's ``QuorumNotAchieved`` give
    ``lock_not_acquired``; a driver error of :data:`SQLSTATE_REASONS` or
    :data:`MYSQL_ERRNO_REASONS`, also wrapped by SQLAlchemy, gives its reason; SQLite's
    "database is locked" gives ``lock_timeout``; anything else is ``error``.

    Example::

        >>> classify_exception(ReservationConflict("out_of_stock"))
        'out_of_stock'
        >>> classify_exception(KeyError("sku"))
        'error'
    """
    if isinstance(exc, ReservationConflict):
        return exc.reason if exc.reason in catalog.CONFLICT_REASONS else "error"
    if (type(exc).__module__, type(exc).__name__) in _LOCK_REFUSALS:
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
    Django's answers), found by class name so that no framework is imported; ``None`` for
    any other exception."""
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
    with a 4xx status (:func:`http_status_of`). A 5xx HTTP exception is a failure."""
    if declared and isinstance(exc, declared):
        return True
    status = http_status_of(exc)
    return status is not None and 400 <= status < 500
