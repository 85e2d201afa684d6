"""One member's answer to one request of ``POST /mcp``, through the same cache as its own route.

A part is looked up under the key ``/servers/<member>/mcp`` would use for the same request
(:meth:`~.fleet.Fleet.key`), so that either route warms the other; a miss goes through the same
read-through (:class:`~gateway.cache.ReadThrough`), with a fetch that reads the member's answer
whole: a part is composed, not relayed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..cache import Answer, Cached, CacheEntry, CacheKey, Lead
from ..codec import loads
from ..errors import BadGateway, GatewayError, GatewayTimeout, Overloaded
from ..protocol import ParsedRequest, method_label
from ..upstream import Upstream
from .compose import Part
from .fleet import Fleet
from .names import quoted

__all__ = ["MemberFailed", "PartFetcher"]

#: What a member may fail with and be left out for (the rest of the answer is still served).
MemberFailed = (BadGateway, GatewayTimeout, Overloaded)


class PartFetcher:
    """Fetches parts for ``POST /mcp`` through ``fleet``'s cache (``previous``: the fetcher of the
    config before a reload)."""

    def __init__(self, fleet: Fleet, previous: PartFetcher | None = None) -> None:
        self.fleet = fleet
        self.readthrough = fleet.readthrough
        self.store = fleet.readthrough.store
        self.clock = fleet.readthrough.clock
        #: The reads under way for ``/mcp`` (each runs to its end for the callers coalesced on it),
        #: with those of ``previous`` (before a reload): :meth:`close` ends them all.
        self._reading: set[asyncio.Future[Part | Cached]] = set() if previous is None else previous._reading

    async def fetch(
        self, upstream: Upstream, parsed: ParsedRequest, body: bytes, request: web.Request, mcp_name: str | None = None
    ) -> Part:
        """``upstream``'s answer to ``body`` (``parsed``), sent with ``request``'s headers and, when
        given, ``mcp_name`` as its ``Mcp-Name``.

        A read of the cache runs to its end even if the request stops waiting for it (a member's
        pages out of time, the caller gone): the callers waiting on the same key get its answer,
        not each a request of their own.

        Raises:
            BadGateway, GatewayTimeout, Overloaded: the member failed (or is at ``max_inflight``)
                and no stale entry of it may answer.
            MemberError: the member answered a JSON-RPC error (or HTTP 5xx).
        """
        key, _ = self.fleet.key(upstream, parsed, request)
        if key is None:
            answer = await self.fleet.fetch(upstream, parsed, body, request, mcp_name)
            return self._part(upstream, parsed, answer, None, None)
        entry = self.store.get(key)
        if entry is not None:
            return self._from_entry(key, entry)

        async def fetch(lead: Lead) -> Part:
            answer = await self.fleet.fetch(upstream, parsed, body, request, mcp_name)
            status, message, size = answer
            # Kept as the member's own route keeps it; an error is an answer too, and ends the stale window.
            _, entry = lead.keep(status, message, size, method_label(parsed.method))
            return self._part(upstream, parsed, answer, key, entry, lead.waited_s)

        read = asyncio.ensure_future(
            self.readthrough.read(key, fetch, timeout_s=upstream.config.timeout_s, request_id=parsed.request_id)
        )
        self._reading.add(read)
        read.add_done_callback(self._read)
        got = await asyncio.shield(read)
        if isinstance(got, Cached):
            return self._from_entry(key, got.entry, stale=got.stale, waited_s=got.waited_s)
        return got

    def _read(self, task: asyncio.Future[Part | Cached]) -> None:
        self._reading.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: whoever still waited has had it

    async def close(self) -> None:
        """Cancel the reads still under way (the app's shutdown)."""
        for task in list(self._reading):
            task.cancel()
        await asyncio.gather(*self._reading, return_exceptions=True)

    def _part(
        self,
        upstream: Upstream,
        parsed: ParsedRequest,
        answer: Answer,
        key: CacheKey | None,
        entry: CacheEntry | None,
        waited_s: float = 0.0,
    ) -> Part:
        """The part ``answer`` makes (``entry``: what it was stored as under ``key``).

        Raises:
            MemberError: the member answered a JSON-RPC error (or HTTP 5xx).
            BadGateway: its answer holds no result.
        """
        status, message, size = answer
        if status >= 500 or "error" in message:
            raise MemberError.of(upstream.name, status, message, parsed.request_id)
        result = message.get("result")
        if not isinstance(result, dict):
            raise BadGateway(f"upstream {upstream.name} answered without a result", request_id=parsed.request_id)
        now = self.clock()
        if entry is not None:
            return Part(result, entry.ttl_ms, True, key, entry, fetched=True, size=size, at=now, waited_s=waited_s)
        ttl = result.get("ttlMs")
        ttl_ms = ttl if type(ttl) is int and ttl > 0 else 0
        public = result.get("cacheScope") == "public"
        return Part(result, ttl_ms, public, fetched=True, size=size, at=now, waited_s=waited_s)

    def _from_entry(self, key: CacheKey, entry: CacheEntry, *, stale: bool = False, waited_s: float = 0.0) -> Part:
        """The part a cache entry holds, with the freshness it has left (0 for a stale one).

        Raises:
            BadGateway: the entry's bytes are not a JSON-RPC result: the member is left out, as
                one that failed (never a 500 for the whole answer).
        """
        now = self.clock()
        try:
            message: Any = loads(entry.response(b"0", now))
        except ValueError:
            message = None
        result = message.get("result") if isinstance(message, dict) else None
        if not isinstance(result, dict):
            raise BadGateway(f"the cache entry of upstream {key.upstream} is not a result; left out", request_id=None)
        ttl_ms = 0 if stale else entry.remaining_ms(now)
        return Part(
            result, ttl_ms, True, key, None if stale else entry, stale, size=entry.size, at=now, waited_s=waited_s
        )


class MemberError(GatewayError):
    """A member answered a JSON-RPC error (or HTTP 5xx): it is left out of a composed answer, and
    a read relays it (``answer``, the member's response, and its HTTP ``status``)."""

    def __init__(self, message: str, *, request_id: object, answer: Any, status: int) -> None:
        super().__init__(message, request_id=request_id)
        self.answer = answer
        self.status = status

    @classmethod
    def of(cls, member: str, status: int, answer: Any, request_id: object) -> MemberError:
        err = answer.get("error") if isinstance(answer, dict) else None
        detail = err.get("message") if isinstance(err, dict) else None
        # The member's text, cut short: it goes into a log line and an error message.
        return cls(
            f"upstream {member} answered HTTP {status}: {quoted(detail)}",
            request_id=request_id,
            answer=answer,
            status=status,
        )
