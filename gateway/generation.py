"""A generation: everything built from one config that a request uses, and the one holder the
routes read it from.

A request reads :attr:`Live.proxy` (or :attr:`Live.generation`) once, as it starts, and keeps what
it read to its end: it sees one config, the old one or the new one, never a mix. A reload
(:mod:`gateway.reload`) builds the next generation from the new config over the parts that live as
long as the app (:class:`AppParts`: the store, the read-through's coalescing and backoffs, the
client session, the registry, the listening clients of ``/mcp``), and swaps it in with one
assignment, without a lock and without an await.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from .aggregate import ROUTE, Aggregate, ListenHub
from .auth import bearer_matches
from .cache import ReadThrough
from .cluster import Cluster, Invalidator
from .config import GatewayConfig
from .errors import Unauthorized, error_response
from .proxy import Proxy
from .registry import AggregateListing, Registry, RegistryViews
from .telemetry import GatewayMetrics
from .upstream import Upstream

__all__ = ["AppParts", "Generation", "Live", "build_generation"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class AppParts:
    """What every generation of an app shares: built once in ``create_app``. ``session`` is set
    while the app runs (its ``cleanup_ctx``); ``exposition`` is ``GET /metrics`` without its
    token check; ``proxy_class`` the proxy the MCP routes are served with (hot or plain)."""

    metrics: GatewayMetrics
    readthrough: ReadThrough
    registry: Registry
    invalidator: Invalidator
    exposition: Handler
    proxy_class: type[Proxy]
    hub: ListenHub | None = None
    cluster: Cluster | None = None
    session: aiohttp.ClientSession | None = None

    def client(self) -> aiohttp.ClientSession | None:
        """The client session while the app runs (:data:`~gateway.auth.SessionSource`)."""
        return self.session


@dataclass
class Generation:
    """What a request uses, built from ``config`` (the config applied: see
    :func:`gateway.reload.applicable`); ``sha256``: the hex SHA-256 of its file's bytes (``None``
    for an app built without one); ``upstreams``: the clients of its upstreams, filled once the
    app's client session exists."""

    config: GatewayConfig
    sha256: str | None
    upstreams: dict[str, Upstream]
    proxy: Proxy
    views: RegistryViews
    metrics_view: Handler
    aggregate: Aggregate | None = None


class Live:
    """The generation the routes serve now: :attr:`proxy` is :attr:`generation`'s, kept apart so
    that the MCP routes read one attribute a request."""

    __slots__ = ("generation", "proxy")

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.proxy = generation.proxy

    def swap(self, generation: Generation) -> None:
        """Serve ``generation`` from the next request on (no await between the two writes)."""
        self.generation = generation
        self.proxy = generation.proxy


def build_generation(
    parts: AppParts,
    config: GatewayConfig,
    sha256: str | None,
    upstreams: dict[str, Upstream],
    previous: Generation | None = None,
) -> Generation:
    """The generation of ``config`` over ``parts`` (``upstreams`` its clients; ``previous``: the
    generation it replaces, whose caller writer, journal, relayed streams and part fetches the new
    one shares). Reads the registry's state as it is now: build after the registry's reload."""
    if previous is None:
        readthrough = parts.readthrough
        proxy = parts.proxy_class(
            config, upstreams, readthrough, parts.metrics, on_success=parts.registry.observe, session=parts.client
        )
    else:
        readthrough = parts.readthrough.retuned(config)
        proxy = parts.proxy_class(
            config,
            upstreams,
            readthrough,
            parts.metrics,
            on_success=parts.registry.observe,
            previous=previous.proxy,
            session=parts.client,
        )
    listing: AggregateListing | None = None  # POST /mcp in /v0.1/servers
    aggregate: Aggregate | None = None
    if parts.hub is not None:
        aggregate = Aggregate(
            config,
            proxy,
            parts.registry.state,
            parts.metrics,
            parts.hub,
            previous=None if previous is None else previous.aggregate,
        )
        listing = AggregateListing(ROUTE, aggregate.members, aggregate.names.separator, aggregate.active)
    identities = parts.cluster.identities if parts.cluster is not None else None
    views = RegistryViews(
        config,
        parts.registry.state,
        listing,
        identities,
        authenticator=proxy.pipeline.authenticator,
        metrics=parts.metrics,
    )
    return Generation(config, sha256, upstreams, proxy, views, metrics_view(config, parts.exposition), aggregate)


def metrics_view(config: GatewayConfig, exposition: Handler) -> Handler:
    """``GET /metrics``: with ``[auth]``, only for a bearer token of ``auth.metrics_tokens`` (or,
    when that is empty, of ``auth.tokens`` and ``[[auth.static]]``): the metrics name every configured upstream."""
    if config.auth is None:
        return exposition
    caller_tokens = (*config.auth.tokens, *(s.token for s in config.auth.static))
    tokens = tuple(t.encode() for t in (config.auth.metrics_tokens or caller_tokens))

    async def metrics(request: web.Request) -> web.StreamResponse:
        if not bearer_matches(request.headers.get("Authorization"), tokens):
            return error_response(Unauthorized())
        return await exposition(request)

    return metrics
