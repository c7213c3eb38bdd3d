"""``stocksentry drill``: the pre-sale drill against a shop's own checkout over HTTP,
judged by the database's truth (see docs/drill.md)."""
