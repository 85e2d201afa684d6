"""Cache entries in Redis: names, and values that are checked before they are served.

A shared entry is stored only when the local cache stored it (``cacheScope`` ``public``, a
complete result, a ``ttlMs``: :func:`~gateway.cache.store_outcome`), and never for an upstream
that receives the caller's ``Authorization`` (such entries stay in the process that saw the
caller). It expires in Redis when it expires for the gateway, or for an upstream with
``stale_if_error_ms`` at the end of its stale window (read then only as a stale answer).

Value layout (bytes): the header :data:`_HEADER` (magic, the key's digest, expiry in wall-clock
milliseconds since the epoch, the stored ``ttlMs``, the offset of the ``ttlMs`` value, and a
BLAKE2b checksum of all of it and the body), then the body: the rendered result with the
``ttlMs`` value cut out (``CacheEntry.head + CacheEntry.tail``). A value is served only if every
part checks out: anything else (garbage, a value copied from another key, a truncated or
altered write) is a miss. The checksum is what makes a read cheap: the body is not parsed again
(that took as long as the Redis round trip itself for a 19 KB list, bench/RESULTS.md).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

from ..cache import CacheEntry, CacheKey, lifetimes

__all__ = ["decode", "encode", "key_digest"]

_MAGIC: Final = b"mcpg1"
_FIELDS: Final = struct.Struct(">5s16sqqI")
_SUM_BYTES: Final = 16
_HEADER_SIZE: Final = _FIELDS.size + _SUM_BYTES
_RESULT: Final = b',"result":'
_TTL_FIELD: Final = b'"ttlMs":'


def _checksum(fields: bytes, body: bytes) -> bytes:
    h = hashlib.blake2b(fields, digest_size=_SUM_BYTES, person=b"mcp-gateway-val")
    h.update(body)
    return h.digest()


def key_digest(key: CacheKey) -> bytes:
    """16 bytes naming ``key`` in Redis (BLAKE2b over its fields, each length-prefixed so that
    no two keys share an encoding)."""
    h = hashlib.blake2b(digest_size=16, person=b"mcp-gateway-key")
    for part in (key.upstream.encode(), key.method.encode(), key.params, key.version.encode()):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    for optional in (key.capabilities, key.authorization):
        if optional is None:
            h.update(b"\xff\xff\xff\xff")
        else:
            h.update(len(optional).to_bytes(4, "big"))
            h.update(optional)
    return h.digest()


def encode(digest: bytes, entry: CacheEntry, *, clock_now: float, wall_now: float) -> tuple[bytes, int]:
    """The Redis value of ``entry`` and its lifetime left in milliseconds (``<= 0``: expired,
    not to be written). ``clock_now`` is the cache clock's time, ``wall_now`` epoch seconds."""
    left_ms = int((entry.expires_at - clock_now) * 1000)
    expires_wall_ms = int(wall_now * 1000) + left_ms
    head = bytes(entry.head)
    body = head + bytes(entry.tail)
    fields = _FIELDS.pack(_MAGIC, digest, expires_wall_ms, entry.ttl_ms, len(head))
    return b"".join((fields, _checksum(fields, body), body)), left_ms


def decode(
    value: object,
    digest: bytes,
    *,
    clock_now: float,
    wall_now: float,
    max_ttl_ms: int,
    max_entry_bytes: int,
    stale_if_error_ms: int = 0,
    refresh_ahead: bool = False,
) -> CacheEntry | None:
    """The entry stored as ``value`` under the key of ``digest``, on the cache clock; ``None``
    if it expired more than ``stale_if_error_ms`` ago, or is not a value :func:`encode` wrote
    for that key within the bounds. The last two arguments are the upstream's (see
    :func:`~gateway.cache.lifetimes`). An entry returned may have expired (``expires_at`` at or
    before ``clock_now``): it is then usable only as a stale answer, never as a hit."""
    if not isinstance(value, bytes) or len(value) < _HEADER_SIZE + len(_RESULT) + 1:
        return None
    fields = value[: _FIELDS.size]
    magic, stored_digest, expires_wall_ms, ttl_ms, at = _FIELDS.unpack(fields)
    body = value[_HEADER_SIZE:]
    if magic != _MAGIC or stored_digest != digest or not 0 < ttl_ms <= max_ttl_ms:
        return None
    left_s = expires_wall_ms / 1000 - wall_now
    if left_s <= -stale_if_error_ms / 1000 or left_s > ttl_ms / 1000 + 1 or len(body) > max_entry_bytes:
        return None  # past its stale window, or claims more life than it was stored with (clocks 1 s apart allowed)
    if not len(_RESULT) <= at < len(body) or not body.startswith(_RESULT) or not body.endswith(b"}"):
        return None
    if value[_FIELDS.size : _HEADER_SIZE] != _checksum(fields, body) or not body.endswith(_TTL_FIELD, 0, at):
        return None  # not what encode() wrote for this key, or not cut at a ttlMs value
    view = memoryview(body)
    expires_at = clock_now + left_s
    keep_until, refresh_at = lifetimes(expires_at, ttl_ms, stale_if_error_ms, refresh_ahead)
    return CacheEntry(
        view[:at], view[at:], expires_at - ttl_ms / 1000, expires_at, ttl_ms, len(body), keep_until, refresh_at
    )
