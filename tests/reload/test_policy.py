"""A reload that changes ``[[policy.rules]]`` applies from the next request, on every route: what a
caller was shown under the old rules is never shown to it under the new ones, even where the
rules keep their places in the file (one ``mcp-gateway serve`` process, ``SIGHUP``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from ..support.fleet import Upstream
from ..support.reloading import gateway, public, rewrite, sighup
from ..support.wire import mcp_headers, rpc

pytestmark = pytest.mark.timeout(60)

READER = "reader-token-0123456789"


def config(up: Upstream, tools: list[str]) -> dict[str, Any]:
    return {
        "auth": {"static": [{"token": READER, "subject": "reader", "scopes": ["mcp:read"]}]},
        "registry": {"enabled": False},
        "upstreams": {"a": public(up)},
        "aggregate": {},
        "policy": {"rules": [{"name": "read", "scopes": ["mcp:read"], "tools": tools}]},
    }


async def tool_names(http: aiohttp.ClientSession, url: str) -> list[str]:
    headers = {**mcp_headers("tools/list"), "Authorization": f"Bearer {READER}"}
    async with http.post(url, data=orjson.dumps(rpc("tools/list")), headers=headers) as resp:
        assert resp.status == 200
        return [tool["name"] for tool in orjson.loads(await resp.read())["result"]["tools"]]


async def test_new_rules_apply_to_the_lists_kept_under_the_old_ones(
    tmp_path: Path, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    async with gateway(tmp_path, config(public_up, ["add"])) as gw:
        routes = (gw.url(0, "a"), f"{gw.base_url(0)}/mcp")
        assert [await tool_names(http, url) for url in routes] == [["add"], ["a__add"]]
        await sighup(gw, rewrite(gw, config(public_up, ["echo"])))
        assert [await tool_names(http, url) for url in routes] == [["echo"], ["a__echo"]]
