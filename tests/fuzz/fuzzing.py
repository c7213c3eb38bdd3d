"""The fuzz suite's budget and shared strategies.

:func:`examples` gives each target its number of examples under the loaded profile:
the ``ci`` figure as written in the test, fifty times that under ``long``. The figures
were chosen so that the whole suite runs in about 60 s of ``make test`` on a 2-core
machine.
"""

from __future__ import annotations

import os
from typing import Final

from hypothesis import settings
from hypothesis import strategies as st

#: How many times the ``ci`` budget the ``long`` profile runs.
LONG_FACTOR: Final = 50
#: Longest generated text, so one example stays cheap (the loaders' own size limits are
#: tested by the unit suite, not here).
MAX_TEXT: Final = 2_000
#: The longest one-line error message a loader may give.
MAX_ERROR: Final = 1_000


def examples(ci: int) -> settings:
    """Hypothesis settings running ``ci`` examples under ``ci`` (more under ``long``)."""
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    return settings(max_examples=ci * LONG_FACTOR if profile == "long" else ci)


_BREAKERS: Final = "\x00\x01\x1b\x7f\x85\u2028\u2029\ufeff\r\n\t \"'`{}[]:=,#&*!|>%@$\\"
#: Any text: every plane, control characters, NUL, lone surrogates.
any_text = st.text(st.characters(codec=None), max_size=MAX_TEXT)
#: Text that is rich in what breaks parsers: controls, quotes, brackets, separators.
hostile_text = st.text(
    st.one_of(
        st.characters(codec=None),
        st.sampled_from(list(_BREAKERS)),
    ),
    max_size=MAX_TEXT,
)


def assert_one_line(message: str) -> None:
    """A loader's error: one line, not empty, at most :data:`MAX_ERROR` characters."""
    assert message, "empty error message"
    # splitlines(): every line break a terminal or a log shipper honours (\x85, \u2028...).
    assert len(message.splitlines()) == 1, repr(message[:200])
    assert len(message) <= MAX_ERROR, (len(message), message[:200])
