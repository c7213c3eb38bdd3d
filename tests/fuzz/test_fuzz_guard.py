"""The SKU guard and label sanitising on hostile values: bounded, clean, idempotent.

``sanitize_label_value`` must give at most ``max_length`` characters of the allowed
alphabet, the same text again when given its own output, and ``__empty__`` for nothing;
a :class:`LabelGuard` must never hand out more distinct series than its promo SKUs,
``max_values`` and the overflow value.
"""

from __future__ import annotations

import re

from fuzzing import any_text, examples, hostile_text
from hypothesis import given
from hypothesis import strategies as st
from stocksentry.instrumentation.catalog import OVERFLOW_VALUE
from stocksentry.instrumentation.guard import EMPTY_VALUE, LabelGuard, sanitize_label_value

_ALLOWED = re.compile(r"[A-Za-z0-9_.:/@#+\-]+")
_values = st.one_of(any_text, hostile_text, st.text("AB-_ ", max_size=70))


@examples(2000)
@given(_values, st.integers(1, 200))
def test_a_label_value_is_bounded_clean_and_idempotent(value: str, max_length: int) -> None:
    label = sanitize_label_value(value, max_length)
    assert 1 <= len(label) <= max_length
    assert _ALLOWED.fullmatch(label), repr(label)
    assert sanitize_label_value(label, max_length) == label
    if not value:
        assert label == EMPTY_VALUE[:max_length]


@examples(600)
@given(
    st.lists(_values, max_size=8),
    st.integers(0, 20),
    st.lists(_values, max_size=80),
)
def test_the_guard_never_exceeds_promo_plus_budget_plus_overflow(
    promo: list[str], max_values: int, seen: list[str]
) -> None:
    guard = LabelGuard(max_values, always=promo)
    labels = {guard(value) for value in seen}
    labels |= {guard(value) for value in promo}
    assert len(labels) <= len(set(promo)) + max_values + 1
    assert guard.admitted_count <= max_values
    for value, label in zip(seen, [guard(v) for v in seen], strict=True):
        # Asked again, the same value keeps its label (a series is never moved).
        assert guard(value) == label
        assert label == OVERFLOW_VALUE or _ALLOWED.fullmatch(label)
        assert len(label) <= 64
