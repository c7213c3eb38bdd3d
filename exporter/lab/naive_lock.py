"""The naive Redis lock the lab reproduces: ``SET key token NX PX ttl``, then ``DEL``.

Deliberately broken and not part of the instrumentation: in an app, use redis-py's
``Lock`` wrapped by :func:`~stocksentry.instrumentation.locks.instrument_lock`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from stocksentry.instrumentation.locks import TrackedLock
from stocksentry.instrumentation.locks.recorder import Steps, as_bytes

if TYPE_CHECKING:
    from stocksentry.instrumentation import Sentry

__all__ = ["SetNxLock"]


# KEYS[1] the lock key; ARGV[1] our token; ARGV[2] "1" to delete whatever is there (the
# naive DEL, kept so that the bug stays observable), "0" to delete only our own token.
# Returns the value that was under the key, read in the same atomic step as the delete.
_RELEASE_LUA = """
local current = redis.call('get', KEYS[1])
if ARGV[2] == '1' or current == ARGV[1] then
    redis.call('del', KEYS[1])
end
return current
"""
# Renew the TTL (ms) only while the token is ours.
_EXTEND_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""


def _ms(seconds: float) -> int:
    # Redis keeps a TTL to the millisecond; never 0, which PX refuses.
    return max(1, round(seconds * 1000))


class SetNxLock(TrackedLock):
    """A home-made Redis lock, ``SET key token NX PX ttl``, measured as a
    :class:`~stocksentry.instrumentation.locks.TrackedLock`.

    ``release="naive"`` is the plain ``DEL key``, which deletes another holder's token
    too, but reads the value in the same Lua step, so the bug is counted;
    ``release="owned"`` is the fix: compare and delete. ``client`` is a ``redis.Redis``
    (``with``) or ``redis.asyncio.Redis`` (``async with``).
    """

    def __init__(
        self,
        client: Any,
        key: str,
        *,
        name: str,
        ttl: float,
        release: Literal["naive", "owned"] = "owned",
        token: str | None = None,
        blocking_timeout: float | None = 0.0,
        retry_delay: float = 0.05,
        sentry: Sentry | None = None,
    ) -> None:
        if release not in ("naive", "owned"):
            raise ValueError(f"release must be 'naive' or 'owned', got {release!r}")
        super().__init__(
            name,
            ttl=ttl,
            token=token,
            blocking_timeout=blocking_timeout,
            retry_delay=retry_delay,
            sentry=sentry,
        )
        self.client = client
        self.key = key
        self.release_mode = release
        self._ttl_ms = _ms(ttl)
        self._release_script = client.register_script(_RELEASE_LUA)
        self._extend_script = client.register_script(_EXTEND_LUA)

    def _attempt(self) -> object:
        return self.client.set(self.key, self.token, nx=True, px=self._ttl_ms)

    def _release_steps(self) -> Steps[tuple[bool | None, object, bool | None]]:
        naive = self.release_mode == "naive"
        args = [self.token, "1" if naive else "0"]
        current = yield lambda: self._release_script(keys=[self.key], args=args)
        owned = as_bytes(current) == self.token.encode()
        return owned, current, naive and not owned and current is not None

    def _extend_once(self, ttl: float) -> object:
        return self._extend_script(keys=[self.key], args=[self.token, _ms(ttl)])
