"""The lock watcher's pure parts: patterns, the lease tracker's rules, the flags, the config."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from stocksentry.exporter.config import ConfigError, parse_config
from stocksentry.exporter.lockwatch.patterns import LockPatterns, missing_flags, refused_hint
from stocksentry.exporter.lockwatch.tracker import END_UNSEEN_GRACE, LeaseTracker
from stocksentry.instrumentation.guard import LabelGuard

KEY = "lock:product:EGG-01"


def tracker(**options: float) -> LeaseTracker:
    guard = LabelGuard(2, always=["EGG-01"])
    patterns = LockPatterns(["lock:product:{sku}", "lock:cart:*"], guard)
    return LeaseTracker(patterns, **options)  # type: ignore[arg-type]


def lease(t: LeaseTracker, key: str, at: float, ttl: float) -> None:
    t.apply(key, "set", at)
    t.apply(key, "expire", at, at + ttl)


def exported(t: LeaseTracker) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    class Collector:
        def collect(self):  # type: ignore[no-untyped-def]
            return t.families()

    registry = CollectorRegistry()
    registry.register(Collector())  # type: ignore[arg-type]
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def test_patterns_glob_label_and_guard() -> None:
    patterns = LockPatterns(["lock:{sku}:stock", "lock:cart:*"], LabelGuard(1))
    assert patterns.globs == ("lock:*:stock", "lock:cart:*")
    assert patterns.label("lock:A:stock") == "lock:A:stock"
    assert patterns.label("lock:B:stock") == "lock:__other__:stock"
    assert patterns.label("lock:cart:9") == "lock:cart:*"
    assert patterns.label("lock:A:stockx") is None
    assert patterns.label("other") is None
    # Hostile SKUs are sanitised by the guard (and then folded).
    assert LockPatterns(["l:{sku}"], LabelGuard(5)).label('l:a"b\n') == "l:a_b_"


def test_incident_sequence_counts_expiry_and_foreign_release() -> None:
    t = tracker()
    lease(t, KEY, 0.0, 5.0)  # A: SET NX EX 5, works 6 s
    t.apply(KEY, "expired", 5.0)
    lease(t, KEY, 5.05, 5.0)  # B enters
    t.apply(KEY, "del", 6.0)  # A's DEL in finally removes B's lock
    assert t.acquisitions == {KEY: 2}
    assert t.expired_while_held == {KEY: 1}
    assert t.release_not_owned == {KEY: 1}
    assert t.tracked == 0
    h = t.hold_ratio[KEY]
    assert h.count == 2
    assert h.total == pytest.approx(1.0 + 0.95 / 5.0)


def test_a_release_late_in_the_new_lease_or_without_expiry_is_not_suspected() -> None:
    t = tracker()
    lease(t, KEY, 0.0, 1.0)
    t.apply(KEY, "expired", 1.0)
    lease(t, KEY, 1.1, 1.0)
    t.apply(KEY, "del", 1.7)  # 0.6 of its TTL: past foreign_release_ratio (0.5)
    lease(t, "lock:product:A", 2.0, 1.0)
    t.apply("lock:product:A", "del", 2.1)  # quick, but that key never expired
    assert t.release_not_owned == {KEY: 0, "lock:product:A": 0}
    assert t.expired_while_held == {KEY: 1, "lock:product:A": 0}


def test_every_link_of_the_cascade_counts_within_the_window_of_its_expiry() -> None:
    t = tracker(reacquire_window=10.0)
    lease(t, KEY, 0.0, 5.0)  # A works past its lease
    t.apply(KEY, "expired", 5.0)
    lease(t, KEY, 5.05, 5.0)  # B
    t.apply(KEY, "del", 6.0)  # A deletes B's lock
    lease(t, KEY, 6.02, 5.0)  # C takes it at once
    t.apply(KEY, "del", 6.5)  # B, robbed, deletes C's
    lease(t, KEY, 6.52, 5.0)  # D
    t.apply(KEY, "del", 7.0)  # C deletes D's
    assert t.release_not_owned == {KEY: 3}
    # Past reacquire_window of the expiry, a quick release no longer counts (the window
    # is counted from the expiry, so a steady run of quick releases ends there).
    lease(t, KEY, 7.1, 5.0)
    t.apply(KEY, "del", 7.2)  # E's: counted (still within 10 s of the expiry at 5.0)
    lease(t, KEY, 15.5, 5.0)
    t.apply(KEY, "del", 15.6)  # 10.5 s after the expiry
    assert t.release_not_owned == {KEY: 4}
    assert t.expired_while_held == {KEY: 1}


def test_a_late_link_is_missed_and_the_next_early_one_still_counts() -> None:
    t = tracker()
    lease(t, KEY, 0.0, 1.0)
    t.apply(KEY, "expired", 1.0)
    lease(t, KEY, 1.05, 1.0)
    t.apply(KEY, "del", 1.35)  # early: counted
    lease(t, KEY, 1.37, 1.0)
    t.apply(KEY, "del", 2.35)  # at 0.98 of the lease: looks like an own release, missed
    lease(t, KEY, 2.37, 1.0)
    t.apply(KEY, "del", 2.67)  # early again, still within reacquire_window of the expiry
    assert t.release_not_owned == {KEY: 2}


def test_reacquire_window_bounds_what_counts_as_a_reacquisition() -> None:
    t = tracker(reacquire_window=10.0)
    lease(t, KEY, 0.0, 1.0)
    t.apply(KEY, "expired", 1.0)
    lease(t, KEY, 20.0, 1.0)  # 19 s later: a fresh acquisition
    t.apply(KEY, "del", 20.1)
    assert t.release_not_owned[KEY] == 0


def test_extensions_move_the_deadline_and_persist_removes_it() -> None:
    t = tracker()
    lease(t, KEY, 0.0, 1.0)
    t.apply(KEY, "expire", 0.5, 1.5)  # extended to 1.5
    t.apply(KEY, "del", 1.2)
    assert t.hold_ratio[KEY].total == pytest.approx(1.2 / 1.5)
    lease(t, "lock:product:A", 0.0, 1.0)
    t.apply("lock:product:A", "persist", 0.1)
    t.apply("lock:product:A", "del", 3.0)  # no TTL: no ratio
    assert "lock:product:A" not in t.hold_ratio


def test_expire_read_back_after_the_key_was_gone_leaves_the_ttl_unknown() -> None:
    t = tracker()
    t.apply(KEY, "set", 0.0)
    t.apply(KEY, "expire", 0.0, None)
    t.apply(KEY, "del", 0.1)
    assert KEY not in t.hold_ratio
    assert t.release_not_owned[KEY] == 0


def test_expiry_of_a_lease_never_seen_acquired_still_counts() -> None:
    t = tracker()
    t.apply(KEY, "expired", 3.0)  # acquired before the watcher started
    assert t.expired_while_held == {KEY: 1}
    assert KEY not in t.hold_ratio


def test_bounds_tracked_limit_end_unseen_evicted_and_disconnect() -> None:
    t = tracker(max_tracked=2)
    for n, key in enumerate(("lock:product:EGG-01", "lock:product:A", "lock:product:B")):
        lease(t, key, float(n), 1.0)
    assert t.tracked == 2
    assert t.lost["tracked_limit"] == 1
    assert t.acquisitions["lock:product:B"] == 1  # counted, not followed
    t.apply("lock:product:A", "evicted", 1.5)
    assert t.lost["evicted"] == 1
    t.sweep(1.0 + END_UNSEEN_GRACE + 1)  # EGG-01's deadline passed long ago
    assert t.lost["end_unseen"] == 1
    assert t.tracked == 0
    lease(t, KEY, 100.0, 10.0)
    assert t.forget() == 1
    assert t.lost["disconnect"] == 1


def test_unknown_events_and_unwatched_keys_are_counted_not_tracked() -> None:
    t = tracker()
    t.apply(KEY, "rename_from", 0.0)
    t.apply("session:1", "set", 0.0)
    assert t.events["other"] == 1
    assert t.events["set"] == 1
    assert t.acquisitions == {}


def test_families_export_the_catalog_names_with_zeroes_from_the_first_acquisition() -> None:
    t = tracker()
    lease(t, KEY, 0.0, 2.0)
    t.apply(KEY, "del", 1.0)
    samples = exported(t)
    lock = (("lock", KEY),)
    assert samples[("stock_lock_acquisitions_total", lock)] == 1
    assert samples[("stock_lock_expired_while_held_total", lock)] == 0
    assert samples[("stock_lock_release_not_owned_total", lock)] == 0
    assert samples[("stock_lock_hold_ratio_bucket", (("le", "0.5"), ("lock", KEY)))] == 1
    assert samples[("stock_lock_hold_ratio_bucket", (("le", "0.25"), ("lock", KEY)))] == 0
    assert samples[("stock_lock_hold_ratio_bucket", (("le", "+Inf"), ("lock", KEY)))] == 1
    assert samples[("stock_lock_hold_ratio_sum", lock)] == pytest.approx(0.5)
    assert samples[("stocksentry_lockwatch_events_total", (("event", "del"),))] == 1
    assert samples[("stocksentry_lockwatch_leases_lost_total", (("reason", "disconnect"),))] == 0


@pytest.mark.parametrize(
    ("current", "missing"),
    [("", "Kg$x"), ("KEA", ""), ("AK", ""), ("Ex", "Kg$"), ("Kgx", "$"), ("K$", "gx")],
)
def test_missing_flags(current: str, missing: str) -> None:
    assert missing_flags(current) == missing
    assert missing_flags(current + missing) == ""


def test_refused_hint_names_the_flags() -> None:
    assert "'g$'" in refused_hint("g$")
    assert "'Kg$x'" in refused_hint(None)


def test_config_defaults_and_errors() -> None:
    config = parse_config("lock_watch:\n  url: redis://127.0.0.1:6390/2\n")
    watch = config.lock_watch
    assert watch is not None
    assert watch.patterns == ("lock:product:{sku}",)
    assert watch.configure_notifications is False
    assert watch.foreign_release_ratio == 0.5
    assert parse_config("{}").lock_watch is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("  patterns: []\n", "lock_watch.patterns: must not be empty"),
        ("  patterns: ['lock:product']\n", 'needs a "*" or "{sku}"'),
        ("  patterns: ['lock:{sku}:{sku}']\n", "expected a key pattern"),
        ("  patterns: ['lock:[ab]*']\n", "expected a key pattern"),
        ("  foreign_release_ratio: 1.5\n", "greater than 0 and at most 1"),
        # An int too large for a float: refused in one line, not an OverflowError.
        ("  foreign_release_ratio: 1" + "0" * 400 + "\n", "greater than 0 and at most 1"),
        ("  max_tracked_locks: 0\n", "lock_watch.max_tracked_locks"),
        ("  colour: red\n", "colour"),
    ],
)
def test_config_refuses_with_the_key(body: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=r"lock_watch") as info:
        parse_config("lock_watch:\n  url: redis://127.0.0.1:6390/0\n" + body)
    assert expected in str(info.value)


def test_url_with_password_must_come_from_env() -> None:
    with pytest.raises(ConfigError, match=r"lock_watch\.url"):
        parse_config("lock_watch:\n  url: redis://u:secret@127.0.0.1:6390/0\n")
