"""Protected resource metadata (RFC 9728): one document per MCP route, path-inserted, and the
root; the resource URIs come from public_base_url, never from Host."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from ..support import StartGateway
from ..support.idp import FixtureIdp
from .oauth import BASE, oauth_config, resource

UPSTREAM = "http://127.0.0.1:9/mcp"  # the metadata never asks an upstream


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as r:
        return r.status, await r.json(content_type=None)


async def test_each_route_has_its_document_and_the_root_names_the_base(
    start_gateway: StartGateway, http: aiohttp.ClientSession, idp: FixtureIdp
) -> None:
    config = oauth_config(idp, UPSTREAM, required_scopes=["mcp:read"])
    config["aggregate"] = {}
    gw = await start_gateway(config)
    well_known = gw.base_url + "/.well-known/oauth-protected-resource"
    expected = {
        "/servers/pub/mcp": resource("pub"),
        "/servers/other/mcp": resource("other"),
        "/mcp": f"{BASE}/mcp",
        "": BASE,
    }
    for path, uri in expected.items():
        status, document = await get(http, well_known + path)
        assert status == 200, path
        assert document == {
            "resource": uri,
            "authorization_servers": [idp.issuer],
            "scopes_supported": ["mcp:read"],
            "bearer_methods_supported": ["header"],
        }
    # Any upstream name has a document, configured or not: the metadata tells no unauthenticated
    # caller which upstreams exist (a 401 on /servers/nope/mcp names this URL too).
    status, document = await get(http, well_known + "/servers/nope/mcp")
    assert (status, document["resource"]) == (200, resource("nope"))
    for path in ("/servers/-bad/mcp", "/servers/pub", "/elsewhere", "x"):
        status, _ = await get(http, well_known + path)
        assert status == 404, path


async def test_configured_servers_and_scopes_are_published_and_mcp_needs_aggregate(
    start_gateway: StartGateway, http: aiohttp.ClientSession, idp: FixtureIdp
) -> None:
    config = oauth_config(idp, UPSTREAM)
    config["auth"]["resource"] |= {"authorization_servers": ["https://login.example.com"], "scopes_supported": ["a"]}
    gw = await start_gateway(config)
    status, document = await get(http, gw.base_url + "/.well-known/oauth-protected-resource/servers/pub/mcp")
    assert status == 200
    assert (document["authorization_servers"], document["scopes_supported"]) == (["https://login.example.com"], ["a"])
    status, _ = await get(http, gw.base_url + "/.well-known/oauth-protected-resource/mcp")
    assert status == 404


@pytest.mark.parametrize("auth", [None, {"tokens": ["plain-token-0123456789"]}])
async def test_without_a_resource_server_there_is_no_metadata(
    start_gateway: StartGateway, http: aiohttp.ClientSession, auth: dict[str, Any] | None
) -> None:
    config: dict[str, Any] = {"upstreams": {"pub": {"url": UPSTREAM}}}
    if auth is not None:
        config["auth"] = auth
    gw = await start_gateway(config)
    for path in ("", "/servers/pub/mcp"):
        status, _ = await get(http, gw.base_url + "/.well-known/oauth-protected-resource" + path)
        assert status == 404


async def test_a_base_url_with_a_path_inserts_the_suffix_before_it(
    start_gateway: StartGateway, http: aiohttp.ClientSession, idp: FixtureIdp
) -> None:
    config = oauth_config(idp, UPSTREAM)
    config["auth"]["resource"]["public_base_url"] = "https://example.com/gw"
    gw = await start_gateway(config)
    status, document = await get(http, gw.base_url + "/.well-known/oauth-protected-resource/gw/servers/pub/mcp")
    assert status == 200 and document["resource"] == "https://example.com/gw/servers/pub/mcp"
    headers = {"Authorization": "Bearer not-a-token-at-all"}
    async with http.post(gw.url("pub"), data=b"{}", headers=headers) as r:
        assert r.status == 401
        assert (
            'resource_metadata="https://example.com/.well-known/oauth-protected-resource/gw/servers/pub/mcp"'
            in (r.headers["WWW-Authenticate"])
        )


async def test_scopes_supported_default_to_every_scope_the_gateway_asks_for(
    start_gateway: StartGateway, http: aiohttp.ClientSession, idp: FixtureIdp
) -> None:
    # A client registers for these scopes and may ask for no others: the rules' scopes must be there.
    config = oauth_config(idp, UPSTREAM, required_scopes=["mcp:read"])
    config["policy"] = {
        "rules": [
            {"name": "read", "scopes": ["mcp:read"], "tools": ["get_*"]},
            {"name": "write", "scopes": ["mcp:read", "mcp:write"], "tools": ["*"]},
        ]
    }
    gw = await start_gateway(config)
    status, document = await get(http, gw.base_url + "/.well-known/oauth-protected-resource/servers/pub/mcp")
    assert (status, document["scopes_supported"]) == (200, ["mcp:read", "mcp:write"])
