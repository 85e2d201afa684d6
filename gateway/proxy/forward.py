"""Forwarding one request upstream, relaying the answer, and storing it when it may be stored.

The request body goes upstream byte for byte; a JSON answer is relayed whole, an SSE answer
chunk by chunk as it arrives (MCP 2026-07-28, basic/transports/streamable-http, 'Sending
Messages', item 6: the server may answer with one JSON object or an event stream; 'Receiving
Messages': notifications, then the final response). Only an answer to be stored (the request
has a cache key) is parsed whole; others are checked for their envelope.

Refresh-ahead (:meth:`Forwarder.refresh`) sends a caller's request again in the background and
stores the answer; nothing of it reaches a caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from ..cache import (
    STORED,
    Backoff,
    CacheEntry,
    CacheKey,
    CacheStore,
    Clock,
    Coalescer,
    Stale,
    build_entry,
    store_outcome,
)
from ..cluster import Cluster, Flight
from ..codec import loads, loads_relayed
from ..config import GatewayConfig
from ..errors import BadGateway, GatewayError, Overloaded
from ..jsonrpc import error_code, response_id_matches
from ..protocol import H_NAME, encode_header_value
from ..tasks import BackgroundTasks
from ..telemetry import GatewayMetrics
from ..upstream import RESPONSE_HEADERS, Upstream
from .exchange import LARGE_BODY_BYTES, Exchange
from .fetch import fetch_answer
from .stream import relay_stream
from .writing import CallerWriter, QueueBudget

__all__ = ["Forwarder"]

log = logging.getLogger("mcp_gateway.proxy")

#: The ``cache_stores`` outcome (and ``Cache-Status`` detail) of a storable answer not stored
#: because the shared tier is read-only (:mod:`gateway.cluster.link`).
HELD: Final = "cluster_read_only"


class Forwarder:
    """Sends requests to their upstream and relays, and where allowed stores, the answers.

    ``on_success(upstream, protocol_version)`` is called after an upstream answered a modern
    request with a JSON-RPC result (the registry's "observed" versions).
    """

    def __init__(
        self,
        config: GatewayConfig,
        store: CacheStore,
        metrics: GatewayMetrics,
        clock: Clock,
        coalescer: Coalescer,
        cluster: Cluster | None = None,
    ) -> None:
        self.store = store
        self.coalescer = coalescer
        self.cluster = cluster
        self.metrics = metrics
        self.clock = clock
        self.max_entry_bytes = config.cache.max_entry_bytes
        self.max_ttl_ms = config.cache.max_ttl_ms
        self.write_timeout_s = config.listener.write_timeout_s
        #: Every answer too large to be handed over at once, and every SSE chunk, goes through it.
        self.writer = CallerWriter(
            self.write_timeout_s,
            QueueBudget(config.listener.max_queued_bytes),
            lambda reason: metrics.callers_dropped.labels(reason).inc(),
        )
        #: With gateway auth, a caller's Authorization holds the gateway's token: never forwarded.
        self.allow_authorization = config.auth is None
        self.on_success: Callable[[str, str], None] | None = None
        self._streams: set[aiohttp.ClientResponse] = set()
        #: Set by :meth:`close_streams`: the relayed streams end because the gateway stops.
        self.closing = False
        #: Per upstream: (stale_if_error_ms, refresh_ahead), what its entries are built with.
        self.entry_options = {
            name: (config.stale_if_error_ms(name), config.refresh_ahead(name)) for name in config.upstreams
        }
        #: When each failing key may be fetched again (stale-if-error, refresh-ahead): only for
        #: failures to fetch; an upstream that answers clears it.
        self.backoff = Backoff()
        #: When a key whose last refresh was answered but not storable (an error, too large...) may
        #: be refreshed again: apart from ``backoff``, so that such an answer never makes a miss
        #: serve the stale entry in place of asking the upstream.
        self.refresh_backoff = Backoff()
        #: The refresh-ahead requests under way (one per key: each leads its key's coalescer).
        self.refreshes = BackgroundTasks(log)

    async def forward(self, ex: Exchange, fwd: str) -> web.StreamResponse:
        """Send ``ex`` to ``ex.upstream`` (``fwd``: ``miss`` or ``bypass``) and relay the answer;
        store it when ``ex.key`` is set and the answer is storable (the entry is left in
        ``ex.entry``).

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
        if not listen and upstream.inflight >= upstream.config.max_inflight:
            raise Overloaded(
                f"upstream {upstream.name} has {upstream.inflight} requests in flight; retry later",
                request_id=ex.request_id,
                headers={"Retry-After": "1"},
            )
        try:
            headers = self.request_headers(ex, upstream)
        except GatewayError as err:
            err.request_id = ex.request_id
            raise
        ex.fwd = fwd
        ex.purges = self.store.purges_of(upstream.name)  # an answer that crosses a purge may be what it was for
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
                    try:
                        return await relay_stream(self, ex, upstream, resp)
                    finally:
                        self._streams.discard(resp)
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

    def request_headers(self, ex: Exchange, upstream: Upstream) -> CIMultiDict[str]:
        """The headers ``ex`` is sent upstream with (:meth:`Upstream.request_headers`), its
        ``Mcp-Name`` replaced by ``ex.mcp_name`` when that is set (``POST /mcp``).

        Raises:
            HeaderMismatch: a header cannot be passed on unchanged.
        """
        headers = upstream.request_headers(ex.request.headers, allow_authorization=self.allow_authorization)
        if ex.mcp_name is not None:
            headers[H_NAME] = encode_header_value(ex.mcp_name)
        return headers

    async def close_streams(self) -> None:
        """End every SSE answer being relayed (the app's ``on_shutdown``): each caller still
        waiting for its response gets a JSON-RPC error event (-32603) and a clean end of stream
        instead of waiting out the shutdown timeout (a legacy ``GET`` stream just ends); a listen
        stream's client then re-subscribes elsewhere. Background refreshes are cancelled."""
        self.closing = True
        for resp in list(self._streams):
            resp.close()
        await self.refreshes.close()

    # -- refresh-ahead -----------------------------------------------------------------------

    def refresh(self, ex: Exchange, key: CacheKey) -> None:
        """Start a background refresh of ``key`` for the hit ``ex`` (its entry is in the last part
        of its lifetime), unless one is under way (it leads the key's coalescer: a miss arriving
        meanwhile waits for it), the key is backing off after a failure, or the upstream is at
        ``max_inflight``. The caller's request is sent again as it came (its body and the headers
        it would have forwarded)."""
        upstream, parsed, body = ex.upstream, ex.parsed, ex.body
        if key in self.coalescer or upstream is None or parsed is None or body is None:
            return  # under way already (every hit until it ends comes here)
        now = self.clock()
        if upstream.inflight >= upstream.config.max_inflight or self.backoff.waiting(key, now):
            return
        if self.refresh_backoff.waiting(key, now):
            return
        try:
            headers = self.request_headers(ex, upstream)
        except GatewayError:
            return
        if self.coalescer.claim(key) is not None:  # cannot be: checked above, and nothing awaited since
            return
        self.refreshes.spawn(self._refresh(upstream, key, body, headers, parsed.request_id, ex.method), name="refresh")

    async def _refresh(
        self,
        upstream: Upstream,
        key: CacheKey,
        body: bytes,
        headers: CIMultiDict[str],
        request_id: object,
        method: str,
    ) -> None:
        released: CacheEntry | Stale | None = None
        outcome = "failed"
        purges = self.store.purges_of(upstream.name)
        flight: Flight | None = None
        fetching = False
        try:
            if self.cluster is not None:
                # One refresh per key per cluster: the cold key's lock (Cluster.lookup).
                found = await self.cluster.lookup(key, upstream.config.timeout_s, refresh=True)
                if found.entry is not None:  # another process refreshed it: adopted from Redis
                    outcome = "shared"
                    if self.store.purges_of(upstream.name) == purges and self.store.put(key, found.entry):
                        released = found.entry
                        self.update_size_gauges()
                    return
                if found.skipped:  # another process refreshes it and its answer did not come
                    outcome = "skipped"
                    return
                flight = found.flight
            upstream.inflight += 1
            fetching = True
            try:
                status, message, size = await fetch_answer(upstream, body, headers, request_id)
            except GatewayError as err:
                log.info("refresh-ahead of a %s entry of %s failed: %s", method, upstream.name, err.message)
                self.backoff.failed(key, self.clock())
                stale = self.store.stale(key)  # it may have expired meanwhile
                released = None if stale is None else Stale(stale)
                return
            _, entry = self.keep(upstream, key, method, status, message, size, purges, flight)
            if entry is None:
                outcome = "unstored"
                self.refresh_backoff.failed(key, self.clock())  # not refreshed again for a while
                return
            outcome, released = "stored", entry
        finally:
            if fetching:
                upstream.inflight -= 1
            if flight is not None and self.cluster is not None:
                self.cluster.finish(flight, key, None)  # a no-op once finished with the entry
            self.coalescer.release(key, released)
            self.metrics.cache_refreshes.labels(upstream.name, method, outcome).inc()

    def build(self, upstream: str, message: dict[str, Any]) -> CacheEntry | None:
        stale_if_error_ms, refresh_ahead = self.entry_options[upstream]
        return build_entry(
            message, self.clock(), self.max_ttl_ms, stale_if_error_ms=stale_if_error_ms, refresh_ahead=refresh_ahead
        )

    # -- relaying --------------------------------------------------------------------------

    def _relay_body(self, ex: Exchange, upstream: Upstream, resp: aiohttp.ClientResponse, data: bytes) -> web.Response:
        status = resp.status
        parsed = ex.parsed
        message: object = None
        checked = 200 <= status < 300 or status >= 500
        # A cacheable request's answer is read at any status: a JSON-RPC response over HTTP 4xx
        # is an answer too, and ends the key's stale window (keep).
        if parsed is not None and parsed.kind == "request" and (checked or ex.key is not None):
            try:
                # Only an answer to store is parsed exactly; a relayed one for its envelope.
                message = loads(data) if ex.key is not None else loads_relayed(data, parsed.request_id)
            except ValueError:
                message = None
            if not response_id_matches(message, parsed.request_id):
                if checked:
                    raise BadGateway(
                        f"upstream {upstream.name} answered HTTP {status} without a JSON-RPC response to this request"
                    )
                message = None  # a 4xx without one is relayed as it came
        self.answered(ex, upstream, status, message if checked else None)
        if ex.key is not None:
            self.maybe_store(ex, upstream, status, message, len(data))
        ex.large = len(data) > LARGE_BODY_BYTES
        return web.Response(body=data, status=status, headers=self.passthrough_headers(ex, resp))

    def passthrough_headers(self, ex: Exchange, resp: aiohttp.ClientResponse) -> CIMultiDict[str]:
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

    def maybe_store(self, ex: Exchange, upstream: Upstream, status: int, message: object, size: int) -> None:
        """Store a cacheable answer of ``size`` bytes if the cache policy allows it."""
        assert ex.key is not None and ex.purges is not None  # set by forward() before sending
        result, entry = self.keep(upstream, ex.key, ex.method, status, message, size, ex.purges, ex.flight)
        if entry is not None:
            ex.entry = entry
            ex.stored_ttl_ms = entry.ttl_ms
        else:
            ex.detail = result.replace("_", "-")
        if ex.leads:
            # The followers learn the outcome now, not when this caller has read the whole
            # answer: a caller that stops reading holds back no one else.
            self.coalescer.release(ex.key, entry)
            ex.leads = False

    def keep(
        self,
        upstream: Upstream,
        key: CacheKey,
        method: str,
        status: int,
        message: object,
        size: int,
        purges: int,
        flight: Flight | None,
    ) -> tuple[str, CacheEntry | None]:
        """Store ``upstream``'s answer (``message``, ``size`` bytes, HTTP ``status``) to the
        cacheable request ``key`` if the cache policy allows (:func:`~gateway.cache.store_outcome`)
        and no purge that could be about it came since it was sent (``purges``: the store's
        ``purges_of(upstream)`` then); with ``[cluster]`` in the shared tier too (``flight``: this
        process leads the key for the cluster, whose other followers learn the outcome).

        ``message`` is the JSON-RPC response to the request (``None``: a 4xx without one). Any
        response that is not stored, whatever its HTTP status (an error, private, no ``ttlMs``,
        too large, refused...), ends the key's stale window here and in the shared tier: it is
        the upstream's newest word on the key, and an older entry must not answer in its place
        once the upstream fails (MCP 2026-07-28, server/utilities/caching: a cache may serve
        stale data when re-fetching fails, and an answer is no failure). Returns the store
        outcome (the ``cache_stores`` label) and the entry stored, if any. Every answer the
        gateway reads for a cacheable request comes here: relayed, refreshed, or a part of
        ``POST /mcp``."""
        result = store_outcome(status, message, size, self.max_entry_bytes)
        entry: CacheEntry | None = None
        if result == STORED and self.store.purges_of(upstream.name) != purges:
            result = "refused"  # purged while it was on its way: this answer may be what the purge was for
        elif result == STORED and self.store.held:
            result = HELD  # the shared tier cannot carry invalidations: nothing stored could be vouched for
        elif result == STORED:
            assert isinstance(message, dict)
            entry = self.build(upstream.name, message)
            if entry is None or not self.store.put(key, entry):
                result, entry = "refused", None
        superseded = entry is None and isinstance(message, dict)
        if superseded:
            self.store.supersede(key)  # an entry kept stale must not outlive this answer
        self.metrics.cache_stores.labels(upstream.name, method, result).inc()
        self.update_size_gauges()
        self.backoff.succeeded(key)  # the upstream answered, stored or not
        if entry is not None:
            self.refresh_backoff.succeeded(key)
        if self.cluster is not None:
            if flight is not None:
                # Written (or its stale window ended), unlocked, then "done".
                self.cluster.finish(flight, key, entry, supersede=superseded)
            elif entry is not None:
                self.cluster.share(key, entry)
            elif superseded:
                self.cluster.supersede(key)
        return result, entry

    def update_size_gauges(self) -> None:
        """``mcp_gateway_cache_entries`` and ``mcp_gateway_cache_bytes`` from the store."""
        self.metrics.cache_entries.set(len(self.store))
        self.metrics.cache_bytes.set(self.store.total_bytes)
