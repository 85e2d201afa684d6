"""``create_app``: builds the whole gateway as one aiohttp application, no module state."""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import aiohttp
from aiohttp import hdrs, web
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from .aggregate import ROUTE, Aggregate, ListenHub
from .auth import WELL_KNOWN, bearer_matches
from .auth.routes import METADATA_ROUTE, metadata_response
from .cache import Clock, Invalidation, MemoryStore, ReadThrough
from .cluster import Cluster, Invalidator
from .cluster.workers import WorkerBus
from .config import GatewayConfig, LoadedConfig
from .errors import BadGateway, GatewayError, GatewayTimeout, NotFound, Overloaded, Unauthorized, error_response
from .generation import AppParts, Generation, Live, build_generation
from .protocol import KNOWN_METHODS
from .proxy import HotProxy, Proxy
from .proxy.cors import Cors
from .registry import Registry
from .reload import Reloader, track_upstream
from .telemetry import GatewayMetrics
from .upstream import Upstream

__all__ = [
    "CLUSTER",
    "CONFIG",
    "INVALIDATOR",
    "LIVE",
    "METRICS",
    "PROXY",
    "REGISTRY",
    "RELOADER",
    "STORE",
    "UPSTREAMS",
    "create_app",
    "reload_on_sighup",
]

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
#: The generation served now (what a reload replaces), and what reloads it.
LIVE: Final = web.AppKey("live", Live)
RELOADER: Final = web.AppKey("reloader", Reloader)


