"""Quiet logs for what clients get wrong: a malformed request is theirs, not our error.

aiohttp answers a request it cannot parse (a 100 kB header, a broken request line,
bytes that are not HTTP) with a correct 4xx, and then logs it at error level with a full
traceback, once per request: anyone who can reach the port can flood the exporter's log.
:class:`ClientErrorLog` is the logger the server hands aiohttp instead. Client errors
(aiohttp's ``HttpProcessingError`` with a 4xx code) become one INFO line without a
traceback, at most once per ``interval`` seconds, with the count of those left out since;
everything else (a bug in a handler) is logged as before, with its traceback.

There is no access log at all: Prometheus scrapes every few seconds and kubelet probes as
often, so one would be mostly noise.

Example::

    runner = web.AppRunner(app, access_log=None, logger=ClientErrorLog())
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["ClientErrorLog"]

_SERVER_LOG: Final = logging.getLogger("stocksentry.exporter.server")


def _client_error(exc_info: object) -> HttpProcessingError | None:
    exc = exc_info[1] if isinstance(exc_info, tuple) and len(exc_info) == 3 else exc_info
    if isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500:
        return exc
    return None


class ClientErrorLog(logging.LoggerAdapter[logging.Logger]):
    """A logger for aiohttp's request handler that rate-limits client errors.

    Args:
        logger: where the lines go (``stocksentry.exporter.server`` by default).
        interval: seconds between two lines about client errors.
        clock: the time source of that rate limit.

    Example::

        >>> from aiohttp.http_exceptions import BadHttpMessage
        >>> log = ClientErrorLog(clock=lambda: 0.0)
        >>> log.exception("Error handling request from %s", "10.0.0.7",
        ...               exc_info=BadHttpMessage("bad header"))
        >>> log.client_errors
        1
    """

    def __init__(
        self,
        logger: logging.Logger = _SERVER_LOG,
        *,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logger, {})
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last_logged: float | None = None
        self._suppressed = 0
        #: Client errors seen since this logger was made.
        self.client_errors = 0

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        """Pass messages through unchanged (no extra context)."""
        return msg, kwargs

    def exception(
        self,
        msg: object,
        *args: object,
        exc_info: Any = True,
        stack_info: bool = False,
        stacklevel: int = 1,
        extra: Mapping[str, object] | None = None,
        **kwargs: Any,
    ) -> None:
        """Client errors: one rate-limited INFO line; anything else: ERROR with traceback."""
        error = _client_error(exc_info)
        if error is None:
            super().exception(
                msg,
                *args,
                exc_info=exc_info,
                stack_info=stack_info,
                stacklevel=stacklevel,
                extra=extra,
                **kwargs,
            )
            return
        now = self._clock()
        with self._lock:
            self.client_errors += 1
            if self._last_logged is not None and now - self._last_logged < self.interval:
                self._suppressed += 1
                return
            self._last_logged = now
            suppressed, self._suppressed = self._suppressed, 0
        remote = args[0] if args else "?"
        detail = " ".join(str(error.message or type(error).__name__).split())[:200]
        note = f" ({suppressed} more since the last line)" if suppressed else ""
        self.logger.info(
            "malformed request from %s answered %d: %s%s", remote, error.code, detail, note
        )
