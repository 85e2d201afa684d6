"""``create_app``: builds the whole gateway as one aiohttp application, no module state."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from .aggregate import ROUTE, Aggregate, ListenHub
from .auth import bearer_matches
from .cache import Clock, Invalidation, MemoryStore, ReadThrough
from .cluster import Cluster, Invalidator
from .cluster.workers import WorkerBus
from .config import GatewayConfig
from .errors import BadGateway, GatewayError, GatewayTimeout, NotFound, Overloaded, Unauthorized, error_response
from .protocol import KNOWN_METHODS
from .proxy import HotProxy, Proxy
from .proxy.pipeline import Pipeline
from .registry import AggregateListing, Registry, RegistryViews
from .telemetry import GatewayMetrics
from .upstream import Upstream

__all__ = ["CLUSTER", "CONFIG", "INVALIDATOR", "METRICS", "PROXY", "REGISTRY", "STORE", "UPSTREAMS", "create_app"]

CONFIG: Final = web.AppKey("config", GatewayConfig)
METRICS: Final = web.AppKey("metrics", GatewayMetrics)
STORE: Final = web.AppKey("store", MemoryStore)
UPSTREAMS: Final = web.AppKey("upstreams", dict[str, Upstream])
PROXY: Final = web.AppKey("proxy", Proxy)
READY: Final = web.AppKey("ready", list[bool])
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REGISTRY: Final = web.AppKey("registry", Registry)
CLUSTER: Final = web.AppKey("cluster", Cluster)
WORKER_BUS: Final = web.AppKey("worker_bus", WorkerBus)
INVALIDATOR: Final = web.AppKey("invalidator", Invalidator)


def create_app(
    config: GatewayConfig,
    *,
    clock: Clock = time.monotonic,
    metrics_registry: CollectorRegistry | None = None,
    rng: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    hot_path: bool = True,
    worker_bus: str | None = None,
) -> web.Application:
    """Build the gateway for ``config``.

    ``clock`` gives monotonic seconds and drives cache expiry (tests pass a fake one);
    ``metrics_registry`` receives every metric (a fresh ``CollectorRegistry`` by default);
    ``rng`` (floats in ``[0, 1)``) and ``sleep`` (seconds) drive the registry's jittered probe
    schedule. The shared ``aiohttp.ClientSession`` and the registry's background tasks (probes,
    listen streams; not with ``registry.enabled = false``) are started and stopped in ``cleanup_ctx``.
    ``hot_path=False`` serves the MCP routes with the plain :class:`~gateway.proxy.Proxy` instead
    of :class:`~gateway.proxy.HotProxy` (the same answers; for the benchmark and the tests).
    ``worker_bus`` is the directory of a ``--workers`` group's bus, through which purges and
    notifications reach the other workers (:mod:`gateway.cluster.workers`), with ``[cluster]`` too.
    """
    # No app-wide middleware: the MCP routes answer their own unexpected errors as JSON-RPC
    # (Proxy.internal_error), and a middleware costs every cache hit ~8% (bench/RESULTS.md). Other
    # routes get aiohttp's plain 500, which never carries a traceback either.
    app = web.Application(client_max_size=config.listener.max_body_bytes)
    metrics = GatewayMetrics(
        metrics_registry if metrics_registry is not None else CollectorRegistry(), cluster=config.cluster is not None
    )
    # The listening clients of /mcp hear every purge of this process: the store tells them.
    hub = ListenHub.of(config) if config.aggregate is not None else None
    store = MemoryStore(
        max_entries=config.cache.max_entries,
        max_bytes=config.cache.max_bytes,
        clock=clock,
        on_evict=metrics.evicted,
        on_purge=hub.purged if hub is not None else None,
        keep_stale=any(config.stale_if_error_ms(name) > 0 for name in config.upstreams),
    )
    metrics.track_store(store)
    upstreams: dict[str, Upstream] = {}
    cluster = Cluster(config, store, metrics, clock=clock) if config.cluster is not None else None
    # What other workers of this group send is applied here; the store tells the hub.
    bus = WorkerBus(worker_bus, store.purge) if worker_bus else None
    invalidator = Invalidator(store, cluster=cluster, bus=bus)
    registry = Registry(
        config, store, metrics, clock=clock, rng=rng, sleep=sleep, invalidator=invalidator, cluster=cluster
    )
    readthrough = ReadThrough(
        config, store, metrics, clock, failures=(BadGateway, GatewayTimeout), busy=(Overloaded,), shared=cluster
    )
    proxy = (HotProxy if hot_path else Proxy)(config, upstreams, readthrough, metrics, on_success=registry.observe)
    app[INVALIDATOR] = invalidator
    if cluster is not None:
        app[CLUSTER] = cluster

        async def shared_tier(app: web.Application) -> AsyncIterator[None]:
            await cluster.start()
            yield
            await cluster.stop()

        app.cleanup_ctx.append(shared_tier)
    if bus is not None:
        app[WORKER_BUS] = bus

        async def worker_bus_ctx(app: web.Application) -> AsyncIterator[None]:
            bus.start()
            yield
            bus.stop()

        app.cleanup_ctx.append(worker_bus_ctx)
    app[CONFIG] = config
    app[METRICS] = metrics
    app[STORE] = store
    app[UPSTREAMS] = upstreams
    app[PROXY] = proxy
    app[READY] = [False]
    app[REGISTRY] = registry

    async def client_session(app: web.Application) -> AsyncIterator[None]:
        # No cookie jar: a cookie one caller's answer set must never reach another caller.
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            auto_decompress=True,
        )
        for name, up_config in config.upstreams.items():
            upstream = upstreams[name] = Upstream(name, up_config, session)
            metrics.track_inflight(name, _inflight_of(upstream))
        app[READY][0] = True
        yield
        app[READY][0] = False
        await session.close()

    async def registry_tasks(app: web.Application) -> AsyncIterator[None]:
        # After client_session: the probes and listen streams use its Upstream objects.
        registry.start(upstreams)
        yield
        await registry.stop()

    async def close_streams(app: web.Application) -> None:
        await proxy.close_streams()

    async def drain_journal(app: web.Application) -> None:
        # The last requests' records, to the metrics and the access log before exit.
        proxy.pipeline.journal.drain()

    app.on_shutdown.append(close_streams)
    app.on_cleanup.append(drain_journal)
    app.cleanup_ctx.append(client_session)
    app.cleanup_ctx.append(registry_tasks)
    app.cleanup_ctx.append(metrics.sampling)  # in a process group only: gauges to the shared files

    # The MCP routes: one exact path per configured upstream, its name bound to the handler,
    # found with one dict lookup (aiohttp indexes plain paths), where the pattern route costs
    # a regular expression and a match dict per request (~4% of a cache hit, bench/RESULTS.md). The
    # pattern route answers every other name with the proxy's JSON-RPC 404. Names match
    # UPSTREAM_NAME_PATTERN: nothing in them needs escaping in a path.
    for name in config.upstreams:
        resource = app.router.add_resource(f"/servers/{name}/mcp")
        resource.add_route("POST", functools.partial(proxy.pipeline.serve, proxy, name=name))
        for method in ("GET", "DELETE"):
            resource.add_route(method, functools.partial(proxy.pipeline.serve, proxy.streams, name=name))
    for method in ("GET", "DELETE"):
        app.router.add_route(method, "/servers/{name}/mcp", proxy.handle_stream)
    app.router.add_post("/servers/{name}/mcp", proxy.handle_post)
    # The routes that tell about the fleet get the MCP routes' DNS-rebinding checks too (a page
    # re-resolved to a loopback listener must not read the registry); health ones need none.
    guarded = functools.partial(_rebinding_checked, proxy.pipeline)
    app.router.add_get("/metrics", guarded(_metrics_view(config, make_aiohttp_handler(metrics.registry))))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    listing: AggregateListing | None = None  # POST /mcp in /v0.1/servers
    if hub is not None:
        aggregate = Aggregate(config, proxy, registry.state, metrics, hub)
        listing = AggregateListing(ROUTE, aggregate.members, aggregate.names.separator, aggregate.active)

        async def end_listen_streams(app: web.Application) -> None:
            aggregate.hub.close()

        async def end_part_fetches(app: web.Application) -> None:
            await aggregate.parts.close()

        app.on_shutdown.append(end_listen_streams)
        app.on_cleanup.append(end_part_fetches)
        app.router.add_post(ROUTE, aggregate.handle_post)
        app.router.add_route("*", ROUTE, aggregate.handle_other)  # every other method: 405
    else:
        app.router.add_route("*", ROUTE, _no_aggregate)
    views = RegistryViews(config, registry.state, listing, cluster.identities if cluster is not None else None)
    app.router.add_get("/v0.1/servers", guarded(views.servers))
    app.router.add_get("/v0.1/servers/{name:.+}/versions", guarded(views.server_versions))
    app.router.add_get("/v0.1/servers/{name:.+}/versions/{version}", guarded(views.server_version))
    app.router.add_get("/registry/versions", guarded(views.versions))
    if config.admin is not None:
        app.router.add_post("/admin/cache/purge", guarded(_purge))
    return app


async def _no_aggregate(request: web.Request) -> web.Response:
    """``/mcp`` without ``[aggregate]``: a JSON-RPC 404 (-32601) that says why (a client pointed at the
    gateway's root endpoint is the commonest first mistake)."""
    return error_response(
        NotFound("Method not found: /mcp needs [aggregate] in the config; each upstream is at /servers/NAME/mcp")
    )


def _rebinding_checked(pipeline: Pipeline, handler: Handler) -> Handler:
    """``handler`` behind the MCP routes' ``Host`` and ``Origin`` checks (421 and 403, as JSON-RPC
    errors: :meth:`~gateway.proxy.pipeline.Pipeline.check_host`, :meth:`~.Pipeline.check_origin`)."""

    async def checked(request: web.Request) -> web.StreamResponse:
        try:
            pipeline.check_host(request)
            pipeline.check_origin(request)
        except GatewayError as err:
            return error_response(err)
        return await handler(request)

    return checked


def _metrics_view(config: GatewayConfig, exposition: Handler) -> Handler:
    """``GET /metrics``: with ``[auth]``, only for a bearer token of ``auth.metrics_tokens`` (or,
    when that is empty, of ``auth.tokens``): the metrics name every configured upstream."""
    if config.auth is None:
        return exposition
    tokens = tuple(t.encode() for t in (config.auth.metrics_tokens or config.auth.tokens))

    async def metrics(request: web.Request) -> web.StreamResponse:
        if not bearer_matches(request.headers.get("Authorization"), tokens):
            return error_response(Unauthorized())
        return await exposition(request)

    return metrics


def _inflight_of(upstream: Upstream) -> Callable[[], float]:
    """``mcp_gateway_inflight_requests{upstream}``, read when scraped."""
    return lambda: upstream.inflight


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    """Ready once the upstream clients exist and (unless ``registry.enabled = false``) every
    upstream was probed once."""
    ready = request.app[READY][0] and request.app[REGISTRY].ready
    return web.json_response({"ready": ready}, status=200 if ready else 503)


async def _purge(request: web.Request) -> web.Response:
    """``POST /admin/cache/purge?upstream=NAME&method=METHOD``: drop matching entries.

    Needs ``Authorization: Bearer <admin token>`` (401 otherwise); an unknown upstream, method or
    query parameter is a 400. Answers ``{"purged": <local count>}``; with ``[cluster]`` also ``"cluster"``:
    ``"done"`` (200) when every replica and the shared tier have it, or ``"pending"`` (503, with
    ``"detail"``) when Redis did not take it (down, refusing writes, too slow): the entries here
    are gone, the invalidation is sent again until Redis takes it, and meanwhile the replicas
    that read Redis serve nothing from their caches (:mod:`gateway.cluster.link`).
    """
    config = request.app[CONFIG]
    assert config.admin is not None
    if not bearer_matches(request.headers.get("Authorization"), (config.admin.token.encode(),)):
        return error_response(Unauthorized(realm="mcp-gateway-admin"))
    # A misspelt key must not widen a purge to every entry: only these two are known.
    unknown = sorted(set(request.query) - {"upstream", "method"})
    if unknown:
        return web.json_response({"error": f"unknown query parameter {unknown[0]!r} (upstream, method)"}, status=400)
    upstream = request.query.get("upstream")
    method = request.query.get("method")
    if upstream is not None and upstream not in config.upstreams:
        return web.json_response({"error": f"unknown upstream {upstream!r}"}, status=400)
    if method is not None and method not in KNOWN_METHODS:
        return web.json_response({"error": f"unknown method {method!r}"}, status=400)
    invalidation = Invalidation(upstream, None if method is None else (method,))
    invalidator = request.app[INVALIDATOR]
    spread = await invalidator.invalidate(invalidation, "purge")  # every worker and replica, the shared tier
    if invalidator.cluster is None:
        return web.json_response({"purged": spread.count})
    if spread.delivered:
        return web.json_response({"purged": spread.count, "cluster": "done"})
    return web.json_response(
        {"purged": spread.count, "cluster": "pending", "detail": _PENDING_DETAIL},
        status=503,
        headers={"Retry-After": "1"},
    )


_PENDING_DETAIL: Final = (
    "purged on this replica only so far: the shared tier (Redis) did not take the invalidation (down, "
    "refusing writes, or too slow); it is sent again until Redis takes it "
    "(mcp_gateway_cluster_invalidations_pending), and meanwhile the replicas that still reach Redis "
    "answer from the upstreams, not from their caches"
)
