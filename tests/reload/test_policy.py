"""A reload that changes ``[[policy.rules]]`` applies from the next request, on every route: what a
caller was shown under the old rules is never shown to it under the new ones, even where the
rules keep their places in the file (one ``mcp-gateway serve`` process, ``SIGHUP``)."""

from __future__ import annotations

import asyncio
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


async def test_a_reload_that_changes_the_rules_ends_the_open_listen_streams(
    tmp_path: Path, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    # A stream was authorized under the old rules: it ends, and its client listens again under the new ones.
    async with gateway(tmp_path, config(changing_up, ["add"])) as gw:
        body = orjson.dumps(rpc("subscriptions/listen", notifications={"toolsListChanged": True}))
        headers = {**mcp_headers("subscriptions/listen"), "Authorization": f"Bearer {READER}"}
        streams = [
            await http.post(url, data=body, headers=headers) for url in (gw.url(0, "a"), f"{gw.base_url(0)}/mcp")
        ]
        try:
            for resp in streams:
                assert resp.status == 200
                assert b"acknowledged" in await resp.content.readuntil(b"\n\n")
            await sighup(gw, rewrite(gw, config(changing_up, ["echo"])))
            async with asyncio.timeout(10):
                for resp in streams:
                    while await resp.content.readany():  # until each stream ends
                        pass
        finally:
            for resp in streams:
                resp.close()