def create_app(
    config: GatewayConfig,
    *,
    clock: Clock = time.monotonic,
    metrics_registry: CollectorRegistry | None = None,
    rng: Callable[[], float] = random.random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    hot_path: bool = True,
    worker_bus: str | None = None,
    config_sha256: str | None = None,
    reload_source: Callable[[], LoadedConfig] | None = None,
    reload_group: Callable[[], object] | None = None,
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
    ``config_sha256`` is the SHA-256 of the file ``config`` was read from (``/readyz``,
    ``mcp_gateway_config_info``); ``reload_source`` reads that file again for a reload
    (``POST /admin/reload``, and ``SIGHUP`` through :data:`RELOADER`; :mod:`gateway.reload`);
    ``reload_group``, in a ``--workers`` worker, has the other workers reload after the route did.
    """
    # No app-wide middleware: the MCP routes answer their own unexpected errors as JSON-RPC
    # (Proxy.internal_error), and a middleware is one more coroutine on every cache hit, whose
    # few microseconds are counted (bench/RESULTS.md). Other routes get aiohttp's plain 500,
    # which never carries a traceback either.
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
    metrics.serving(config.upstreams)
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
    parts = AppParts(
        metrics,
        readthrough,
        registry,
        invalidator,
        make_aiohttp_handler(metrics.registry),
        HotProxy if hot_path else Proxy,
        hub,
        cluster,
    )
    live = Live(build_generation(parts, config, config_sha256, {}))
    upstreams = live.generation.upstreams  # filled once the client session exists
    proxy = live.proxy
    app[RELOADER] = Reloader(parts, live, store, reload_source, group=reload_group)
    app[LIVE] = live
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
    # The config and the parts built from it at start (a reload builds new ones: LIVE has them).
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
            track_upstream(metrics, upstream)
        parts.session = session
        app[READY][0] = True
        yield
        app[READY][0] = False
        await session.close()

    async def registry_tasks(app: web.Application) -> AsyncIterator[None]:
        # After client_session: the probes and listen streams use its Upstream objects.
        registry.start(upstreams)
        yield
        parts.session = None  # no reload from now on: it would start probes past this stop
        await registry.stop()

    async def close_streams(app: web.Application) -> None:
        await live.proxy.close_streams()  # every generation's: they share the relayed streams

    async def drain_journal(app: web.Application) -> None:
        # The last requests' records, to the metrics and the access log before exit.
        live.proxy.pipeline.journal.drain()

    app.on_shutdown.append(close_streams)
    app.on_cleanup.append(drain_journal)
    app.cleanup_ctx.append(client_session)
    app.cleanup_ctx.append(registry_tasks)
    app.cleanup_ctx.append(metrics.sampling)  # in a process group only: gauges to the shared files

    # The MCP routes: one exact path per upstream configured at start, its name bound to the
    # handler, found with one dict lookup (aiohttp indexes plain paths), where the pattern route
    # costs a regular expression and a match dict per request (~4% of a cache hit,
    # bench/RESULTS.md). The pattern route answers every other name: an upstream added by a
    # reload (the router is frozen once the app starts), and unknown names with the proxy's
    # JSON-RPC 404. Each handler reads the live proxy once. Names match UPSTREAM_NAME_PATTERN:
    # nothing in them needs escaping in a path.
    cors = Cors(config.listener.allowed_origins, WELL_KNOWN)
    preflight = _preflight_handler(live, cors)
    for name in config.upstreams:
        resource = app.router.add_resource(f"/servers/{name}/mcp")
        resource.add_route("POST", _post_handler(live, name))
        for method in ("GET", "DELETE"):
            resource.add_route(method, _stream_handler(live, name))
        resource.add_route("OPTIONS", preflight)
    for method in ("GET", "DELETE"):
        app.router.add_route(method, "/servers/{name}/mcp", _stream_handler(live, None))
    app.router.add_post("/servers/{name}/mcp", _post_handler(live, None))
    app.router.add_route("OPTIONS", "/servers/{name}/mcp", preflight)
    if cors.origins:  # without allowed origins no hook: nothing on any answer
        app.on_response_prepare.append(cors.on_prepare)
    # The routes that tell about the fleet get the MCP routes' DNS-rebinding checks too (a page
    # re-resolved to a loopback listener must not read the registry); health ones need none.
    guarded = functools.partial(_rebinding_checked, live)
    app.router.add_get("/metrics", guarded(_live_view(live, lambda g: g.metrics_view)))
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    if hub is not None:

        async def end_listen_streams(app: web.Application) -> None:
            hub.close()

        async def end_part_fetches(app: web.Application) -> None:
            aggregate = live.generation.aggregate
            assert aggregate is not None
            await aggregate.parts.close()  # every generation's: they share the reads under way

        app.on_shutdown.append(end_listen_streams)
        app.on_cleanup.append(end_part_fetches)
        app.router.add_post(ROUTE, _live_view(live, lambda g: _aggregate_of(g).handle_post))
        app.router.add_route("OPTIONS", ROUTE, preflight)
        app.router.add_route("*", ROUTE, _live_view(live, lambda g: _aggregate_of(g).handle_other))  # others: 405
    else:
        app.router.add_route("*", ROUTE, _no_aggregate)
    app.router.add_get("/v0.1/servers", guarded(_live_view(live, lambda g: g.views.servers)))
    app.router.add_get("/v0.1/servers/{name:.+}/versions", guarded(_live_view(live, lambda g: g.views.server_versions)))
    app.router.add_get(
        "/v0.1/servers/{name:.+}/versions/{version}", guarded(_live_view(live, lambda g: g.views.server_version))
    )
    app.router.add_get("/registry/versions", guarded(_live_view(live, lambda g: g.views.versions)))
    app.router.add_get(METADATA_ROUTE, guarded(_metadata_handler(live)))
    app.router.add_route("OPTIONS", METADATA_ROUTE, preflight)
    if config.admin is not None:
        app.router.add_post("/admin/cache/purge", guarded(_purge))
        app.router.add_post("/admin/reload", guarded(_reload))
    return app


async def reload_on_sighup(app: web.Application) -> None:
    """An ``on_startup`` hook (``mcp-gateway serve``): ``SIGHUP`` reloads the config
    (:data:`RELOADER`, :mod:`gateway.reload`) until the app stops."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, app[RELOADER].reload)

    async def stop(app: web.Application) -> None:
        loop.remove_signal_handler(signal.SIGHUP)

    app.on_cleanup.append(stop)


def _post_handler(live: Live, name: str | None) -> Handler:
    """``POST /servers/{name}/mcp`` on the live proxy: of ``name``, or (``None``) of the name in the path."""

    async def post(request: web.Request) -> web.StreamResponse:
        return await live.proxy.handle_post(request, name)

    return post


def _stream_handler(live: Live, name: str | None) -> Handler:
    """``GET``/``DELETE /servers/{name}/mcp`` on the live proxy (``name`` as for :func:`_post_handler`)."""

    async def stream(request: web.Request) -> web.StreamResponse:
        proxy = live.proxy
        return await proxy.pipeline.serve(proxy.streams, request, request.match_info["name"] if name is None else name)

    return stream


def _preflight_handler(live: Live, cors: Cors) -> Handler:
    """``OPTIONS`` on the MCP and metadata routes: a CORS preflight (:mod:`gateway.proxy.cors`),
    after the ``Host`` and ``Origin`` checks (421, 403); without an ``Origin``, the methods served."""

    async def preflight(request: web.Request) -> web.StreamResponse:
        if hdrs.ORIGIN not in request.headers:
            return web.Response(status=204, headers={"Allow": "POST, GET, DELETE, OPTIONS"})
        return cors.preflight(request)

    return _rebinding_checked(live, preflight)


def _metadata_handler(live: Live) -> Handler:
    """``GET /.well-known/oauth-protected-resource[/PATH]`` of the live config (RFC 9728)."""

    async def metadata(request: web.Request) -> web.StreamResponse:
        return metadata_response(live.proxy.pipeline.authenticator.resources, request.match_info["tail"])

    return metadata


def _live_view(live: Live, pick: Callable[[Generation], Handler]) -> Handler:
    """The handler ``pick`` finds in the live generation, read as each request starts."""

    async def view(request: web.Request) -> web.StreamResponse:
        return await pick(live.generation)(request)

    return view


def _aggregate_of(generation: Generation) -> Aggregate:
    aggregate = generation.aggregate
    assert aggregate is not None  # [aggregate] is there from the start or never (gateway.reload)
    return aggregate


async def _no_aggregate(request: web.Request) -> web.Response:
    """``/mcp`` without ``[aggregate]``: a JSON-RPC 404 (-32601) that says why (a client pointed at the
    gateway's root endpoint is the commonest first mistake)."""
    return error_response(
        NotFound("Method not found: /mcp needs [aggregate] in the config; each upstream is at /servers/NAME/mcp")
    )


def _rebinding_checked(live: Live, handler: Handler) -> Handler:
    """``handler`` behind the MCP routes' ``Host`` and ``Origin`` checks (421 and 403, as JSON-RPC
    errors: :meth:`~gateway.proxy.pipeline.Pipeline.check_host`, :meth:`~.Pipeline.check_origin`)."""

    async def checked(request: web.Request) -> web.StreamResponse:
        pipeline = live.proxy.pipeline
        try:
            pipeline.check_host(request)
            pipeline.check_origin(request)
        except GatewayError as err:
            return error_response(err)
        return await handler(request)

    return checked


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    """Ready once the upstream clients exist and (unless ``registry.enabled = false``) every
    upstream was probed once. With a config file, ``config_sha256``: the SHA-256 of the file
    served (its bytes, as ``mcp_gateway_config_info`` shows it)."""
    ready = request.app[READY][0] and request.app[REGISTRY].ready
    body: dict[str, object] = {"ready": ready}
    if (sha256 := request.app[LIVE].generation.sha256) is not None:
        body["config_sha256"] = sha256
    return web.json_response(body, status=200 if ready else 503)


async def _purge(request: web.Request) -> web.Response:
    """``POST /admin/cache/purge?upstream=NAME&method=METHOD``: drop matching entries.

    Needs ``Authorization: Bearer <admin token>`` (401 otherwise); an unknown upstream, method or
    query parameter is a 400. Answers ``{"purged": <local count>}``; with ``[cluster]`` also ``"cluster"``:
    ``"done"`` (200) when every replica and the shared tier have it, or ``"pending"`` (503, with
    ``"detail"``) when Redis did not take it (down, refusing writes, too slow): the entries here
    are gone, the invalidation is sent again until Redis takes it, and meanwhile the replicas
    that read Redis serve nothing from their caches (:mod:`gateway.cluster.link`).
    """
    config = request.app[LIVE].generation.config
    if not _is_admin(request, config):
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


def _is_admin(request: web.Request, config: GatewayConfig) -> bool:
    """Whether ``request`` carries ``Authorization: Bearer <[admin].token>``."""
    assert config.admin is not None
    return bearer_matches(request.headers.get("Authorization"), (config.admin.token.encode(),))


async def _reload(request: web.Request) -> web.Response:
    """``POST /admin/reload``: read the config file again and apply it (:mod:`gateway.reload`).

    Needs ``Authorization: Bearer <admin token>`` (401 otherwise). Answers 200 and
    ``{"reloaded": true, "config_sha256": ..., "added": [names], "removed": [...], "changed": [...],
    "retuned": [...], "tables": [...], "not_applied": [dotted keys]}`` (with ``"detail"`` when keys were not
    applied); 400 and ``{"reloaded": false, "error": <check-config's message>, "config_sha256":
    <the one still served>}`` for an invalid file, which changes nothing; 409 likewise when this
    process cannot reload. In a ``--workers`` group the other workers reload too
    (:meth:`~gateway.reload.Reloader.reload_group`); the answer is this worker's. With
    ``[cluster]``, it answers once the upstreams given a new identity are shared
    (:meth:`~gateway.reload.Reloader.settled`, at most 2 s).
    """
    if not _is_admin(request, request.app[LIVE].generation.config):
        return error_response(Unauthorized(realm="mcp-gateway-admin"))
    reloader = request.app[RELOADER]
    outcome = reloader.reload_group()
    if outcome.error is None:
        await reloader.settled()  # with [cluster]: the changed upstreams shared from the answer on
    return web.json_response(outcome.to_json(), status=outcome.status)


_PENDING_DETAIL: Final = (
    "purged on this replica only so far: the shared tier (Redis) did not take the invalidation (down, "
    "refusing writes, or too slow); it is sent again until Redis takes it "
    "(mcp_gateway_cluster_invalidations_pending), and meanwhile the replicas that still reach Redis "
    "answer from the upstreams, not from their caches"
)
