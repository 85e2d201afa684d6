"""The aiohttp handlers for ``/servers/{name}/mcp``: validate, look up, forward, store, respond.

Order on every POST (digest §12): Origin check, then the request is read and parsed, then
caller authentication (before the cache, even for ``public`` entries, gotcha 11), then
header/body validation, then the cache or the upstream. The request body is forwarded byte
for byte; responses stream back as they arrive. Every response carries an RFC 9211
``Cache-Status`` header naming this cache ``mcp-gateway``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from .cache import STORED, CacheEntry, CacheKey, CacheStore, Clock, Coalescer, build_entry, make_key, store_outcome
from .config import GatewayConfig
from .metrics import GatewayMetrics
from .protocol import (
    BadGateway,
    GatewayError,
    ParsedRequest,
    SSEParser,
    dumps,
    loads,
    method_label,
    parse_request,
    response_id_matches,
)
from .upstream import RESPONSE_HEADERS, Upstream

__all__ = ["CACHE_NAME", "Forbidden", "NotFound", "Overloaded", "PayloadTooLarge", "Proxy", "Unauthorized"]

CACHE_NAME: Final = "mcp-gateway"
access_log = logging.getLogger("mcp_gateway.access")


class NotFound(GatewayError):
    """No upstream of that name (HTTP 404 with -32601, which dual-era clients read as modern)."""

    code = -32601
    status = 404


class Unauthorized(GatewayError):
    """Missing or wrong bearer token for the gateway (HTTP 401, ``WWW-Authenticate: Bearer``)."""

    code = -32600
    status = 401


class Forbidden(GatewayError):
    """An ``Origin`` that is present and not allowed (HTTP 403, streamable-http Security)."""

    code = -32600
    status = 403


class PayloadTooLarge(GatewayError):
    """Request body over ``listener.max_body_bytes`` (HTTP 413)."""

    code = -32600
    status = 413


class Overloaded(GatewayError):
    """Too many requests in flight to one upstream (HTTP 503 with ``Retry-After``)."""

    code = -32603
    status = 503


@dataclass(slots=True)
class _Outcome:
    """What one MCP request ended as, for metrics and the access log."""

    upstream: str
    method: str = "other"
    cache: str = "bypass"
    error_code: int | None = None
    extra: dict[str, object] = field(default_factory=dict)


def _status(*params: str) -> str:
    return "; ".join((CACHE_NAME, *params))


_JSON_HEADERS: Final = {"Content-Type": "application/json"}


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
        self._vary = {name: config.vary_on_capabilities(name) for name in config.upstreams}
        #: Called as ``on_success(upstream, protocol_version)`` after an upstream answered a
        #: modern request with a JSON-RPC result (the registry's "observed" versions).
        self.on_success: Callable[[str, str], None] | None = None

    # -- entry points -------------------------------------------------------------------

    async def handle_post(self, request: web.Request) -> web.StreamResponse:
        """``POST /servers/{name}/mcp``."""
        started = time.perf_counter()
        outcome = _Outcome(request.match_info["name"])
        response: web.StreamResponse | None = None
        try:
            response = await self._post(request, outcome)
        except GatewayError as err:
            response = self._error_response(err, outcome)
        finally:
            self._observe(request, outcome, response, started)
        return response

    async def handle_stream(self, request: web.Request) -> web.StreamResponse:
        """``GET``/``DELETE /servers/{name}/mcp``: legacy-era traffic passed through."""
        started = time.perf_counter()
        outcome = _Outcome(request.match_info["name"], method=request.method, cache="bypass")
        response: web.StreamResponse | None = None
        try:
            upstream = self._upstream(outcome.upstream)
            self._check_origin(request)
            self._check_auth(request, None)
            outcome.extra["cache_status"] = status = _status("fwd=bypass", "detail=legacy")
            response = await self._forward(request, upstream, None, None, None, status, outcome)
        except GatewayError as err:
            response = self._error_response(err, outcome)
        finally:
            self._observe(request, outcome, response, started)
        return response

    # -- the POST path ------------------------------------------------------------------

    async def _post(self, request: web.Request, outcome: _Outcome) -> web.StreamResponse:
        upstream = self._upstream(outcome.upstream)
        self._check_origin(request)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise PayloadTooLarge(f"request body exceeds {self.config.listener.max_body_bytes} bytes") from exc
        try:
            parsed = parse_request(body, request.headers)
        except GatewayError as err:
            self._check_auth(request, err.request_id)
            raise
        outcome.method = method_label(parsed.method)
        self._check_auth(request, parsed.request_id)

        if parsed.cache_bypass is not None:
            outcome.cache = "bypass"
            self.metrics.cache_lookups.labels(upstream.name, outcome.method, "bypass").inc()
            status = _status("fwd=bypass", f"detail={parsed.cache_bypass}")
            return await self._forward(request, upstream, body, parsed, None, status, outcome)

        try:
            key = make_key(upstream.name, parsed, vary_on_capabilities=self._vary[upstream.name])
        except ValueError:
            status = _status("fwd=bypass", "detail=uncacheable")
            return await self._forward(request, upstream, body, parsed, None, status, outcome)
        entry = self.store.get(key)
        if entry is not None:
            return self._hit(parsed, entry, upstream.name, outcome, collapsed=False)
        waiter = self.coalescer.claim(key)
        if waiter is not None:
            entry = await asyncio.shield(waiter)
            if entry is not None:
                return self._hit(parsed, entry, upstream.name, outcome, collapsed=True)
            # Not storable (private, error, ...): this caller's answer is its own.
            outcome.cache = "miss"
            self.metrics.cache_lookups.labels(upstream.name, outcome.method, "miss").inc()
            return await self._forward(request, upstream, body, parsed, key, _status("fwd=miss"), outcome)
        outcome.cache = "miss"
        self.metrics.cache_lookups.labels(upstream.name, outcome.method, "miss").inc()
        stored: CacheEntry | None = None
        try:
            response = await self._forward(request, upstream, body, parsed, key, _status("fwd=miss"), outcome)
            stored = outcome.extra.pop("entry", None)  # type: ignore[assignment]
            return response
        finally:
            self.coalescer.release(key, stored)

    def _hit(
        self, parsed: ParsedRequest, entry: CacheEntry, upstream: str, outcome: _Outcome, *, collapsed: bool
    ) -> web.Response:
        now = self.clock()
        outcome.cache = "hit"
        self.metrics.cache_lookups.labels(upstream, outcome.method, "coalesced" if collapsed else "hit").inc()
        body = entry.response(dumps(parsed.request_id), now)
        ttl_s = entry.remaining_ms(now) // 1000
        status = _status("hit", f"ttl={ttl_s}", "collapsed") if collapsed else _status("hit", f"ttl={ttl_s}")
        outcome.extra["cache_status"] = status
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": status})

    # -- checks -------------------------------------------------------------------------

    def _upstream(self, name: str) -> Upstream:
        upstream = self.upstreams.get(name)
        if upstream is None:
            raise NotFound(f"no upstream named {name!r} behind this gateway", data={"upstream": name})
        return upstream

    def _check_origin(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is not None and origin not in self._origins:
            raise Forbidden(f"origin {origin!r} is not allowed")

    def _check_auth(self, request: web.Request, request_id: object) -> None:
        if not self._tokens:
            return
        header = request.headers.get("Authorization", "")
        scheme, _, presented = header.partition(" ")
        candidate = presented.strip().encode() if scheme.lower() == "bearer" else b""
        ok = False
        for token in self._tokens:  # no early exit: constant time over the configured set
            ok |= hmac.compare_digest(candidate, token)
        if not ok:
            raise Unauthorized(
                "Unauthorized: a valid bearer token is required",
                request_id=request_id,
                headers={"WWW-Authenticate": 'Bearer realm="mcp-gateway"'},
            )

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
        and the answer is storable (the entry is left in ``outcome.extra["entry"]``)."""
        if upstream.inflight >= upstream.config.max_inflight:
            raise Overloaded(
                f"upstream {upstream.name} has {upstream.inflight} requests in flight; retry later",
                request_id=parsed.request_id if parsed else None,
                headers={"Retry-After": "1"},
            )
        outcome.extra["cache_status"] = cache_status
        headers = upstream.request_headers(request.headers, allow_authorization=not self._tokens)
        gauge = self.metrics.inflight.labels(upstream.name)
        upstream.inflight += 1
        gauge.inc()
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            async with upstream.open(request.method, body, headers) as resp:
                if resp.content_type == "text/event-stream":
                    return await self._relay_stream(request, upstream, resp, parsed, key, cache_status, outcome)
                data = await upstream.read_body(resp, loop.time() + upstream.config.timeout_s)
                return self._relay_body(upstream, resp, data, parsed, key, cache_status, outcome)
        except GatewayError as err:
            if parsed is not None and err.request_id is None:
                err.request_id = parsed.request_id
            # One detail only: the failure replaces the bypass reason.
            outcome.extra["cache_status"] = cache_status.split("; detail=")[0] + "; detail=upstream-error"
            raise
        finally:
            upstream.inflight -= 1
            gauge.dec()
            self.metrics.upstream_request_duration.labels(upstream.name, outcome.method).observe(
                time.perf_counter() - started
            )

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
            try:
                message = loads(data)
            except ValueError:
                message = None
            assert parsed is not None
            if not response_id_matches(message, parsed.request_id):
                raise BadGateway(
                    f"upstream {upstream.name} answered HTTP {status} without a JSON-RPC response to this request"
                )
        if isinstance(message, dict) and isinstance(message.get("error"), dict):
            code = message["error"].get("code")
            outcome.error_code = code if isinstance(code, int) else None
        elif status == 200 and message is not None:
            self._succeeded(upstream, parsed)
        if key is not None:
            cache_status = self._maybe_store(upstream, key, status, message, len(data), cache_status, outcome)
        headers = self._passthrough_headers(resp, cache_status)
        outcome.extra["cache_status"] = cache_status
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
        self.metrics.cache_stores.labels(upstream.name, outcome.method, result).inc()
        self._update_size_gauges()
        fwd = f"{cache_status}; fwd-status={status}"
        if entry is not None:
            outcome.extra["entry"] = entry
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
                    for data in parser.feed(chunk):
                        try:
                            message = loads(data)
                        except ValueError:
                            continue
                        if response_id_matches(message, request_id):
                            final, final_size = message, len(data)
                            break
        except ConnectionResetError:
            # The caller went away: that is the cancellation (gotcha 6); closing our side
            # of the upstream request (on return) propagates it. Nothing is stored.
            outcome.extra["disconnected"] = True
            return out
        if request_id is not None and final is None:
            outcome.error_code = BadGateway.code
            error = BadGateway(f"upstream {upstream.name} ended the stream before answering", request_id=request_id)
            await out.write(b"event: message\ndata: " + error.body() + b"\n\n")
        elif final is not None and isinstance(error_obj := final.get("error"), dict):
            code = error_obj.get("code")
            outcome.error_code = code if isinstance(code, int) else None
        elif final is not None and resp.status == 200:
            self._succeeded(upstream, parsed)
        if key is not None:
            if final is not None:
                self._maybe_store(upstream, key, resp.status, final, final_size, cache_status, outcome)
            else:
                self.metrics.cache_stores.labels(upstream.name, outcome.method, "stream_broken").inc()
        await out.write_eof()
        return out

    # -- answers and bookkeeping ----------------------------------------------------------

    def _error_response(self, err: GatewayError, outcome: _Outcome) -> web.Response:
        outcome.error_code = err.code
        cache_status = outcome.extra.get("cache_status")
        if not isinstance(cache_status, str):
            cache_status = _status("detail=rejected")
        outcome.extra["cache_status"] = cache_status
        headers = {"Content-Type": "application/json", "Cache-Status": cache_status, **err.headers}
        return web.Response(body=err.body(), status=err.status, headers=headers)

    def _observe(
        self, request: web.Request, outcome: _Outcome, response: web.StreamResponse | None, started: float
    ) -> None:
        elapsed = time.perf_counter() - started
        status = response.status if response is not None else 499
        upstream = outcome.upstream if outcome.upstream in self.upstreams else "unknown"
        self.metrics.requests.labels(upstream, outcome.method, str(status)).inc()
        self.metrics.request_duration.labels(upstream, outcome.method, outcome.cache).observe(elapsed)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                "request",
                extra={
                    "upstream": upstream,
                    "method": outcome.method,
                    "http_method": request.method,
                    "status": status,
                    "jsonrpc_error": outcome.error_code,
                    "cache": outcome.cache,
                    "cache_status": outcome.extra.get("cache_status"),
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )
