"""One MCP request on its way through the proxy: what it carries and what it ended as.

The ``Cache-Status`` response header (RFC 9211) names this cache ``mcp-gateway`` and says what
happened: ``hit; ttl=S`` (``collapsed`` when the request waited for another's miss,
``detail=shared`` when the entry came from the cluster's shared tier; ``ttl=-S`` for a stale
answer, S seconds past expiry: stale-if-error), or
``fwd=miss|bypass``, the upstream's ``fwd-status``, ``stored; ttl=S`` and a ``detail``: why it
bypassed the cache (``uncacheable``, ``legacy``, ``notification``, ``input-responses``,
``unknown-version``, ``disabled``), why the answer was not stored (``private``, ``error``,
``status``, ``input-required``, ``no-ttl``, ``too-large``, ``refused``), ``upstream-error``, or
``rejected`` (the gateway answered the request itself).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Final

from ..auth import ANONYMOUS, Caller, Verdict

if TYPE_CHECKING:
    from aiohttp import web

    from ..cache import CacheKey, CacheLookup, Lead
    from ..policy import Rights
    from ..protocol import ParsedRequest
    from ..upstream import Upstream

__all__ = ["CACHE_NAME", "LARGE_BODY_BYTES", "Exchange", "Forwarded", "hit_status", "stale_status"]

CACHE_NAME: Final = "mcp-gateway"
#: A body over this many bytes may not fit what the connection buffers before writing waits
#: for the caller to read (aiohttp's writer limit): it is written in chunks under the write
#: deadline and the queue budget (:mod:`gateway.proxy.writing`); a cache hit this large is
#: answered from the entry's own bytes, not a copy.
LARGE_BODY_BYTES: Final = 64 * 1024


class Forwarded(StrEnum):
    """Why a request went upstream: the ``fwd`` parameter of ``Cache-Status`` (RFC 9211, 2.2)."""

    #: The cache did not have it.
    MISS = "miss"
    #: The cache was not asked: not cacheable, or off (``detail`` says why).
    BYPASS = "bypass"


def hit_status(ttl_ms: int, collapsed: bool, shared: bool = False) -> str:
    """The ``Cache-Status`` of a hit whose answer carries ``ttlMs`` ``ttl_ms`` (milliseconds;
    the header's ``ttl`` is whole seconds); ``shared``: the entry came from the shared tier."""
    status = f"{CACHE_NAME}; hit; ttl={ttl_ms // 1000}"
    if collapsed:
        status += "; collapsed"
    return f"{status}; detail=shared" if shared else status


def stale_status(past_s: int, collapsed: bool) -> str:
    """The ``Cache-Status`` of a stale answer ``past_s`` whole seconds (at least 1) past its
    expiry: a hit with a negative ``ttl`` (RFC 9211, section 2.5: the response is stale)."""
    status = f"{CACHE_NAME}; hit; ttl=-{past_s}"
    return f"{status}; collapsed" if collapsed else status


class Exchange:
    """The state of one MCP request, handed from step to step of the proxy.

    Set on the way in: ``request``, ``upstream_name`` (from the route; may name no upstream),
    ``upstream`` (once found), ``body`` (the raw request body, forwarded as it is), ``parsed``,
    ``key`` (the cache key, ``None`` when the cache is bypassed), ``caller`` (who is calling,
    :class:`~gateway.auth.Caller`; anonymous until authenticated).

    On the way: ``lead``, the read-through's handle of this request's fetch (a cache miss), which
    keeps the answer (:meth:`~gateway.cache.Lead.keep`).

    Set on the way out, for the response and the request record: ``method`` (the metric
    label), ``lookup`` (how the cache answered, :class:`~gateway.cache.CacheLookup`; ``None``
    if it was not asked; the record's ``cache`` label follows from it), ``error_code`` (the
    JSON-RPC error code answered), the ``Cache-Status`` (``hit``: the whole value of an answer
    from an entry; else built from ``fwd``, ``fwd_status``, ``stored_ttl_ms`` and ``detail``),
    ``upstream_seconds`` (the time the upstream took), ``disconnected`` (the caller went away or
    was dropped before its answer was written whole: recorded as 499), ``written`` (every byte
    of a large answer is with the transport: a cancellation after it, the caller hanging up at
    the end, is no 499) and ``large`` (the answer's body is large enough to be written by
    ``Pipeline.send``, in chunks under the write deadline).

    The defaults are class attributes: one exchange is built per request, and a hit sets few.
    """

    upstream: Upstream | None = None
    body: bytes | None = None
    parsed: ParsedRequest | None = None
    key: CacheKey | None = None
    method: str = "other"
    lookup: CacheLookup | None = None
    error_code: int | None = None
    hit: str | None = None
    fwd: Forwarded | None = None
    fwd_status: int | None = None
    stored_ttl_ms: int | None = None
    detail: str | None = None
    upstream_seconds: float | None = None
    disconnected: bool = False
    written: bool = False
    lead: Lead | None = None
    large: bool = False
    #: The ``Mcp-Name`` to send upstream in place of the caller's (``POST /mcp`` rewrites names).
    mcp_name: str | None = None
    #: Who is calling, once authenticated (the pipeline's second step).
    caller: Caller = ANONYMOUS
    #: What the caller's token proved, found before the body is read when finding it may await
    #: (a token not seen before); ``None``: :meth:`Pipeline.authenticate` looks it up itself.
    verdict: Verdict | None = None
    #: The ``outcome`` of ``mcp_gateway_auth_total`` for this request (the last one set wins:
    #: a policy refusal after ``ok`` counts as ``denied``); ``None`` without ``[auth]``.
    auth_outcome: str | None = None
    #: What the caller may see and use, with ``[[policy.rules]]`` (``None`` without: everything).
    rights: Rights | None = None

    def __init__(self, request: web.Request, upstream_name: str) -> None:
        self.request = request
        self.upstream_name = upstream_name

    @property
    def request_id(self) -> object:
        """The request's JSON-RPC id, ``None`` until parsed (or for a notification)."""
        return self.parsed.request_id if self.parsed is not None else None

    def adopt(self, member: Exchange) -> None:
        """Take over what happened to ``member``, the exchange that served this one for it (a
        call on ``POST /mcp`` is served as a request to one member); the route's name stays."""
        for name, value in vars(member).items():
            if name not in ("request", "upstream_name"):
                setattr(self, name, value)

    def cache_status(self) -> str:
        """The ``Cache-Status`` value of what has happened so far (RFC 9211)."""
        if self.hit is not None:
            return self.hit
        parts = [CACHE_NAME]
        if self.fwd is not None:
            parts.append(f"fwd={self.fwd}")
        if self.fwd_status is not None:
            parts.append(f"fwd-status={self.fwd_status}")
        if self.stored_ttl_ms is not None:
            parts.append(f"stored; ttl={self.stored_ttl_ms // 1000}")
        if self.detail is not None:
            parts.append(f"detail={self.detail}")
        return "; ".join(parts)
