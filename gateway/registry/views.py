"""The registry's HTTP routes: ``GET /v0.1/servers`` (the MCP Registry API shape; with
``[aggregate]``, ``POST /mcp`` listed too) and ``/registry/versions``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson
from aiohttp import web

from .. import __version__
from ..auth import ANONYMOUS, Authenticator, Caller, bearer_token
from ..config import AGGREGATE_SERVER_NAME, GatewayConfig
from ..errors import Unauthorized, error_response
from ..policy import Policy
from ..telemetry import GatewayMetrics
from .state import RegistryState, UpstreamState, newest_first

__all__ = ["AGGREGATE_NAME", "LIVE_META_KEY", "AggregateListing", "RegistryViews"]

#: Our own ``_meta`` key for the live state in ``/v0.1/servers``. Its second label is neither
#: ``modelcontextprotocol`` nor ``mcp``, so the prefix is not reserved (MCP 2026-07-28,
#: basic/index, '`_meta`', 'Key name format').
LIVE_META_KEY: Final = "io.github.mcp-gateway/live"
DEFAULT_PAGE_LIMIT: Final = 30
MAX_PAGE_LIMIT: Final = 100
#: ``server.json`` limits its ``description`` to 100 characters.
MAX_DESCRIPTION_CHARS: Final = 100
#: The name ``POST /mcp`` is listed under (``<server_namespace>/aggregate``); with ``[aggregate]``
#: no upstream may have it (:class:`~gateway.config.GatewayConfig`).
AGGREGATE_NAME: Final = AGGREGATE_SERVER_NAME


@dataclass(frozen=True, slots=True)
class AggregateListing:
    """What ``/v0.1/servers`` says of ``POST /mcp`` (``[aggregate]``): its ``route``, its
    ``members`` in order, the ``separator`` of its exposed names, and ``active``, the members it
    serves now (:meth:`gateway.aggregate.Aggregate.active`: not the legacy-era ones)."""

    route: str
    members: tuple[str, ...]
    separator: str
    active: Callable[[], Sequence[str]]


def _rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _json(payload: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, headers={"Content-Type": "application/json"})


class RegistryViews:
    """``GET /v0.1/servers``, ``/v0.1/servers/{name}/versions[/{version}]`` and ``/registry/versions``.

    The ``/v0.1`` routes follow the official MCP Registry API (``ServerList``: ``servers[]`` of
    ``{server, _meta}`` and ``metadata`` ``{nextCursor?, count}``; ``server`` is a ``server.json``
    with one ``streamable-http`` remote pointing at the gateway). Names are
    ``<server_namespace>/<upstream name>``; the bare upstream name is accepted in paths too.
    When ``[auth]`` is configured these routes need one of its bearer tokens, else they answer
    the gateway's one 401 (:class:`~gateway.errors.Unauthorized`).

    With ``aggregate`` (``[aggregate]``), ``POST /mcp`` is one more server, named
    ``<server_namespace>/aggregate`` (:meth:`aggregate_entry`).
    """

    def __init__(
        self,
        config: GatewayConfig,
        state: RegistryState,
        aggregate: AggregateListing | None = None,
        identities: Mapping[str, str] | None = None,
        *,
        authenticator: Authenticator | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.config = config
        self.state = state
        self.aggregate = aggregate
        #: With ``[cluster]``: each upstream's configuration digest (``configDigest``), by name.
        self.identities = identities or {}
        settings = config.registry
        self.namespace = settings.server_namespace
        self.base_url = str(settings.public_base_url).rstrip("/") if settings.public_base_url else None
        #: Who callers are: the MCP routes' (a JWT for any of the gateway's resources is accepted here).
        self.authenticator = authenticator if authenticator is not None else Authenticator(config)
        self._auth_total = None if metrics is None else metrics.auth
        #: With ``[[policy.rules]]``: an upstream no rule allows the caller is not listed to it.
        self._policy = Policy(config.policy) if config.policy.rules else None

    async def identify(self, request: web.Request) -> Caller | web.Response:
        """The caller of a registry request, or the 401 to answer: with ``[auth]``, a static
        token or a verified token for any of the gateway's resource URIs (or ``audiences``)."""
        auth = self.authenticator
        if not auth.enabled:
            return ANONYMOUS
        token = bearer_token(request.headers.get("Authorization"))
        verdict = await auth.caller(token)
        ok = auth.accepts_anywhere(verdict)
        if self._auth_total is not None:
            self._auth_total.labels("ok" if ok else verdict.outcome if verdict.caller is None else "invalid").inc()
        if ok and verdict.caller is not None:
            return verdict.caller
        return error_response(
            Unauthorized(
                resource_metadata=auth.resources.root_metadata_url if auth.resources.published else None,
                invalid_token=verdict.outcome != "missing",
            )
        )

    def _shown(self, caller: Caller) -> Callable[[str], bool] | None:
        """Which names ``caller`` is shown (``None``: all): the upstreams some rule allows it,
        and the aggregate when one of its members is."""
        if self._policy is None:
            return None
        rights = self._policy.rights(caller)
        members = () if self.aggregate is None else self.aggregate.members

        def shown(name: str) -> bool:
            if self.aggregate is not None and name == AGGREGATE_NAME:
                return any(rights.allows_upstream(m) for m in members)
            return rights.allows_upstream(name)

        return shown

    def _base(self, request: web.Request) -> str:
        return self.base_url or str(request.url.origin())

    def server_name(self, upstream: str) -> str:
        return f"{self.namespace}/{upstream}"

    def _names(self) -> list[str]:
        """The names listed (upstreams, and the aggregate), in their order in ``/v0.1/servers``."""
        names = list(self.state.upstreams)
        if self.aggregate is not None:
            names.append(AGGREGATE_NAME)
        return sorted(names)

    def _entry_of(self, name: str, base: str, shown: Callable[[str], bool] | None = None) -> dict[str, Any] | None:
        """The entry of upstream ``name`` (or of the aggregate, with the members ``shown``),
        ``None`` if there is none."""
        if self.aggregate is not None and name == AGGREGATE_NAME:
            return self.aggregate_entry(self.aggregate, base, shown)
        state = self.state.upstreams.get(name)
        return None if state is None else self.entry(state, base)

    async def _named_entry(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The entry of the server named in the path, or the 401/404 to answer instead."""
        caller = await self.identify(request)
        if isinstance(caller, web.Response):
            return caller
        name = request.match_info["name"]
        prefix = f"{self.namespace}/"
        upstream = name.removeprefix(prefix) if name.startswith(prefix) else name
        shown = self._shown(caller)
        entry = self._entry_of(upstream, self._base(request), shown) if shown is None or shown(upstream) else None
        if entry is None:
            return _json({"error": "Server not found"}, 404)
        return entry

    def entry(self, state: UpstreamState, base: str) -> dict[str, Any]:
        """One ``ServerResponse``: ``{"server": server.json, "_meta": {LIVE_META_KEY: live state}}``."""
        info = state.server_info or {}
        url = f"{base}/servers/{state.name}/mcp"
        description = info.get("description") or f"MCP server '{state.name}' behind this gateway"
        server: dict[str, Any] = {
            "name": self.server_name(state.name),
            "description": description[:MAX_DESCRIPTION_CHARS],
            "version": info.get("version") or "unknown",
            "remotes": [{"type": "streamable-http", "url": url}],
        }
        if isinstance(info.get("title"), str):
            server["title"] = info["title"][:MAX_DESCRIPTION_CHARS]
        if isinstance(info.get("websiteUrl"), str):
            server["websiteUrl"] = info["websiteUrl"]
        health, reason = state.health
        listen = state.listen
        probe = state.last_probe
        live = {
            "upstream": state.name,
            "url": url,
            "era": state.era,
            "dualEra": state.dual_era,
            "supportedVersions": list(state.advertised),
            "observedVersions": newest_first(state.observed),
            "capabilities": state.capabilities,
            "serverInfo": state.server_info,
            "instructions": state.instructions,
            "health": {"status": health, "reason": reason, "up": state.up},
            "lastProbe": None
            if probe is None
            else {
                "at": _rfc3339(probe.at),
                "outcome": probe.outcome,
                "detail": probe.detail,
                "durationMs": probe.duration_ms,
            },
            "probes": state.probes,
            "nextProbeAt": _rfc3339(state.next_probe_at),
            "ttlMs": state.ttl_ms,
            "listen": {
                "state": listen.state,
                "requested": listen.requested,
                "honoured": listen.honoured,
                "problem": listen.problem,
                "streams": listen.streams,
                "losses": listen.losses,
            },
        }
        if state.name in self.identities:
            # Replicas share this upstream's entries, probes and state only where these agree.
            live["configDigest"] = self.identities[state.name]
        return {"server": server, "_meta": {LIVE_META_KEY: live}}

    def aggregate_entry(
        self, aggregate: AggregateListing, base: str, shown: Callable[[str], bool] | None = None
    ) -> dict[str, Any]:
        """The ``ServerResponse`` of ``POST /mcp``: its remote ``<base>/mcp``, and as live state
        the members (those ``shown``, when given), which of them it serves now and which it
        leaves out (legacy-era members: they have no ``_meta`` to carry the caller's through),
        and the separator."""
        url = f"{base}{aggregate.route}"
        active = set(aggregate.active())
        members = [m for m in aggregate.members if shown is None or shown(m)]
        description = f"The tools, prompts and resources of {len(members)} servers behind this gateway"
        server: dict[str, Any] = {
            "name": self.server_name(AGGREGATE_NAME),
            "title": "The fleet as one MCP server",
            "description": description[:MAX_DESCRIPTION_CHARS],
            "version": __version__,
            "remotes": [{"type": "streamable-http", "url": url}],
        }
        live = {
            "aggregate": True,
            "url": url,
            "era": "modern",
            "members": members,
            "served": [m for m in members if m in active],
            "leftOut": [{"upstream": m, "reason": self._left_out_because(m)} for m in members if m not in active],
            "separator": aggregate.separator,
        }
        return {"server": server, "_meta": {LIVE_META_KEY: live}}

    def _left_out_because(self, member: str) -> str:
        state = self.state.upstreams.get(member)
        return "legacy" if state is not None and state.era == "legacy" else "not served"

    async def servers(self, request: web.Request) -> web.Response:
        """``GET /v0.1/servers?cursor=&limit=&search=&version=``; ``cursor`` is the last name of
        the previous page (opaque to callers), ``limit`` 1-100 (default 30), ``search`` a
        case-insensitive substring of the name, ``version`` ``latest`` or an exact version."""
        caller = await self.identify(request)
        if isinstance(caller, web.Response):
            return caller
        shown = self._shown(caller)
        raw_limit = request.query.get("limit", str(DEFAULT_PAGE_LIMIT))
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            return _json({"error": f"limit must be an integer from 1 to {MAX_PAGE_LIMIT}"}, 400)
        cursor = request.query.get("cursor") or ""
        search = (request.query.get("search") or "").lower()
        version = request.query.get("version")
        base = self._base(request)
        entries = []
        for upstream in self._names():
            name = self.server_name(upstream)
            if name <= cursor or (search and search not in name.lower()):
                continue
            if shown is not None and not shown(upstream):
                continue
            entry = self._entry_of(upstream, base, shown)
            assert entry is not None
            if version not in (None, "", "latest") and entry["server"]["version"] != version:
                continue
            entries.append(entry)
        page = entries[:limit]
        meta: dict[str, Any] = {"count": len(page)}
        if len(entries) > limit:
            meta["nextCursor"] = page[-1]["server"]["name"]
        return _json({"servers": page, "metadata": meta})

    async def server_versions(self, request: web.Request) -> web.Response:
        """``GET /v0.1/servers/{name}/versions``: a ``ServerList`` of the one live version."""
        entry = await self._named_entry(request)
        if isinstance(entry, web.Response):
            return entry
        return _json({"servers": [entry], "metadata": {"count": 1}})

    async def server_version(self, request: web.Request) -> web.Response:
        """``GET /v0.1/servers/{name}/versions/{version}``: ``latest`` or the live version; 404 JSON otherwise."""
        entry = await self._named_entry(request)
        if isinstance(entry, web.Response):
            return entry
        if request.match_info["version"] not in ("latest", entry["server"]["version"]):
            return _json({"error": "Server version not found"}, 404)
        return _json(entry)

    async def versions(self, request: web.Request) -> web.Response:
        """``GET /registry/versions``: see :meth:`RegistryState.aggregate` (over the upstreams
        the caller is shown)."""
        caller = await self.identify(request)
        if isinstance(caller, web.Response):
            return caller
        document = self.state.aggregate(self._shown(caller))
        for name, one in document["upstreams"].items():
            if name in self.identities:
                one["configDigest"] = self.identities[name]
        return _json(document)
