"""The registry's routes (gateway.registry.views): /v0.1/servers, /registry/versions, auth, and a
mixed-era fleet of real servers (the official SDK's modern upstreams and a legacy-only one,
mcp 1.30.0 in ``.tools/legacy-venv``).
"""

from __future__ import annotations

import aiohttp
import pytest
from mcp import Client

from gateway.registry import (
    LIVE_META_KEY,
)

from ..support.fleet import Upstream, free_port, legacy_requests, run_legacy_server
from ..support.polling import wait_until
from ..support.scripted_mcp import ScriptedMcp
from ..support.wire import V
from .harness import (
    FAST,
    FUTURE_V,
    LEGACY_V,
    Servers,
    get_json,
    legacy_venv_or_skip,
    mcp,
    probed,
    start_gateway,
)

pytestmark = pytest.mark.timeout(60)


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
