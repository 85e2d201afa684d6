"""``POST /mcp`` against odd names and URIs: members' tools named ``""`` or in non-ASCII,
member names that glue into the same exposed name, URIs that name no member or climb with
``..``.

What must hold: every name and URI listed on ``/mcp`` can be called or read, and reaches the one
item it was listed for, in its member's own spelling (``Mcp-Name`` in the base64 form where
needed); an exposed name names one tool, or the config is refused at load time; a URI naming no
member is -32602 and reaches no upstream. Exposed names are ``<member>__<name>``, URIs
``mcp-gateway:<member>/<uri>`` (docs/aggregate.md "Names").
"""

from __future__ import annotations

import base64
import json

import aiohttp
import pytest

from gateway.config import ConfigError

from ..support import StartGateway, StartUpstream
from .conftest import agg, aggregate_config, names
from .scripted import listing, member

pytestmark = pytest.mark.timeout(60)


async def test_every_listed_name_and_uri_can_be_called_or_read(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/aggregate.md "Names": an item nothing could call is left out. A tool named "" (MCP
    # 2026-07-28, server/tools, 'Tool Names': 1-128 characters) and a resource whose uri is "" are
    # either left out or callable: never listed as "a__" or "mcp-gateway:a/" only for a call or
    # read of what was listed to be -32602.
    up = await member(start_upstream, "", "ok")
    up.handlers["resources/list"] = listing(
        "resources", [{"uri": "", "name": "empty"}, {"uri": "res://r", "name": "r"}]
    )
    up.handlers["resources/read"] = listing("contents", [], scope="private")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    for name in names((await agg(http, gw, "tools/list")).result):
        reply = await agg(http, gw, "tools/call", {"name": name, "arguments": {}})
        assert reply.status == 200, (name, reply.raw)
    for item in (await agg(http, gw, "resources/list")).result["resources"]:
        reply = await agg(http, gw, "resources/read", {"uri": item["uri"]})
        assert reply.status == 200, (item, reply.raw)


@pytest.mark.parametrize(
    ("first", "second"),
    [(("a", "_x"), ("a_", "x")), (("a", "b__x"), ("a__b", "x"))],
    ids=["a+_x/a_+x", "a+b__x/a__b+x"],
)
async def test_every_listed_name_is_unique_and_reaches_the_tool_it_was_listed_for(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    first: tuple[str, str],
    second: tuple[str, str],
) -> None:
    # An exposed name names one tool (MCP 2026-07-28, server/tools, 'Tool Names': unique within a
    # server) and a call of a listed name reaches the tool listed under it, or the config is
    # refused. With separator "__", member a's "_x" and member a_'s "x" would both be "a___x"
    # (likewise a's "b__x" and a__b's "x", "a__b__x"), and a call of it reach one member only.
    ups = {m: await member(start_upstream, tool) for m, tool in (first, second)}
    try:
        gw = await start_gateway(aggregate_config({m: up.url for m, up in ups.items()}))
    except ConfigError:
        return  # refused at load time: fine
    listed = names((await agg(http, gw, "tools/list")).result)
    assert len(listed) == len(set(listed)) == 2, listed
    reached = set()
    for name in listed:
        reply = await agg(http, gw, "tools/call", {"name": name, "arguments": {}})
        reached.add((reply.result["content"][0]["text"], tuple(m for m, up in ups.items() if up.count("tools/call"))))
        for up in ups.values():
            up.requests.clear()
    assert reached == {(f"called {first[1]}", (first[0],)), (f"called {second[1]}", (second[0],))}, reached


async def test_a_non_ascii_tool_name_reaches_the_member_in_the_base64_form(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Names needing the =?base64?...?= form of Mcp-Name, and one that looks like that form.
    tricky = ["café", "tab\tin", " lead", "=?base64?eA==?="]
    up = await member(start_upstream, *tricky)
    gw = await start_gateway(aggregate_config({"a": up.url}))
    assert names((await agg(http, gw, "tools/list")).result) == [f"a__{n}" for n in tricky]
    for name in tricky:
        reply = await agg(http, gw, "tools/call", {"name": f"a__{name}", "arguments": {}})
        assert reply.result["content"][0]["text"] == f"called {name}", reply.raw
        sent = up.requests[-1].headers["Mcp-Name"]
        if sent.startswith("=?base64?") and sent.endswith("?="):
            sent = base64.b64decode(sent[9:-2]).decode()
        else:
            assert name.isascii() and name == name.strip() and not name.startswith("=?"), sent
        assert sent == name


@pytest.mark.parametrize(
    "uri",
    [
        "mcp-gateway:a",
        "mcp-gateway:a/",
        "mcp-gateway:/res://x",
        "mcp-gateway:%61/res://x",
        "mcp-gateway:A/res://x",
        "mcp-gateway:other/res://x",  # an upstream of the gateway, but not a member
        "mcp-gateway:a\u0000/res://x",
        "MCP-GATEWAY:a/res://x",
        "res://x",
    ],
)
async def test_a_uri_naming_no_member_is_32602_and_reaches_no_upstream(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, uri: str
) -> None:
    a = await start_upstream()
    other = await start_upstream()
    gw = await start_gateway(aggregate_config({"a": a.url, "other": other.url}, {"upstreams": ["a"]}))
    reply = await agg(http, gw, "resources/read", {"uri": uri}, id="u")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, "u"), reply.raw
    assert not a.requests and not other.requests


async def test_a_uri_with_dot_segments_reaches_its_own_member_unchanged(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # "mcp-gateway:a/../b/x" is member a's URI "../b/x": never member b's.
    a, b = await start_upstream(), await start_upstream()
    for up in (a, b):
        up.handlers["resources/read"] = listing("contents", [], scope="private")
    gw = await start_gateway(aggregate_config({"a": a.url, "b": b.url}))
    reply = await agg(http, gw, "resources/read", {"uri": "mcp-gateway:a/../b/x"})
    assert reply.status == 200, reply.raw
    assert not b.requests
    assert json.loads(a.requests[-1].body)["params"]["uri"] == "../b/x"
    assert a.requests[-1].headers["Mcp-Name"] == "../b/x"
