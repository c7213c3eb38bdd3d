"""The per-SKU freeze contract: one Redis key per frozen SKU, and a channel announcing changes.

A checkout in any language honours a freeze by checking, before it reserves, whether the
SKU's key exists (O(1)); this module is that contract written once, for the Python
instrumentation (:class:`~stocksentry.instrumentation.freezeview.FreezeView`), the
``stocksentry freeze / unfreeze / frozen`` commands and the sidecar's Alertmanager webhook.

The contract (docs/containment.md):

- **key**: ``key_template`` with ``{sku}`` replaced by the SKU, by default
  ``stocksentry:freeze:{sku}``. It exists while the SKU is frozen; a freeze with an expiry
  has a Redis TTL, so the key disappears by itself.
- **value**: a JSON object ``{"sku", "reason", "source", "at", "expires_at", "by"}``:
  ``source`` is ``person`` or ``alert``, ``at`` and ``expires_at`` Unix seconds
  (``expires_at`` ``null`` without an expiry), ``by`` who or what froze it.
- **channel**: every change is published on ``channel`` (default ``stocksentry:freeze``) as
  ``{"action": "freeze" | "unfreeze", "sku", "state"}`` (``state`` the value, ``null`` on
  unfreeze), so a checkout can keep a local view instead of asking Redis per reservation.

Changes go through two Lua scripts (:data:`FREEZE_SCRIPT`, :data:`UNFREEZE_SCRIPT`) that
write and publish atomically and enforce the one rule between the sources: an alert never
overwrites nor lifts a person's freeze.

    >>> key_for(DEFAULT_KEY_TEMPLATE, "EGG-01")
    'stocksentry:freeze:EGG-01'
    >>> sku_of_key(DEFAULT_KEY_TEMPLATE, "stocksentry:freeze:EGG-01")
    'EGG-01'
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, get_args

#: Who froze a SKU.
FreezeSource = Literal["person", "alert"]
FREEZE_SOURCES: Final[tuple[str, ...]] = get_args(FreezeSource)
DEFAULT_KEY_TEMPLATE: Final = "stocksentry:freeze:{sku}"
DEFAULT_CHANNEL: Final = "stocksentry:freeze"
#: Longest SKU a freeze accepts (a key, a log field and a label, so kept short).
MAX_SKU_LENGTH: Final = 200
MAX_REASON_LENGTH: Final = 500

# An alert's freeze never replaces a person's (it would give it the alert's expiry); a
# person's replaces anything. Returns what happened: frozen, refreshed or kept.
FREEZE_SCRIPT: Final = """
local current = redis.call('GET', KEYS[1])
if current and ARGV[2] == 'alert' then
  local ok, old = pcall(cjson.decode, current)
  if ok and type(old) == 'table' and old['source'] == 'person' then return 'kept' end
end
local ttl = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', ARGV[4], ARGV[5])
if current then return 'refreshed' end
return 'frozen'
"""
# An alert lifts only an alert's freeze. Returns unfrozen, absent or kept.
UNFREEZE_SCRIPT: Final = """
local current = redis.call('GET', KEYS[1])
if not current then return 'absent' end
if ARGV[1] == 'alert' then
  local ok, old = pcall(cjson.decode, current)
  if not (ok and type(old) == 'table' and old['source'] == 'alert') then return 'kept' end
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 'unfrozen'
"""


class FreezeContractError(ValueError):
    """A SKU, reason, template or stored value that the freeze contract does not allow."""


def _json_object(raw: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FreezeContractError(f"{what} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FreezeContractError(f"{what} is not a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class FreezeState:
    """One frozen SKU: the JSON value of its key."""

    sku: str
    reason: str
    source: str
    at: float
    expires_at: float | None = None
    by: str = ""

    def active(self, now: float | None = None) -> bool:
        """Whether the freeze holds at ``now`` (Unix seconds; default the current time)."""
        return self.expires_at is None or self.expires_at > (time.time() if now is None else now)

    def to_json(self) -> str:
        """The key's value."""
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> FreezeState:
        """The state a key holds; :class:`FreezeContractError` for anything else."""
        data = _json_object(raw, "freeze value")
        sku, reason, source = data.get("sku"), data.get("reason", ""), data.get("source")
        at, expires, by = data.get("at"), data.get("expires_at"), data.get("by", "")
        if not isinstance(sku, str) or not isinstance(reason, str) or not isinstance(by, str):
            raise FreezeContractError("freeze value: sku, reason and by must be strings")
        if source not in FREEZE_SOURCES:
            raise FreezeContractError(f"freeze value: source must be one of {FREEZE_SOURCES}")
        if not isinstance(at, (int, float)) or not _is_time(at):
            raise FreezeContractError("freeze value: at must be Unix seconds")
        if expires is not None and not (isinstance(expires, (int, float)) and _is_time(expires)):
            raise FreezeContractError("freeze value: expires_at must be Unix seconds or null")
        return cls(sku, reason, source, float(at), None if expires is None else float(expires), by)


