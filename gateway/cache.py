"""The result cache: keys, the storability decision, the store and request coalescing.

Rules (DESIGN.md "The cache, in one paragraph"; digest §5 and gotchas 9-14): store only
HTTP 200 JSON-RPC ``result``s of the six cacheable methods with ``resultType:"complete"``,
``cacheScope:"public"`` and an integer ``ttlMs > 0``; keep them ``min(ttlMs, max_ttl_ms)``
from receipt; on a hit answer with the caller's id and ``ttlMs`` lowered to what is left.
No aiohttp here: the store sits behind :class:`CacheStore` so another store (Redis) only
touches this module.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import math
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple, Protocol

from .codec import dumps
from .protocol import CLIENT_CAPABILITIES_KEY, ParsedRequest

__all__ = [
    "CacheEntry",
    "CacheKey",
    "CacheStore",
    "Clock",
    "Coalescer",
    "MemoryStore",
    "build_entry",
    "canonical_json",
    "make_key",
    "store_outcome",
]

#: Seconds on a monotonic scale (``time.monotonic`` in production, a fake clock in tests).
Clock = Callable[[], float]
#: Called with an eviction reason (``expired``, ``size``, ``purge``, ...) and a count.
EvictionListener = Callable[[str, int], None]

STORED: Final = "stored"


def canonical_json(value: object) -> bytes:
    """Deterministic JSON: sorted keys, no insignificant white space."""
    return dumps(value, sort_keys=True)


class CacheKey(NamedTuple):
    """Identity of one cache entry (DESIGN.md); a tuple, so hashing and equality run in C.

    ``params`` is the canonical JSON of ``params`` without ``_meta`` (so ``cursor`` and
    ``uri`` count, the JSON-RPC id, ``clientInfo``, ``progressToken`` and trace context do
    not); ``capabilities`` is a SHA-256 of the canonical ``clientCapabilities``, or
    ``None`` when the upstream does not vary on them; ``authorization`` is a SHA-256 of
    the caller's ``Authorization`` header for upstreams that receive it
    (``forward_authorization``): such an upstream authenticates every request itself, so
    even its ``public`` answers are reused only within one authorization context, never
    in place of the upstream's own 401 (digest §5 rule 5, §10).
    """

    upstream: str
    method: str
    params: bytes
    version: str
    capabilities: bytes | None
    authorization: bytes | None = None


def make_key(
    upstream: str, request: ParsedRequest, vary_on_capabilities: bool, authorization: str | None = None
) -> CacheKey:
    """The cache key of a validated, cacheable modern request.

    Raises:
        ValueError: the params hold a non-finite number (such a request is not cached).
    """
    # A cacheable request always has method, version and params (parse_request); no assert:
    # this runs on every cache hit.
    params: Mapping[str, Any] = request.params  # type: ignore[assignment]
    meta = params.get("_meta")
    if len(params) == 1 and meta is not None:
        rest = _NO_PARAMS  # the usual list request: nothing but _meta
    else:
        # A copy: orjson's output holds a ~4 KB buffer whatever its length, and the keys of
        # stored entries live as long as the entries.
        rest = memoryview(canonical_json({k: v for k, v in params.items() if k != "_meta"})).tobytes()
    caps: bytes | None = None
    if vary_on_capabilities and type(meta) is dict:
        client_caps = meta.get(CLIENT_CAPABILITIES_KEY)
        if type(client_caps) is dict and not client_caps:
            caps = _EMPTY_CAPS  # the commonest set: no canonical JSON to write
        else:
            caps_json = canonical_json(client_caps)
            caps = _DIGESTS.get(caps_json)
            if caps is None:
                caps = _digest(caps_json)
    auth = None if authorization is None else hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).digest()
    # tuple.__new__ skips the NamedTuple's Python-level __new__ (one is built per request).
    return _new_tuple(CacheKey, (upstream, request.method, rest, request.version, caps, auth))


_new_tuple: Final = tuple.__new__
_NO_PARAMS: Final = canonical_json({})


#: SHA-256 of recently seen canonical clientCapabilities (clients send the same few sets
#: over and over): a bounded memo, emptied when full, that changes no behaviour.
_DIGESTS: dict[bytes, bytes] = {}
_DIGESTS_MAX: Final = 1024
_EMPTY_CAPS: Final = hashlib.sha256(canonical_json({})).digest()


def _digest(caps_json: bytes) -> bytes:
    digest = hashlib.sha256(caps_json).digest()
    if len(_DIGESTS) >= _DIGESTS_MAX:
        _DIGESTS.clear()
    _DIGESTS[memoryview(caps_json).tobytes()] = digest  # an exact-size copy, see make_key
    return digest


def store_outcome(status: int, message: object, size: int, max_entry_bytes: int) -> str:
    """Decide whether an upstream answer may be stored.

    ``message`` is the parsed JSON-RPC response and ``size`` its serialised size in bytes.
    Returns ``"stored"`` or the reason it may not be: ``status`` (not HTTP 200), ``error``
    (JSON-RPC error or not a result), ``input_required`` (``resultType`` other than
    ``complete``), ``private`` (``cacheScope`` not exactly ``public``, absent included,
    digest §13.2), ``no_ttl`` (``ttlMs`` absent, not an integer, or ``<= 0``), ``too_large``.
    """
    if status != 200:
        return "status"
    if not isinstance(message, dict) or "error" in message:
        return "error"
    result = message.get("result")
    if not isinstance(result, dict):
        return "error"
    if result.get("resultType") != "complete":
        return "input_required"
    if result.get("cacheScope") != "public":
        return "private"
    ttl = result.get("ttlMs")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        return "no_ttl"
    if size > max_entry_bytes:
        return "too_large"
    return STORED


_RESPONSE_START: Final = b'{"jsonrpc":"2.0","id":'


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One stored result, pre-rendered so a hit costs one byte join.

    ``head`` and ``tail`` are the serialised result before and after its ``ttlMs`` value
    (views of one buffer, so the result is held once). The response to a hit is
    ``{"jsonrpc":"2.0","id":<id>`` + ``head`` + remaining ttlMs + ``tail``;
    ``expires_at`` and ``stored_at`` are clock seconds, ``ttl_ms`` the stored lifetime
    (already capped by ``max_ttl_ms``), ``size`` the payload size in bytes.
    """

    head: bytes | memoryview
    tail: bytes | memoryview
    stored_at: float
    expires_at: float
    ttl_ms: int
    size: int

    def remaining_ms(self, now: float) -> int:
        """Milliseconds of freshness left at ``now``, floored at 0."""
        return max(0, int((self.expires_at - now) * 1000))

    def response(self, id_json: bytes, now: float) -> bytes:
        """The JSON-RPC response for a caller whose id serialises to ``id_json``."""
        return self.hit(id_json, now)[0]

    def hit(self, id_json: bytes, now: float) -> tuple[bytes, int]:
        """The response for a cache hit at ``now`` and the ``ttlMs`` it carries (what is left,
        as :meth:`remaining_ms`; inlined, this is every hit's path)."""
        ttl_ms = _floor((self.expires_at - now) * 1000)  # floor(): int() costs twice as much
        if ttl_ms < 0:
            ttl_ms = 0
        return b"".join((_RESPONSE_START, id_json, self.head, b"%d" % ttl_ms, self.tail)), ttl_ms


