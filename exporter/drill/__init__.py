"""``stocksentry drill``: the pre-sale drill against a shop's own checkout over HTTP,
judged by the database's truth (see docs/drill.md)."""

#: The scenarios, in the order they run and are reported (here, so --help loads no more).
SCENARIOS = ("burst", "retry", "duplicate_callback", "stale_availability", "observability")
