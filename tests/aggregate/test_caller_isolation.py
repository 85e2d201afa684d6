"""``POST /mcp`` against leaks from one caller to another through the composed cache: members
whose public answers depend on the caller's capabilities or ``Authorization``, a private member,
and one caller's cursor replayed by another.

What must hold: a composed list or read goes only to callers whose members' answers would be the
same: beyond the method and params (MCP 2026-07-28, server/utilities/caching, 'Cache Key'), its
key covers the caller's ``clientCapabilities`` and, with ``forward_authorization``, its
``Authorization`` (docs/cache.md "What is stored"); a private part is asked of its member for every
caller and never stored; a cursor of one caller's private list names no page of another's.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ..support import StartGateway, StartUpstream
from .conftest import agg, aggregate_config, list_pages, names
from .scripted import member, result_of, tools

pytestmark = pytest.mark.timeout(60)


async def test_callers_with_other_client_capabilities_never_get_each_others_composed_list(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # The member answers by the caller's capabilities (public, so every answer is stored, and the
    # composed one too): each caller gets its own, from the cache the second time.
    up = await start_upstream()

    async def by_caps(request: web.Request, msg: Any) -> web.StreamResponse:
        caps = msg["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
        tool = "with_elicitation" if "elicitation" in caps else "plain"
        return await tools(tool)(request, msg)

    up.handlers["tools/list"] = by_caps
    gw = await start_gateway(aggregate_config({"m": up.url}))
    elicit: dict[str, Any] = {"elicitation": {"form": {}}}
    for _ in range(2):
        for caps, tool in (({}, "m__plain"), (elicit, "m__with_elicitation")):
            reply = await agg(http, gw, "tools/list", caps=caps)
            assert names(reply.result) == [tool], (caps, reply.raw)
    assert up.count("tools/list") == 2  # one per capability set; the rest from the cache
    second = await agg(http, gw, "tools/list", caps=elicit)
    assert second.cache_hit


async def test_callers_with_other_authorization_never_get_each_others_answers(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # forward_authorization, no [auth]: the member's public answers depend on who asks; neither a
    # composed list nor a composed read may go to another caller (nor to one without the header).
    up = await start_upstream()

    def who(request: web.Request) -> str:
        return request.headers.get("Authorization", "nobody").replace(" ", "_")

    async def tools_by_caller(request: web.Request, msg: Any) -> web.StreamResponse:
        return await tools(f"for_{who(request)}")(request, msg)

    async def read_by_caller(request: web.Request, msg: Any) -> web.StreamResponse:
        contents = [{"uri": msg["params"]["uri"], "text": who(request)}]
        return result_of(msg, {"contents": contents, "resultType": "complete", "cacheScope": "public", "ttlMs": 60_000})

    up.handlers["tools/list"] = tools_by_caller
    up.handlers["resources/read"] = read_by_caller
    gw = await start_gateway(aggregate_config({"m": {"url": up.url, "forward_authorization": True}}))
    callers = [{"Authorization": "Bearer alice"}, {"Authorization": "Bearer bob"}, {}]
    for _ in range(2):
        for headers in callers:
            expect = headers.get("Authorization", "nobody").replace(" ", "_")
            listed = await agg(http, gw, "tools/list", headers=headers)
            assert names(listed.result) == [f"m__for_{expect}"], listed.raw
            read = await agg(http, gw, "resources/read", {"uri": "mcp-gateway:m/res://me"}, headers=headers)
            assert read.result["contents"][0]["text"] == expect, read.raw
    assert up.count("tools/list") == up.count("resources/read") == 3  # once per caller, then stored


async def test_a_private_members_answer_is_never_stored_nor_given_to_another_caller(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    pub = await member(start_upstream, "shared")
    priv = await start_upstream()

    async def by_client(request: web.Request, msg: Any) -> web.StreamResponse:
        name = msg["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]["name"]
        return await tools(f"mine_{name}", scope="private")(request, msg)

    priv.handlers["tools/list"] = by_client
    gw = await start_gateway(aggregate_config({"p": pub.url, "q": priv.url}, {"page_size": 1}))
    for caller in ("alice", "bob", "alice"):
        meta = {"io.modelcontextprotocol/clientInfo": {"name": caller, "version": "1"}}
        pages = await list_pages(http, gw, "tools/list", meta=meta)
        assert [n for p in pages for n in names(p)] == ["p__shared", f"q__mine_{caller}"]
        assert all(p["cacheScope"] == "private" for p in pages)
    assert priv.count("tools/list") == 6  # asked for each page of each walk: never stored
    assert pub.count("tools/list") == 1
    # alice's cursor of her private list names no page of bob's (their lists differ)
    alice = {"io.modelcontextprotocol/clientInfo": {"name": "alice", "version": "1"}}
    cursor = (await agg(http, gw, "tools/list", meta=alice)).result["nextCursor"]
    bob = {"io.modelcontextprotocol/clientInfo": {"name": "bob", "version": "1"}}
    stolen = await agg(http, gw, "tools/list", {"cursor": cursor}, meta=bob, id="b")
    assert (stolen.status, stolen.error["code"], stolen.json["id"]) == (400, -32602, "b"), stolen.raw
    assert b"alice" not in stolen.raw