_floor: Final = math.floor
_RESULT: Final = b',"result":'
_PLACEHOLDER: Final = "mcp-gateway-ttl-" + secrets.token_hex(8)
_PLACEHOLDER_JSON: Final = dumps(_PLACEHOLDER)


def build_entry(message: Mapping[str, Any], now: float, max_ttl_ms: int) -> CacheEntry | None:
    """Pre-render a storable response (see :func:`store_outcome`) as a :class:`CacheEntry`.

    Lifetime is ``min(ttlMs, max_ttl_ms)`` from ``now``. Returns ``None`` if the result
    cannot be split around its ``ttlMs`` (it never happens for JSON the gateway parsed).
    """
    result = dict(message["result"])
    ttl_ms = min(int(result["ttlMs"]), max_ttl_ms)
    result["ttlMs"] = _PLACEHOLDER
    try:
        # A fresh, exact-size copy: orjson's own output buffer is over-allocated, and the
        # entry may live for an hour.
        rendered = _RESULT + dumps(result) + b"}"
    except ValueError:  # a non-finite number parsed from an exotic literal: not storable
        return None
    at = rendered.find(_PLACEHOLDER_JSON)
    end = at + len(_PLACEHOLDER_JSON)
    if at < 0 or rendered.find(_PLACEHOLDER_JSON, end) >= 0:
        return None
    view = memoryview(rendered)
    return CacheEntry(view[:at], view[end:], now, now + ttl_ms / 1000, ttl_ms, len(rendered))


class CacheStore(Protocol):
    """The store behind the cache. Implementations bound themselves and report evictions."""

    def get(self, key: CacheKey) -> CacheEntry | None:
        """The fresh entry for ``key``, or ``None``."""

    def put(self, key: CacheKey, entry: CacheEntry) -> bool:
        """Store ``entry``; ``False`` if it was refused (caching disabled, too big)."""

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        """Remove every entry whose key matches; returns how many."""

    def __len__(self) -> int: ...

    @property
    def total_bytes(self) -> int:
        """Sum of the stored entries' sizes."""


