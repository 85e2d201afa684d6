"""Cache entries in Redis: names, and values that are checked before they are served.

A shared entry is stored only when the local cache stored it (``cacheScope`` ``public``, a
complete result, a ``ttlMs``: :func:`~gateway.cache.store_outcome`), and never for an upstream
that receives the caller's ``Authorization`` (such entries stay in the process that saw the
caller). It expires in Redis when it expires for the gateway, or for an upstream with
``stale_if_error_ms`` at the end of its stale window (read then only as a stale answer).

Value layout (bytes): the header :data:`_FIELDS` (magic, the digest of the Redis key it is
stored under (:func:`name_digest`: generation and cache key), expiry in wall-clock milliseconds
since the epoch, the stored ``ttlMs``, the offset of the ``ttlMs`` value), the body (the
rendered result with the ``ttlMs`` value cut out: ``CacheEntry.head + CacheEntry.tail``), then
an HMAC-SHA256 of both (:mod:`gateway.cluster.mac`, keyed with ``[cluster].secret``). A value is
served only if every part checks out, in this order: the MAC (else ``forged``: written by
someone without the key, or altered), then the header's bounds, then the body, checked as the
local tier checks an upstream's answer before storing it: a JSON-RPC result that
:func:`~gateway.cache.store_outcome` stores, cut at its own ``ttlMs``. With simdjson (the
``speed`` extra) that check runs on the whole document without building it in Python
(:func:`_storable`); without it, or for what simdjson cannot hold, the body is parsed and
rendered again by :func:`~gateway.cache.build_entry`, and only the same bytes pass. Anything
else is ``corrupt``. Both are misses, never an answer. For a 19 KB list the MAC takes about 13
µs and the check about 15 µs (60 + 15 µs parsed and rendered again), once per entry read from
Redis: it is then in the local tier.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any, Final

from ..cache import STORED, CacheEntry, CacheKey, build_entry, lifetimes, store_outcome
from ..codec import loads
from .mac import MAC_BYTES, Keys

try:  # the ``speed`` extra: a value is checked without building its result in Python
    import simdjson
except ImportError:  # pragma: no cover - exercised by forcing _PARSER to None
    simdjson = None  # type: ignore[assignment]

__all__ = ["CORRUPT", "FORGED", "decode", "encode", "key_digest", "name_digest"]

#: Why a value was not used (``mcp_gateway_cluster_reads_total{result}``): its MAC is wrong ...
FORGED: Final = "forged"
#: ... or it is not an entry this gateway would serve (bounds, expiry, or the body).
CORRUPT: Final = "corrupt"

_MAGIC: Final = b"mcpg3"
_FIELDS: Final = struct.Struct(">5s16sqqI")
_RESULT: Final = b',"result":'
_TTL_FIELD: Final = b'"ttlMs":'
_RESPONSE_START: Final = b'{"jsonrpc":"2.0","id":0'


def key_digest(key: CacheKey, identity: str) -> bytes:
    """16 bytes naming ``key`` in Redis for an upstream configured as ``identity``
    (:meth:`~gateway.cluster.mac.Keys.identity`): BLAKE2b over the fields, each length-prefixed
    so that no two keys share an encoding."""
    h = hashlib.blake2b(digest_size=16, person=b"mcp-gateway-key")
    for part in (identity.encode(), key.upstream.encode(), key.method.encode(), key.params, key.version.encode()):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    for optional in (key.capabilities, key.authorization):
        if optional is None:
            h.update(b"\xff\xff\xff\xff")
        else:
            h.update(len(optional).to_bytes(4, "big"))
            h.update(optional)
    return h.digest()


def name_digest(name: str) -> bytes:
    """16 bytes naming the Redis key a value is stored under (``<generation>:<key digest>``), for
    the value's header: the MAC covers the header, so a value copied under another key (the same
    key digest under a later generation, to bring back an entry a purge put out of reach) does not
    check out."""
    return hashlib.blake2b(name.encode(), digest_size=16, person=b"mcp-gateway-name").digest()


def encode(keys: Keys, digest: bytes, entry: CacheEntry, *, clock_now: float, wall_now: float) -> tuple[bytes, int]:
    """The Redis value of ``entry`` (MAC'd with ``keys``) and its lifetime left in milliseconds
    (``<= 0``: expired, not to be written). ``clock_now`` is the cache clock's time, ``wall_now``
    epoch seconds."""
    left_ms = int((entry.expires_at - clock_now) * 1000)
    expires_wall_ms = int(wall_now * 1000) + left_ms
    head = bytes(entry.head)
    fields = _FIELDS.pack(_MAGIC, digest, expires_wall_ms, entry.ttl_ms, len(head))
    signed = b"".join((fields, head, entry.tail))
    return signed + keys.mac(signed), left_ms


def decode(
    keys: Keys,
    value: object,
    digest: bytes,
    *,
    clock_now: float,
    wall_now: float,
    max_ttl_ms: int,
    max_entry_bytes: int,
    stale_if_error_ms: int = 0,
    refresh_ahead: bool = False,
) -> CacheEntry | str:
    """The entry stored as ``value`` under the key of ``digest``, on the cache clock; or why it
    is not one to use: :data:`FORGED` (its MAC under ``keys`` is wrong) or :data:`CORRUPT` (it
    expired more than ``stale_if_error_ms`` ago, is not what :func:`encode` wrote for that key
    within the bounds, or its body is not a result the cache would store). The last two
    arguments are the upstream's (see :func:`~gateway.cache.lifetimes`). An entry returned may
    have expired (``expires_at`` at or before ``clock_now``): it is then usable only as a stale
    answer, never as a hit."""
    if not isinstance(value, bytes) or len(value) < _FIELDS.size + len(_RESULT) + 1 + MAC_BYTES:
        return CORRUPT
    signed = memoryview(value)[:-MAC_BYTES]
    if not keys.verify(signed, memoryview(value)[-MAC_BYTES:]):
        return FORGED
    magic, stored_digest, expires_wall_ms, ttl_ms, at = _FIELDS.unpack_from(value)
    body = signed[_FIELDS.size :]
    if magic != _MAGIC or stored_digest != digest or not 0 < ttl_ms <= max_ttl_ms:
        return CORRUPT
    left_s = expires_wall_ms / 1000 - wall_now
    if left_s <= -stale_if_error_ms / 1000 or left_s > ttl_ms / 1000 + 1 or len(body) > max_entry_bytes:
        return CORRUPT  # past its stale window, or claims more life than it was stored with (clocks 1 s apart allowed)
    if not len(_TTL_FIELD) <= at < len(body) or not value.endswith(_TTL_FIELD, 0, _FIELDS.size + at):
        return CORRUPT
    expires_at = clock_now + left_s
    keep_until, refresh_at = lifetimes(expires_at, ttl_ms, stale_if_error_ms, refresh_ahead)
    verdict = _storable(body, at)
    if verdict is not None:
        if not verdict:
            return CORRUPT
        # A copy that owns its bytes: the entry may outlive the value read from Redis by an hour.
        view = memoryview(bytes(body))
        return CacheEntry(
            view[:at], view[at:], expires_at - ttl_ms / 1000, expires_at, ttl_ms, len(body), keep_until, refresh_at
        )
    # Parsed and rendered again as the local tier stores an answer: only the same bytes pass.
    try:
        message = loads(b"".join((_RESPONSE_START, body[:at], b"%d" % ttl_ms, body[at:])))
    except ValueError:
        return CORRUPT
    if store_outcome(200, message, len(body), max_entry_bytes) != STORED:
        return CORRUPT
    rebuilt = build_entry(message, expires_at - ttl_ms / 1000, max_ttl_ms)
    if rebuilt is None or rebuilt.ttl_ms != ttl_ms or rebuilt.head != body[:at] or rebuilt.tail != body[at:]:
        return CORRUPT
    return CacheEntry(
        rebuilt.head, rebuilt.tail, expires_at - ttl_ms / 1000, expires_at, ttl_ms, rebuilt.size, keep_until, refresh_at
    )


def _storable(body: memoryview, at: int) -> bool | None:
    """simdjson's verdict on ``body`` cut at ``at`` (see :func:`decode`), ``None`` when it has
    none (not installed, over :data:`FAST_CHECK_MAX_BYTES`, or a document it cannot hold, such
    as an integer beyond 64 bits): then the caller parses and renders it again.

    With ``-1`` put at the cut, the document must be ``{"jsonrpc", "id", "result"}`` exactly,
    the result an object without duplicate members whose ``ttlMs`` is that ``-1`` (the cut is
    at the result's own ``ttlMs``), ``resultType`` ``"complete"`` and ``cacheScope``
    ``"public"``: what :func:`~gateway.cache.store_outcome` requires of an answer, checked on the
    whole document (valid JSON, valid UTF-8) without building it in Python (about 15 µs instead
    of 60 µs to parse and 15 µs to render a 19 KB list again; duplicate members are refused
    because orjson keeps the last and simdjson the first).
    """
    if _PARSER is None or len(body) > FAST_CHECK_MAX_BYTES:
        return None
    try:
        doc = _PARSER.parse(b"".join((_RESPONSE_START, body[:at], b"-1", body[at:])))
    except (ValueError, RuntimeError):  # not JSON to simdjson, or a number it cannot hold
        return None
    if not isinstance(doc, simdjson.Object) or list(doc.keys()) != ["jsonrpc", "id", "result"]:
        return False
    result = doc["result"]
    if not isinstance(result, simdjson.Object):
        return False
    members = list(result.keys())
    if len(members) != len(set(members)):
        return False
    ttl = result.get("ttlMs")
    return (
        type(ttl) is int
        and ttl == -1
        and result.get("resultType") == "complete"
        and result.get("cacheScope") == "public"
    )


#: Values up to this size (bytes of body) are checked by simdjson when it is installed (the
#: ``speed`` extra); larger ones, rare, are parsed and rendered again. The parser keeps buffers
#: for the largest document it parsed: bounded by this.
FAST_CHECK_MAX_BYTES: Final = 256 * 1024
_PARSER: Any = simdjson.Parser(max_capacity=FAST_CHECK_MAX_BYTES + 64) if simdjson is not None else None
