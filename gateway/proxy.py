"""The aiohttp handlers for ``/servers/{name}/mcp``: validate, look up, forward, store, respond.

Order on every POST (digest §12): Origin check, then the request is read and parsed, then
caller authentication (before the cache, even for ``public`` entries, gotcha 11), then
header/body validation, then the cache or the upstream. The request body is forwarded byte
for byte; responses stream back as they arrive. Every response carries an RFC 9211
``Cache-Status`` header naming this cache ``mcp-gateway``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Final, Generic, TypeVar

import aiohttp
import orjson
from aiohttp import hdrs, web
from multidict import CIMultiDict, istr

from .accesslog import ACCESS_LOGGER
from .auth import bearer_matches
from .cache import STORED, CacheEntry, CacheKey, CacheStore, Clock, Coalescer, build_entry, make_key, store_outcome
from .codec import id_json, loads, loads_relayed
from .config import GatewayConfig
from .errors import BadGateway, Forbidden, GatewayError, NotFound, Overloaded, PayloadTooLarge, Unauthorized
from .journal import RequestJournal
from .metrics import GatewayMetrics
from .protocol import KNOWN_METHODS, ParsedRequest, parse_request, response_id_matches
from .sse import SSEParser
from .upstream import RESPONSE_HEADERS, Upstream

__all__ = ["CACHE_NAME", "Proxy"]

CACHE_NAME: Final = "mcp-gateway"
access_log = logging.getLogger(ACCESS_LOGGER)


class _Outcome:
    """What one MCP request ended as, for metrics and the access log.

    ``cache`` is the ``cache`` label of the duration histogram (hit, miss, bypass); ``lookup``
    the cache lookup result (hit, miss, coalesced, bypass; ``None`` if the cache was not
    asked); ``cache_status`` the ``Cache-Status`` value answered (or to answer); ``entry`` the
    cache entry stored from this request's upstream answer, if any; ``upstream_seconds`` the
    time the upstream took (seconds), if it was asked. The defaults are class
    attributes: one is built per request, and a cache hit sets three fields.
    """

    method: str = "other"
    cache: str = "bypass"
    lookup: str | None = None
    error_code: int | None = None
    cache_status: str | None = None
    entry: CacheEntry | None = None
    disconnected: bool = False
    upstream_seconds: float | None = None

    def __init__(self, upstream: str, method: str = "other") -> None:
        self.upstream = upstream
        if method != "other":
            self.method = method


def _final_response(events: list[bytes], request_id: object) -> tuple[dict[str, object] | None, int]:
    """The JSON-RPC response to ``request_id`` among SSE ``events``, with its size in bytes."""
    for data in events:
        try:
            message = loads(data)
        except ValueError:
            continue
        if response_id_matches(message, request_id):
            return message, len(data)
    return None, 0


def _status(*params: str) -> str:
    return "; ".join((CACHE_NAME, *params))


_HIT: Final = _status("hit", "ttl=")
_dumps: Final = orjson.dumps
_CACHE_STATUS: Final = istr("Cache-Status")
#: Copied for each hit (cheaper than building the headers from a dict).
_JSON_HEADERS: Final = CIMultiDict({"Content-Type": "application/json"})
_Child = TypeVar("_Child")


class _Children(dict[tuple[str, ...], _Child], Generic[_Child]):
    """A metric's label children by label values, each bound once (``labels()`` costs more
    than the update itself). Children appear in ``/metrics`` when first used, as before."""

    def __init__(self, labels: Callable[..., _Child]) -> None:
        super().__init__()
        self._labels = labels

    def __missing__(self, key: tuple[str, ...]) -> _Child:
        child = self[key] = self._labels(*key)
        return child


class _CachedResponse(web.Response):
    """A ``200 OK`` of ready bytes with ready headers: what ``web.Response(body=, headers=)``
    builds, without its argument handling and header copy (a cache hit builds one each).

    It sets the attributes ``web.Response.__init__`` sets; :data:`_LEAN_RESPONSES` checks at
    import that the two agree, for the aiohttp installed, and the hit path uses
    ``web.Response`` when they do not.
    """

    __slots__ = ()

    def __init__(self, body: bytes, headers: CIMultiDict[str]) -> None:
        self._state = {}
        self._headers = headers
        self._status = 200
        self._reason = "OK"
        self._body = body
        self._compressed_body = None
        self._zlib_executor_size = _ZLIB_EXECUTOR_SIZE
        self._zlib_executor = None


_ZLIB_EXECUTOR_SIZE: Final = web.Response()._zlib_executor_size  # aiohttp's default


def _same_as_aiohttp() -> bool:
    """Whether :class:`_CachedResponse` builds exactly what ``web.Response`` builds."""
    headers = CIMultiDict({"Content-Type": "application/json", "Cache-Status": "x"})
    try:
        lean, real = vars(_CachedResponse(b"{}", headers.copy())), vars(web.Response(body=b"{}", headers=headers))
    except Exception:
        return False
    return lean == real


#: Whether cache hits are answered with :class:`_CachedResponse`.
_LEAN_RESPONSES: Final = _same_as_aiohttp()


def _not_found(name: str, request_id: object) -> NotFound:
    return NotFound(f"no upstream named {name!r} behind this gateway", request_id=request_id, data={"upstream": name})


class Proxy:
    """Serves the MCP routes for every configured upstream (DESIGN.md "HTTP surface")."""

    def __init__(
        self,
        config: GatewayConfig,
        upstreams: Mapping[str, Upstream],
        store: CacheStore,
        metrics: GatewayMetrics,
        clock: Clock,
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.store = store
        self.coalescer = Coalescer()
        self.metrics = metrics
        self.clock = clock
        self._tokens = tuple(t.encode() for t in config.auth.tokens) if config.auth else ()
        self._origins = frozenset(config.listener.allowed_origins)
        #: Per upstream: (vary the cache key on clientCapabilities, forward Authorization).
        self._key_options = {
            name: (config.vary_on_capabilities(name), up.forward_authorization) for name, up in config.upstreams.items()
        }
        self._caching = config.cache.max_entries > 0
        self._max_body = config.listener.max_body_bytes
        self.journal = RequestJournal(metrics.request_metrics, access_log)
        self._add_record = self.journal.add
        self._stores = _Children(metrics.cache_stores.labels)
        #: Called as ``on_success(upstream, protocol_version)`` after an upstream answered a
        #: modern request with a JSON-RPC result (the registry's "observed" versions).
        self.on_success: Callable[[str, str], None] | None = None
        self._streams: set[aiohttp.ClientResponse] = set()
        self._closing = False

    # -- entry points -------------------------------------------------------------------

    async def handle_post(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        """``POST /servers/{name}/mcp``: ``upstream_name`` is bound by the upstream's own route
        (``None``: ``name`` from the path, the route for names not configured).

        Authentication comes before the upstream lookup, so that callers without a token
        cannot tell configured upstream names from others. The checks and the cache lookup
        are written out here rather than in helpers: this is every cache hit's path.
        """
        started = time.perf_counter()
        outcome = _Outcome(request.match_info["name"] if upstream_name is None else upstream_name)
        response: web.StreamResponse | None = None
        try:
            headers = request.headers
            origin = headers.get(hdrs.ORIGIN)
            if origin is not None and origin not in self._origins:
                raise Forbidden(f"origin {origin!r} is not allowed")
            content = request.content
            if content.is_eof():
                # The whole body has arrived (the usual case for a small POST): take it from
                # the buffer, a fraction of what the read() loop costs.
                body = content.read_nowait()
                if len(body) > self._max_body:
                    raise PayloadTooLarge(f"request body exceeds {self._max_body} bytes")
            else:
                try:
                    body = await request.read()
                except web.HTTPRequestEntityTooLarge as exc:
                    raise PayloadTooLarge(f"request body exceeds {self._max_body} bytes") from exc
            try:
                parsed = parse_request(body, headers)
            except GatewayError as err:
                self._check_auth(request, err.request_id)
                self._upstream(outcome.upstream, err.request_id)
                raise
            method = parsed.method
            outcome.method = method if method in KNOWN_METHODS else "other"  # method_label, inlined
            if self._tokens:
                self._check_auth(request, parsed.request_id)
            upstream = self.upstreams.get(outcome.upstream)
            if upstream is None:
                raise _not_found(outcome.upstream, parsed.request_id)
            bypass = parsed.cache_bypass
            if bypass is None and self._caching:
                try:
                    vary, forward_authorization = self._key_options[upstream.name]
                    # Positional arguments: cheaper to pass, and this is every hit's path.
                    key = make_key(
                        upstream.name,
                        parsed,
                        vary,
                        # "" for no header: a caller without credentials is a context of its own.
                        headers.get(hdrs.AUTHORIZATION, "") if forward_authorization else None,
                    )
                except ValueError:
                    status = _status("fwd=bypass", "detail=uncacheable")
                    response = await self._forward(request, upstream, body, parsed, None, status, outcome)
                else:
                    entry = self.store.get(key)
                    if entry is not None:
                        response = self._hit(parsed, entry, outcome, False)
                    else:
                        response = await self._miss(request, upstream, body, parsed, key, outcome)
            else:
                if bypass is None:
                    bypass = "disabled"  # max_entries = 0: nothing is looked up, stored or coalesced
                outcome.cache = outcome.lookup = "bypass"
                status = _status("fwd=bypass", f"detail={bypass}")
                response = await self._forward(request, upstream, body, parsed, None, status, outcome)
        except GatewayError as err:
            response = self._error_response(err, outcome)
        except web.HTTPException:
            raise
        except Exception:
            response = self._internal_error(request, outcome)
        finally:
            self._observe(request, outcome, response, started)
        return response

    async def handle_stream(self, request: web.Request, upstream_name: str | None = None) -> web.StreamResponse:
        """``GET``/``DELETE /servers/{name}/mcp``: legacy-era traffic passed through
        (``upstream_name`` as for :meth:`handle_post`)."""
        started = time.perf_counter()
        outcome = _Outcome(
            request.match_info["name"] if upstream_name is None else upstream_name, method=request.method
        )
        response: web.StreamResponse | None = None
        try:
            self._check_origin(request)
            self._check_auth(request, None)
            upstream = self._upstream(outcome.upstream)
            outcome.cache_status = status = _status("fwd=bypass", "detail=legacy")
            response = await self._forward(request, upstream, None, None, None, status, outcome)
        except GatewayError as err:
            response = self._error_response(err, outcome)
        except web.HTTPException:
            raise
        except Exception:
            response = self._internal_error(request, outcome)
        finally:
            self._observe(request, outcome, response, started)
        return response

    # -- the POST path: cache misses and hits -------------------------------------------

    async def _miss(
        self,
        request: web.Request,
        upstream: Upstream,
        body: bytes,
        parsed: ParsedRequest,
        key: CacheKey,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        """Not in the cache: wait for the same request already on its way upstream, or send it."""
        waiter = self.coalescer.claim(key)
        if waiter is not None:
            entry = await asyncio.shield(waiter)
            if entry is not None:
                return self._hit(parsed, entry, outcome, True)
            # Not storable (private, error, ...): this caller's answer is its own.
            outcome.cache = outcome.lookup = "miss"
            return await self._forward(request, upstream, body, parsed, key, _status("fwd=miss"), outcome)
        outcome.cache = outcome.lookup = "miss"
        try:
            return await self._forward(request, upstream, body, parsed, key, _status("fwd=miss"), outcome)
        finally:
            self.coalescer.release(key, outcome.entry)

    def _hit(self, parsed: ParsedRequest, entry: CacheEntry, outcome: _Outcome, collapsed: bool) -> web.Response:
        """Answer from ``entry``: the caller's id, ``ttlMs`` lowered to what is left."""
        outcome.cache = "hit"
        outcome.lookup = "coalesced" if collapsed else "hit"
        try:
            id_text = _dumps(parsed.request_id)  # id_json, inlined
        except TypeError:
            id_text = id_json(parsed.request_id)
        body, ttl_ms = entry.hit(id_text, self.clock())
        status = f"{_HIT}{ttl_ms // 1000}; collapsed" if collapsed else f"{_HIT}{ttl_ms // 1000}"
        outcome.cache_status = status
        headers = _JSON_HEADERS.copy()
        headers[_CACHE_STATUS] = status
        if _LEAN_RESPONSES:
            return _CachedResponse(body, headers)
        return web.Response(body=body, headers=headers)

    # -- checks -------------------------------------------------------------------------

    def _upstream(self, name: str, request_id: object = None) -> Upstream:
        upstream = self.upstreams.get(name)
        if upstream is None:
            raise _not_found(name, request_id)
        return upstream

    async def close_streams(self) -> None:
        """End every SSE answer being relayed (the app's ``on_shutdown``): each caller gets a
        clean end of stream with a JSON-RPC error (-32603) instead of waiting out the
        shutdown timeout; a listen stream's client then re-subscribes elsewhere."""
        self._closing = True
        for resp in list(self._streams):
            resp.close()

    def _check_origin(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self._origins:
            raise Forbidden(f"origin {origin!r} is not allowed")

    def _check_auth(self, request: web.Request, request_id: object) -> None:
        if not self._tokens:
            return
        if not bearer_matches(request.headers.get(hdrs.AUTHORIZATION), self._tokens):
            raise Unauthorized(request_id=request_id)

    # -- forwarding ---------------------------------------------------------------------

    async def _forward(
        self,
        request: web.Request,
        upstream: Upstream,
        body: bytes | None,
        parsed: ParsedRequest | None,
        key: CacheKey | None,
        cache_status: str,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        """Send the request upstream and relay the answer; store it when ``key`` is set
        and the answer is storable (the entry is left in ``outcome.entry``)."""
        if upstream.inflight >= upstream.config.max_inflight:
            raise Overloaded(
                f"upstream {upstream.name} has {upstream.inflight} requests in flight; retry later",
                request_id=parsed.request_id if parsed else None,
                headers={"Retry-After": "1"},
            )
        outcome.cache_status = cache_status
        try:
            headers = upstream.request_headers(request.headers, allow_authorization=not self._tokens)
        except GatewayError as err:
            err.request_id = parsed.request_id if parsed else None
            raise
        upstream.inflight += 1  # mcp_gateway_inflight_requests reads it
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            async with upstream.open(request.method, body, headers) as resp:
                if resp.content_type == "text/event-stream":
                    self._streams.add(resp)
                    try:
                        return await self._relay_stream(request, upstream, resp, parsed, key, cache_status, outcome)
                    finally:
                        self._streams.discard(resp)
                data = await upstream.read_body(resp, loop.time() + upstream.config.timeout_s)
                return self._relay_body(upstream, resp, data, parsed, key, cache_status, outcome)
        except GatewayError as err:
            if parsed is not None and err.request_id is None:
                err.request_id = parsed.request_id
            # One detail only: the failure replaces the bypass reason.
            outcome.cache_status = cache_status.split("; detail=")[0] + "; detail=upstream-error"
            raise
        finally:
            upstream.inflight -= 1
            outcome.upstream_seconds = time.perf_counter() - started

    def _passthrough_headers(self, resp: aiohttp.ClientResponse, cache_status: str) -> CIMultiDict[str]:
        out: CIMultiDict[str] = CIMultiDict()
        for name in RESPONSE_HEADERS:
            for value in resp.headers.getall(name, ()):
                out.add(name, value)
        out["Cache-Status"] = cache_status
        return out

    def _relay_body(
        self,
        upstream: Upstream,
        resp: aiohttp.ClientResponse,
        data: bytes,
        parsed: ParsedRequest | None,
        key: CacheKey | None,
        cache_status: str,
        outcome: _Outcome,
    ) -> web.Response:
        status = resp.status
        message: object = None
        expects_response = parsed is not None and parsed.kind == "request"
        if expects_response and (200 <= status < 300 or status >= 500):
            assert parsed is not None
            try:
                # Only an answer to store is parsed exactly; a relayed one for its envelope.
                message = loads(data) if key is not None else loads_relayed(data, parsed.request_id)
            except ValueError:
                message = None
            if not response_id_matches(message, parsed.request_id):
                raise BadGateway(
                    f"upstream {upstream.name} answered HTTP {status} without a JSON-RPC response to this request"
                )
        if isinstance(message, dict) and isinstance(message.get("error"), dict):
            code = message["error"].get("code")
            outcome.error_code = code if type(code) is int else None  # not a bool
        elif status == 200 and message is not None:
            self._succeeded(upstream, parsed)
        if key is not None:
            cache_status = self._maybe_store(upstream, key, status, message, len(data), cache_status, outcome)
        headers = self._passthrough_headers(resp, cache_status)
        outcome.cache_status = cache_status
        return web.Response(body=data, status=status, headers=headers)

    def _maybe_store(
        self,
        upstream: Upstream,
        key: CacheKey,
        status: int,
        message: object,
        size: int,
        cache_status: str,
        outcome: _Outcome,
    ) -> str:
        """Store a cacheable answer of ``size`` bytes if allowed; returns the Cache-Status."""
        result = store_outcome(status, message, size, self.config.cache.max_entry_bytes)
        entry: CacheEntry | None = None
        if result == STORED:
            assert isinstance(message, dict)
            entry = build_entry(message, self.clock(), self.config.cache.max_ttl_ms)
            if entry is None or not self.store.put(key, entry):
                result, entry = "refused", None
        self._stores[upstream.name, outcome.method, result].inc()
        self._update_size_gauges()
        fwd = f"{cache_status}; fwd-status={status}"
        if entry is not None:
            outcome.entry = entry
            return f"{fwd}; stored; ttl={entry.ttl_ms // 1000}"
        return f"{fwd}; detail={result.replace('_', '-')}"

    def _succeeded(self, upstream: Upstream, parsed: ParsedRequest | None) -> None:
        if self.on_success is not None and parsed is not None and parsed.era == "modern" and parsed.version:
            self.on_success(upstream.name, parsed.version)

    def _update_size_gauges(self) -> None:
        self.metrics.cache_entries.set(len(self.store))
        self.metrics.cache_bytes.set(self.store.total_bytes)

    async def _relay_stream(
        self,
        request: web.Request,
        upstream: Upstream,
        resp: aiohttp.ClientResponse,
        parsed: ParsedRequest | None,
        key: CacheKey | None,
        cache_status: str,
        outcome: _Outcome,
    ) -> web.StreamResponse:
        """Relay an SSE answer chunk by chunk (no buffering, gotcha 5). For a cacheable
        request the final JSON-RPC response in it is stored (gotcha 12). If the upstream
        stream ends without a response to the request, a JSON-RPC error event ends it."""
        headers = self._passthrough_headers(resp, f"{cache_status}; fwd-status={resp.status}")
        headers["X-Accel-Buffering"] = "no"
        headers["Cache-Control"] = "no-cache"
        out = web.StreamResponse(status=resp.status, headers=headers)
        await out.prepare(request)
        request_id = parsed.request_id if parsed is not None and parsed.kind == "request" else None
        parser = SSEParser(upstream.config.max_response_bytes) if request_id is not None else None
        final: dict[str, object] | None = None
        final_size = 0
        try:
            async for chunk in upstream.iter_stream(resp):
                await out.write(chunk)
                if parser is not None and final is None:
                    final, final_size = _final_response(parser.feed(chunk), request_id)
            if parser is not None and final is None:
                final, final_size = _final_response(parser.finish(), request_id)
            if parser is not None and final is None:
                # The upstream stopped without answering. End whatever event it left
                # unfinished, as the caller's parser will see it, so that an error event
                # after it is read on its own. Should that complete the answer after all,
                # the caller has it (but it is not stored: the stream was cut).
                await out.write(b"\n\n")
                cut_answer, _ = _final_response(parser.feed(b"\n\n"), request_id)
                if cut_answer is None:
                    outcome.error_code = BadGateway.code
                    reason = "the gateway is shutting down" if self._closing else "ended the stream before answering"
                    error = BadGateway(f"upstream {upstream.name}: {reason}", request_id=request_id)
                    await out.write(b"event: message\ndata: " + error.body() + b"\n\n")
        except ConnectionResetError:
            # The caller went away: that is the cancellation (gotcha 6); closing our side
            # of the upstream request (on return) propagates it. Nothing is stored.
            outcome.disconnected = True
            return out
        if final is not None and isinstance(error_obj := final.get("error"), dict):
            code = error_obj.get("code")
            outcome.error_code = code if type(code) is int else None  # not a bool
        elif final is not None and resp.status == 200:
            self._succeeded(upstream, parsed)
        if key is not None:
            if final is not None:
                self._maybe_store(upstream, key, resp.status, final, final_size, cache_status, outcome)
            else:
                self._stores[upstream.name, outcome.method, "stream_broken"].inc()
        await out.write_eof()
        return out

    # -- answers and bookkeeping ----------------------------------------------------------

    def _error_response(self, err: GatewayError, outcome: _Outcome) -> web.Response:
        outcome.error_code = err.code
        if outcome.cache_status is None:
            outcome.cache_status = _status("detail=rejected")
        headers = {"Content-Type": "application/json", "Cache-Status": outcome.cache_status, **err.headers}
        return web.Response(body=err.body(), status=err.status, headers=headers)

    def _internal_error(self, request: web.Request, outcome: _Outcome) -> web.Response:
        """A bug, not a protocol error: logged with its traceback, answered as a JSON-RPC
        internal error (HTTP 500) and counted, without the traceback reaching the caller."""
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return self._error_response(GatewayError("Internal error in the gateway"), outcome)

    def _observe(
        self, request: web.Request, outcome: _Outcome, response: web.StreamResponse | None, started: float
    ) -> None:
        ended = time.perf_counter()
        upstream = outcome.upstream if outcome.upstream in self.upstreams else "unknown"
        # A request record (gateway.records, items in order): metrics and the access log get
        # it in a batch through the journal.
        self._add_record(
            (
                upstream,
                outcome.method,
                request.method,
                response.status if response is not None else 499,
                outcome.error_code,
                outcome.cache,
                outcome.cache_status,
                ended - started,
                outcome.lookup,
                ended,
                outcome.upstream_seconds,
            )
        )