class MemoryStore:
    """In-process store: per-entry expiry, least-recently-used eviction.

    Bounded by ``max_entries`` entries and ``max_bytes`` bytes in total; ``clock`` gives
    seconds. ``on_evict(reason, count)`` hears of ``expired``, ``size`` and purge evictions.
    An entry is gone from ``expires_at`` on (``clock() >= expires_at``); expired entries are
    dropped, and reported, by the next call that looks at the store.

    The entries sit in an ``OrderedDict`` in LRU order, with a heap of expiry times beside
    it: a hit is a dict lookup, a comparison with the heap's head and a ``move_to_end``.
    """

    def __init__(
        self,
        *,
        max_entries: int,
        max_bytes: int,
        clock: Clock,
        on_evict: EvictionListener | None = None,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._clock = clock
        self._on_evict = on_evict
        self._bytes = 0
        self._data: OrderedDict[CacheKey, CacheEntry] = OrderedDict()
        # (expires_at, sequence, key, entry); entries replaced or removed early stay until
        # their time comes (or a compaction) and are then skipped.
        self._expiry: list[tuple[float, int, CacheKey, CacheEntry]] = []
        self._sequence = itertools.count()

    def _evicted(self, reason: str, count: int) -> None:
        if count and self._on_evict is not None:
            self._on_evict(reason, count)

    def _expire(self, now: float) -> None:
        heap, data = self._expiry, self._data
        count = 0
        while heap and heap[0][0] <= now:
            _, _, key, entry = heapq.heappop(heap)
            if data.get(key) is entry:
                del data[key]
                self._bytes -= entry.size
                count += 1
        self._evicted("expired", count)

    def _remove(self, key: CacheKey) -> CacheEntry | None:
        entry = self._data.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size
        return entry

    def get(self, key: CacheKey) -> CacheEntry | None:
        heap = self._expiry
        if heap and heap[0][0] <= (now := self._clock()):
            self._expire(now)
        entry = self._data.get(key)
        if entry is not None:
            self._data.move_to_end(key)
        return entry

    def put(self, key: CacheKey, entry: CacheEntry) -> bool:
        if self._max_entries == 0 or entry.size > self._max_bytes:
            return False
        now = self._clock()
        self._expire(now)
        if entry.expires_at <= now:
            return False
        self._remove(key)
        data = self._data
        evicted = 0
        while data and (len(data) >= self._max_entries or self._bytes + entry.size > self._max_bytes):
            _, victim = data.popitem(last=False)
            self._bytes -= victim.size
            evicted += 1
        self._evicted("size", evicted)
        data[key] = entry
        self._bytes += entry.size
        heapq.heappush(self._expiry, (entry.expires_at, next(self._sequence), key, entry))
        if len(self._expiry) > 2 * len(data) + 64:
            self._compact()
        return True

    def _compact(self) -> None:
        """Drop heap items of entries no longer stored (replaced, evicted, purged)."""
        data = self._data
        self._expiry = [item for item in self._expiry if data.get(item[2]) is item[3]]
        heapq.heapify(self._expiry)

    def purge(self, predicate: Callable[[CacheKey], bool], reason: str) -> int:
        self._expire(self._clock())
        doomed = [k for k in self._data if predicate(k)]
        for k in doomed:
            self._remove(k)
        self._evicted(reason, len(doomed))
        return len(doomed)

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[CacheKey]:
        return iter(list(self._data))

    @property
    def total_bytes(self) -> int:
        return self._bytes


class Coalescer:
    """Collapses concurrent misses on one key into one upstream request (DESIGN.md).

    The first caller of :meth:`claim` for a key is the leader and must call
    :meth:`release` with the stored entry or ``None``; later callers get a future that
    resolves to that value. ``None`` tells followers to go upstream on their own (the
    answer was private, an error, or the leader gave up).
    """

    def __init__(self) -> None:
        self._inflight: dict[CacheKey, asyncio.Future[CacheEntry | None]] = {}

    def claim(self, key: CacheKey) -> asyncio.Future[CacheEntry | None] | None:
        """``None`` if the caller now leads ``key``; else the leader's future to await."""
        fut = self._inflight.get(key)
        if fut is not None:
            return fut
        self._inflight[key] = asyncio.get_running_loop().create_future()
        return None

    def release(self, key: CacheKey, entry: CacheEntry | None) -> None:
        """Publish the leader's outcome for ``key`` to its followers."""
        fut = self._inflight.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(entry)

    def __len__(self) -> int:
        return len(self._inflight)
