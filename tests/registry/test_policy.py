"""The registry routes under a per-caller policy: an upstream no rule allows the caller is not
listed to it (``/v0.1/servers``, its versions routes, ``/registry/versions``), and ``POST /mcp``
is listed with the members it may see."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.registry import LIVE_META_KEY

from ..support import RunningGateway, StartGateway
from ..support.fleet import Upstream

pytestmark = pytest.mark.timeout(60)

READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789"
PLAIN = "plain-token-0123456789"


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream) -> RunningGateway:
    return await start_gateway(
        {
            "auth": {
                "tokens": [PLAIN],
                "static": [
                    {"token": READER, "subject": "reader", "scopes": ["mcp:read"]},
                    {"token": ADMIN, "subject": "admin", "scopes": ["mcp:admin"]},
                ],
            },
            "upstreams": {name: {"url": public_up.url} for name in ("alpha", "beta", "gamma")},
            "aggregate": {},
            "policy": {
                "rules": [
                    {"name": "read", "scopes": ["mcp:read"], "upstreams": ["alpha", "g*"]},
                    {"name": "admin", "scopes": ["mcp:admin"], "tools": ["*"]},
                ]
            },
        }
    )


async def get(http: aiohttp.ClientSession, gw: RunningGateway, path: str, token: str | None) -> tuple[int, Any]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with http.get(f"{gw.base_url}{path}", headers=headers) as resp:
        return resp.status, await resp.json()


async def test_servers_lists_only_the_upstreams_the_caller_may_see(
    http: aiohttp.ClientSession, gw: RunningGateway
) -> None:
    listed = {}
    for token in (READER, ADMIN, PLAIN):
        status, page = await get(http, gw, "/v0.1/servers", token)
        assert status == 200
        listed[token] = {e["server"]["name"].split("/")[-1]: e for e in page["servers"]}
    assert sorted(listed[READER]) == ["aggregate", "alpha", "gamma"]
    assert sorted(listed[ADMIN]) == ["aggregate", "alpha", "beta", "gamma"]
    assert listed[PLAIN] == {}
    assert listed[READER]["aggregate"]["_meta"][LIVE_META_KEY]["members"] == ["alpha", "gamma"]
    assert listed[ADMIN]["aggregate"]["_meta"][LIVE_META_KEY]["members"] == ["alpha", "beta", "gamma"]
    assert (await get(http, gw, "/v0.1/servers", None))[0] == 401


async def test_a_hidden_upstream_is_not_found_by_name_and_left_out_of_the_versions(
    http: aiohttp.ClientSession, gw: RunningGateway
) -> None:
    assert (await get(http, gw, "/v0.1/servers/beta/versions", READER))[0] == 404
    assert (await get(http, gw, "/v0.1/servers/beta/versions/latest", READER))[0] == 404
    assert (await get(http, gw, "/v0.1/servers/beta/versions", ADMIN))[0] == 200
    assert (await get(http, gw, "/v0.1/servers/aggregate/versions", PLAIN))[0] == 404
    status, versions = await get(http, gw, "/registry/versions", READER)
    assert status == 200 and sorted(versions["upstreams"]) == ["alpha", "gamma"]
    assert sorted((await get(http, gw, "/registry/versions", ADMIN))[1]["upstreams"]) == ["alpha", "beta", "gamma"]
