"""The live registry (gateway.registry): probes, era detection, versions, listen streams, routes.

Pure parts (schedule, verdicts, invalidation, aggregation) are tested without I/O; the probe
loop's and the listen stream's schedules with a fake ``sleep``/``rng`` (no real waiting), and the
listen stream's pauses in a running gateway with :class:`FakeTime`; the rest against small scripted
aiohttp upstreams (tests/fleet_registry.py) and real servers: the official SDK's modern upstreams
(tests/servers/public_upstream.py, changing_upstream.py) and a legacy-only one (mcp 1.30.0 in
``.tools/legacy-venv``, tests/servers/legacy_upstream.py). Real intervals are short (0.1-0.4 s).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client
from prometheus_client import CollectorRegistry

from gateway.app import REGISTRY, STORE, create_app
from gateway.cache import CacheKey, MemoryStore, canonical_json, invalidation
from gateway.config import ConfigError, RegistryConfig, UpstreamConfig, parse_config
from gateway.registry import (
    LISTEN_RESYNC_S,
    LIVE_META_KEY,
    PROBE_JITTER,
    RESUBSCRIBE_AFTER_GRACEFUL_S,
    ListenStream,
    ProbeRecord,
    ProbeResult,
    RegistryState,
    UpstreamState,
    backoff_delay,
    classify_discover,
    classify_initialize,
    probe_delay,
)
from gateway.upstream import Upstream as GatewayUpstream

from .fleet_registry import (
    LEGACY_PYTHON,
    FakeTime,
    RecordingSleep,
    ScriptedMcp,
    V,
    legacy_requests,
    run_legacy_server,
    wait_until,
)
from .support.fleet import Upstream, add_tool, bump_resource, free_port, run_server
from .support.wire import LEGACY_VERSIONS

pytestmark = pytest.mark.timeout(60)

LEGACY_V = "2025-11-25"
FUTURE_V = "2099-01-01"
FAST = {
    "probe_min_interval_s": 0.2,
    "probe_max_interval_s": 0.4,
    "probe_timeout_s": 3,
    "backoff_base_s": 0.1,
    "backoff_max_s": 0.4,
}
LIST_CHANGED = {"tools": {"listChanged": True}, "prompts": {"listChanged": True}}
ACCEPT = "application/json, text/event-stream"


# -- fixtures and helpers -------------------------------------------------------------------------


class Servers:
    """aiohttp TestServers started by a test (gateway and scripted upstreams), closed at its end."""

    def __init__(self) -> None:
        self.running: list[TestServer] = []

    async def start(self, app: web.Application, port: int | None = None) -> TestServer:
        server = TestServer(app, host="127.0.0.1", port=port)
        await server.start_server()
        self.running.append(server)
        return server

    async def stop(self, server: TestServer) -> None:
        self.running.remove(server)
        await server.close()

    async def upstream(self, scripted: ScriptedMcp, port: int | None = None) -> str:
        return str((await self.start(scripted.app(), port)).make_url("/mcp"))


@pytest.fixture
async def servers() -> AsyncIterator[Servers]:
    s = Servers()
    yield s
    for server in reversed(s.running):
        await server.close()


class Gateway:
    def __init__(self, server: TestServer, app: web.Application, metrics: CollectorRegistry) -> None:
        self.server, self.app, self.metrics = server, app, metrics

    @property
    def base(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def url(self, upstream: str) -> str:
        return f"{self.base}/servers/{upstream}/mcp"

    @property
    def state(self) -> RegistryState:
        return self.app[REGISTRY].state

    @property
    def store(self) -> MemoryStore:
        return self.app[STORE]

    def keys(self, upstream: str) -> list[CacheKey]:
        return [k for k in self.store.keys() if k.upstream == upstream]

    def metric(self, name: str, **labels: str) -> float | None:
        return self.metrics.get_sample_value(name, labels)


async def start_gateway(
    servers: Servers,
    upstreams: dict[str, Any],
    registry: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Gateway:
    config: dict[str, Any] = {k: v for k, v in kwargs.items() if k in ("auth", "cache")}
    config["upstreams"] = {n: u if isinstance(u, dict) else {"url": u} for n, u in upstreams.items()}
    config["registry"] = {"enabled": False} if registry is None else registry
    metrics = CollectorRegistry()
    extra = {k: v for k, v in kwargs.items() if k in ("rng", "sleep", "clock")}
    app = create_app(parse_config(config, env={}), metrics_registry=metrics, **extra)
    return Gateway(await servers.start(app), app, metrics)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def get_json(http: aiohttp.ClientSession, url: str, **headers: str) -> tuple[int, Any]:
    async with http.get(url, headers=headers) as resp:
        return resp.status, await resp.json()


async def mcp(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any] | None = None, **headers: str
) -> dict[str, Any]:
    """A modern JSON-RPC request (2026-07-28) through the gateway; returns the response."""
    meta = {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**(params or {}), "_meta": meta}}
    hdrs = {"Content-Type": "application/json", "Accept": ACCEPT, "MCP-Protocol-Version": V, "Mcp-Method": method}
    if method == "resources/read":
        hdrs["Mcp-Name"] = (params or {})["uri"]
    async with http.post(url, data=orjson.dumps(body), headers={**hdrs, **headers}) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


def probed(gw: Gateway, name: str, count: int = 1) -> bool:
    return gw.state.upstreams[name].probes >= count


def listening(gw: Gateway, name: str) -> bool:
    return gw.state.upstreams[name].listen.state == "acknowledged"


def key(upstream: str, method: str, **params: Any) -> CacheKey:
    return CacheKey(upstream, method, canonical_json(params), V, None)


# -- the schedule (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl_ms", "base"),
    [(None, 10.0), (0, 10.0), (3_000, 10.0), (60_000, 60.0), (299_000, 299.0), (3_600_000, 300.0), (-5, 10.0)],
)
def test_probe_delay_clamps_the_discover_ttl_to_floor_and_ceiling_and_only_ever_comes_early(
    ttl_ms: int | None, base: float
) -> None:
    assert probe_delay(ttl_ms, min_s=10, max_s=300, rng=lambda: 0.0) == base
    earliest = probe_delay(ttl_ms, min_s=10, max_s=300, rng=lambda: 0.999999)
    assert base * (1 - PROBE_JITTER) <= earliest < base


def test_backoff_doubles_per_failure_up_to_the_ceiling() -> None:
    low = [backoff_delay(n, base_s=1, max_s=60, rng=lambda: 0.0) for n in range(1, 10)]
    assert low == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    high = [backoff_delay(n, base_s=1, max_s=60, rng=lambda: 0.999999) for n in range(1, 4)]
    assert high == pytest.approx([1, 2, 4], rel=1e-5)
    assert backoff_delay(10_000, base_s=1, max_s=60, rng=lambda: 0.5) == 45  # no overflow


@given(
    failures=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.01, max_value=10),
    ceiling=st.floats(min_value=10, max_value=600),
    r=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_is_always_between_half_the_step_and_the_step(
    failures: int, base: float, ceiling: float, r: float
) -> None:
    step = min(ceiling, base * 2 ** min(failures - 1, 62))
    delay = backoff_delay(failures, base_s=base, max_s=ceiling, rng=lambda: r)
    assert step / 2 <= delay <= step and delay > 0


async def test_probe_loop_backs_off_with_jitter_while_down_then_follows_the_ttl(servers: Servers) -> None:
    """The real probe loop, with a fake sleep (records, does not wait) and a fixed rng."""
    scripted = ScriptedMcp(ttl_ms=45_000)
    failing = {"left": 4}

    async def discover(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        if failing["left"] > 0:
            failing["left"] -= 1
            return web.Response(status=503, text="busy")
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": scripted.discover_result()})

    scripted.handlers["server/discover"] = discover
    fake_sleep = RecordingSleep(park_after=7)
    settings = {**FAST, "backoff_base_s": 2, "backoff_max_s": 10, "probe_min_interval_s": 10, "listen": False}
    settings["probe_max_interval_s"] = 300
    gw = await start_gateway(
        servers, {"s": await servers.upstream(scripted)}, settings, sleep=fake_sleep, rng=lambda: 0.5
    )
    await asyncio.wait_for(fake_sleep.enough.wait(), 10)
    # failures 1-4: steps 2, 4, 8, 10 (capped) with equal jitter at 0.5 -> 3/4 of the step
    assert fake_sleep.delays[:4] == [1.5, 3.0, 6.0, 7.5]
    # then up: ttlMs 45 s within [10, 300], brought forward by rng * 20 %
    assert fake_sleep.delays[4:] == [45 * (1 - PROBE_JITTER * 0.5)] * 3
    assert gw.state.upstreams["s"].health == ("up", None)


async def test_listen_refusals_back_off_exponentially_with_jitter(servers: Servers) -> None:
    """The real listen stream against an upstream that refuses every listen, with a fake sleep."""
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)

    async def refuse(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=503)

    scripted.handlers["subscriptions/listen"] = refuse
    fake_sleep = RecordingSleep(park_after=5)
    settings = RegistryConfig.model_validate({**FAST, "backoff_base_s": 2, "backoff_max_s": 10})
    state = UpstreamState("s", era="modern", advertised=(V,), capabilities=LIST_CHANGED, probe_health="up")
    async with aiohttp.ClientSession() as session:
        upstream = GatewayUpstream(
            "s", UpstreamConfig.model_validate({"url": await servers.upstream(scripted)}), session
        )
        stream = ListenStream(
            upstream, state, settings, purge=lambda p, r: 0, cached_uris=lambda n: (), sleep=fake_sleep, rng=lambda: 0.5
        )
        task = asyncio.ensure_future(stream.run())
        try:
            await asyncio.wait_for(fake_sleep.enough.wait(), 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert fake_sleep.delays == [1.5, 3.0, 6.0, 7.5, 7.5]
    assert scripted.count("subscriptions/listen") == 5
    assert state.listen.state == "retrying" and state.health[0] == "degraded"


# -- verdicts (pure) ---------------------------------------------------------------------------------


def discover_response(**result: Any) -> dict[str, Any]:
    body = {"resultType": "complete", "supportedVersions": [V], "capabilities": {}, "ttlMs": 1, "cacheScope": "public"}
    return {"jsonrpc": "2.0", "id": "p", "result": {**body, **result}}


def error_response(code: int, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": "x"}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": "p", "error": err}


def test_a_discover_result_means_modern_and_up() -> None:
    meta = {"io.modelcontextprotocol/serverInfo": {"name": "a", "version": "2", "secret": 1}}
    verdict = classify_discover(200, discover_response(supportedVersions=[FUTURE_V, V, LEGACY_V], _meta=meta))
    assert verdict is not None
    assert (verdict.era, verdict.health, verdict.advertised) == ("modern", "up", (FUTURE_V, V, LEGACY_V))
    assert verdict.server_info == {"name": "a", "version": "2"} and verdict.ttl_ms == 1


def test_unsupported_version_means_modern_and_records_data_supported() -> None:
    verdict = classify_discover(400, error_response(-32022, {"supported": [FUTURE_V], "requested": V}))
    assert verdict is not None
    assert (verdict.era, verdict.health, verdict.advertised) == ("modern", "degraded", (FUTURE_V,))


@pytest.mark.parametrize("code", [-32020, -32021])
def test_other_recognised_modern_errors_mean_modern_not_legacy(code: int) -> None:
    verdict = classify_discover(400, error_response(code))
    assert verdict is not None and verdict.era == "modern" and verdict.health == "degraded"


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, None),  # a bare 4xx
        (404, None),
        (405, None),
        (400, error_response(-32600)),  # what mcp 1.x answers
        (404, error_response(-32601)),
        (200, error_response(-32602)),
        (200, {"jsonrpc": "2.0", "id": "p", "result": {"tools": []}}),  # not a DiscoverResult
        (200, discover_response(supportedVersions="2026-07-28")),
    ],
)
def test_any_other_error_or_a_bare_4xx_means_try_the_legacy_handshake(status: int, message: object) -> None:
    assert classify_discover(status, message) is None


@pytest.mark.parametrize(("status", "health"), [(500, "down"), (503, "down"), (401, "down"), (403, "down")])
def test_server_errors_and_auth_failures_are_down_without_an_era(status: int, health: str) -> None:
    verdict = classify_discover(status, None)
    assert verdict is not None and verdict.health == health and verdict.era is None


def test_initialize_result_means_legacy_with_its_version_and_identity() -> None:
    result = {"protocolVersion": LEGACY_V, "capabilities": {"tools": {}}, "serverInfo": {"name": "l", "version": "1"}}
    verdict = classify_initialize(200, {"jsonrpc": "2.0", "id": "i", "result": result}, "HTTP 400")
    assert (verdict.era, verdict.health, verdict.advertised) == ("legacy", "up", (LEGACY_V,))
    assert verdict.capabilities == {"tools": {}} and verdict.server_info == {"name": "l", "version": "1"}
    assert classify_initialize(502, None, "HTTP 400").health == "down"
    unknown = classify_initialize(400, error_response(-32600), "HTTP 400")
    assert (unknown.era, unknown.health) == ("unknown", "degraded")


# -- state and aggregation (pure) ----------------------------------------------------------------------


def up_state(name: str, era: str, advertised: tuple[str, ...], health: str = "up") -> ProbeResult:
    return ProbeResult(health=health, outcome=era, era=era, advertised=advertised, capabilities={})  # type: ignore[arg-type]


def test_aggregate_covers_only_up_upstreams_newest_first() -> None:
    state = RegistryState(["pub", "legacy", "scripted", "gone"])
    record = ProbeRecord(0, 1, "modern", None)
    state.upstreams["pub"].apply(up_state("pub", "modern", (V,)), record)
    state.upstreams["legacy"].apply(up_state("legacy", "legacy", (LEGACY_V,)), record)
    state.upstreams["scripted"].apply(up_state("scripted", "modern", (V, FUTURE_V, LEGACY_V)), record)
    state.upstreams["gone"].apply(up_state("gone", "modern", ("2024-11-05",)), record)
    state.upstreams["gone"].apply(ProbeResult(health="down", outcome="unreachable"), record)
    state.observe("pub", "2025-06-18")
    out = state.aggregate()
    assert out["union"] == [FUTURE_V, V, LEGACY_V, "2025-06-18"]
    assert out["intersection"] == []
    assert out["byVersion"] == {
        FUTURE_V: ["scripted"],
        V: ["pub", "scripted"],
        LEGACY_V: ["legacy", "scripted"],
        "2025-06-18": ["pub"],
    }
    assert out["upstreams"]["gone"] == {"advertised": ["2024-11-05"], "observed": [], "era": "modern", "up": False}
    assert out["upstreams"]["pub"]["observed"] == ["2025-06-18"]
    state.upstreams["legacy"].apply(ProbeResult(health="down", outcome="unreachable"), record)
    out = state.aggregate()
    assert (out["union"], out["intersection"]) == ([FUTURE_V, V, LEGACY_V, "2025-06-18"], [V])
    assert out["byVersion"][LEGACY_V] == ["scripted"]


def test_observed_versions_are_bounded_and_known_and_reset_when_an_upstream_comes_back() -> None:
    state = RegistryState(["a"])
    a: UpstreamState = state.upstreams["a"]
    a.advertised = tuple(f"2026-01-{i:02d}" for i in range(1, 17))
    for version in (*a.advertised, V, *LEGACY_VERSIONS):  # 21 versions it may be seen to speak
        state.observe("a", version)
    state.observe("a", "bad version\n")
    state.observe("a", "9999-12-31")  # well-formed, but neither known nor advertised
    state.observe("nope", V)
    observed = a.observed
    assert len(observed) == 16 and "bad version\n" not in observed and "9999-12-31" not in observed
    record = ProbeRecord(0, 1, "modern", None)
    a.apply(up_state("a", "modern", (V,)), record)  # unknown -> up keeps them
    assert len(a.observed) == 16
    a.apply(ProbeResult(health="down", outcome="unreachable"), record)
    assert len(a.observed) == 16  # still shown while down (but not aggregated)
    a.apply(up_state("a", "modern", (V,)), record)  # down -> up: maybe another build
    assert a.observed == {}


# -- invalidation (pure) ---------------------------------------------------------------------------------


def test_each_notification_purges_only_what_it_makes_stale() -> None:
    keys = [
        key("a", "tools/list"),
        key("a", "tools/list", cursor="p2"),
        key("a", "prompts/list"),
        key("a", "resources/list"),
        key("a", "resources/templates/list"),
        key("a", "resources/read", uri="res://x"),
        key("a", "resources/read", uri="res://x/child"),
        key("a", "resources/read", uri="res://xy"),
        key("a", "server/discover"),
        key("b", "tools/list"),
        key("b", "resources/read", uri="res://x"),
    ]

    def purged(method: str, **params: Any) -> list[tuple[str, str, bytes]]:
        predicate = invalidation("a", method, params)
        assert predicate is not None
        return [(k.upstream, k.method, k.params) for k in keys if predicate(k)]

    assert purged("notifications/tools/list_changed") == [
        ("a", "tools/list", b"{}"),
        ("a", "tools/list", b'{"cursor":"p2"}'),
    ]
    assert purged("notifications/prompts/list_changed") == [("a", "prompts/list", b"{}")]
    assert [m for _, m, _ in purged("notifications/resources/list_changed")] == [
        "resources/list",
        "resources/templates/list",
    ]
    assert purged("notifications/resources/updated", uri="res://x") == [
        ("a", "resources/read", b'{"uri":"res://x"}'),
        ("a", "resources/read", b'{"uri":"res://x/child"}'),
    ]
    assert invalidation("a", "notifications/message", {}) is None
    assert invalidation("a", "notifications/resources/updated", {}) is None


# -- config -------------------------------------------------------------------------------------------------


def test_registry_table_is_optional_validated_and_strict() -> None:
    assert parse_config({}).registry.enabled is True  # on by default
    assert parse_config({"registry": {"enabled": False}}).registry.enabled is False
    cfg = parse_config({"registry": {}}).registry
    assert (cfg.probe_min_interval_s, cfg.probe_max_interval_s, cfg.probe_timeout_s) == (10, 300, 10)
    assert (cfg.backoff_base_s, cfg.backoff_max_s, cfg.listen) == (1, 120, True)
    for bad, where in [
        ({"probe_min_interval_s": 5, "probe_max_interval_s": 1}, "registry"),
        ({"backoff_base_s": 9, "backoff_max_s": 1}, "registry"),
        ({"probe_timeout_s": 0}, "registry.probe_timeout_s"),
        ({"server_namespace": "has/slash"}, "registry.server_namespace"),
        ({"probe_every": 1}, "registry.probe_every: unknown key"),
    ]:
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            parse_config({"registry": bad})


# -- probes against scripted upstreams ------------------------------------------------------------------------


async def test_with_the_registry_disabled_nothing_is_probed_and_the_routes_answer_from_config(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp()
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)})
    status, _ = await get_json(http, f"{gw.base}/readyz")
    assert status == 200
    await mcp(http, gw.url("s"), "tools/list")
    _, versions = await get_json(http, f"{gw.base}/registry/versions")
    assert versions == {  # observed in real traffic, but nothing is known to be up
        "union": [],
        "intersection": [],
        "byVersion": {},
        "upstreams": {"s": {"advertised": [], "observed": [V], "era": "unknown", "up": False}},
    }
    _, one = await get_json(http, f"{gw.base}/v0.1/servers/s/versions/latest")
    assert one["_meta"][LIVE_META_KEY]["health"] == {"status": "unknown", "reason": "not probed yet", "up": False}
    assert [m for m, _, _ in scripted.requests] == ["tools/list"]


async def test_probes_carry_the_configured_headers_and_never_a_callers_authorization(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    own = ScriptedMcp(capabilities=LIST_CHANGED)
    upstreams = {
        "fwd": {"url": await servers.upstream(scripted), "forward_authorization": True, "headers": {"X-Key": "k1"}},
        "own": {"url": await servers.upstream(own), "headers": {"Authorization": "Bearer gateway-own-credential"}},
    }
    gw = await start_gateway(servers, upstreams, FAST)
    for _ in range(3):
        await mcp(http, gw.url("fwd"), "prompts/list", Authorization="Bearer caller-secret")
        await mcp(http, gw.url("own"), "prompts/list", Authorization="Bearer caller-secret")
    await wait_until(lambda: probed(gw, "fwd", 3) and probed(gw, "own", 3), what="three probes each")
    await wait_until(lambda: listening(gw, "fwd") and listening(gw, "own"), what="listen streams")
    assert scripted.of("prompts/list")[0][1]["Authorization"] == "Bearer caller-secret"  # the caller's own request
    ours = [h for m, h, _ in scripted.requests if m in ("server/discover", "subscriptions/listen")]
    assert len(ours) >= 4
    assert all("Authorization" not in h and h["X-Key"] == "k1" for h in ours)
    mine = [h for m, h, _ in own.requests if m in ("server/discover", "subscriptions/listen")]
    assert mine and all(h["Authorization"] == "Bearer gateway-own-credential" for h in mine)
    discover = scripted.of("server/discover")[0]
    assert discover[1]["MCP-Protocol-Version"] == V and discover[1]["Mcp-Method"] == "server/discover"
    meta = discover[2]["params"]["_meta"]
    assert meta["io.modelcontextprotocol/clientCapabilities"] == {}
    assert meta["io.modelcontextprotocol/clientInfo"]["name"] == "mcp-gateway"


async def test_redirects_are_not_followed_and_mark_the_upstream_down(servers: Servers) -> None:
    target = ScriptedMcp()
    target_url = await servers.upstream(target)

    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(target_url)

    app = web.Application()
    app.router.add_route("*", "/mcp", moved)
    redirecting = str((await servers.start(app)).make_url("/mcp"))
    gw = await start_gateway(servers, {"r": redirecting}, FAST)
    await wait_until(lambda: probed(gw, "r"), what="a probe")
    health, reason = gw.state.upstreams["r"].health
    assert health == "down" and reason is not None and "redirect" in reason
    assert target.requests == []


async def test_unsupported_version_marks_the_upstream_modern_with_its_supported_list(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp()

    async def refuse(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        body = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32022, "message": "no"}}
        body["error"]["data"] = {"supported": [FUTURE_V], "requested": V}
        return web.json_response(body, status=400)

    scripted.handlers["server/discover"] = refuse
    gw = await start_gateway(servers, {"f": await servers.upstream(scripted)}, FAST)
    await wait_until(lambda: probed(gw, "f"), what="a probe")
    state = gw.state.upstreams["f"]
    assert (state.era, state.advertised, state.health[0]) == ("modern", (FUTURE_V,), "degraded")
    assert scripted.count("initialize") == 0  # a recognised modern error: no legacy fallback
    _, versions = await get_json(http, f"{gw.base}/registry/versions")
    assert versions["union"] == [FUTURE_V] and versions["upstreams"]["f"]["up"] is True


async def test_readyz_turns_ready_once_every_upstream_was_probed_whatever_the_outcome(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    slow = ScriptedMcp()
    release = asyncio.Event()

    async def hang(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        await release.wait()
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": slow.discover_result()})

    slow.handlers["server/discover"] = hang
    fast = ScriptedMcp()
    upstreams = {
        "slow": await servers.upstream(slow),
        "fast": await servers.upstream(fast),
        "dead": "http://127.0.0.1:1/mcp",
    }
    gw = await start_gateway(servers, upstreams, FAST)
    await wait_until(lambda: probed(gw, "fast") and probed(gw, "dead"), what="two probes")
    status, body = await get_json(http, f"{gw.base}/readyz")
    assert (status, body) == (503, {"ready": False})
    assert (await get_json(http, f"{gw.base}/healthz"))[0] == 200
    release.set()
    await wait_until(lambda: probed(gw, "slow"), what="the slow probe")
    assert (await get_json(http, f"{gw.base}/readyz")) == (200, {"ready": True})
    assert gw.state.upstreams["dead"].health[0] == "down"


async def test_metrics_follow_health_and_drop_versions_no_longer_advertised(servers: Servers) -> None:
    scripted = ScriptedMcp(versions=[FUTURE_V, V])
    port = free_port()
    server_url = await servers.upstream(scripted, port)
    gw = await start_gateway(servers, {"s": server_url}, FAST)
    await wait_until(lambda: probed(gw, "s"), what="a probe")
    assert gw.metric("mcp_gateway_upstream_up", upstream="s") == 1
    assert gw.metric("mcp_gateway_upstream_supported_version", upstream="s", version=FUTURE_V) == 1
    scripted.versions = [V]
    seen = gw.state.upstreams["s"].probes
    await wait_until(lambda: probed(gw, "s", seen + 1), what="another probe")
    assert gw.metric("mcp_gateway_upstream_supported_version", upstream="s", version=FUTURE_V) is None
    assert gw.metric("mcp_gateway_upstream_supported_version", upstream="s", version=V) == 1
    await servers.stop(servers.running[0])
    await wait_until(lambda: gw.metric("mcp_gateway_upstream_up", upstream="s") == 0, what="upstream_up 0")


# -- listen streams against scripted upstreams ------------------------------------------------------------------


async def fill_cache(http: aiohttp.ClientSession, gw: Gateway, name: str) -> None:
    for method in ("tools/list", "prompts/list"):
        await mcp(http, gw.url(name), method)
    await mcp(http, gw.url(name), "resources/read", {"uri": "res://a"})


async def test_list_changed_notification_purges_that_list_of_that_upstream_only(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    one = ScriptedMcp(capabilities=LIST_CHANGED)
    two = ScriptedMcp(capabilities=LIST_CHANGED)
    gw = await start_gateway(servers, {"one": await servers.upstream(one), "two": await servers.upstream(two)}, FAST)
    await wait_until(lambda: listening(gw, "one") and listening(gw, "two"), what="listen streams")
    assert one.listens[0].filter == {"toolsListChanged": True, "promptsListChanged": True}
    await fill_cache(http, gw, "one")
    await fill_cache(http, gw, "two")
    one.listens[-1].notify("notifications/tools/list_changed")
    await wait_until(lambda: not any(k.method == "tools/list" for k in gw.keys("one")), what="the purge")
    assert sorted(k.method for k in gw.keys("one")) == ["prompts/list", "resources/read"]
    assert len(gw.keys("two")) == 3
    assert gw.metric("mcp_gateway_cache_evictions_total", reason="notification") == 1
    await mcp(http, gw.url("one"), "tools/list")
    assert one.count("tools/list") == 2


async def test_listen_stream_ended_without_the_result_purges_the_upstream_and_resubscribes(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    other = ScriptedMcp(capabilities=LIST_CHANGED)
    upstreams = {"s": await servers.upstream(scripted), "other": await servers.upstream(other)}
    gw = await start_gateway(servers, upstreams, FAST)
    await wait_until(lambda: listening(gw, "s") and listening(gw, "other"), what="listen streams")
    await fill_cache(http, gw, "s")
    await fill_cache(http, gw, "other")
    assert len(gw.keys("s")) == 3
    scripted.new_listen.clear()
    scripted.listens[-1].end(graceful=False)
    await wait_until(lambda: gw.keys("s") == [], what="the stream_lost purge")
    assert gw.metric("mcp_gateway_cache_evictions_total", reason="stream_lost") == 3
    assert len(gw.keys("other")) == 3
    await asyncio.wait_for(scripted.new_listen.wait(), 5)  # re-subscribed
    await wait_until(lambda: listening(gw, "s"), what="the new stream's acknowledgement")
    assert len(scripted.listens) == 2 and gw.state.upstreams["s"].listen.losses == 1
    assert gw.state.upstreams["s"].health == ("up", None)


async def test_entries_stored_while_the_stream_is_down_are_purged_when_it_is_back(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST)
    await wait_until(lambda: listening(gw, "s"), what="a listen stream")

    async def refuse(request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        return web.Response(status=503)

    scripted.handlers["subscriptions/listen"] = refuse
    scripted.listens[-1].end(graceful=False)
    refused = scripted.count("subscriptions/listen") + 1
    await wait_until(lambda: scripted.count("subscriptions/listen") > refused, what="refused re-subscriptions")
    await fill_cache(http, gw, "s")  # stored during the gap: no notification could reach us
    assert len(gw.keys("s")) == 3 and gw.state.upstreams["s"].health[0] == "degraded"
    del scripted.handlers["subscriptions/listen"]
    await wait_until(lambda: listening(gw, "s"), what="the stream back")
    assert gw.keys("s") == []
    assert gw.state.upstreams["s"].health == ("up", None)


async def test_graceful_listen_end_keeps_the_entries_and_resubscribes(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    fake = FakeTime()
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST, sleep=fake.sleep, clock=fake)
    await wait_until(lambda: listening(gw, "s"), what="a listen stream")
    await fill_cache(http, gw, "s")
    scripted.new_listen.clear()
    scripted.listens[-1].end(graceful=True)
    await fake.asleep(RESUBSCRIBE_AFTER_GRACEFUL_S)  # the pause before re-subscribing
    fake.advance(RESUBSCRIBE_AFTER_GRACEFUL_S)
    await asyncio.wait_for(scripted.new_listen.wait(), 5)
    assert len(gw.keys("s")) == 3
    assert gw.state.upstreams["s"].listen.losses == 0


async def test_a_stream_that_does_not_start_with_the_acknowledgement_is_refused_and_degrades_health(
    servers: Servers,
) -> None:
    scripted = ScriptedMcp(capabilities=LIST_CHANGED)
    scripted.ack_first = False
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST)
    await wait_until(lambda: len(scripted.listens) >= 2, what="a retry")
    state = gw.state.upstreams["s"]
    assert state.listen.state in ("retrying", "connecting") and state.listen.losses == 0
    health, reason = state.health
    assert health == "degraded" and reason is not None and "acknowledgement" in reason
    assert state.up  # still counted: it answers, only invalidation is TTL-bound
    scripted.ack_first = True
    await wait_until(lambda: listening(gw, "s"), what="an acknowledged stream")
    assert state.health == ("up", None)


async def test_resource_updates_are_subscribed_for_cached_uris_without_a_gap(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    scripted = ScriptedMcp(capabilities={"resources": {"subscribe": True}})
    fake = FakeTime()
    gw = await start_gateway(servers, {"s": await servers.upstream(scripted)}, FAST, sleep=fake.sleep, clock=fake)
    await wait_until(lambda: probed(gw, "s"), what="a probe")
    assert scripted.listens == []  # subscribe advertised, but nothing cached to listen for yet
    await mcp(http, gw.url("s"), "resources/read", {"uri": "res://a"})
    await mcp(http, gw.url("s"), "resources/read", {"uri": "res://b"})
    await fake.asleep(LISTEN_RESYNC_S)  # until the listen stream's next look at the cache
    fake.advance(LISTEN_RESYNC_S)
    await wait_until(lambda: listening(gw, "s"), what="a stream for the cached URIs")
    first = scripted.listens[-1]
    assert first.filter == {"resourceSubscriptions": ["res://a", "res://b"]}
    await mcp(http, gw.url("s"), "resources/read", {"uri": "res://c"})
    await fake.asleep(LISTEN_RESYNC_S)
    fake.advance(LISTEN_RESYNC_S)
    await wait_until(lambda: len(scripted.listens) >= 2 and listening(gw, "s"), what="a wider stream")
    await asyncio.wait_for(first.closed.wait(), 5)  # the old one is closed once the new one is acknowledged
    assert scripted.listens[-1].filter == {"resourceSubscriptions": ["res://a", "res://b", "res://c"]}
    assert len(gw.keys("s")) == 3  # replacing a stream is not a loss
    scripted.listens[-1].notify("notifications/resources/updated", uri="res://b")
    await wait_until(lambda: len(gw.keys("s")) == 2, what="the read of res://b purged")
    assert sorted(orjson.loads(k.params)["uri"] for k in gw.keys("s")) == ["res://a", "res://c"]


# -- routes -------------------------------------------------------------------------------------------------


async def test_servers_route_has_the_registry_api_shape_pages_searches_and_404s(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    names = ["alpha", "beta", "gamma"]
    upstreams = {n: await servers.upstream(ScriptedMcp(name=n, versions=[V, LEGACY_V])) for n in names}
    gw = await start_gateway(servers, upstreams, {**FAST, "server_namespace": "com.example.fleet"})
    await wait_until(lambda: all(probed(gw, n) for n in names), what="probes")
    status, page = await get_json(http, f"{gw.base}/v0.1/servers?limit=2")
    assert status == 200
    assert [e["server"]["name"] for e in page["servers"]] == ["com.example.fleet/alpha", "com.example.fleet/beta"]
    assert page["metadata"] == {"count": 2, "nextCursor": "com.example.fleet/beta"}
    _, rest = await get_json(http, f"{gw.base}/v0.1/servers?limit=2&cursor=com.example.fleet%2Fbeta")
    assert [e["server"]["name"] for e in rest["servers"]] == ["com.example.fleet/gamma"]
    assert rest["metadata"] == {"count": 1}
    _, found = await get_json(http, f"{gw.base}/v0.1/servers?search=GAM")
    assert [e["server"]["name"] for e in found["servers"]] == ["com.example.fleet/gamma"]
    entry = page["servers"][0]
    assert entry["server"] == {
        "name": "com.example.fleet/alpha",
        "description": "MCP server 'alpha' behind this gateway",
        "version": "9.9.9",
        "remotes": [{"type": "streamable-http", "url": f"{gw.base}/servers/alpha/mcp"}],
        "title": "Scripted",
    }
    live = entry["_meta"][LIVE_META_KEY]
    assert live["era"] == "modern" and live["dualEra"] is True and live["supportedVersions"] == [V, LEGACY_V]
    assert live["health"] == {"status": "up", "reason": None, "up": True}
    assert live["serverInfo"] == {"name": "alpha", "version": "9.9.9", "title": "Scripted"}
    assert live["lastProbe"]["outcome"] == "modern" and live["lastProbe"]["at"].endswith("Z")
    for path in ("com.example.fleet%2Fbeta", "com.example.fleet/beta", "beta"):
        status, one = await get_json(http, f"{gw.base}/v0.1/servers/{path}/versions/latest")
        assert status == 200 and one["server"]["name"] == "com.example.fleet/beta"
    assert (await get_json(http, f"{gw.base}/v0.1/servers/beta/versions/9.9.9"))[0] == 200
    status, versions = await get_json(http, f"{gw.base}/v0.1/servers/beta/versions")
    assert status == 200 and versions["metadata"] == {"count": 1}
    assert await get_json(http, f"{gw.base}/v0.1/servers/nope/versions/latest") == (404, {"error": "Server not found"})
    assert (await get_json(http, f"{gw.base}/v0.1/servers/beta/versions/1.0.0"))[0] == 404
    assert (await get_json(http, f"{gw.base}/v0.1/servers?limit=0"))[0] == 400


async def test_registry_routes_need_a_gateway_token_when_auth_is_configured(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    token = "gateway-token-0123456789"
    gw = await start_gateway(servers, {"s": await servers.upstream(ScriptedMcp())}, auth={"tokens": [token]})
    for path in ("/v0.1/servers", "/v0.1/servers/s/versions/latest", "/registry/versions"):
        async with http.get(gw.base + path) as resp:
            assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
            assert (await resp.json())["error"]["code"] == -32600  # the gateway's one 401, a JSON-RPC error
        assert (await get_json(http, gw.base + path, Authorization=f"Bearer {token}"))[0] == 200


# -- real servers: a mixed-era fleet --------------------------------------------------------------------------


def legacy_venv_or_skip() -> None:
    if not LEGACY_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)")
        pytest.skip(f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)")


@pytest.fixture(scope="module")
def public_up() -> Iterator[Upstream]:
    with run_server("public_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def changing_up() -> Iterator[Upstream]:
    with run_server("changing_upstream") as up:
        yield up


@pytest.fixture(scope="module")
def legacy_up() -> Iterator[Upstream]:
    legacy_venv_or_skip()
    with run_legacy_server() as up:
        yield up


async def test_fleet_registry_shows_each_era_and_aggregates_versions_as_upstreams_come_and_go(
    servers: Servers, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    legacy_venv_or_skip()
    scripted = ScriptedMcp(name="scripted", versions=[FUTURE_V, V, LEGACY_V], capabilities={"tools": {}})
    legacy_port = free_port()
    async with run_legacy_server(port=legacy_port) as legacy:
        upstreams = {"pub": public_up.url, "legacy": legacy.url, "scripted": await servers.upstream(scripted)}
        gw = await start_gateway(servers, upstreams, FAST)
        await wait_until(lambda: all(probed(gw, n) for n in upstreams), what="the first probes")
        assert (await get_json(http, f"{gw.base}/readyz"))[0] == 200

        _, listing = await get_json(http, f"{gw.base}/v0.1/servers")
        live = {e["_meta"][LIVE_META_KEY]["upstream"]: e["_meta"][LIVE_META_KEY] for e in listing["servers"]}
        assert {n: (x["era"], x["dualEra"], x["health"]["status"]) for n, x in live.items()} == {
            "legacy": ("legacy", False, "up"),
            "pub": ("modern", False, "up"),
            "scripted": ("modern", True, "up"),
        }
        assert live["legacy"]["serverInfo"] == {"name": "legacy-upstream", "version": "1.30.0"}
        assert live["legacy"]["lastProbe"]["outcome"] == "legacy"
        assert live["pub"]["serverInfo"]["name"] == "public-upstream"
        assert live["pub"]["capabilities"]["tools"] == {"listChanged": True}

        _, versions = await get_json(http, f"{gw.base}/registry/versions")
        assert versions["union"] == [FUTURE_V, V, LEGACY_V]
        assert versions["intersection"] == []
        assert versions["byVersion"] == {
            FUTURE_V: ["scripted"],
            V: ["pub", "scripted"],
            LEGACY_V: ["legacy", "scripted"],
        }
        assert versions["upstreams"]["legacy"] == {
            "advertised": [LEGACY_V],
            "observed": [],
            "era": "legacy",
            "up": True,
        }

        await mcp(http, gw.url("pub"), "tools/list")  # real traffic: observed
        _, versions = await get_json(http, f"{gw.base}/registry/versions")
        assert versions["upstreams"]["pub"]["observed"] == [V]

    # legacy stopped: marked down, gone from the aggregate
    await wait_until(lambda: not gw.state.upstreams["legacy"].up, what="legacy marked down")
    _, versions = await get_json(http, f"{gw.base}/registry/versions")
    assert versions["intersection"] == [V]
    assert versions["byVersion"][LEGACY_V] == ["scripted"]
    assert versions["upstreams"]["legacy"]["up"] is False
    assert gw.metric("mcp_gateway_upstream_up", upstream="legacy") == 0

    async with run_legacy_server(port=legacy_port):
        await wait_until(lambda: gw.state.upstreams["legacy"].up, limit_s=15, what="legacy back up")
        _, versions = await get_json(http, f"{gw.base}/registry/versions")
        assert versions["intersection"] == []
        assert versions["byVersion"][LEGACY_V] == ["legacy", "scripted"]
        assert gw.metric("mcp_gateway_upstream_up", upstream="legacy") == 1


async def test_legacy_and_dual_era_clients_work_through_the_gateway_against_the_legacy_upstream(
    servers: Servers, legacy_up: Upstream
) -> None:
    gw = await start_gateway(servers, {"legacy": legacy_up.url}, FAST)
    await wait_until(lambda: probed(gw, "legacy"), what="a probe")
    for mode in ("legacy", "auto"):
        async with Client(gw.url("legacy"), mode=mode, cache=None) as client:
            assert client.protocol_version == LEGACY_V
            tools = await client.list_tools()
            assert {t.name for t in tools.tools} == {"add", "echo"}
            result = await client.call_tool("add", {"a": 40, "b": 2})
            assert result.structured_content == {"result": 42}
            read = await client.read_resource("res://legacy")
            assert read.contents[0].text == "served by a legacy-only upstream"  # type: ignore[union-attr]
    records = await legacy_requests(legacy_up)
    sessions = {r["response_session"] for r in records if r["method"] == "initialize" and r["client"] != "mcp-gateway"}
    assert len(sessions) == 2  # one per client
    for session in sessions:
        mine = [r for r in records if r["session"] == session]
        assert {"<GET>", "<DELETE>", "tools/list", "tools/call"} <= {r["method"] for r in mine}
        assert all(r["status"] is not None and r["status"] < 400 for r in mine if r["method"] != "<DELETE>")
    probe_sessions = {r["response_session"] for r in records if r["client"] == "mcp-gateway"}
    ended = {r["session"] for r in records if r["method"] == "<DELETE>"}
    assert probe_sessions & ended  # the probes' legacy sessions are closed


# -- real servers: invalidation ------------------------------------------------------------------------------------


async def test_a_tool_added_at_run_time_shows_in_tools_list_through_the_gateway_long_before_the_ttl(
    servers: Servers, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    gw = await start_gateway(servers, {"chg": changing_up.url}, FAST)
    await wait_until(lambda: listening(gw, "chg"), what="the gateway's listen stream")
    honoured = gw.state.upstreams["chg"].listen.honoured
    assert honoured is not None and honoured["toolsListChanged"] is True
    first = await mcp(http, gw.url("chg"), "tools/list")
    assert first["result"]["ttlMs"] == 60_000
    names = {t["name"] for t in first["result"]["tools"]}
    added = (await add_tool(changing_up, "registry_test_tool"))["added"]
    assert added not in names
    loop = asyncio.get_running_loop()
    started = loop.time()

    async def shows_new_tool() -> bool:
        listed = await mcp(http, gw.url("chg"), "tools/list")
        return added in {t["name"] for t in listed["result"]["tools"]}

    await wait_until(shows_new_tool, limit_s=5, what="the new tool through the gateway")
    assert loop.time() - started < 5  # the TTL is 60 s
    assert (gw.metric("mcp_gateway_cache_evictions_total", reason="notification") or 0) >= 1


async def test_resources_updated_from_a_real_upstream_purges_the_cached_read(
    servers: Servers, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    fake = FakeTime()
    gw = await start_gateway(servers, {"chg": changing_up.url}, FAST, sleep=fake.sleep, clock=fake)
    await wait_until(lambda: listening(gw, "chg"), what="the gateway's listen stream")
    before = await mcp(http, gw.url("chg"), "resources/read", {"uri": "res://counter"})
    value = before["result"]["contents"][0]["text"]
    await fake.asleep(LISTEN_RESYNC_S)  # until the listen stream's next look at the cache
    fake.advance(LISTEN_RESYNC_S)

    def subscribed() -> bool:
        listen = gw.state.upstreams["chg"].listen
        return listen.state == "acknowledged" and "res://counter" in (listen.honoured or {}).get(
            "resourceSubscriptions", []
        )

    await wait_until(subscribed, what="a listen stream subscribed to res://counter")
    cached = await mcp(http, gw.url("chg"), "resources/read", {"uri": "res://counter"})
    assert cached["result"]["contents"][0]["text"] == value
    bumped = await bump_resource(changing_up)
    await wait_until(lambda: not gw.keys("chg"), what="the purge of the cached read")
    after = await mcp(http, gw.url("chg"), "resources/read", {"uri": "res://counter"})
    assert after["result"]["contents"][0]["text"] == f"counter={bumped['value']}"
