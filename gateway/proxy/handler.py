"""The aiohttp handlers of ``/servers/{name}/mcp``: validate, look up, forward, store, respond.

Order on every POST: the ``Host`` and ``Origin`` checks (MCP 2026-07-28,
basic/transports/streamable-http, 'Security & Endpoint': DNS rebinding; the rules are in
``gateway.proxy.origin``), the body read, then parsed and checked against its headers
('Server Validation'); whatever that finds, the caller's token and the upstream name are checked
before any parse or header error is answered, and before the cache, even for ``public`` entries:
a cached answer is never a way around authentication (basic/authorization, 'Token Handling';
server/utilities/caching, 'Security Considerations'). Then the cache or the upstream.

This module is the plain path, written to be read. ``gateway.proxy.hot`` serves cache hits
with some of these steps inlined, and must answer byte for byte as this module does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestPayloadError
from multidict import CIMultiDict

from ..auth import bearer_matches
from ..cache import CacheEntry, CacheKey, CacheStore, Clock, Coalescer, Failed, Stale, make_key
from ..cluster import Cluster
from ..codec import id_json
from ..config import GatewayConfig
from ..errors import (
    BadGateway,
    Forbidden,
    GatewayError,
    GatewayTimeout,
    Misdirected,
    NotFound,
    ParseError,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    error_response,
)
from ..protocol import ParsedRequest, method_label, parse_request
from ..telemetry import ACCESS_LOGGER, GatewayMetrics, RequestJournal, RequestRecord
from ..upstream import Upstream
from .exchange import LARGE_BODY_BYTES, Exchange, hit_status, stale_status
from .forward import Forwarder
from .origin import OriginPolicy
from .writing import CallerGone, PiecesResponse

__all__ = ["Proxy"]

access_log = logging.getLogger(ACCESS_LOGGER)
log = logging.getLogger("mcp_gateway.proxy")


def caller_gone(request: web.Request) -> bool:
    """Whether the caller's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


def sockname(request: web.Request) -> object:
    """The local address of the socket ``request`` arrived on (``(address, port, ...)``), or
    ``None`` once the connection is gone."""
    transport = request.transport
    return None if transport is None else transport.get_extra_info("sockname")


