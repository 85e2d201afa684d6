"""The route ``/servers/{name}/mcp``: its steps of the pipeline (:mod:`.pipeline`), the cache, and the
answers made from cache entries.

After the pipeline's checks, a request names its upstream (404 if none), then either bypasses the
cache (forwarded as it came) or is looked up under its key: a fresh entry answers here; a miss
goes through the read-through (:class:`~gateway.cache.ReadThrough`: coalescing, the shared tier,
stale-if-error), whose fetch is the forwarder's (:mod:`.forward`).

This module is the plain path, written to be read. ``gateway.proxy.hot`` answers the commonest
cache hits in one step, with a leaner response object, and must answer and record byte for byte
as this module and the pipeline do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from aiohttp import hdrs, web
from multidict import CIMultiDict

from ..auth import SessionSource
from ..cache import Answer, Cached, CacheEntry, CacheKey, CacheLookup, Lead, ReadThrough, make_key
from ..cache.private import PrivateAnswers
from ..cache.readthrough import COALESCED, HIT, SHARED
from ..codec import dumps, id_json
from ..config import GatewayConfig
from ..errors import GatewayError, NotFound
from ..policy import LIST_ITEMS, Kind, ListViews, filter_result
from ..protocol import ParsedRequest, method_label
from ..telemetry import GatewayMetrics
from ..upstream import Upstream
from .exchange import LARGE_BODY_BYTES, Exchange, Forwarded, hit_status, stale_status
from .forward import Forwarder
from .pipeline import Pipeline
from .writing import CallerWriter, PiecesResponse, QueueBudget

__all__ = ["LegacyStreams", "Proxy"]


class Proxy:
    """The route of every configured upstream, a :class:`~.pipeline.Route`: ``POST`` here, the
    legacy ``GET``/``DELETE`` streams in :attr:`streams`.

    ``upstreams`` is filled by the app once its client session exists; ``readthrough`` holds the
    cache (``readthrough.store``) and the shared tier behind it. ``on_success(upstream,
    protocol_version)`` hears every modern request an upstream answered with a result.
    ``previous``: the proxy of the config before a reload, whose caller writer, journal and
    relayed streams this one shares; ``session`` gives the app's client session (for the
    identity provider, :class:`~gateway.auth.Authenticator`).
    """

    reads_body = True

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Mapping[str, Upstream],
        readthrough: ReadThrough,
        metrics: GatewayMetrics,
        on_success: Callable[[str, str], None] | None = None,
        *,
        previous: Proxy | None = None,
        session: SessionSource | None = None,
    ) -> None:
        self.upstreams = upstreams
        self.readthrough = readthrough
        self.store = readthrough.store
        self.clock = readthrough.clock
        if previous is None:
            writer = CallerWriter(
                config.listener.write_timeout_s,
                QueueBudget(config.listener.max_queued_bytes),
                lambda reason: metrics.callers_dropped.labels(reason).inc(),
            )
            self.pipeline = Pipeline(config, metrics, writer, session=session)
        else:  # the listener's (not reloaded): one queue budget and one journal for the app
            writer = previous.pipeline.writer
            self.pipeline = Pipeline(config, metrics, writer, previous.pipeline.journal, session=session)
        self.forwarder: Forwarder = Forwarder(
            config, readthrough, metrics, writer, on_success, previous=None if previous is None else previous.forwarder
        )
        self.streams = LegacyStreams(self)
        #: With ``[[policy.rules]]``: the lists each set of rights sees (:mod:`gateway.policy.views`).
        self.views = ListViews()
        self.caching = config.cache.max_entries > 0
        #: Per upstream: (vary the cache key on clientCapabilities, forward Authorization).
        self.key_options = {
            name: (config.vary_on_capabilities(name), up.forward_authorization) for name, up in config.upstreams.items()
        }

    # -- entry points -------------------------------------------------------------------------

    async def handle_post(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        """``POST /servers/{name}/mcp``. ``upstream_name`` is bound by a configured upstream's
        own route; ``None`` takes ``name`` from the path (the route for names not configured)."""
        name = request.match_info["name"] if upstream_name is None else upstream_name
        return await self.pipeline.serve(self, request, name)

    async def handle_stream(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        """``GET``/``DELETE /servers/{name}/mcp`` (``upstream_name`` as for :meth:`handle_post`)."""
        name = request.match_info["name"] if upstream_name is None else upstream_name
        return await self.pipeline.serve(self.streams, request, name)

    # -- the route's steps --------------------------------------------------------------------

    def admit(self, ex: Exchange) -> None:
        """Nothing to check before the body on this route."""

    def resolve(self, ex: Exchange, request_id: object) -> None:
        """``ex.upstream``, the upstream the path names. Raises :class:`NotFound` (HTTP 404, -32601)."""
        upstream = self.upstreams.get(ex.upstream_name)
        # An upstream no rule allows is an unknown upstream to this caller, whatever it asks.
        hidden = upstream is not None and ex.rights is not None and not ex.rights.allows_upstream(ex.upstream_name)
        if hidden:
            self.pipeline.hidden(ex, ex.upstream_name)
        if upstream is None or hidden:
            raise NotFound(
                f"no upstream named {ex.upstream_name!r} behind this gateway",
                request_id=request_id,
                data={"upstream": ex.upstream_name},
            )
        ex.upstream = upstream

    def authorize(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """A call, get, read or completion of something no rule allows the caller is refused
        (:meth:`Pipeline.denied`), never forwarded."""
        assert parsed is not None and ex.rights is not None
        used = uses(parsed)
        if used is not None and not ex.rights.allows(used[0], ex.upstream_name, used[1]):
            raise self.pipeline.denied(ex, used[0], ex.upstream_name, used[1], parsed.request_id)

    def label(self, ex: Exchange) -> str:
        """The upstream's name, ``unknown`` for names not configured."""
        return ex.upstream_name if ex.upstream_name in self.upstreams else "unknown"

    def look_up(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse | None:
        """The answer from a fresh entry, if there is one (``ex.key`` set when the request is
        cacheable; else ``ex.detail`` says why not)."""
        assert parsed is not None and ex.upstream is not None
        key, bypass = self.key(ex.upstream, parsed, ex.request)
        if key is None:
            # Counted as a bypass unless the key could not be written (the cache was asked).
            ex.lookup = CacheLookup.BYPASS if parsed.cache_bypass is not None or not self.caching else None
            ex.detail = bypass
            return None
        ex.key = key
        entry = self.store.get(key)
        if entry is None and self.forwarder.private is not None and ex.caller.context:
            # private_per_identity: this caller's own answer (gateway.cache.private)
            entry = self.store.get(PrivateAnswers.key(key, ex.caller.context))
        return None if entry is None else self.hit(ex, entry)

    async def answer(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse:
        """Not in the local tier: the read-through (:meth:`miss`), or the upstream for a request
        that bypasses the cache."""
        if ex.key is None:
            if ex.rights is not None and ex.method in LIST_ITEMS:  # a list the caller sees filtered
                return await self.filtered_forward(ex, Forwarded.BYPASS)
            return await self.forwarder.forward(ex, Forwarded.BYPASS)
        return await self.miss(ex, ex.key)

    def key(
        self, upstream: Upstream, parsed: ParsedRequest, request: web.Request
    ) -> tuple[CacheKey | None, str | None]:
        """The cache key of ``parsed`` on ``upstream``'s route, or ``None`` and why the cache is
        bypassed (``uncacheable``, ``disabled``, or the request's own reason:
        :attr:`~gateway.protocol.ParsedRequest.cache_bypass`). ``POST /mcp`` looks its parts up
        under these keys too."""
        bypass = parsed.cache_bypass
        if bypass is None and not self.caching:
            bypass = "disabled"  # max_entries = 0: nothing is looked up, stored or coalesced
        if bypass is not None:
            return None, bypass
        vary, forward_authorization = self.key_options[upstream.name]
        # "" for no header: a caller without credentials is a context of its own.
        authorization = request.headers.get(hdrs.AUTHORIZATION, "") if forward_authorization else None
        try:
            return make_key(upstream.name, parsed, vary, authorization), None
        except ValueError:  # a number JSON cannot write back: forwarded, not cached
            return None, "uncacheable"

    async def miss(self, ex: Exchange, key: CacheKey) -> web.StreamResponse:
        """Not in the local tier: the read-through, with the forwarder's relay as its fetch."""
        assert ex.upstream is not None
        # A list for a caller whose rights filter it is read whole: the shared entry is stored as
        # it came, the caller is sent its view.
        filtered = ex.rights is not None and key.method in LIST_ITEMS
        try:
            got = await self.readthrough.read(
                key,
                functools.partial(self.filtered_miss if filtered else self.forwarder.miss, ex),
                timeout_s=ex.upstream.config.timeout_s,
                request_id=ex.request_id,
            )
        except GatewayError:
            if ex.lookup is None:  # the leader's failure, answered by a follower
                ex.lookup = CacheLookup.MISS
                ex.detail = "upstream-error"
            raise
        if isinstance(got, Cached):
            if got.stale:
                return self.stale(ex, got.entry, collapsed=got.collapsed)
            return self.hit(ex, got.entry, collapsed=got.collapsed, shared=got.shared)
        return got

    # -- answers from entries -----------------------------------------------------------------

    def hit(
        self, ex: Exchange, entry: CacheEntry, *, collapsed: bool = False, shared: bool = False
    ) -> web.StreamResponse:
        """Answer from ``entry``: the caller's id, ``ttlMs`` lowered to what is left. A hit in
        the last part of the entry's lifetime (refresh-ahead: ``entry.refresh_at``) starts its
        background refresh (:meth:`Forwarder.refresh`). A large entry (over
        :data:`LARGE_BODY_BYTES`) answers with its stored bytes, not a copy (:meth:`large_answer`)."""
        ex.lookup = COALESCED if collapsed else SHARED if shared else HIT
        if ex.rights is not None and ex.upstream is not None:  # the caller's view of a list
            entry = self.views.view(entry, ex.method, ex.upstream.name, ex.rights)
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

    def stale(self, ex: Exchange, entry: CacheEntry, *, collapsed: bool) -> web.StreamResponse:
        """Answer from the expired ``entry`` (stale-if-error): the caller's id, ``ttlMs`` 0 and
        ``Cache-Status: mcp-gateway; hit; ttl=-S``, S the whole seconds past expiry."""
        ex.lookup = CacheLookup.STALE
        if ex.rights is not None and ex.upstream is not None:
            entry = self.views.view(entry, ex.method, ex.upstream.name, ex.rights)
        if entry.size > LARGE_BODY_BYTES:
            pieces, past_s = entry.stale_pieces(id_json(ex.request_id), self.clock())
            ex.hit = stale_status(past_s, collapsed)
            return self.large_answer(ex, pieces)
        body, past_s = entry.stale(id_json(ex.request_id), self.clock())
        ex.hit = stale_status(past_s, collapsed)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.hit})

    async def filtered_miss(self, ex: Exchange, lead: Lead) -> web.StreamResponse:
        """The read-through's fetch of a list for a caller whose rights filter it
        (:meth:`filtered_forward`), its whole answer kept as any miss's."""
        ex.lookup = CacheLookup.MISS
        ex.lead = lead
        return await self.filtered_forward(ex, Forwarded.MISS)

    async def filtered_forward(self, ex: Exchange, fwd: Forwarded) -> web.StreamResponse:
        """A list for a caller whose rights filter it, sent upstream (``fwd``: why): the whole
        answer read (JSON or SSE; kept when the request is a miss, ``ex.lead``), and the caller
        sent the items it may see, ``cacheScope`` ``private`` (:func:`~gateway.policy.filter_result`).
        A JSON-RPC error is relayed as it came.

        Raises:
            Overloaded, BadGateway, GatewayTimeout: as :meth:`Forwarder.fetch`.
        """
        upstream, parsed = ex.upstream, ex.parsed
        assert upstream is not None and parsed is not None and ex.body is not None and ex.rights is not None
        ex.fwd = fwd
        try:
            headers = self.forwarder.request_headers(ex.request, upstream, ex.mcp_name)
            status, message, size = await self.forwarder.fetch(upstream, ex.body, headers, parsed.request_id, ex.method)
        except GatewayError as err:
            if err.request_id is None:
                err.request_id = parsed.request_id
            ex.detail = "upstream-error"
            raise
        ex.fwd_status = status
        self.forwarder.answered(ex, upstream, status, message)
        self.forwarder.keep(ex, status, message, size)
        rights, name = ex.rights, upstream.name
        result = message.get("result") if isinstance(message, dict) else None
        if isinstance(result, dict):
            filtered = filter_result(result, ex.method, lambda kind, item: rights.allows(kind, name, item), own=_same)
            message = {**message, "result": filtered}
        body = dumps(message)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(
            body=body, status=status, headers={"Content-Type": "application/json", "Cache-Status": ex.cache_status()}
        )

    @staticmethod
    def large_answer(ex: Exchange, pieces: tuple[bytes | memoryview, ...]) -> PiecesResponse:
        """The JSON answer made of ``pieces`` (``ex.hit`` its ``Cache-Status``), to be written
        by :meth:`Pipeline.send`."""
        ex.large = True
        assert ex.hit is not None
        return PiecesResponse(pieces, headers=CIMultiDict({"Content-Type": "application/json", "Cache-Status": ex.hit}))

    # -- for POST /mcp --------------------------------------------------------------------------

    async def serve_member(self, ex: Exchange) -> web.StreamResponse:
        """``ex`` (parsed, its upstream named) answered as on the upstream's own route, past the
        pipeline's checks, which the caller's route has made."""
        self.resolve(ex, ex.request_id)
        response = self.look_up(ex, ex.parsed)
        return await self.answer(ex, ex.parsed) if response is None else response

    async def fetch(
        self, upstream: Upstream, parsed: ParsedRequest, body: bytes, request: web.Request, mcp_name: str | None
    ) -> Answer:
        """``upstream``'s whole answer to ``body`` (``parsed``), sent with ``request``'s headers
        and, when given, ``mcp_name`` as its ``Mcp-Name`` (:meth:`Forwarder.fetch`)."""
        headers = self.forwarder.request_headers(request, upstream, mcp_name)
        return await self.forwarder.fetch(upstream, body, headers, parsed.request_id, method_label(parsed.method))

    async def close_streams(self) -> None:
        """See :meth:`Forwarder.close_streams`."""
        await self.forwarder.close_streams()


