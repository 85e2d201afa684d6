"""CORS for browser clients: a preflight from an allowed origin is answered (204, the methods,
the requested MCP headers, Max-Age, Vary: Origin), any other origin's is a 403, and answers to
an allowed origin, challenges included, say who may read them and which headers."""

from __future__ import annotations

import json

import aiohttp

from ..support import StartGateway, mcp_headers, rpc
from ..support.fleet import Upstream

APP = "https://app.example.com"
TOKEN = "browser-token-0123456789"


def config(upstream: str) -> dict[str, object]:
    return {
        "listener": {"allowed_origins": [APP]},
        "auth": {"tokens": [TOKEN]},
        "upstreams": {"pub": {"url": upstream}},
        "aggregate": {},
    }


async def preflight(http: aiohttp.ClientSession, url: str, origin: str, headers: str) -> aiohttp.ClientResponse:
    request_headers = {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": headers,
    }
    async with http.options(url, headers=request_headers) as r:
        await r.read()
        return r


async def test_a_preflight_from_an_allowed_origin_is_answered_with_the_mcp_headers_it_asked_for(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    gw = await start_gateway(config(public_up.url))
    asked = "authorization, content-type, mcp-protocol-version, mcp-method, mcp-name, mcp-param-city, x-evil"
    for url in (gw.url("pub"), gw.url("not-configured"), gw.base_url + "/mcp"):
        r = await preflight(http, url, APP, asked)
        assert r.status == 204, url
        assert r.headers["Access-Control-Allow-Origin"] == APP
        assert r.headers["Access-Control-Allow-Methods"] == "POST, GET, DELETE, OPTIONS"
        allowed = r.headers["Access-Control-Allow-Headers"]
        assert allowed == "authorization, content-type, mcp-protocol-version, mcp-method, mcp-name, mcp-param-city"
        assert r.headers["Access-Control-Max-Age"] == "600" and r.headers["Vary"] == "Origin"
    r = await preflight(http, gw.base_url + "/.well-known/oauth-protected-resource/servers/pub/mcp", APP, "accept")
    assert r.status == 204 and r.headers["Access-Control-Allow-Methods"] == "GET, OPTIONS"


async def test_a_preflight_from_another_origin_is_a_403(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    gw = await start_gateway(config(public_up.url))
    r = await preflight(http, gw.url("pub"), "https://evil.example.com", "authorization")
    assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers


async def test_answers_to_an_allowed_origin_carry_the_cors_headers_and_others_none(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    gw = await start_gateway(config(public_up.url))
    body = json.dumps(rpc("tools/list"))
    for token, status in ((TOKEN, 200), (None, 401)):
        headers = mcp_headers("tools/list", Origin=APP)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with http.post(gw.url("pub"), data=body, headers=headers) as r:
            assert r.status == status
            assert r.headers["Access-Control-Allow-Origin"] == APP
            exposed = r.headers["Access-Control-Expose-Headers"]
            assert exposed == "WWW-Authenticate, Mcp-Session-Id, MCP-Protocol-Version, Cache-Status"
            assert "Origin" in r.headers.getall("Vary")
    headers = mcp_headers("tools/list", Authorization=f"Bearer {TOKEN}")
    async with http.post(gw.url("pub"), data=body, headers=headers) as r:
        assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
    async with http.get(gw.base_url + "/healthz", headers={"Origin": APP}) as r:
        assert "Access-Control-Allow-Origin" not in r.headers  # not an MCP or metadata route
