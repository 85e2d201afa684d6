"""Cache policy: what may be stored, how an entry answers a hit, and what a notification makes stale.

MCP 2026-07-28, server/utilities/caching: a result of the six cacheable methods carries ``ttlMs``
and ``cacheScope`` ('Cacheable Results'); a shared cache may keep it only when ``cacheScope`` is
``"public"`` ('Cache Scope Field'), for no longer than ``ttlMs`` from receipt ('Freshness
Calculation'). The gateway answers a hit with ``ttlMs`` lowered to the time that is left (its own
reading of 'Freshness Calculation'). An input-required result is never a cacheable answer.
Notifications (``notifications/*/list_changed``, ``notifications/resources/updated``) make
entries stale before their time ('Interaction with Notifications'; they arrive on a
``subscriptions/listen`` stream, basic/patterns/subscriptions).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import orjson

from ..codec import dumps
from .keys import CacheKey

__all__ = [
    "REFRESH_FRACTION",
    "REFRESH_MIN_S",
    "STORED",
    "CacheEntry",
    "Invalidation",
    "StoreOutcome",
    "build_entry",
    "derive_entry",
    "entry_result",
    "invalidation",
    "lifetimes",
    "store_outcome",
    "uri_of",
]


class StoreOutcome(StrEnum):
    """What became of an answer to a cacheable request: the ``cache_stores`` label (its value)
    and, when it was not stored, the ``Cache-Status`` ``detail`` (:attr:`detail`)."""

    STORED = "stored"
    #: Not HTTP 200.
    STATUS = "status"
    #: A JSON-RPC error, or no result.
    ERROR = "error"
    #: ``resultType`` absent or other than ``complete``.
    INPUT_REQUIRED = "input_required"
    #: ``cacheScope`` not exactly ``public``.
    PRIVATE = "private"
    #: ``ttlMs`` absent, not an integer, or not positive.
    NO_TTL = "no_ttl"
    #: Over ``max_entry_bytes``.
    TOO_LARGE = "too_large"
    #: Storable, but purged while on its way (it may be what the purge was for), or the store
    #: refused it (expired on arrival, over ``max_bytes``).
    REFUSED = "refused"
    #: Storable, but the shared tier is read-only: nothing stored could be vouched for.
    CLUSTER_READ_ONLY = "cluster_read_only"
    #: A relayed SSE answer that ended without the response.
    STREAM_BROKEN = "stream_broken"

    @property
    def detail(self) -> str:
        """The ``Cache-Status`` ``detail`` form (RFC 9211 parameters use hyphens)."""
        return _DETAILS[self]


_DETAILS: Final = {outcome: outcome.value.replace("_", "-") for outcome in StoreOutcome}
STORED: Final = StoreOutcome.STORED
#: Refresh-ahead: an entry asked for in the last tenth of its lifetime is fetched again ...
REFRESH_FRACTION: Final = 0.1
#: ... or in its last second, whichever is longer (but never in the first half of its lifetime),
#: so that a short-lived entry has the time of an upstream round trip left to be refreshed in.
REFRESH_MIN_S: Final = 1.0


def store_outcome(status: int, message: object, size: int, max_entry_bytes: int) -> StoreOutcome:
    """Decide whether an upstream answer may be stored.

    ``message`` is the parsed JSON-RPC response and ``size`` its serialised size in bytes.
    Returns :attr:`StoreOutcome.STORED` or the reason it may not be: ``status`` (not HTTP 200), ``error``
    (JSON-RPC error or not a result), ``input_required`` (``resultType`` absent or other than
    ``complete``), ``private`` (``cacheScope`` not exactly ``public``, absent included: schema
    ``CacheableResult`` requires it and MCP 2026-07-28, server/utilities/caching, 'Cache Scope
    Field' gives no default), ``no_ttl`` (``ttlMs`` absent, not an integer, or ``<= 0``),
    ``too_large`` (``size`` over ``max_entry_bytes``).
    """
    if status != 200:
        return StoreOutcome.STATUS
    if not isinstance(message, dict) or "error" in message:
        return StoreOutcome.ERROR
    result = message.get("result")
    if not isinstance(result, dict):
        return StoreOutcome.ERROR
    if result.get("resultType") != "complete":
        return StoreOutcome.INPUT_REQUIRED
    if result.get("cacheScope") != "public":
        return StoreOutcome.PRIVATE
    ttl = result.get("ttlMs")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        return StoreOutcome.NO_TTL
    if size > max_entry_bytes:
        return StoreOutcome.TOO_LARGE
    return STORED


_RESPONSE_START: Final = b'{"jsonrpc":"2.0","id":'


@dataclass(frozen=True, slots=True, weakref_slot=True)
class CacheEntry:
    """One stored result, pre-rendered so a hit costs one byte join.

    ``head`` and ``tail`` are the rest of the response after its id (``,"result":{...}}``),
    before and after the ``ttlMs`` value (views of one buffer, so the result is held once).
    The response to a hit is ``{"jsonrpc":"2.0","id":<id>`` + ``head`` + remaining ttlMs +
    ``tail``; ``expires_at`` and ``stored_at`` are clock seconds, ``ttl_ms`` the stored lifetime
    in milliseconds (already capped by ``max_ttl_ms``), ``size`` the length of the buffer
    ``head`` and ``tail`` are views of, in bytes. ``keep_until`` (clock seconds, at least
    ``expires_at``) is when the store drops it: later than ``expires_at`` only for an upstream
    with ``stale_if_error_ms``, whose expired entry may answer while fetching it again fails.
    ``refresh_at`` (clock seconds; infinite without refresh-ahead) is when a hit on it starts a
    background refresh (:func:`lifetimes`). Weakly referable: an answer of ``POST /mcp`` notes
    the member entries it was made of without keeping them alive (:mod:`gateway.aggregate`).
    """

    head: bytes | memoryview
    tail: bytes | memoryview
    stored_at: float
    expires_at: float
    ttl_ms: int
    size: int
    keep_until: float
    refresh_at: float = math.inf

    def remaining_ms(self, now: float) -> int:
        """Milliseconds of freshness left at ``now``, floored at 0."""
        return max(0, math.floor((self.expires_at - now) * 1000))

    def response(self, id_json: bytes, now: float) -> bytes:
        """The JSON-RPC response for a caller whose id serialises to ``id_json``."""
        return self.hit(id_json, now)[0]

    def hit(self, id_json: bytes, now: float) -> tuple[bytes, int]:
        """The response for a cache hit at ``now`` and the ``ttlMs`` it carries (what is left, as
        :meth:`remaining_ms`, written out: every hit comes here)."""
        ttl_ms = math.floor((self.expires_at - now) * 1000)
        if ttl_ms < 0:
            ttl_ms = 0
        return b"".join((_RESPONSE_START, id_json, self.head, b"%d" % ttl_ms, self.tail)), ttl_ms

    def hit_pieces(self, id_json: bytes, now: float) -> tuple[tuple[bytes | memoryview, ...], int]:
        """:meth:`hit`, not joined: the pieces of the response (``head`` and ``tail`` the entry's
        own views, shared by every caller sent them) and its ``ttlMs``; for large entries."""
        ttl_ms = max(0, math.floor((self.expires_at - now) * 1000))
        return (_RESPONSE_START, id_json, self.head, b"%d" % ttl_ms, self.tail), ttl_ms

    def stale_pieces(self, id_json: bytes, now: float) -> tuple[tuple[bytes | memoryview, ...], int]:
        """:meth:`stale`, not joined (as :meth:`hit_pieces`)."""
        past = max(1, math.ceil(now - self.expires_at))
        return (_RESPONSE_START, id_json, self.head, b"0", self.tail), past

    def stale(self, id_json: bytes, now: float) -> tuple[bytes, int]:
        """The response for a stale answer (stale-if-error) at ``now``, past ``expires_at``: ``ttlMs``
        0, and the whole seconds it is past its expiry, rounded up (at least 1: RFC 9211 reads a
        negative ``ttl`` as stale, and ``-0`` would be 0)."""
        past = max(1, math.ceil(now - self.expires_at))
        return b"".join((_RESPONSE_START, id_json, self.head, b"0", self.tail)), past


def lifetimes(expires_at: float, ttl_ms: int, stale_if_error_ms: int, refresh_ahead: bool) -> tuple[float, float]:
    """``(keep_until, refresh_at)`` of an entry expiring at ``expires_at`` (clock seconds) after a
    lifetime of ``ttl_ms``: kept ``stale_if_error_ms`` past its expiry; with ``refresh_ahead``,
    refreshed from :data:`REFRESH_FRACTION` of its lifetime (at least :data:`REFRESH_MIN_S`, at
    most half of it) before it expires, else never."""
    keep_until = expires_at + stale_if_error_ms / 1000
    if not refresh_ahead:
        return keep_until, math.inf
    ttl_s = ttl_ms / 1000
    return keep_until, expires_at - min(max(REFRESH_FRACTION * ttl_s, REFRESH_MIN_S), ttl_s / 2)


_RESULT: Final = b',"result":'
_PLACEHOLDER: Final = "mcp-gateway-ttl-" + secrets.token_hex(8)
_PLACEHOLDER_JSON: Final = dumps(_PLACEHOLDER)


def build_entry(
    message: Mapping[str, Any],
    now: float,
    max_ttl_ms: int,
    *,
    stale_if_error_ms: int = 0,
    refresh_ahead: bool = False,
) -> CacheEntry | None:
    """Pre-render a storable response (see :func:`store_outcome`) as a :class:`CacheEntry`.

    Lifetime is ``min(ttlMs, max_ttl_ms)`` milliseconds from ``now`` (clock seconds); the last two
    arguments are the upstream's (``keep_until``, ``refresh_at``: :func:`lifetimes`). Returns
    ``None`` if the result cannot be written back (it holds a number beyond the float range) or
    cannot be split around its ``ttlMs``.
    """
    result = message["result"]
    ttl_ms = min(int(result["ttlMs"]), max_ttl_ms)
    split = _rendered(result)
    if split is None:
        return None
    head, tail, size = split
    expires_at = now + ttl_ms / 1000
    keep_until, refresh_at = lifetimes(expires_at, ttl_ms, stale_if_error_ms, refresh_ahead)
    return CacheEntry(head, tail, now, expires_at, ttl_ms, size, keep_until, refresh_at)


def _rendered(result: Mapping[str, Any]) -> tuple[memoryview, memoryview, int] | None:
    """``result`` rendered as the rest of a response after its id, split around its ``ttlMs``
    value: (head, tail, size in bytes), views of one buffer; ``None`` when it cannot be (a
    number beyond the float range, or the placeholder found twice)."""
    body = dict(result)
    body["ttlMs"] = _PLACEHOLDER
    try:
        # A fresh, exact-size copy: orjson's own output buffer is over-allocated, and the
        # entry may live for an hour.
        rendered = _RESULT + dumps(body) + b"}"
    except ValueError:  # a non-finite number parsed from an exotic literal: not storable
        return None
    at = rendered.find(_PLACEHOLDER_JSON)
    end = at + len(_PLACEHOLDER_JSON)
    if at < 0 or rendered.find(_PLACEHOLDER_JSON, end) >= 0:
        return None
    view = memoryview(rendered)
    return view[:at], view[end:], len(rendered)


def entry_result(entry: CacheEntry) -> dict[str, Any]:
    """The JSON-RPC result ``entry`` holds, parsed (its ``ttlMs`` the stored lifetime)."""
    rendered = b"".join((bytes(entry.head), b"%d" % entry.ttl_ms, bytes(entry.tail)))
    result: dict[str, Any] = orjson.loads(rendered[len(_RESULT) : -1])
    return result


def derive_entry(entry: CacheEntry, result: Mapping[str, Any]) -> CacheEntry | None:
    """An entry answering ``result`` (another result made from ``entry``'s: a filtered view) with
    ``entry``'s lifetimes, so that it answers with the time ``entry`` has left. ``None`` when it
    cannot be rendered (as :func:`build_entry`)."""
    split = _rendered(result)
    if split is None:
        return None
    head, tail, size = split
    return CacheEntry(
        head, tail, entry.stored_at, entry.expires_at, entry.ttl_ms, size, entry.keep_until, entry.refresh_at
    )


def uri_of(key: CacheKey) -> object:
    """The ``uri`` in ``key``'s params (for a ``resources/read`` key, the resource read), or
    ``None`` when they have none."""
    try:
        params = orjson.loads(key.params)
    except orjson.JSONDecodeError:
        return None
    return params.get("uri") if isinstance(params, dict) else None


@dataclass(frozen=True, slots=True)
class Invalidation:
    """Which cache entries an event makes stale; called with a key, says whether it is one.

    Every entry of ``upstream`` (of every upstream when ``None``) whose method is in ``methods``
    (any method when ``None``); with ``uri``, only ``resources/read`` entries of that URI or of
    a sub-resource of it. Plain data, so that it can travel to other workers and replicas
    (:meth:`to_json`, :meth:`from_json`).
    """

    upstream: str | None = None
    methods: tuple[str, ...] | None = None
    uri: str | None = None

    def __call__(self, key: CacheKey) -> bool:
        if self.upstream is not None and key.upstream != self.upstream:
            return False
        if self.methods is not None and key.method not in self.methods:
            return False
        if self.uri is None:
            return True
        cached = uri_of(key)
        return isinstance(cached, str) and (cached == self.uri or cached.startswith(self.uri.rstrip("/") + "/"))

    def to_json(self) -> dict[str, Any]:
        """``{"upstream": str|null, "methods": [str]|null, "uri": str|null}``."""
        methods = None if self.methods is None else list(self.methods)
        return {"upstream": self.upstream, "methods": methods, "uri": self.uri}

    @classmethod
    def from_json(cls, value: object) -> Invalidation | None:
        """The invalidation :meth:`to_json` wrote, or ``None`` if ``value`` is not one."""
        if not isinstance(value, dict):
            return None
        upstream, methods, uri = value.get("upstream"), value.get("methods"), value.get("uri")
        if upstream is not None and not isinstance(upstream, str):
            return None
        if uri is not None and not isinstance(uri, str):
            return None
        if methods is not None:
            if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
                return None
            methods = tuple(methods)
        return cls(upstream, methods, uri)


def invalidation(upstream: str, method: str, params: Mapping[str, Any]) -> Invalidation | None:
    """Which of ``upstream``'s cache entries a listen-stream notification makes stale (MCP
    2026-07-28, server/utilities/caching, 'Interaction with Notifications').

    ``tools/list_changed`` → every ``tools/list`` page; ``prompts/list_changed`` → ``prompts/list``;
    ``resources/list_changed`` → ``resources/list`` and ``resources/templates/list`` (which has no
    notification of its own: the gateway's choice); ``resources/updated {uri}`` → ``resources/read``
    of that URI and of its sub-resources (schema ``ResourceUpdatedNotificationParams``: the ``uri``
    "might be a sub-resource"). ``None`` for any other notification, or a ``resources/updated``
    without a string ``uri``.
    """
    methods = {
        "notifications/tools/list_changed": ("tools/list",),
        "notifications/prompts/list_changed": ("prompts/list",),
        "notifications/resources/list_changed": ("resources/list", "resources/templates/list"),
    }.get(method)
    if methods is not None:
        return Invalidation(upstream, methods)
    if method == "notifications/resources/updated":
        uri = params.get("uri")
        if not isinstance(uri, str):
            return None
        return Invalidation(upstream, ("resources/read",), uri)
    return None