def _is_time(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        seconds = float(value)
    except OverflowError:  # an int too large for a float: JSON allows any
        return False
    return math.isfinite(seconds) and seconds >= 0


def check_sku(sku: object) -> str:
    """``sku`` when a freeze may name it: a non-empty str of at most
    :data:`MAX_SKU_LENGTH` characters, without control characters."""
    if not isinstance(sku, str):
        raise FreezeContractError(f"SKU must be a string, got {type(sku).__name__}")
    if not sku or len(sku) > MAX_SKU_LENGTH:
        raise FreezeContractError(f"SKU must be 1 to {MAX_SKU_LENGTH} characters")
    if (
        any((ch.isspace() and ch != " ") or not ch.isprintable() for ch in sku)
        or sku != sku.strip()
    ):
        raise FreezeContractError("SKU holds control characters or surrounding blanks")
    return sku


def check_template(template: object) -> str:
    """``template`` when it is a key template: a str holding ``{sku}`` exactly once."""
    if not isinstance(template, str):
        raise TypeError(f"key_template must be a str, got {type(template).__name__}")
    if template.count("{sku}") != 1:
        raise ValueError(f"key_template must hold {{sku}} exactly once, got {template!r:.80}")
    return template


def key_for(template: str, sku: str) -> str:
    """The key of ``sku`` under ``template``."""
    return template.replace("{sku}", sku)


def sku_of_key(template: str, key: str) -> str | None:
    """The SKU a key names under ``template``, or ``None`` when it is not one of its keys."""
    prefix, _, suffix = template.partition("{sku}")
    if len(key) <= len(prefix) + len(suffix):
        return None
    if not key.startswith(prefix) or not key.endswith(suffix):
        return None
    return key[len(prefix) : len(key) - len(suffix)]


def scan_pattern(template: str) -> str:
    """The ``SCAN MATCH`` pattern of every key of ``template`` (glob characters escaped)."""
    prefix, _, suffix = template.partition("{sku}")
    return _glob_escape(prefix) + "*" + _glob_escape(suffix)


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def message(
    action: Literal["freeze", "unfreeze"],
    sku: str,
    state: FreezeState | None,
    source: str | None = None,
) -> str:
    """The channel message announcing a change; ``source``: who lifted it, on unfreeze."""
    body: dict[str, Any] = {"action": action, "sku": sku, "state": None}
    if state is not None:
        body["state"] = asdict(state)
    if source is not None:
        body["source"] = source
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def parse_message(raw: str | bytes) -> tuple[str, str, FreezeState | None, str]:
    """``(action, sku, state, source)`` of a channel message (``state`` ``None`` on
    unfreeze; ``source`` who made the change); :class:`FreezeContractError` else."""
    data = _json_object(raw, "freeze message")
    action, sku, state = data.get("action"), data.get("sku"), data.get("state")
    if action not in ("freeze", "unfreeze") or not isinstance(sku, str):
        raise FreezeContractError("freeze message: unknown action or no sku")
    if action == "unfreeze":
        source = data.get("source")
        return action, sku, None, source if source in FREEZE_SOURCES else "person"
    parsed = FreezeState.from_json(json.dumps(state))
    return action, sku, parsed, parsed.source


@dataclass(frozen=True, slots=True)
class FreezeCall:
    """One script call: what ``client.eval(script, len(keys), *keys, *args)`` takes, the
    same for redis-py's sync and asyncio clients."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str, ...]


def freeze_call(
    template: str,
    channel: str,
    sku: str,
    *,
    reason: str,
    source: FreezeSource,
    ttl: float | None = None,
    by: str = "",
    now: float | None = None,
) -> tuple[FreezeCall, FreezeState]:
    """The script call that freezes ``sku`` (for ``ttl`` seconds, or until unfrozen), and
    the state it writes."""
    check_sku(sku)
    if source not in FREEZE_SOURCES:
        raise FreezeContractError(f"source must be one of {FREEZE_SOURCES}, got {source!r:.40}")
    if ttl is not None and not (math.isfinite(ttl) and ttl > 0):
        raise FreezeContractError(f"ttl must be a positive number of seconds, got {ttl!r}")
    at = time.time() if now is None else now
    state = FreezeState(
        sku,
        reason[:MAX_REASON_LENGTH],
        source,
        round(at, 3),
        None if ttl is None else round(at + ttl, 3),
        by[:MAX_REASON_LENGTH],
    )
    ttl_ms = 0 if ttl is None else max(1, int(ttl * 1000))
    args = (state.to_json(), source, str(ttl_ms), channel, message("freeze", sku, state))
    return FreezeCall(FREEZE_SCRIPT, (key_for(template, sku),), args), state


def unfreeze_call(template: str, channel: str, sku: str, *, source: FreezeSource) -> FreezeCall:
    """The script call that lifts the freeze of ``sku`` (an alert's only, when ``source``
    is ``alert``)."""
    check_sku(sku)
    args = (source, channel, message("unfreeze", sku, None, source))
    return FreezeCall(UNFREEZE_SCRIPT, (key_for(template, sku),), args)


def decoded(reply: object) -> str:
    """A script's reply as text (redis-py gives bytes unless ``decode_responses``)."""
    return reply.decode() if isinstance(reply, bytes) else str(reply)
