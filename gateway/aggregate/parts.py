"""One member's answer to one request of ``POST /mcp``, through the same cache as its own route.

A part is looked up under the key ``/servers/<member>/mcp`` would use for the same request
(:func:`~gateway.cache.make_key`), so that either route warms the other. A miss joins the
request to that key already on its way (the proxy's coalescer), or with ``[cluster]`` the shared
tier, or goes to the member and stores what may be stored, as the proxy does
(:mod:`gateway.proxy.forward`). The answer is read whole: a part is composed, not relayed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from aiohttp import hdrs, web

from ..cache import CacheEntry, CacheKey, Failed, Stale, make_key
from ..cluster import Flight
from ..codec import loads
from ..errors import BadGateway, GatewayError, GatewayTimeout, Overloaded
from ..protocol import H_NAME, ParsedRequest, encode_header_value, method_label
from ..proxy import Proxy
from ..proxy.fetch import fetch_answer
from ..upstream import Upstream
from .compose import Part
from .names import quoted

__all__ = ["MemberFailed", "PartFetcher"]

#: What a member may fail with and be left out for (the rest of the answer is still served).
MemberFailed = (BadGateway, GatewayTimeout, Overloaded)


class PartFetcher:
    """Fetches parts for ``POST /mcp`` with ``proxy``'s cache, coalescer and shared tier."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.forwarder = proxy.forwarder
        self.store = proxy.store
        self.clock = proxy.clock
        #: The fetches this process leads for ``/mcp`` (each runs to its end for its followers).
        self._leading: set[asyncio.Future[Part]] = set()

    def key(self, upstream: Upstream, parsed: ParsedRequest, request: web.Request) -> CacheKey | None:
        """The key of ``parsed`` on ``upstream``'s own route, ``None`` when it is not cached there."""
        if parsed.cache_bypass is not None or not self.proxy.caching:
            return None
        vary, forward_authorization = self.proxy.key_options[upstream.name]
        authorization = request.headers.get(hdrs.AUTHORIZATION, "") if forward_authorization else None
        try:
            return make_key(upstream.name, parsed, vary, authorization)
        except ValueError:
            return None

    async def fetch(
        self, upstream: Upstream, parsed: ParsedRequest, body: bytes, request: web.Request, mcp_name: str | None = None
    ) -> Part:
        """``upstream``'s answer to ``body`` (``parsed``), sent with ``request``'s headers and, when
        given, ``mcp_name`` as its ``Mcp-Name``.

        A fetch this request leads runs to its end even if the request stops waiting for it (a
        member's pages out of time, the caller gone): the callers waiting on the same key get its
        answer, not each a request of their own.

        Raises:
            BadGateway, GatewayTimeout, Overloaded: the member failed (or is at ``max_inflight``)
                and no stale entry of it may answer.
            MemberError: the member answered a JSON-RPC error (or HTTP 5xx).
        """
        key = self.key(upstream, parsed, request)
        if key is None:
            return await self._send(upstream, None, body, request, parsed, mcp_name)
        entry = self.store.get(key)
        if entry is not None:
            return self._from_entry(key, entry)
        waiter = self.proxy.coalescer.claim(key)
        if waiter is None:
            lead = asyncio.ensure_future(self._lead(upstream, key, body, request, parsed, mcp_name))
            self._leading.add(lead)
            lead.add_done_callback(self._led)
            return await asyncio.shield(lead)
        got = await asyncio.shield(waiter)
        if isinstance(got, CacheEntry):
            return self._from_entry(key, got)
        if isinstance(got, Stale):
            return self._from_entry(key, got.entry, stale=True)
        if isinstance(got, Failed):
            raise type(got.error)(got.error.message, request_id=parsed.request_id)
        return await self._send(upstream, None, body, request, parsed, mcp_name)  # not storable: ours alone

    def _led(self, task: asyncio.Future[Part]) -> None:
        self._leading.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: whoever still waited has had it

    async def close(self) -> None:
        """Cancel the fetches still under way (the app's shutdown)."""
        for task in list(self._leading):
            task.cancel()
        await asyncio.gather(*self._leading, return_exceptions=True)

    async def _lead(
        self,
        upstream: Upstream,
        key: CacheKey,
        body: bytes,
        request: web.Request,
        parsed: ParsedRequest,
        mcp_name: str | None,
    ) -> Part:
        """Fetch ``key`` for everyone waiting on it (this request leads its coalescer)."""
        cluster = self.proxy.cluster
        released: CacheEntry | Stale | Failed | None = None
        flight: Flight | None = None
        backoff = self.forwarder.backoff
        waited_s = 0.0
        try:
            # A member failing just now, with a stale entry kept (stale-if-error): that answers,
            # without the member being asked again until its backoff ends (as on its own route).
            if backoff.waiting(key, self.clock()) and (stale := self.store.stale(key)) is not None:
                released = Stale(stale)
                return self._from_entry(key, stale, stale=True)
            if cluster is not None:
                started = time.perf_counter()
                found = await cluster.lookup(key, upstream.config.timeout_s)
                waited_s = time.perf_counter() - started
                if found.entry is not None:
                    self.store.put(key, found.entry)
                    released = found.entry
                    return dataclasses.replace(self._from_entry(key, found.entry), waited_s=waited_s)
                flight = found.flight
                if found.stale is not None:
                    self.store.put_stale(key, found.stale)
            try:
                part = await self._send(upstream, key, body, request, parsed, mcp_name, flight)
            except Overloaded:
                # Busy, not failing: no backoff, and the followers try for themselves.
                if (stale := self.store.stale(key)) is None:
                    raise
                return self._from_entry(key, stale, stale=True)
            except MemberFailed as err:
                backoff.failed(key, self.clock())
                stale = self.store.stale(key)
                if stale is None:
                    released = Failed(err)
                    raise
                released = Stale(stale)
                return self._from_entry(key, stale, stale=True)
            released = part.entry
            return dataclasses.replace(part, waited_s=waited_s)
        finally:
            self.proxy.coalescer.release(key, released)
            if flight is not None and cluster is not None:
                cluster.finish(flight, key, None)  # a no-op once finished with the entry

    async def _send(
        self,
        upstream: Upstream,
        key: CacheKey | None,
        body: bytes,
        request: web.Request,
        parsed: ParsedRequest,
        mcp_name: str | None = None,
        flight: Flight | None = None,
    ) -> Part:
        """Send ``body`` to ``upstream`` and read the answer whole; store it under ``key`` when
        the cache policy allows (:func:`~gateway.cache.store_outcome`), as the proxy would, and
        whatever it is (an error included) end the key's stale window if it is not stored
        (:meth:`~gateway.proxy.forward.Forwarder.keep`)."""
        if upstream.inflight >= upstream.config.max_inflight:
            raise Overloaded(f"upstream {upstream.name} has {upstream.inflight} requests in flight")
        headers = upstream.request_headers(request.headers, allow_authorization=self.forwarder.allow_authorization)
        if mcp_name is not None:
            headers[H_NAME] = encode_header_value(mcp_name)
        purges = self.store.purges_of(upstream.name)
        method = method_label(parsed.method)
        upstream.inflight += 1
        started = time.perf_counter()
        try:
            status, message, size = await fetch_answer(upstream, body, headers, parsed.request_id)
        finally:
            upstream.inflight -= 1
            self.forwarder.metrics.request_metrics.upstream_request(
                upstream.name, method, time.perf_counter() - started
            )
        entry: CacheEntry | None = None
        if key is not None:
            # Stored as the proxy would store it; an error is an answer too, and ends the stale window.
            _, entry = self.forwarder.keep(upstream, key, method, status, message, size, purges, flight)
        if status >= 500 or "error" in message:
            raise MemberError.of(upstream.name, status, message, parsed.request_id)
        result = message.get("result")
        if not isinstance(result, dict):
            raise BadGateway(f"upstream {upstream.name} answered without a result", request_id=parsed.request_id)
        now = self.clock()
        if entry is not None:
            return Part(result, entry.ttl_ms, True, key, entry, fetched=True, size=size, at=now)
        ttl = result.get("ttlMs")
        ttl_ms = ttl if type(ttl) is int and ttl > 0 else 0
        return Part(result, ttl_ms, result.get("cacheScope") == "public", fetched=True, size=size, at=now)

    def _from_entry(self, key: CacheKey, entry: CacheEntry, *, stale: bool = False) -> Part:
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
        return Part(result, ttl_ms, True, key, None if stale else entry, stale, size=entry.size, at=now)


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
