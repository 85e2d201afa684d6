"""``POST /mcp``: the members of ``[aggregate]`` as one MCP server (README, "One endpoint for the
fleet").

Every check of the per-upstream route holds here first, in the same order (Host, Origin, the
body within its bounds, the token before any parse error is told, then the body against its
headers: :mod:`gateway.proxy.handler`), against the names as the caller sent them. Then:

* ``server/discover`` and the four lists are composed from the members' answers, each part
  looked up under the key the member's own route would use (:mod:`.parts`), the missing ones
  fetched concurrently, every page of each member followed up to ``max_member_pages``; the
  aggregate is paged by the gateway (:mod:`.names`) and stored while every part is
  (:class:`~.compose.ComposedEntry`).
* Calls (``tools/call``, ``prompts/get``, ``resources/read``, ``completion/complete``) are the
  member's own requests: the name or URI un-exposed in the body and in ``Mcp-Name``
  (:mod:`.rewrite`), then served by the proxy exactly as on ``/servers/<member>/mcp``.
* ``subscriptions/listen`` is served by the hub (:mod:`.listen`).

``/mcp`` is a modern-only server (MCP 2026-07-28, basic/versioning, 'Backward Compatibility'): a
legacy-era request is refused with -32022 naming the versions it speaks; removed and unknown
methods are -32601 (HTTP 404).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiohttp import hdrs, web

from .. import __version__
from ..cache import CacheKey, build_entry, make_key
from ..codec import dumps
from ..config import GatewayConfig
from ..errors import BadGateway, GatewayError, InvalidParams, NotFound, UnsupportedProtocolVersion
from ..protocol import MODERN_VERSIONS, NAME_FIELD, ParsedRequest, method_label, parse_request
from ..proxy import Proxy
from ..proxy.exchange import LARGE_BODY_BYTES, Exchange, hit_status
from ..proxy.forward import error_code
from ..registry import RegistryState
from .compose import LIST_FIELDS, ComposedEntry, Part, capabilities_union, exposed_items, hints, supported_versions
from .listen import FLAGS, ListenHub
from .names import Names, fingerprint, mint_cursor, read_cursor
from .parts import MemberError, MemberFailed, PartFetcher
from .rewrite import replace_value, with_cursor

__all__ = ["ROUTE", "Aggregate"]

log = logging.getLogger("mcp_gateway.aggregate")

#: The route, and the ``upstream`` label of its requests in the metrics (no upstream is named so).
ROUTE: Final = "/mcp"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
#: How much of a caller's name an error message quotes back.
_QUOTED_CHARS: Final = 80


class _MemberList:
    """What one member gave for one aggregate request: its parts (pages), and whether they are
    all of it (false: it failed, or had more pages than ``max_member_pages``)."""

    __slots__ = ("complete", "parts", "problem")

    def __init__(self, parts: list[Part], complete: bool, problem: str | None = None) -> None:
        self.parts = parts
        self.complete = complete
        self.problem = problem  # why it was left out


class Aggregate:
    """Serves ``POST /mcp`` with ``proxy`` (its checks, cache and upstreams) and the registry's
    ``state`` (which members are legacy-era, which can report list changes)."""

    def __init__(self, config: GatewayConfig, proxy: Proxy, state: RegistryState) -> None:
        settings = config.aggregate
        assert settings is not None
        self.proxy = proxy
        self.state = state
        self.members = config.aggregate_members()
        self.names = Names(self.members, settings.separator)
        self.page_size = settings.page_size
        self.max_member_pages = settings.max_member_pages
        self.parts = PartFetcher(proxy)
        self.hub = ListenHub(self.members, settings.max_listen_streams, config.listener.write_timeout_s)
        #: The composed answer varies on whatever any of its parts varies on.
        self.vary = any(config.vary_on_capabilities(m) for m in self.members)
        self.forward_authorization = any(config.upstreams[m].forward_authorization for m in self.members)
        self.listening = config.registry.enabled and config.registry.listen

    def active(self) -> list[str]:
        """The members served now: legacy-era members are left out (they have no ``_meta``)."""
        return [m for m in self.members if self.state.upstreams[m].era != "legacy"]

    # -- entry points -------------------------------------------------------------------------

    async def handle_post(self, request: web.Request) -> web.StreamResponse:
        """``POST /mcp``."""
        proxy = self.proxy
        started = time.perf_counter()
        ex = Exchange(request, ROUTE)
        response: web.StreamResponse | None = None
        try:
            proxy.check_host(request)
            proxy.check_origin(request)
            ex.body = await proxy.read_body(request)
            try:
                parsed = parse_request(ex.body, request.headers)
            except GatewayError as err:
                proxy.check_auth(request, err.request_id)  # a caller without a token learns nothing
                raise
            ex.parsed = parsed
            ex.method = method_label(parsed.method)
            proxy.check_auth(request, parsed.request_id)
            response = await self.answer(ex, parsed)
            if ex.large:
                await proxy.send(ex, response)
        except Exception as exc:
            response = proxy.failed(ex, exc)
        finally:
            proxy.record(ex, response, started, ROUTE)
        return response

    async def handle_other(self, request: web.Request) -> web.Response:
        """``GET``/``DELETE /mcp``: a modern-only endpoint has no stream to open or session to
        end (MCP 2026-07-28, basic/transports/streamable-http: 405)."""
        started = time.perf_counter()
        response = web.Response(status=405, headers={"Allow": "POST"})
        self.proxy.record(Exchange(request, ROUTE, request.method), response, started, ROUTE)
        return response

    async def answer(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """Everything after the token check."""
        if parsed.era == "legacy" or parsed.kind == "response":
            requested = parsed.params.get("protocolVersion") if parsed.params else None
            raise self._unsupported(parsed, requested if type(requested) is str else parsed.version)
        if parsed.kind == "notification":
            ex.detail = "notification"
            return web.Response(status=202)
        if parsed.version not in MODERN_VERSIONS:
            raise self._unsupported(parsed, parsed.version)
        method = parsed.method
        if method == "server/discover" or method in LIST_FIELDS:
            return await self.composed(ex, parsed)
        if method in NAME_FIELD or method == "completion/complete":
            return await self.call(ex, parsed)
        if method == "subscriptions/listen":
            return await self.listen(ex, parsed)
        raise NotFound(f"Method not found: {_quoted(method)} is not served on /mcp", request_id=parsed.request_id)

    @staticmethod
    def _unsupported(parsed: ParsedRequest, requested: str | None) -> UnsupportedProtocolVersion:
        supported = sorted(MODERN_VERSIONS, reverse=True)
        return UnsupportedProtocolVersion(
            f"Unsupported protocol version: /mcp speaks {', '.join(supported)} only",
            request_id=parsed.request_id,
            data={"supported": supported, "requested": requested or ""},
        )

    # -- calls --------------------------------------------------------------------------------

    async def call(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """A call, served by the proxy as the member's own request (see the module)."""
        params = dict(parsed.params or {})
        method = parsed.method or ""
        if method == "completion/complete":
            ref = params.get("ref")
            field = "uri" if isinstance(ref, dict) and ref.get("type") == "ref/resource" else "name"
            path: Sequence[str] = ("params", "ref", field)
            exposed = ref.get(field) if isinstance(ref, dict) else None
        else:
            field = NAME_FIELD[method]
            path = ("params", field)
            exposed = params.get(field)
        target = self.names.resolve_uri(exposed) if field == "uri" else self.names.resolve(exposed)
        if target is None or target[0] not in self.active():
            raise InvalidParams(
                f"Invalid params: {field} {_quoted(exposed)} names nothing served on /mcp",
                request_id=parsed.request_id,
            )
        member, own = target
        if method == "resources/read":
            return await self.read(ex, parsed, member, own)
        if method == "completion/complete":
            params["ref"] = {**params["ref"], field: own}
        else:
            params[field] = own
        member_ex = Exchange(ex.request, member)
        member_ex.method = ex.method
        assert ex.body is not None
        member_ex.body = replace_value(ex.body, path, own)
        member_ex.parsed = ParsedRequest(
            parsed.kind, parsed.request_id, method, parsed.era, parsed.version, params, parsed.cache_bypass
        )
        if method in NAME_FIELD:
            member_ex.mcp_name = own  # the spec requires Mcp-Name to equal the body's name
        try:
            return await self.proxy.answer(member_ex, member_ex.parsed)
        finally:
            ex.adopt(member_ex)

    async def read(self, ex: Exchange, parsed: ParsedRequest, member: str, uri: str) -> web.StreamResponse:
        """``resources/read`` of ``uri`` on ``member``: the member's own read through its cache
        entry (:mod:`.parts`), answered with each ``contents[].uri`` exposed as ``/mcp`` lists it,
        so that a sub-resource a read returns can be read through ``/mcp`` too; stored as a
        composed answer of that one part. A JSON-RPC error of the member is relayed as it came."""
        key = ex.key = self.composed_key(ex, parsed)
        store = self.proxy.store
        if key is not None:
            entry = store.get(key)
            if isinstance(entry, ComposedEntry) and entry.current(store.get):
                return self.proxy.hit(ex, entry, collapsed=False)
        assert ex.body is not None and parsed.params is not None
        body = replace_value(ex.body, ("params", "uri"), uri)
        params = {**parsed.params, "uri": uri}
        member_parsed = ParsedRequest(
            parsed.kind, parsed.request_id, parsed.method, parsed.era, parsed.version, params, parsed.cache_bypass
        )
        try:
            part = await self.parts.fetch(self.proxy.upstreams[member], member_parsed, body, ex.request, uri)
        except MemberError as err:
            ex.cache = ex.lookup = "miss"
            ex.fwd = "miss"
            ex.error_code = error_code(err.answer)
            ex.detail = "error"
            return web.Response(
                body=dumps(err.answer),
                status=err.status,
                headers={"Content-Type": "application/json", "Cache-Status": ex.cache_status()},
            )
        result = dict(part.result)
        contents = result.get("contents")
        if isinstance(contents, list):
            result["contents"] = [
                {**c, "uri": self.names.expose_uri(member, c["uri"])}
                if isinstance(c, dict) and type(c.get("uri")) is str
                else c
                for c in contents
            ]
        message = {"jsonrpc": "2.0", "id": parsed.request_id, "result": result}
        ttl = result.get("ttlMs")
        self._outcome(ex, [part], ttl if type(ttl) is int else 0, not part.stale)
        if key is not None and part.entry is not None:
            self._store(ex, key, message, [part])
        body = dumps(message)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.cache_status()})

    # -- listen -------------------------------------------------------------------------------

    async def listen(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """A listen stream from the hub; it offers the list flags some active member reports, or
        may report (not probed yet, on this replica: its changes will reach the hub all the same)."""
        offered: set[str] = set()
        if self.listening:
            for name in self.active():
                caps = self.state.upstreams[name].capabilities
                if caps is None:
                    offered.update(FLAGS)
                    break
                for flag, (methods, _) in FLAGS.items():
                    feature = next(iter(methods)).split("/")[0]  # tools, prompts, resources
                    if isinstance(got := caps.get(feature), dict) and got.get("listChanged") is True:
                        offered.add(flag)
        ex.detail = "listen"
        requested = (parsed.params or {}).get("notifications")
        return await self.hub.serve(ex.request, parsed.request_id, requested, offered, ex.cache_status())

    # -- composed answers ---------------------------------------------------------------------

    def composed_key(self, ex: Exchange, parsed: ParsedRequest) -> CacheKey | None:
        """The key of a composed answer (route ``/mcp``, the gateway's cursor included), varying
        on whatever a part varies on; ``None`` when nothing is cached."""
        if not self.proxy.caching or parsed.cache_bypass is not None:
            return None
        authorization = ex.request.headers.get(hdrs.AUTHORIZATION, "") if self.forward_authorization else None
        try:
            return make_key(ROUTE, parsed, self.vary, authorization)
        except ValueError:
            return None

    async def composed(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """``server/discover`` or a list: a stored composition whose parts are all still current,
        or one composed now."""
        params: Mapping[str, Any] = parsed.params or {}
        method = parsed.method or ""
        page = 0
        list_fingerprint = None
        if method != "server/discover" and "cursor" in params:
            page, list_fingerprint = read_cursor(params["cursor"], parsed.request_id)
        store = self.proxy.store
        key = ex.key = self.composed_key(ex, parsed)
        if key is not None:
            entry = store.get(key)
            if isinstance(entry, ComposedEntry) and entry.current(store.get):
                return self.proxy.hit(ex, entry, collapsed=False)
        members = self.active()
        lists = await asyncio.gather(*(self._member(name, ex, parsed) for name in members))
        if members and not any(got.parts for got in lists):
            ex.fwd, ex.detail = "miss", "upstream-error"
            reasons = "; ".join(f"{name}: {got.problem}" for name, got in zip(members, lists, strict=True))
            raise BadGateway(f"no member of /mcp answered {method} ({reasons})", request_id=parsed.request_id)
        parts = [part for got in lists for part in got.parts]
        complete = all(got.complete for got in lists)
        if method == "server/discover":
            result = self._discover([got.parts[0].result for got in lists if got.parts], members, lists)
        else:
            result = self._page(method, members, lists, page, list_fingerprint, parsed.request_id)
        ttl_ms, scope = hints(parts, complete)
        result.update(resultType="complete", ttlMs=ttl_ms, cacheScope=scope)
        message = {"jsonrpc": "2.0", "id": parsed.request_id, "result": result}
        self._outcome(ex, parts, ttl_ms, complete)
        if key is not None and complete and scope == "public" and ttl_ms > 0 and all(p.entry for p in parts):
            self._store(ex, key, message, parts)
        body = dumps(message)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.cache_status()})

    @staticmethod
    def _outcome(ex: Exchange, parts: Sequence[Part], ttl_ms: int, complete: bool) -> None:
        """What the answer was, for ``Cache-Status`` and the record: a hit when no member was
        asked (every part from the cache, none stale), else a miss ``detail=composed`` (or
        ``partial``: a member left out, or stale)."""
        if complete and not any(part.fetched for part in parts):
            ex.cache = ex.lookup = "hit"
            ex.hit = f"{hit_status(ttl_ms, False)}; detail=composed"
        else:
            ex.cache = ex.lookup = "miss"
            ex.fwd = "miss"
            ex.detail = "composed" if complete else "partial"

    def _store(self, ex: Exchange, key: CacheKey, message: dict[str, Any], parts: list[Part]) -> None:
        proxy = self.proxy
        rendered = build_entry(message, proxy.clock(), proxy.forwarder.max_ttl_ms)
        if rendered is not None:
            entry = ComposedEntry.of(rendered, parts)
            if proxy.store.put(key, entry):
                ex.stored_ttl_ms = entry.ttl_ms
                proxy.update_size_gauges()

    async def _member(self, name: str, ex: Exchange, parsed: ParsedRequest) -> _MemberList:
        """Every page of member ``name``'s answer to ``parsed`` (one for ``server/discover``),
        each request the caller's body with only ``params.cursor`` changed."""
        upstream = self.proxy.upstreams[name]
        params = {k: v for k, v in (parsed.params or {}).items() if k != "cursor"}
        assert ex.body is not None
        body = ex.body if "cursor" not in (parsed.params or {}) else with_cursor(ex.body, None)
        parts: list[Part] = []
        try:
            for _ in range(self.max_member_pages):
                member_parsed = ParsedRequest(
                    "request", parsed.request_id, parsed.method, parsed.era, parsed.version, params, parsed.cache_bypass
                )
                part = await self.parts.fetch(upstream, member_parsed, body, ex.request)
                parts.append(part)
                cursor = part.result.get("nextCursor") if parsed.method != "server/discover" else None
                if type(cursor) is not str:
                    return _MemberList(parts, not any(p.stale for p in parts))
                params = {**params, "cursor": cursor}
                body = with_cursor(body, cursor)
        except (*MemberFailed, MemberError) as err:
            log.info("/mcp: left %s out of a %s answer: %s", name, parsed.method, err.message)
            return _MemberList([], False, err.message)
        log.info(
            "/mcp: %s has more than %d pages of %s; the rest is left out", name, self.max_member_pages, parsed.method
        )
        return _MemberList(parts, False)

    def _page(
        self,
        method: str,
        members: Sequence[str],
        lists: Sequence[_MemberList],
        page: int,
        list_fingerprint: bytes | None,
        request_id: object,
    ) -> dict[str, Any]:
        """Page ``page`` of the members' items under their exposed names, with the cursor of the
        next page if there is one.

        Raises:
            InvalidParams: the cursor's list has changed since, or it names a page past the end.
        """
        field = LIST_FIELDS[method]
        items = [
            item
            for name, got in zip(members, lists, strict=True)
            for part in got.parts
            for item in exposed_items(method, name, part.result.get(field), self.names)
        ]
        try:
            current = fingerprint(dumps(items))
        except ValueError as exc:  # a number beyond the float range in a member's list
            raise BadGateway("a member's list cannot be written back as JSON", request_id=request_id) from exc
        pages = max(1, math.ceil(len(items) / self.page_size))
        if list_fingerprint is not None and (list_fingerprint != current or page >= pages):
            raise InvalidParams(
                "Invalid params: the list has changed since this cursor was given; list again from the start",
                request_id=request_id,
            )
        start = page * self.page_size
        result: dict[str, Any] = {field: items[start : start + self.page_size]}
        if page + 1 < pages:
            result["nextCursor"] = mint_cursor(page + 1, current)
        return result

    def _discover(
        self, results: Sequence[Mapping[str, Any]], members: Sequence[str], lists: Sequence[_MemberList]
    ) -> dict[str, Any]:
        """``server/discover`` of ``/mcp``: the versions every answering member speaks, the union
        of their capabilities, instructions naming the members."""
        sep = self.names.separator
        answered = [name for name, got in zip(members, lists, strict=True) if got.parts]
        lines = [
            f"One MCP server made of {len(answered)} members: {', '.join(answered)}. Tools and prompts are "
            f"named <member>{sep}<name>; resources mcp-gateway:<member>/<uri>."
        ]
        for name, got in zip(members, lists, strict=True):
            text = got.parts[0].result.get("instructions") if got.parts else None
            if isinstance(text, str) and text:
                lines.append(f"{name}: {text}")
        return {
            "supportedVersions": supported_versions(results, MODERN_VERSIONS),
            "capabilities": capabilities_union(results),
            "instructions": "\n\n".join(lines),
            "_meta": {SERVER_INFO_KEY: {"name": "mcp-gateway", "version": __version__}},
        }


def _quoted(value: object) -> str:
    """``value`` for an error message, cut short: a caller's name may be megabytes long."""
    text = repr(value)
    return text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 3] + "..."
