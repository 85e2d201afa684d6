"""The request record: what one finished MCP request leaves for the metrics and the access log."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["RequestRecord"]


class RequestRecord(NamedTuple):
    """One finished request on an MCP route (built by the proxy, collected by the journal).

    A tuple, read by name: every request, cache hits included, builds one, and the metrics
    read a batch of them column by column (``RequestRecord._make(zip(*batch))``).
    """

    #: Configured upstream name, ``/mcp`` for the aggregate route (gateway.aggregate), or ``unknown``.
    upstream: str
    #: MCP method label (``gateway.protocol.method_label``): a known method or ``other``.
    method: str
    #: ``POST``, ``GET`` or ``DELETE``.
    http_method: str
    #: HTTP status answered (499: the caller went away first).
    status: int
    #: JSON-RPC error code answered, or ``None``.
    jsonrpc_error: int | None
    #: ``cache`` label of the duration histogram: ``hit``, ``miss``, ``bypass`` or ``stale``.
    cache: str
    #: The ``Cache-Status`` value answered (RFC 9211), or ``None``.
    cache_status: str | None
    #: Time to answer, in seconds.
    seconds: float
    #: Cache lookup result (``hit``, ``shared``, ``miss``, ``coalesced``, ``stale``, ``bypass``), ``None``
    #: if not asked.
    lookup: str | None
    #: ``time.perf_counter()`` when the request ended, in seconds.
    ended: float
    #: Time the upstream took, in seconds; ``None`` if it was not asked.
    upstream_seconds: float | None
    #: Who called (``Caller.subject``: ``sub``, or a static token's ``subject``), never a token.
    subject: str | None = None
    #: ``outcome`` of ``mcp_gateway_auth_total`` (``gateway.auth.AUTH_OUTCOMES``); ``None`` without ``[auth]``.
    auth: str | None = None
