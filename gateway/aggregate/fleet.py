"""What ``POST /mcp`` needs of the per-upstream routes: the cache, the pipeline, and the way to each
member. :class:`gateway.proxy.Proxy` is one; ``/mcp`` reaches nothing else of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from ..cache import Answer, CacheEntry, CacheKey, ReadThrough
from ..protocol import ParsedRequest
from ..proxy import Exchange
from ..proxy.pipeline import Pipeline
from ..upstream import Upstream

__all__ = ["Fleet"]


class Fleet(Protocol):
    """The per-upstream routes, as ``/mcp`` uses them."""

    #: The members by name (filled once the app's client session exists).
    upstreams: Mapping[str, Upstream]
    #: The cache (``readthrough.store``), coalescing and the shared tier, shared with every route.
    readthrough: ReadThrough
    #: The steps every MCP route shares (checks, writing large answers, the record).
    pipeline: Pipeline

    def key(
        self, upstream: Upstream, parsed: ParsedRequest, request: web.Request
    ) -> tuple[CacheKey | None, str | None]:
        """The key of ``parsed`` on ``upstream``'s own route, or ``None`` and why it bypasses the cache."""
        ...

    def hit(
        self, ex: Exchange, entry: CacheEntry, *, collapsed: bool = False, shared: bool = False
    ) -> web.StreamResponse:
        """The answer to ``ex`` from ``entry``."""
        ...

    async def serve_member(self, ex: Exchange) -> web.StreamResponse:
        """``ex`` (a member's own request, parsed) answered as on the member's route."""
        ...

    async def fetch(
        self, upstream: Upstream, parsed: ParsedRequest, body: bytes, request: web.Request, mcp_name: str | None
    ) -> Answer:
        """``upstream``'s whole answer to ``body``, sent with ``request``'s headers."""
        ...
