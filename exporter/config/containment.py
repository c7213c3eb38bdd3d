"""``containment``: where the per-SKU freezes live, and what the Alertmanager webhook may do.

One section for both users of the freeze contract in the sidecar: the
``stocksentry_sku_frozen`` gauge read from Redis, and the webhook that freezes the SKUs
named by the allowed alerts (docs/containment.md). ``stocksentry freeze --config FILE``
reads the same keys.
"""

# ruff: noqa: RUF009 - the fields' metadata is built by calls (key(), url_keys() ...) that
# return dataclasses.field objects, the way dataclasses.field itself is called.

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from stocksentry.instrumentation.freeze import DEFAULT_CHANNEL, DEFAULT_KEY_TEMPLATE
from stocksentry.instrumentation.secrets import Secret

from .kinds import DAY, MINUTE, Bool, Choice, Duration, Integer, Named, Template, Text, TextList
from .specs import derived, key, redis_url

#: The alerts whose firing freezes the SKU they name, unless the config says otherwise.
DEFAULT_FREEZE_ALERTS: Final = ("StockOversold", "StockNegativeInventory", "StockNegativeWrite")
#: Where the sidecar takes Alertmanager's webhook (behind the same web config as /metrics).
WEBHOOK_PATH: Final = "/alertmanager/freeze"
MODES: Final = ("dry_run", "enforce")
ALERT_NAME: Final = Named("[a-zA-Z_:][a-zA-Z0-9_:]*", "an alert name", "alert name")


@dataclass(frozen=True, slots=True)
class ContainmentConfig:
    """``containment``: per-SKU freezes in Redis, and the webhook that sets them."""

    url: Secret = redis_url(
        "the Redis holding the freezes (the one the checkouts read): `redis://`, "
        "`rediss://` or `unix://`",
    )
    url_source: str = derived("literal", "where the URL came from")
    key_template: str = key(
        DEFAULT_KEY_TEMPLATE, Template("sku"), "the key of a frozen SKU (the checkouts' too)"
    )
    channel: str = key(DEFAULT_CHANNEL, Text(), "the channel announcing every freeze change")
    mode: str = key(
        "dry_run",
        Choice(MODES),
        "`dry_run`: the webhook logs and counts the freezes it would make and makes none; "
        "`enforce`: it freezes",
    )
    alerts: tuple[str, ...] = key(
        DEFAULT_FREEZE_ALERTS,
        TextList(ALERT_NAME, non_empty=True),
        "alerts whose firing freezes the SKU in their `sku` label; any other is ignored",
    )
    max_auto_frozen: int = key(
        5,
        Integer(1, 10_000),
        "SKUs frozen by alerts at once at most; past it the webhook freezes no more, logs "
        "and counts `over_limit` (StockFreezeLimitReached pages)",
    )
    expiry: float = key(
        30 * MINUTE,
        Duration(maximum=7 * DAY),
        "an alert's freeze lifts itself after this (a firing alert renews it: Alertmanager "
        "sends it again each `repeat_interval`)",
    )
    unfreeze_on_resolved: bool = key(
        False,
        Bool(),
        "a resolved alert lifts the freeze that alerts made (never a person's); `false`: "
        "it runs out at `expiry` or a person lifts it",
    )
    max_body_bytes: int = key(
        1 << 20, Integer(1024, 64 << 20), "a webhook body larger than this is refused (413)"
    )
    resync_interval: float = key(
        5.0,
        Duration(maximum=10 * MINUTE),
        "how often the sidecar re-reads every freeze key (a lost change message is caught "
        "then); changes arrive at once through the channel",
    )
