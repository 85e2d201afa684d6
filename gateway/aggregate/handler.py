"""``POST /mcp``: the members of ``[aggregate]`` as one MCP server (docs/aggregate.md).

Served by the one pipeline of every MCP route (:mod:`gateway.proxy.pipeline`: Host, Origin, the
body within its bounds, the token before any parse error is told, then the body against its
headers), against the names as the caller sent them; this route supplies its steps. Then:

* ``server/discover`` and the four lists are composed from the members' answers, each part
  looked up under the key the member's own route would use (:mod:`.parts`), the missing ones
  fetched concurrently, every page of each member followed, within bounds (:mod:`.members`); the
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
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from aiohttp import hdrs, web

from .. import __version__
from ..cache import CacheKey, CacheLookup, build_entry, make_key
from ..codec import dumps
from ..config import GatewayConfig
from ..errors import (
    BadGateway,
    InvalidParams,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    UnsupportedProtocolVersion,
)
from ..jsonrpc import error_code, result_message
from ..policy import LIST_ITEMS, Kind, Rights
from ..protocol import (
    H_METHOD,
    MODERN_VERSIONS,
    NAME_FIELD,
    ParsedRequest,
)
from ..proxy.exchange import LARGE_BODY_BYTES, Exchange, Forwarded, hit_status
from ..registry import RegistryState
from ..telemetry import GatewayMetrics
from .compose import LIST_FIELDS, ComposedEntry, MemberList, Part, discover_result, hints, page_of
from .fleet import Fleet
from .listen import FLAGS, ListenHub
from .members import MemberCollector
from .names import Names, quoted, read_cursor
from .parts import MemberError, MemberFailed, PartFetcher
from .rewrite import replace_value

__all__ = ["ROUTE", "Aggregate"]

#: The route, and the ``upstream`` label of its requests in the metrics (no upstream is named so).
ROUTE: Final = "/mcp"
#: The largest listen request ``/mcp`` takes: a stream holds its request while it is open, and a
#: filter of list flags is a few hundred bytes (``resourceSubscriptions`` is not honoured here).
MAX_LISTEN_BODY_BYTES: Final = 64 * 1024


class Aggregate:
    """``POST /mcp``, a :class:`~gateway.proxy.pipeline.Route`, served with ``fleet`` (the
    pipeline, the cache and the members), the registry's ``state`` (which members are
    legacy-era, which can report list changes) and ``hub`` (the listening clients:
    :meth:`ListenHub.of`, built before the store that tells it of purges); ``previous``: the
    route of the config before a reload, whose part fetches this one ends with its own."""

    reads_body = True

    def __init__(
        self,
        config: GatewayConfig,
        fleet: Fleet,
        state: RegistryState,
        metrics: GatewayMetrics,
        hub: ListenHub,
        previous: Aggregate | None = None,
    ) -> None:
        settings = config.aggregate
        assert settings is not None
        self.fleet = fleet
        self.pipeline = fleet.pipeline
        self.readthrough = fleet.readthrough
        self.store = fleet.readthrough.store
        self.state = state
        self.members = config.aggregate_members()
        self.names = Names(self.members, settings.separator)
        self.page_size = settings.page_size
        self.max_member_pages = settings.max_member_pages
        self.parts: PartFetcher = PartFetcher(fleet, None if previous is None else previous.parts)
        self.collector = MemberCollector(fleet.upstreams, metrics, self.parts, self.names, settings.max_member_pages)
        self.hub = hub
        self.caching = config.cache.max_entries > 0
        #: The composed answer varies on whatever any of its parts varies on.
        self.vary = any(config.vary_on_capabilities(m) for m in self.members)
        self.forward_authorization = any(config.upstreams[m].forward_authorization for m in self.members)
        self.listening = config.registry.enabled and config.registry.listen
        self.other_methods = OtherMethods()

    def active(self) -> list[str]:
        """The members served now: legacy-era members are left out (they have no ``_meta``)."""
        return [m for m in self.members if self.state.upstreams[m].era != "legacy"]

    @staticmethod
    def visible(ex: Exchange, members: list[str]) -> list[str]:
        """Those of ``members`` the caller may see (per-caller policy: a member no rule allows
        is no member for it)."""
        rights = ex.rights
        return members if rights is None else [m for m in members if rights.allows_upstream(m)]

    # -- entry points -------------------------------------------------------------------------

    async def handle_post(self, request: web.Request) -> web.StreamResponse:
        """``POST /mcp``."""
        return await self.pipeline.serve(self, request, ROUTE)

    async def handle_other(self, request: web.Request) -> web.StreamResponse:
        """Any method but ``POST`` on ``/mcp`` (:class:`OtherMethods`)."""
        return await self.pipeline.serve(self.other_methods, request, ROUTE)

    # -- the route's steps --------------------------------------------------------------------

    def admit(self, ex: Exchange) -> None:
        """A listen request (by its ``Mcp-Method``) over :data:`MAX_LISTEN_BODY_BYTES` is refused
        before its body is read, once the caller's token is checked (HTTP 413)."""
        request = ex.request
        if (
            request.headers.get(H_METHOD) == "subscriptions/listen"
            and (request.content_length or 0) > MAX_LISTEN_BODY_BYTES
        ):
            self.pipeline.authenticate(ex, None)
            raise _listen_too_large(None)

    def resolve(self, ex: Exchange, request_id: object) -> None:
        """``/mcp`` names no upstream: what a request names is resolved as it is answered."""

    def label(self, ex: Exchange) -> str:
        return ROUTE

    def authorize(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """What a call names is authorized once its member is known (:meth:`call`)."""

    def look_up(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """Composed answers are looked up as they are composed (:meth:`answer`)."""

    async def answer(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse:
        """Everything after the token check."""
        assert parsed is not None
        if parsed.method == "initialize" and parsed.version in MODERN_VERSIONS:
            # Removed in 2026-07-28: well-formed but for its method, it is unknown (HTTP 404).
            raise NotFound("Method not found: initialize is not part of 2026-07-28", request_id=parsed.request_id)
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
        raise NotFound(f"Method not found: {quoted(method)} is not served on /mcp", request_id=parsed.request_id)

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
        if target is None or target[0] not in self.visible(ex, self.active()):
            raise InvalidParams(
                f"Invalid params: {field} {quoted(exposed)} names nothing served on /mcp",
                request_id=parsed.request_id,
                # A resource that is not there says which (MCP 2026-07-28, server/resources, 'Error Handling').
                data={"uri": exposed} if field == "uri" and type(exposed) is str else None,
            )
        member, own = target
        if ex.rights is not None:
            kind: Kind = "resources" if field == "uri" else "prompts" if method != "tools/call" else "tools"
            if not ex.rights.allows(kind, member, own):
                raise self.pipeline.denied(ex, kind, member, own, parsed.request_id, shown=exposed)
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
            return await self.fleet.serve_member(member_ex)
        finally:
            ex.adopt(member_ex)

    async def read(self, ex: Exchange, parsed: ParsedRequest, member: str, uri: str) -> web.StreamResponse:
        """``resources/read`` of ``uri`` on ``member``: the member's own read through its cache
        entry (:mod:`.parts`), answered with each ``contents[].uri`` exposed as ``/mcp`` lists it,
        so that a sub-resource a read returns can be read through ``/mcp`` too; stored as a
        composed answer of that one part. A JSON-RPC error of the member is relayed as it came."""
        key = ex.key = self.composed_key(ex, parsed)
        store = self.store
        if key is not None:
            entry = store.get(key)
            if isinstance(entry, ComposedEntry) and entry.current(store.get):
                return self.fleet.hit(ex, entry)
        assert ex.body is not None and parsed.params is not None
        body = replace_value(ex.body, ("params", "uri"), uri)
        params = {**parsed.params, "uri": uri}
        member_parsed = ParsedRequest(
            parsed.kind, parsed.request_id, parsed.method, parsed.era, parsed.version, params, parsed.cache_bypass
        )
        try:
            part = await self.parts.fetch(self.fleet.upstreams[member], member_parsed, body, ex.request, uri)
        except MemberFailed as err:  # as on the member's own route: the caller's id, upstream-error
            err.request_id = parsed.request_id
            if isinstance(err, Overloaded):  # the gateway's own refusal, to be retried
                err.headers["Retry-After"] = "1"
                raise
            ex.lookup = CacheLookup.MISS
            ex.fwd, ex.detail = Forwarded.MISS, "upstream-error"
            raise
        except MemberError as err:
            ex.lookup = CacheLookup.MISS
            ex.fwd = Forwarded.MISS
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
        message = result_message(parsed.request_id, result)
        ttl = result.get("ttlMs")
        self._outcome(ex, [part], ttl if type(ttl) is int else 0, not part.stale)
        if key is not None and part.entry is not None:
            self._store(ex, key, message, [part])
        body = _render(message, parsed.request_id)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.cache_status()})

    # -- listen -------------------------------------------------------------------------------

    async def listen(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """A listen stream from the hub; it offers the list flags some active member reports, or
        may report (not probed yet, on this replica: its changes will reach the hub all the same)."""
        assert ex.body is not None
        if len(ex.body) > MAX_LISTEN_BODY_BYTES:
            raise _listen_too_large(parsed.request_id)
        offered: set[str] = set()
        if self.listening:
            for name in self.visible(ex, self.active()):
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
        members = None if ex.rights is None else self.visible(ex, list(self.members))
        expires_at = ex.caller.expires_at
        ends_at = None if expires_at is None else asyncio.get_running_loop().time() + (expires_at - time.time())
        return await self.hub.serve(
            ex.request, parsed.request_id, requested, offered, ex.cache_status(), members, ends_at
        )

    # -- composed answers ---------------------------------------------------------------------

    def composed_key(self, ex: Exchange, parsed: ParsedRequest) -> CacheKey | None:
        """The key of a composed answer (route ``/mcp``, the gateway's cursor included), varying
        on whatever a part varies on; ``None`` when nothing is cached."""
        if not self.caching or parsed.cache_bypass is not None:
            return None
        authorization = ex.request.headers.get(hdrs.AUTHORIZATION, "") if self.forward_authorization else None
        try:
            key = make_key(ROUTE, parsed, self.vary, authorization)
        except ValueError:
            return None
        if ex.rights is not None and parsed.method != "resources/read":
            # Composed of what the caller may see: one composition per set of rights (its parts,
            # the members' own entries, stay shared).
            tag = ex.rights.tag
            key = key._replace(authorization=hashlib.sha256((key.authorization or b"") + b"|" + tag).digest())
        return key

    async def composed(self, ex: Exchange, parsed: ParsedRequest) -> web.StreamResponse:
        """``server/discover`` or a list: a stored composition whose parts are all still current,
        or one composed now."""
        params: Mapping[str, Any] = parsed.params or {}
        method = parsed.method or ""
        page = 0
        list_fingerprint = None
        if method != "server/discover" and "cursor" in params:
            page, list_fingerprint = read_cursor(params["cursor"], parsed.request_id)
        store = self.store
        key = ex.key = self.composed_key(ex, parsed)
        if key is not None:
            entry = store.get(key)
            if isinstance(entry, ComposedEntry) and entry.current(store.get):
                return self.fleet.hit(ex, entry)
        members = self.visible(ex, self.active())
        lists = await asyncio.gather(*(self.collector.collect(name, ex, parsed) for name in members))
        if ex.rights is not None and method != "server/discover":
            self.filter_lists(ex.rights, method, members, lists)
        if members and not any(got.parts for got in lists):
            ex.fwd, ex.detail = Forwarded.MISS, "upstream-error"
            reasons = "; ".join(f"{name}: {got.problem}" for name, got in zip(members, lists, strict=True))
            raise BadGateway(f"no member of /mcp answered {method} ({reasons})", request_id=parsed.request_id)
        parts = [part for got in lists for part in got.parts]
        complete = all(got.complete for got in lists)
        if method == "server/discover":
            info = {"name": "mcp-gateway", "version": __version__}
            result = discover_result(members, lists, self.names.separator, info)
        else:
            result = page_of(method, lists, page, list_fingerprint, self.page_size, parsed.request_id)
        ttl_ms, scope = hints(parts, complete, self.readthrough.clock())
        # A list composed for a caller's rights is its own (stored for those rights, locally).
        shown = "private" if ex.rights is not None and method != "server/discover" else scope
        result.update(resultType="complete", ttlMs=ttl_ms, cacheScope=shown)
        message = result_message(parsed.request_id, result)
        self._outcome(ex, parts, ttl_ms, complete, any(got.problem is not None for got in lists))
        if key is not None and complete and scope == "public" and ttl_ms > 0 and all(p.entry for p in parts):
            self._store(ex, key, message, parts)
        body = _render(message, parsed.request_id)
        ex.large = len(body) > LARGE_BODY_BYTES
        return web.Response(body=body, headers={"Content-Type": "application/json", "Cache-Status": ex.cache_status()})

    def filter_lists(self, rights: Rights, method: str, members: Sequence[str], lists: Sequence[MemberList]) -> None:
        """Leave in each member's items only those ``rights`` allow, matched on the member's own
        names and URIs (``tools = ["get_*"]`` allows ``weather__get_forecast``)."""
        _, name_field, kind = LIST_ITEMS[method]
        for member, got in zip(members, lists, strict=True):
            prefix = self.names.expose_uri(member, "") if name_field != "name" else self.names.expose(member, "")
            kept = []
            for item in got.items:
                exposed = item.get(name_field)
                if (
                    type(exposed) is str
                    and exposed.startswith(prefix)
                    and rights.allows(kind, member, exposed[len(prefix) :])
                ):
                    kept.append(item)
            if len(kept) != len(got.items):
                got.items = kept
                got.rendered = dumps(kept)

    @staticmethod
    def _outcome(ex: Exchange, parts: Sequence[Part], ttl_ms: int, complete: bool, left_out: bool = False) -> None:
        """What the answer was, for ``Cache-Status`` and the record: a hit when no member was
        asked (every part from the cache, none stale); ``stale`` (counted as stale answers are)
        when a failing member's expired entry stood in for it; else a miss ``detail=composed``;
        ``detail=partial`` when a member was left out or cut short (``left_out``)."""
        if complete and not any(part.fetched for part in parts):
            ex.lookup = CacheLookup.HIT
            ex.hit = f"{hit_status(ttl_ms, False)}; detail=composed"
            return
        ex.fwd = Forwarded.MISS
        stale = any(part.stale for part in parts)
        ex.lookup = CacheLookup.STALE if stale else CacheLookup.MISS
        ex.detail = "partial" if left_out else "stale" if stale else "composed"

    def _store(self, ex: Exchange, key: CacheKey, message: dict[str, Any], parts: list[Part]) -> None:
        through = self.readthrough
        rendered = build_entry(message, through.clock(), through.max_ttl_ms)
        if rendered is not None and rendered.size <= through.max_entry_bytes:
            entry = ComposedEntry.of(rendered, parts)
            if self.store.put(key, entry):
                ex.stored_ttl_ms = entry.ttl_ms


class OtherMethods:
    """Any method but ``POST`` on ``/mcp``, a :class:`~gateway.proxy.pipeline.Route`: after the
    same Host, Origin and token checks, a modern-only endpoint has no stream to open (``GET``) or
    session to end (``DELETE``), so 405 with ``Allow: POST`` (MCP 2026-07-28,
    basic/transports/streamable-http) and a JSON-RPC body."""

    reads_body = False

    def admit(self, ex: Exchange) -> None:
        """No body is read."""

    def resolve(self, ex: Exchange, request_id: object) -> None:
        """Nothing is named."""

    def authorize(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """Nothing is used."""

    def label(self, ex: Exchange) -> str:
        return ROUTE

    def look_up(self, ex: Exchange, parsed: ParsedRequest | None) -> None:
        """Nothing to look up."""

    async def answer(self, ex: Exchange, parsed: ParsedRequest | None) -> web.StreamResponse:
        raise MethodNotAllowed(f"{ex.request.method} is not served on /mcp: it is a modern-only endpoint; POST")


def _listen_too_large(request_id: object) -> PayloadTooLarge:
    err = PayloadTooLarge(
        f"a subscriptions/listen request over {MAX_LISTEN_BODY_BYTES} bytes is refused on /mcp: its stream "
        "would hold it for as long as it stays open",
        request_id=request_id,
    )
    err.close_connection = True  # the body was not read
    return err


def _render(message: Mapping[str, Any], request_id: object) -> bytes:
    """The JSON of an answer. Raises :class:`BadGateway` when a member's part of it cannot be
    written back (a number beyond the float range, nesting too deep)."""
    try:
        return dumps(message)
    except ValueError as exc:
        raise BadGateway("a member's answer cannot be written back as JSON", request_id=request_id) from exc