class Proxy:
    """Serves the MCP routes of every configured upstream.

    ``upstreams`` is filled by the app once its client session exists; ``clock`` gives the
    cache's monotonic seconds; ``cluster`` is the shared tier behind ``store`` (with ``[cluster]``).
    """

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Mapping[str, Upstream],
        store: CacheStore,
        metrics: GatewayMetrics,
        clock: Clock,
        cluster: Cluster | None = None,
    ) -> None:
        self.upstreams = upstreams
        self.store = store
        self.clock = clock
        self.cluster = cluster
        self.coalescer = Coalescer()
        self.forwarder = Forwarder(config, store, metrics, clock, self.coalescer, cluster)
        self.journal = RequestJournal(metrics.request_metrics, access_log)
        self.tokens = tuple(t.encode() for t in config.auth.tokens) if config.auth else ()
        public_base_url = config.registry.public_base_url
        self.origin_policy = OriginPolicy(
            config.listener.host,
            config.listener.allowed_origins,
            None if public_base_url is None else str(public_base_url),
        )
        #: The lookups that settle the common cases (see OriginPolicy), bound for the hot path.
        self.origins = self.origin_policy.origins
        self.hosts = self.origin_policy.hosts
        self.check_hosts = self.origin_policy.check_host
        self.max_body = config.listener.max_body_bytes
        self.body_timeout_s = config.listener.body_timeout_s
        self.caching = config.cache.max_entries > 0
        #: Per upstream: (vary the cache key on clientCapabilities, forward Authorization).
        self.key_options = {
            name: (config.vary_on_capabilities(name), up.forward_authorization) for name, up in config.upstreams.items()
        }

    @property
    def on_success(self) -> Callable[[str, str], None] | None:
        """See :class:`~gateway.proxy.forward.Forwarder`."""
        return self.forwarder.on_success

    @on_success.setter
    def on_success(self, hook: Callable[[str, str], None] | None) -> None:
        self.forwarder.on_success = hook

    # -- entry points -------------------------------------------------------------------------

    async def handle_post(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        """``POST /servers/{name}/mcp``. ``upstream_name`` is bound by a configured upstream's
        own route; ``None`` takes ``name`` from the path (the route for names not configured)."""
        started = time.perf_counter()
        ex = Exchange(request, request.match_info["name"] if upstream_name is None else upstream_name)
        response: web.StreamResponse | None = None
        try:
            self.check_host(request)
            self.check_origin(request)
            ex.body = await self.read_body(request)
            response = await self.answer(ex, self.parse(ex, ex.body))
            if ex.large:
                response = await self.send(ex, response)
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a caller that went away (after its whole answer
            # was written, it went away at the end: answered)
            ex.disconnected = not ex.written
            raise
        except Exception as exc:
            response = self.failed(ex, exc)
        finally:
            self.record(ex, response, started)
        return response

    async def handle_stream(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        """``GET``/``DELETE /servers/{name}/mcp``: legacy-era traffic passed through
        (``upstream_name`` as for :meth:`handle_post`)."""
        started = time.perf_counter()
        ex = Exchange(request, request.match_info["name"] if upstream_name is None else upstream_name, request.method)
        response: web.StreamResponse | None = None
        try:
            self.check_host(request)
            self.check_origin(request)
            self.check_auth(request, None)
            ex.upstream = self.find_upstream(ex.upstream_name, None)
            ex.detail = "legacy"
            response = await self.forwarder.forward(ex, "bypass")
        except asyncio.CancelledError:
            # aiohttp cancels the handler of a caller that went away (after its whole answer
            # was written, it went away at the end: answered)
            ex.disconnected = not ex.written
            raise
        except Exception as exc:
            response = self.failed(ex, exc)
        finally:
            self.record(ex, response, started)
        return response

    # -- the steps of a POST ------------------------------------------------------------------

    def check_host(self, request: web.Request) -> None:
        """Raises :class:`Misdirected` (HTTP 421) for a ``Host`` that is present and not a
        loopback name on a loopback bind (see :mod:`gateway.proxy.origin`)."""
        if self.check_hosts:
            host = request.headers.get(hdrs.HOST)
            if host is None or host in self.hosts:
                return
            if not self.origin_policy.host_allowed(host, sockname(request)):
                raise Misdirected(f"host {host!r} is not a loopback name, and this listener is bound to loopback")

    def check_origin(self, request: web.Request) -> None:
        """Raises :class:`Forbidden` (HTTP 403) for an ``Origin`` that is present and neither
        allowed nor one of the listener's own (see :mod:`gateway.proxy.origin`)."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or origin in self.origins:
            return
        if not self.origin_policy.origin_allowed(origin, sockname(request)):
            raise Forbidden(f"origin {origin!r} is not allowed")

    async def read_body(self, request: web.Request) -> bytes:
        """The whole request body, at most ``listener.max_body_bytes``, within
        ``listener.body_timeout_s`` seconds.

        Raises:
            RequestTimeout: the body did not arrive in time (HTTP 408).
            PayloadTooLarge: the body is larger (HTTP 413).
            ParseError: the body does not decode as its ``Content-Encoding`` says (HTTP 400).
        """
        try:
            # Bounded in time as well as size: the body is read before the token is checked.
            async with asyncio.timeout(self.body_timeout_s):
                body = await request.read()
        except TimeoutError as exc:
            raise RequestTimeout(f"request body not received within {self.body_timeout_s:g} s") from exc
        except web.HTTPRequestEntityTooLarge as exc:
            raise PayloadTooLarge(f"request body exceeds {self.max_body} bytes") from exc
        except RequestPayloadError as exc:  # e.g. Content-Encoding: gzip that is not gzip
            raise ParseError("Parse error: the body cannot be decoded as its Content-Encoding says") from exc
        if len(body) > self.max_body:
            raise PayloadTooLarge(f"request body exceeds {self.max_body} bytes")
        return body

    def parse(self, ex: Exchange, body: bytes) -> ParsedRequest:
        """Parse and validate ``body`` (see :func:`~gateway.protocol.parse_request`).

        A request that does not parse is still checked for the token and the upstream name
        first, so that a caller without a token learns nothing from the error.
        """
        try:
            parsed = parse_request(body, ex.request.headers)
        except GatewayError as err:
            self.check_auth(ex.request, err.request_id)
            self.find_upstream(ex.upstream_name, err.request_id)
            raise
        ex.parsed = parsed
        ex.method = method_label(parsed.method)
        return parsed

    def check_auth(self, request: web.Request, request_id: object) -> None:
        """Raises :class:`Unauthorized` unless the caller presents one of ``[auth].tokens``
        (always passes without ``[auth]``)."""
        if self.tokens and not bearer_matches(request.headers.get(hdrs.AUTHORIZATION), self.tokens):
            raise Unauthorized(request_id=request_id)

    def find_upstream(self, name: str, request_id: object) -> Upstream:
        """The upstream called ``name``. Raises :class:`NotFound` (HTTP 404, -32601)."""
        upstream = self.upstreams.get(name)
        if upstream is None:
            raise NotFound(
                f"no upstream named {name!r} behind this gateway", request_id=request_id, data={"upstream": name}
            )
        return upstream

    def cache_key(self, ex: Exchange, parsed: ParsedRequest, upstream: Upstream) -> CacheKey | None:
        """The cache key of a cacheable request; ``None`` (with the reason in ``ex.detail``) when
        the cache is bypassed."""
        bypass = parsed.cache_bypass
        if bypass is None and not self.caching:
            bypass = "disabled"  # max_entries = 0: nothing is looked up, stored or coalesced
        if bypass is not None:
            ex.cache = ex.lookup = "bypass"
            ex.detail = bypass
            return None
        vary, forward_authorization = self.key_options[upstream.name]
        # "" for no header: a caller without credentials is a context of its own.
        authorization = ex.request.headers.get(hdrs.AUTHORIZATION, "") if forward_authorization else None
        try:
            return make_key(upstream.name, parsed, vary, authorization)
        except ValueError:  # a number JSON cannot write back: forwarded, not cached
            ex.detail = "uncacheable"
            return None

    async def answer(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """Everything after parsing: the token, the upstream, then the cache or the upstream."""
        self.check_auth(ex.request, parsed.request_id)
        upstream = ex.upstream = self.find_upstream(ex.upstream_name, parsed.request_id)
        key = ex.key = self.cache_key(ex, parsed, upstream)
        if key is None:
            return await self.forwarder.forward(ex, "bypass")
        entry = self.store.get(key)
        if entry is not None:
            return self.hit(ex, entry, collapsed=False)
        return await self.miss(ex, key)

    async def miss(self, ex: Exchange, key: CacheKey) -> web.StreamResponse:
        """Not in the cache: wait for the same request already on its way upstream, or (with
        ``[cluster]``, see :meth:`shared`) take it from the shared tier, or send it (for an
        upstream with ``stale_if_error_ms``: :meth:`send_or_stale`)."""
        waiter = self.coalescer.claim(key)
        if waiter is not None:
            entry = await asyncio.shield(waiter)
            if isinstance(entry, Stale):  # the leader's fetch failed: its stale answer is ours too
                return self.stale(ex, entry.entry, collapsed=True)
            if isinstance(entry, Failed):
                # The leader could not fetch it just now: neither would this caller. Its failure,
                # with this caller's id, rather than one more attempt on a failing upstream.
                ex.cache = ex.lookup = "miss"
                ex.detail = "upstream-error"
                err = entry.error
                raise type(err)(str(err), request_id=ex.request_id)
            if entry is not None:
                return self.hit(ex, entry, collapsed=True)
            # Not storable (private, an error, ...): this caller's answer is its own.
            ex.cache = ex.lookup = "miss"
            return await self.forwarder.forward(ex, "miss")
        ex.leads = True
        try:
            if self.cluster is not None and (response := await self.shared(ex, key)) is not None:
                return response
            ex.cache = ex.lookup = "miss"
            if self.forwarder.entry_options[key.upstream][0]:
                return await self.send_or_stale(ex, key)
            return await self.forwarder.forward(ex, "miss")
        except (BadGateway, GatewayTimeout) as err:
            if ex.leads:  # the followers answer this failure too
                self.coalescer.release(key, Failed(err))
                ex.leads = False
            raise
        finally:
            if ex.leads:  # the forwarder did not release them (an error, a cut stream)
                self.coalescer.release(key, None)
            if ex.flight is not None and self.cluster is not None:
                self.cluster.finish(ex.flight, key, None)  # a no-op once the forwarder finished it

    async def send_or_stale(self, ex: Exchange, key: CacheKey) -> web.StreamResponse:
        """Send a miss (this request leads ``key``) of an upstream with ``stale_if_error_ms``,
        and if fetching fails (:class:`BadGateway`, :class:`GatewayTimeout`: refused, reset,
        timed out, or no JSON-RPC answer to the request), answer from the key's expired entry
        if it is still kept (:meth:`stale`); never in place of a JSON-RPC answer, whatever its
        HTTP status. After a failure the key backs off (:class:`~gateway.cache.Backoff`): until
        then its stale entry answers without the upstream being asked."""
        backoff = self.forwarder.backoff
        if backoff.waiting(key, self.clock()) and (entry := self.store.stale(key)) is not None:
            return self.stale(ex, entry, collapsed=False)
        try:
            return await self.forwarder.forward(ex, "miss")
        except (BadGateway, GatewayTimeout):
            backoff.failed(key, self.clock())
            entry = self.store.stale(key)  # looked up now: a purge meanwhile removed it
            if entry is None:
                raise
            return self.stale(ex, entry, collapsed=False)

    def stale(self, ex: Exchange, entry: CacheEntry, *, collapsed: bool) -> web.StreamResponse:
        """Answer from the expired ``entry`` (stale-if-error): the caller's id, ``ttlMs`` 0 and
        ``Cache-Status: mcp-gateway; hit; ttl=-S``, S the whole seconds past expiry. A request
        that leads its key hands the entry to its followers (:class:`~gateway.cache.Stale`)."""
        if ex.leads and ex.key is not None:
            self.coalescer.release(ex.key, Stale(entry))
            ex.leads = False
        ex.cache = ex.lookup = "stale"
        if entry.size > LARGE_BODY_BYTES:
            pieces, past_s = entry.stale_pieces(id_json(ex.request_id), self.clock())
            ex.hit = stale_status(past_s, collapsed)
            return self.large_answer(ex, pieces)
        body, past_s = entry.stale(id_json(ex.request_id), self.clock())
        ex.hit = stale_status(past_s, collapsed)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.hit})

    async def shared(self, ex: Exchange, key: CacheKey) -> web.StreamResponse | None:
        """The shared tier after a local miss (this request leads the key in this process): a
        hit from Redis, copied into the local tier, or ``None`` with ``ex.flight`` set when this
        process leads the key for the whole cluster (see :mod:`gateway.cluster.node`). An expired
        shared entry in its stale window is copied into the local tier as a stale one only."""
        assert self.cluster is not None and ex.upstream is not None
        found = await self.cluster.lookup(key, ex.upstream.config.timeout_s)
        if found.entry is None:
            ex.flight = found.flight
            if found.stale is not None and self.store.put_stale(key, found.stale):
                self.forwarder.update_size_gauges()  # send_or_stale answers from it if fetching fails
            return None
        self.store.put(key, found.entry)
        self.forwarder.update_size_gauges()
        self.coalescer.release(key, found.entry)
        ex.leads = False
        return self.hit(ex, found.entry, collapsed=found.collapsed, shared=True)

    def hit(self, ex: Exchange, entry: CacheEntry, *, collapsed: bool, shared: bool = False) -> web.StreamResponse:
        """Answer from ``entry``: the caller's id, ``ttlMs`` lowered to what is left. A hit in
        the last part of the entry's lifetime (refresh-ahead: ``entry.refresh_at``) starts its
        background refresh (:meth:`Forwarder.refresh`). A large entry (over
        :data:`LARGE_BODY_BYTES`) answers with its stored bytes, not a copy (:meth:`large_answer`)."""
        ex.cache = "hit"
        ex.lookup = "coalesced" if collapsed else "shared" if shared else "hit"
        now = self.clock()
        if now >= entry.refresh_at and ex.key is not None:
            self.forwarder.refresh(ex, ex.key)
        if entry.size > LARGE_BODY_BYTES:
            pieces, ttl_ms = entry.hit_pieces(id_json(ex.request_id), now)
            ex.hit = hit_status(ttl_ms, collapsed, shared)
            return self.large_answer(ex, pieces)
        body, ttl_ms = entry.hit(id_json(ex.request_id), now)
        ex.hit = hit_status(ttl_ms, collapsed, shared)
        ex.large = len(body) > LARGE_BODY_BYTES  # a small entry, a long id
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.hit})

    @staticmethod
    def large_answer(ex: Exchange, pieces: tuple[bytes | memoryview, ...]) -> PiecesResponse:
        """The JSON answer made of ``pieces`` (``ex.hit`` its ``Cache-Status``), to be written
        by :meth:`send`."""
        ex.large = True
        assert ex.hit is not None
        return PiecesResponse(pieces, headers=CIMultiDict({"Content-Type": "application/json", "Cache-Status": ex.hit}))

    async def send(self, ex: Exchange, response: web.StreamResponse) -> web.StreamResponse:
        """Write a large answer now, in chunks under the write deadline and the queue budget
        (:class:`~gateway.proxy.writing.CallerWriter`); returns what the handler returns. A
        caller that goes away or is dropped meanwhile sets ``ex.disconnected``."""
        try:
            return await self.forwarder.writer.send(ex.request, response, written=ex)
        except CallerGone:
            ex.disconnected = True
            return response

    # -- answers and bookkeeping --------------------------------------------------------------

    def failed(self, ex: Exchange, exc: Exception) -> web.Response:
        """The answer to a request that raised ``exc``: a :class:`GatewayError` is answered as
        itself, aiohttp's own HTTP exceptions go on to aiohttp, anything else is a bug
        (:meth:`internal_error`)."""
        if isinstance(exc, GatewayError):
            return self.error(ex, exc)
        if isinstance(exc, web.HTTPException):
            raise exc
        if isinstance(exc, ConnectionResetError) and caller_gone(ex.request):
            # Writing to a caller that went away: its doing, not a failure of the gateway.
            ex.disconnected = True
            log.debug("caller went away on %s %s: %s", ex.request.method, ex.request.path, exc)
            return web.Response(status=499)
        return self.internal_error(ex)

    def error(self, ex: Exchange, err: GatewayError) -> web.Response:
        """The gateway's own error answer (``detail=rejected`` unless the request was forwarded)."""
        ex.error_code = err.code
        if ex.fwd is None and ex.hit is None:
            ex.detail = "rejected"
        return error_response(err, ex.cache_status())

    def internal_error(self, ex: Exchange) -> web.Response:
        """A bug, not a protocol error: logged with its traceback, answered as a JSON-RPC
        internal error (HTTP 500) and counted, without the traceback reaching the caller."""
        request = ex.request
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return self.error(ex, GatewayError("Internal error in the gateway"))

    def record(
        self, ex: Exchange, response: web.StreamResponse | None, started: float, label: str | None = None
    ) -> None:
        """The request's record, to the journal (metrics and access log, in batches), under the
        upstream label ``label`` (default: the upstream's name, ``unknown`` for names not configured)."""
        ended = time.perf_counter()
        self.journal.add(
            # Positional, in the order of RequestRecord's fields: a third of the cost of keywords,
            # and every request, hits included, builds one.
            RequestRecord(
                label or (ex.upstream_name if ex.upstream_name in self.upstreams else "unknown"),
                ex.method,
                ex.request.method,
                499 if response is None or ex.disconnected else response.status,  # 499: the caller went away
                ex.error_code,
                ex.cache,
                ex.cache_status(),
                ended - started,
                ex.lookup,
                ended,
                ex.upstream_seconds,
            )
        )

    async def close_streams(self) -> None:
        """See :meth:`Forwarder.close_streams`."""
        await self.forwarder.close_streams()

    def update_size_gauges(self) -> None:
        """The cache size gauges, after the store changed outside a request (a purge)."""
        self.forwarder.update_size_gauges()
