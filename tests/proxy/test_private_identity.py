"""``[cache] private_per_identity``, through a real gateway in front of the real SDK upstream whose
answers are all ``private`` (``tests/servers/private_upstream.py``), with ``[[auth.static]]``
callers: each caller's private answer is its own, and answers it again from the cache."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest

from gateway.app import STORE

from ..support import RunningGateway, StartGateway, mcp_headers, rpc
from ..support.fleet import Upstream, fetch_counts, reset_counts

pytestmark = pytest.mark.timeout(60)

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789abc"


def config(up: Upstream, *, private_per_identity: bool = True, **more: Any) -> dict[str, Any]:
    return {
        "auth": {
            "static": [
                {"token": ALICE, "subject": "alice", "scopes": ["mcp:read"]},
                {"token": BOB, "subject": "bob", "scopes": ["mcp:read"]},
            ]
        },
        "cache": {"private_per_identity": private_per_identity},
        "upstreams": {"priv": {"url": up.url}},
        **more,
    }


async def tools_list(http: aiohttp.ClientSession, gw: RunningGateway, token: str) -> tuple[dict[str, Any], str]:
    headers = {**mcp_headers("tools/list"), "Authorization": f"Bearer {token}"}
    async with http.post(gw.url("priv"), data=orjson.dumps(rpc("tools/list")), headers=headers) as resp:
        assert resp.status == 200
        return orjson.loads(await resp.read()), resp.headers["Cache-Status"]


async def test_the_same_caller_gets_its_private_answer_from_the_cache_and_another_caller_never_does(
    http: aiohttp.ClientSession, start_gateway: StartGateway, private_up: Upstream
) -> None:
    await reset_counts(private_up)
    gw = await start_gateway(config(private_up))
    first, status = await tools_list(http, gw, ALICE)
    assert "fwd=miss" in status and "stored" in status and "detail=private" in status
    again, status = await tools_list(http, gw, ALICE)
    assert status.startswith("mcp-gateway; hit")
    assert again["result"]["tools"] == first["result"]["tools"] and again["result"]["cacheScope"] == "private"
    assert (await fetch_counts(private_up)).get("tools/list") == 1
    _, status = await tools_list(http, gw, BOB)
    assert "fwd=miss" in status  # never Alice's
    assert (await fetch_counts(private_up)).get("tools/list") == 2
    _, status = await tools_list(http, gw, BOB)
    assert status.startswith("mcp-gateway; hit")
    assert (await fetch_counts(private_up)).get("tools/list") == 2
    private = [k for k in gw.app[STORE].keys() if k.method == "tools/list"]
    assert len(private) == 2 and len({k.authorization for k in private}) == 2