def uses(parsed: ParsedRequest) -> tuple[Kind, str] | None:
    """What ``parsed`` uses that a rule must allow: ``("tools", name)`` for ``tools/call``,
    ``("prompts", name)`` for ``prompts/get`` and a prompt's ``completion/complete``,
    ``("resources", uri)`` for ``resources/read``, a legacy ``resources/subscribe`` or
    ``unsubscribe`` and a resource template's completion; ``None``
    for other methods. A name that is not a string is ``""`` (no glob allows it: refused as
    unknown)."""
    method, params = parsed.method, parsed.params or {}
    if method == "tools/call":
        kind: Kind = "tools"
        value = params.get("name")
    elif method == "prompts/get":
        kind, value = "prompts", params.get("name")
    elif method in ("resources/read", "resources/subscribe", "resources/unsubscribe"):
        kind, value = "resources", params.get("uri")
    elif method == "completion/complete":
        ref = params.get("ref")
        ref = ref if isinstance(ref, dict) else {}
        if ref.get("type") == "ref/resource":
            kind, value = "resources", ref.get("uri")
        else:
            kind, value = "prompts", ref.get("name")
    else:
        return None
    return kind, value if type(value) is str else ""


def _same(name: str) -> str:
    return name


class LegacyStreams:
    """``GET``/``DELETE /servers/{name}/mcp``, a :class:`~.pipeline.Route`: legacy-era traffic
    (the SSE stream a 2025-11-25 client opens, the session it ends) passed through uncached."""

    reads_body = False

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.resolve = proxy.resolve
        self.label = proxy.label

    def admit(self, ex: Exchange) -> None:
        """No body is read."""

    def authorize(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """No body names anything: the upstream is allowed (:meth:`Proxy.resolve`)."""

    def look_up(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """Nothing of it is cached."""

    async def answer(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse:
        ex.detail = "legacy"
        return await self.proxy.forwarder.forward(ex, Forwarded.BYPASS)
