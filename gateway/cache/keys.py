"""Cache keys: what makes two requests the same request to the cache.

MCP 2026-07-28, server/utilities/caching, 'Cache Key': a key is the method and its params; the
JSON-RPC ``id``, ``clientInfo``, ``progressToken`` and trace context never count. The gateway adds
the upstream, the protocol version (basic/versioning, 'Protocol Version Negotiation'), the
client's capabilities (an answer may depend on what the client can do) unless the upstream opts
out, and for upstreams that receive the caller's ``Authorization`` the caller's authorization
context ('Cache Scope Field'): these additions are the gateway's own rules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from ..codec import dumps
from ..protocol import CLIENT_CAPABILITIES_KEY, ParsedRequest

__all__ = ["MAX_KEY_PARAMS_BYTES", "CacheKey", "canonical_json", "make_key"]

#: Requests whose params (without ``_meta``) take more canonical JSON than this are forwarded,
#: never cached: every key is small, so ``max_entries`` bounds the memory keys take, whatever
#: callers send (a cursor or URI is far shorter in practice).
MAX_KEY_PARAMS_BYTES: Final = 4096


def canonical_json(value: object) -> bytes:
    """Deterministic JSON: sorted keys, no insignificant white space.

    Raises:
        ValueError: ``value`` holds a number beyond the float range (see :func:`~gateway.codec.dumps`).
    """
    return dumps(value, sort_keys=True)


class CacheKey(NamedTuple):
    """Identity of one cache entry; a tuple, so hashing and equality run in C.

    ``params`` is the canonical JSON of ``params`` without ``_meta`` (so ``cursor`` and ``uri``
    count); ``capabilities`` a SHA-256 of the canonical ``clientCapabilities``, or ``None`` when
    the upstream does not vary on them; ``authorization`` a SHA-256 of the caller's
    ``Authorization`` header for upstreams with ``forward_authorization``: such an upstream
    authenticates every request itself, so even its ``public`` answers are reused only within
    one authorization context, never in place of the upstream's own 401 (the gateway's rule;
    cf. MCP 2026-07-28, server/utilities/caching, 'Security Considerations').
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
    """The cache key of a validated, cacheable modern request (``request.cacheable``).

    ``authorization`` is the caller's header value (``""`` for none) for upstreams that receive
    it, else ``None``.

    Raises:
        ValueError: the params or capabilities hold a number beyond the float range, or the params
            take more than :data:`MAX_KEY_PARAMS_BYTES` (such a request is not cached).
    """
    params: Mapping[str, Any] = request.params or {}
    meta = params.get("_meta")
    if len(params) == 1 and meta is not None:
        rest = _NO_PARAMS  # the usual list request: nothing but _meta
    else:
        # An exact-size copy: orjson's output holds a ~4 KB buffer whatever its length, and
        # the keys of stored entries live as long as the entries.
        rest = bytes(memoryview(canonical_json({k: v for k, v in params.items() if k != "_meta"})))
        if len(rest) > MAX_KEY_PARAMS_BYTES:
            raise ValueError(f"params over {MAX_KEY_PARAMS_BYTES} bytes are not keyed")
    caps: bytes | None = None
    if vary_on_capabilities:
        client_caps = meta.get(CLIENT_CAPABILITIES_KEY) if type(meta) is dict else None
        # {} is the commonest set: its hash is computed once.
        if not client_caps and type(client_caps) is dict:
            caps = _EMPTY_CAPS  # the commonest set: its digest is computed once
        else:
            caps = hashlib.sha256(canonical_json(client_caps)).digest()
    auth = None if authorization is None else hashlib.sha256(authorization.encode("utf-8", "surrogateescape")).digest()
    return CacheKey(upstream, request.method or "", rest, request.version or "", caps, auth)


_NO_PARAMS: Final = canonical_json({})
_EMPTY_CAPS: Final = hashlib.sha256(canonical_json({})).digest()
