"""Forwarding one request upstream, relaying the answer, and keeping it when it is a cacheable one.

The request body goes upstream byte for byte; a JSON answer is relayed whole, an SSE answer
chunk by chunk as it arrives (MCP 2026-07-28, basic/transports/streamable-http, 'Sending
Messages', item 6: the server may answer with one JSON object or an event stream; 'Receiving
Messages': notifications, then the final response). Only an answer to keep (the request has a
:class:`~gateway.cache.Lead`: a cache miss) is parsed whole; others are checked for their envelope.
What is stored, and who else gets it, is the read-through's (:mod:`gateway.cache.readthrough`).

:meth:`Forwarder.fetch` reads an answer whole instead (refresh-ahead, the parts of ``POST /mcp``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import aiohttp
from aiohttp import web
from cachetools import LRUCache
from multidict import CIMultiDict

from ..cache import Answer, CacheKey, CacheLookup, Lead, ReadThrough, StoreOutcome
from ..cache.private import PrivateAnswers
from ..codec import loads, loads_relayed
from ..config import GatewayConfig
from ..errors import BadGateway, GatewayError, NotFound, Overloaded
from ..jsonrpc import error_code, response_id_matches
from ..protocol import H_NAME, encode_header_value
from ..telemetry import GatewayMetrics
from ..upstream import RESPONSE_HEADERS, Upstream
from .exchange import LARGE_BODY_BYTES, Exchange, Forwarded
from .fetch import fetch_answer
from .stream import relay_stream
from .writing import CallerWriter

__all__ = ["Forwarder"]


#: Legacy sessions whose opener is remembered (the oldest forgotten first).
MAX_SESSIONS: Final = 10_000
_SESSION_ID: Final = "Mcp-Session-Id"


class _Relays:
    """What every forwarder of the app shares across reloads: the SSE answers being relayed now,
    whether the gateway is stopping, and who opened each legacy session."""

    __slots__ = ("closing", "listening", "sessions", "streams")

    def __init__(self) -> None:
        self.streams: set[aiohttp.ClientResponse] = set()
        #: Of those, the ``subscriptions/listen`` streams.
        self.listening: set[aiohttp.ClientResponse] = set()
        self.closing = False
        #: A legacy session's ``Mcp-Session-Id`` → the authorization context of the caller that
        #: opened it (with gateway auth only).
        self.sessions: LRUCache[str, bytes] = LRUCache(MAX_SESSIONS)


class Forwarder:
    """Sends requests to their upstream and relays the answers, keeping (through ``readthrough``)
    those of cache misses.

    ``on_success(upstream, protocol_version)`` is called after an upstream answered a modern
    request with a JSON-RPC result (the registry's "observed" versions).
    """

    def __init__(
        self,
        config: GatewayConfig,
        readthrough: ReadThrough,
        metrics: GatewayMetrics,
        writer: CallerWriter,
        on_success: Callable[[str, str], None] | None = None,
        *,
        previous: Forwarder | None = None,
    ) -> None:
        self.readthrough = readthrough
        self.metrics = metrics
        #: Every answer too large to be handed over at once, and every SSE chunk, goes through it.
        self.writer = writer
        #: With gateway auth, a caller's Authorization holds the gateway's token: never forwarded.
        self.allow_authorization = config.auth is None
        self.on_success = on_success
        #: With ``[cache] private_per_identity`` (and gateway auth: a caller with a context):
        #: private answers kept per authorization context (:mod:`gateway.cache.private`).
        self.private = (
            PrivateAnswers(
                readthrough.store,
                readthrough.clock,
                max_entry_bytes=config.cache.max_entry_bytes,
                max_ttl_ms=config.cache.max_ttl_ms,
            )
            if config.cache.private_per_identity and config.auth is not None
            else None
        )
        #: The SSE answers being relayed, by every forwarder of the app (``previous``: the one
        #: built from the config before a reload), so that a stop ends them all.
        self._relays: _Relays = _Relays() if previous is None else previous._relays
        self._streams = self._relays.streams

    @property
    def closing(self) -> bool:
        """Set by :meth:`close_streams`: the relayed streams end because the gateway stops."""
        return self._relays.closing

    async def forward(self, ex: Exchange, fwd: Forwarded) -> web.StreamResponse:
        """Send ``ex`` to ``ex.upstream`` (``fwd``: why) and relay the answer;
        keep it (:meth:`keep`) when the request is a cache miss (``ex.lead``).

        Raises:
            Overloaded: ``max_inflight`` requests to that upstream are under way.
            HeaderMismatch: a header to forward cannot be passed on unchanged.
            BadGateway, GatewayTimeout: the upstream failed (see :class:`~gateway.upstream.Upstream`),
                or answered a request with HTTP 2xx/5xx and a body that is not a JSON-RPC
                response to it (:class:`BadGateway`).
        """
        upstream = ex.upstream
        assert upstream is not None
        # A caller's listen stream stays open for as long as the caller likes: such streams have
        # their own bound, so that they never crowd out requests.
        listen = ex.parsed is not None and ex.parsed.method == "subscriptions/listen"
        if listen and upstream.listening >= upstream.config.max_listen_streams:
            raise Overloaded(
                f"upstream {upstream.name} has {upstream.listening} listen streams open; retry later",
                request_id=ex.request_id,
                headers={"Retry-After": "1"},
            )
        if not listen:
            self.check_inflight(upstream, ex.request_id)
        self.check_session(ex)
        try:
            headers = self.request_headers(ex.request, upstream, ex.mcp_name)
        except GatewayError as err:
            err.request_id = ex.request_id
            raise
        ex.fwd = fwd
        if listen:
            upstream.listening += 1
        else:
            upstream.inflight += 1  # mcp_gateway_inflight_requests reads it
        started = time.perf_counter()
        try:
            async with upstream.open(ex.request.method, ex.body, headers) as resp:
                ex.fwd_status = resp.status
                if resp.content_type == "text/event-stream":
                    self._streams.add(resp)
                    if listen:
                        self._relays.listening.add(resp)
                    try:
                        return await relay_stream(self, ex, upstream, resp)
                    finally:
                        self._streams.discard(resp)
                        self._relays.listening.discard(resp)
                deadline = asyncio.get_running_loop().time() + upstream.config.timeout_s
                data = await upstream.read_body(resp, deadline)
                return self._relay_body(ex, upstream, resp, data)
        except GatewayError as err:
            if err.request_id is None:
                err.request_id = ex.request_id
            ex.detail = "upstream-error"  # one detail only: the failure replaces the bypass reason
            raise
        finally:
            if listen:
                upstream.listening -= 1
            else:
                upstream.inflight -= 1
            ex.upstream_seconds = time.perf_counter() - started

    async def miss(self, ex: Exchange, lead: Lead) -> web.StreamResponse:
        """The read-through's fetch of a cache miss (``lead``): :meth:`forward`, keeping the answer."""
        ex.lookup = CacheLookup.MISS
        ex.lead = lead
        return await self.forward(ex, Forwarded.MISS)

    @staticmethod
    def check_inflight(upstream: Upstream, request_id: object) -> None:
        """Raises :class:`Overloaded` (HTTP 503, ``Retry-After: 1``) when ``upstream`` has its
        ``max_inflight`` requests under way."""
        if upstream.inflight >= upstream.config.max_inflight:
            raise Overloaded(
                f"upstream {upstream.name} has {upstream.inflight} requests in flight; retry later",
                request_id=request_id,
                headers={"Retry-After": "1"},
            )

    def request_headers(self, request: web.Request, upstream: Upstream, mcp_name: str | None) -> CIMultiDict[str]:
        """The headers ``request`` is sent upstream with (:meth:`Upstream.request_headers`), its
        ``Mcp-Name`` replaced by ``mcp_name`` when that is given (``POST /mcp`` rewrites names).

        Raises:
            HeaderMismatch: a header cannot be passed on unchanged.
        """
        headers = upstream.request_headers(request.headers, allow_authorization=self.allow_authorization)
        if mcp_name is not None:
            headers[H_NAME] = encode_header_value(mcp_name)
        return headers

    async def fetch(
        self, upstream: Upstream, body: bytes, headers: CIMultiDict[str], request_id: object, method: str
    ) -> Answer:
        """Send ``body`` (a ``method`` request) and read its JSON-RPC answer whole
        (:func:`~gateway.proxy.fetch.fetch_answer`), counted in flight and in the upstream's
        request durations.

        Raises:
            Overloaded: ``max_inflight`` requests to that upstream are under way.
            BadGateway, GatewayTimeout: the upstream failed, or gave no JSON-RPC answer.
        """
        self.check_inflight(upstream, request_id)
        upstream.inflight += 1
        started = time.perf_counter()
        try:
            return await fetch_answer(upstream, body, headers, request_id)
        finally:
            upstream.inflight -= 1
            self.metrics.request_metrics.upstream_request(upstream.name, method, time.perf_counter() - started)

    def end_listening(self) -> None:
        """End every ``subscriptions/listen`` stream being relayed (a reload that changes
        ``[auth]`` or the rules): each caller gets a JSON-RPC error event and the end of its
        stream, and listens again under the new config."""
        for resp in list(self._relays.listening):
            resp.close()

    async def close_streams(self) -> None:
        """End every SSE answer being relayed (the app's ``on_shutdown``): each caller still
        waiting for its response gets a JSON-RPC error event (-32603) and a clean end of stream
        instead of waiting out the shutdown timeout (a legacy ``GET`` stream just ends); a listen
        stream's client then re-subscribes elsewhere. Background refreshes are cancelled."""
        self._relays.closing = True
        for resp in list(self._streams):
            resp.close()
        await self.readthrough.close()

    # -- refresh-ahead -----------------------------------------------------------------------

    def refresh(self, ex: Exchange, key: CacheKey) -> None:
        """Fetch ``key`` again in the background for the hit ``ex`` (its entry is in the last part
        of its lifetime: :meth:`ReadThrough.refresh`), with the caller's request as it came (its
        body and the headers it would have forwarded), unless the upstream is at ``max_inflight``."""
        upstream, parsed, body = ex.upstream, ex.parsed, ex.body
        if upstream is None or parsed is None or body is None or key in self.readthrough.coalescer:
            return  # under way already (every hit until it ends comes here)
        if upstream.inflight >= upstream.config.max_inflight:
            return
        try:
            headers = self.request_headers(ex.request, upstream, ex.mcp_name)
        except GatewayError:
            return
        method, request_id = ex.method, parsed.request_id
        self.readthrough.refresh(
            key,
            lambda: self.fetch(upstream, body, headers, request_id, method),
            timeout_s=upstream.config.timeout_s,
            method=method,
        )

    # -- relaying --------------------------------------------------------------------------

    def _relay_body(self, ex: Exchange, upstream: Upstream, resp: aiohttp.ClientResponse, data: bytes) -> web.Response:
        status = resp.status
        parsed = ex.parsed
        message: object = None
        checked = 200 <= status < 300 or status >= 500
        # A cacheable request's answer is read at any status: a JSON-RPC response over HTTP 4xx
        # is an answer too, and ends the key's stale window (keep).
        if parsed is not None and parsed.kind == "request" and (checked or ex.lead is not None):
            try:
                # Only an answer to keep is parsed exactly; a relayed one for its envelope.
                message = loads(data) if ex.lead is not None else loads_relayed(data, parsed.request_id)
            except ValueError:
                message = None
            if not response_id_matches(message, parsed.request_id):
                if checked:
                    raise BadGateway(
                        f"upstream {upstream.name} answered HTTP {status} without a JSON-RPC response to this request"
                    )
                message = None  # a 4xx without one is relayed as it came
        self.answered(ex, upstream, status, message if checked else None)
        self.keep(ex, status, message, len(data))
        ex.large = len(data) > LARGE_BODY_BYTES
        return web.Response(body=data, status=status, headers=self.passthrough_headers(ex, resp))

    def check_session(self, ex: Exchange) -> None:
        """A legacy session (``Mcp-Session-Id``, MCP 2025-11-25, basic/transports, 'Session
        Management') is used only by the caller that opened it: another caller's request in it
        is answered as an unknown session (HTTP 404), never forwarded. A session this process did
        not see open (another replica's, or before a restart) is passed on as it comes.

        Raises:
            NotFound: the session was opened by another caller.
        """
        session = ex.request.headers.get(_SESSION_ID)
        if session is None or not ex.caller.context:
            return
        opener = self._relays.sessions.get(session)
        if opener is not None and opener != ex.caller.context:
            raise NotFound("Session not found", request_id=ex.request_id)

    def passthrough_headers(self, ex: Exchange, resp: aiohttp.ClientResponse) -> CIMultiDict[str]:
        session = resp.headers.get(_SESSION_ID)
        if session is not None and ex.caller.context and _SESSION_ID not in ex.request.headers:
            self._relays.sessions[session] = ex.caller.context  # a session opened: by this caller
        out: CIMultiDict[str] = CIMultiDict()
        for name in RESPONSE_HEADERS:
            for value in resp.headers.getall(name, ()):
                out.add(name, value)
        out["Cache-Status"] = ex.cache_status()
        return out

    # -- what the answer was -----------------------------------------------------------------

    def answered(self, ex: Exchange, upstream: Upstream, status: int, message: object) -> None:
        """Note a JSON-RPC error code, or a success in real traffic (``on_success``)."""
        if isinstance(message, dict) and isinstance(message.get("error"), dict):
            ex.error_code = error_code(message)
        elif status == 200 and message is not None:
            parsed = ex.parsed
            if self.on_success is not None and parsed is not None and parsed.era == "modern" and parsed.version:
                self.on_success(upstream.name, parsed.version)

    def keep(self, ex: Exchange, status: int, message: object, size: int) -> None:
        """Keep the answer of a cache miss (``ex.lead``; ``size`` bytes, HTTP ``status``):
        :meth:`~gateway.cache.Lead.keep`; its ``Cache-Status`` says ``stored`` or why not. A
        ``private`` answer is kept for the caller's authorization context alone with
        ``private_per_identity`` (``stored`` and ``detail=private``), unless a purge crossed it."""
        lead = ex.lead
        if lead is None:
            return
        outcome, entry = lead.keep(status, message, size, ex.method)
        if entry is not None:
            ex.stored_ttl_ms = entry.ttl_ms
            return
        ex.detail = outcome.detail
        if outcome is StoreOutcome.PRIVATE and self.private is not None and ex.caller.context:
            key = lead.key
            if self.readthrough.store.purges_of(key.upstream) != lead.purges:
                return
            kept = self.private.keep(key, ex.caller.context, ex.caller.expires_at, status, message, size)
            if kept is not None:
                ex.stored_ttl_ms = kept.ttl_ms
