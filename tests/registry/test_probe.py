"""Probes (gateway.registry.probe): the schedule and the verdicts, pure; the probe loop against
scripted upstreams (tests/support/scripted_mcp.py), with a fake ``sleep``/``rng`` where it waits.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import RegistryConfig, UpstreamConfig
from gateway.registry import (
    LIVE_META_KEY,
    PROBE_JITTER,
    ListenStream,
    UpstreamState,
    backoff_delay,
    classify_discover,
    classify_initialize,
    probe_delay,
)
from gateway.upstream import Upstream as GatewayUpstream

from ..support.clock import RecordingSleep
from ..support.fleet import free_port
from ..support.polling import wait_until
from ..support.scripted_mcp import ScriptedMcp
from ..support.wire import V
from .harness import (
    FAST,
    FUTURE_V,
    LEGACY_V,
    LIST_CHANGED,
    Servers,
    get_json,
    listening,
    mcp,
    probed,
    start_gateway,
)

pytestmark = pytest.mark.timeout(60)


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
