"""Per-SKU freezes: :mod:`.cli` holds ``stocksentry freeze / unfreeze / frozen``,
:mod:`.webhook` the sidecar's freeze gauge and Alertmanager webhook. The contract is the
instrumentation's (:mod:`stocksentry.instrumentation.freeze`), the one a checkout honours.
"""


def scrub(error: BaseException, url: str) -> str:
    """``error`` as text without the secrets of the Redis ``url``."""
    from stocksentry.instrumentation.secrets import redact, secret_fragments

    return redact(f"{type(error).__name__}: {error}", secret_fragments(url))
