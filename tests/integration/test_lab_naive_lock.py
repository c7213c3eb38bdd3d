"""The lab's naive ``SET NX`` lock (:class:`~stocksentry.exporter.lab.naive_lock.SetNxLock`)
against the real Redis: a lock that expires mid-work, and the holder that deletes the next
holder's lock, counted.

The scenarios it shares with a home-made lock live in :mod:`lockscenarios`
(:class:`TestSetNxLock` runs them on ``SetNxLock``); the owned release is the lab's own.
Every key lives under the test's ``redis_prefix``.
"""

from __future__ import annotations

import time
from typing import Any

import lockscenarios
import pytest
import redis
from lockscenarios import EXPIRED, NOT_OWNED, value
from prometheus_client import CollectorRegistry
from stocksentry.exporter.lab.naive_lock import SetNxLock
from stocksentry.instrumentation import Sentry

pytestmark = pytest.mark.integration

# The shared fixtures, named here so that pytest finds them for this module.
sentry = lockscenarios.sentry
client = lockscenarios.client


def set_nx_lock(client: Any, key: str, *, naive_del: bool = False, **options: Any) -> SetNxLock:
    """``SetNxLock``, with the naive release where a scenario needs the plain DEL."""
    return SetNxLock(client, key, release="naive" if naive_del else "owned", **options)


class TestSetNxLock(lockscenarios.NaiveLockScenarios):
    """The naive-lock scenarios on the lab's ``SetNxLock``."""

    make = staticmethod(set_nx_lock)
    # Its release reads the key in the same Lua step as the DEL, so it can tell.
    deleted_other_holder = True


def test_owned_release_keeps_the_second_holders_lock(
    client: redis.Redis, redis_prefix: str, registry: CollectorRegistry, sentry: Sentry
) -> None:
    key = redis_prefix + "lock:owned"
    lock_a = SetNxLock(client, key, name="owned", ttl=0.1, release="owned", sentry=sentry)
    assert lock_a.acquire()
    time.sleep(0.2)
    client.set(key, b"someone-else", px=5000)
    assert lock_a.release() is False
    assert client.get(key) == b"someone-else"
    assert value(registry, EXPIRED, lock="owned") == 1
    assert value(registry, NOT_OWNED, lock="owned") == 1
