"""``POST /mcp``: exposed names, and calls reaching the member an exposed name belongs to.

Two processes of ``tests/servers/public_upstream.py`` are members ``a`` and ``b``: every tool,
prompt and resource name is in both, so only the prefix tells them apart. Each upstream records
the requests it gets (``fetch_requests``), which shows which one a call reached, with what body
and which ``Mcp-Name``.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from mcp import Client

from ..support import FakeClock, RunningGateway, StartGateway, StartUpstream, V, header_value, mcp_headers
from ..support.fleet import RecordedRequest, Upstream, fetch_requests
from .conftest import (
    FEATURE_PROMPTS,
    FEATURE_RESOURCES,
    FEATURE_TEMPLATES,
    FEATURE_TOOLS,
    LIST_KEYS,
    agg,
    agg_url,
    aggregate_config,
    count,
    direct_list,
    exposed,
    exposed_uri,
    names,
    post,
    reset,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def gw(
    start_gateway: StartGateway, fake_clock: FakeClock, public_up: Upstream, public_up_b: Upstream
) -> RunningGateway:
    """Members ``a`` (public_up) and ``b`` (public_up_b), an empty cache, a fake clock."""
    await reset(public_up, public_up_b)
    return await start_gateway(aggregate_config({"a": public_up, "b": public_up_b}), clock=fake_clock)


async def calls(up: Upstream, method: str) -> list[RecordedRequest]:
    return [r for r in await fetch_requests(up) if r.method == method]


# -- the official client -----------------------------------------------------------------------------


async def test_the_sdk_client_lists_calls_reads_and_gets_prompts_of_two_members_sharing_names(
    gw: RunningGateway, public_up: Upstream, public_up_b: Upstream
) -> None:
    async with Client(agg_url(gw), mode=V, cache=None) as c:
        tools = await c.list_tools()
        assert [t.name for t in tools.tools] == [exposed(m, n) for m in "ab" for n in FEATURE_TOOLS]
        assert tools.next_cursor is None

        to_a = await c.call_tool(exposed("a", "echo"), {"text": "to a"})
        to_b = await c.call_tool(exposed("b", "echo"), {"text": "to b"})
        added = await c.call_tool(exposed("b", "add"), {"a": 2, "b": 3})
        assert to_a.structured_content == {"result": "to a"}
        assert to_b.structured_content == {"result": "to b"}
        assert added.structured_content == {"result": 5}

        resources = await c.list_resources()
        assert [str(r.uri) for r in resources.resources] == [exposed_uri(m, u) for m in "ab" for u in FEATURE_RESOURCES]
        read = await c.read_resource(exposed_uri("a", "res://hello"))
        assert [(str(x.uri), x.text) for x in read.contents] == [  # type: ignore[union-attr]
            (exposed_uri("a", "res://hello"), "hello world")
        ]
        templates = await c.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == [
            exposed_uri(m, t) for m in "ab" for t in FEATURE_TEMPLATES
        ]
        item = await c.read_resource(exposed_uri("b", "res://items/42"))
        assert [(str(x.uri), x.text) for x in item.contents] == [  # type: ignore[union-attr]
            (exposed_uri("b", "res://items/42"), "item 42")
        ]

        prompts = await c.list_prompts()
        assert [p.name for p in prompts.prompts] == [exposed(m, n) for m in "ab" for n in FEATURE_PROMPTS]
        prompt = await c.get_prompt(exposed("a", "greet"), {"name": "Ada"})
        assert [m.content.text for m in prompt.messages] == ["Hello, Ada!"]  # type: ignore[union-attr]

    def args(records: list[RecordedRequest]) -> list[tuple[str, Any]]:
        return [(r.json()["params"]["name"], r.json()["params"].get("arguments")) for r in records]

    # Each same-named tool reached its own upstream, under its own name.
    assert args(await calls(public_up, "tools/call")) == [("echo", {"text": "to a"})]
    assert args(await calls(public_up_b, "tools/call")) == [("echo", {"text": "to b"}), ("add", {"a": 2, "b": 3})]
    assert args(await calls(public_up, "prompts/get")) == [("greet", {"name": "Ada"})]
    assert await calls(public_up_b, "prompts/get") == []
    assert [r.json()["params"]["uri"] for r in await calls(public_up, "resources/read")] == ["res://hello"]
    assert [r.json()["params"]["uri"] for r in await calls(public_up_b, "resources/read")] == ["res://items/42"]


@pytest.mark.parametrize("method", list(LIST_KEYS))
async def test_every_listed_item_is_the_members_own_but_for_its_prefixed_name_or_mapped_uri(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream, method: str
) -> None:
    key = LIST_KEYS[method]
    reply = await agg(http, gw, method)
    assert reply.status == 200, reply.raw
    expected: list[dict[str, Any]] = []
    for member, up in (("a", public_up), ("b", public_up_b)):
        for item in (await direct_list(http, up, method))[key]:
            item = dict(item)
            if "name" in item and method in ("tools/list", "prompts/list"):
                item["name"] = exposed(member, item["name"])
            if method == "resources/list":
                item["uri"] = exposed_uri(member, item["uri"])
            if method == "resources/templates/list":
                item["uriTemplate"] = exposed_uri(member, item["uriTemplate"])
            expected.append(item)
    assert reply.result[key] == expected
    assert reply.result["resultType"] == "complete"


async def test_a_configured_separator_names_the_tools_and_routes_the_calls(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    await reset(public_up, public_up_b)
    config = aggregate_config({"a": public_up, "b": public_up_b}, {"separator": ".", "upstreams": ["b", "a"]})
    gw = await start_gateway(config)
    listed = await agg(http, gw, "tools/list")
    assert names(listed.result) == [f"{m}.{n}" for m in "ba" for n in FEATURE_TOOLS]  # the order configured
    reply = await agg(http, gw, "tools/call", {"name": "a.echo", "arguments": {"text": "dot"}})
    assert reply.result["structuredContent"] == {"result": "dot"}
    assert [r.json()["params"]["name"] for r in await calls(public_up, "tools/call")] == ["echo"]
    wrong = await agg(http, gw, "tools/call", {"name": "a__echo", "arguments": {"text": "x"}}, id="w")
    assert (wrong.status, wrong.error["code"]) == (400, -32602)
    assert await calls(public_up_b, "tools/call") == []


# -- what the member receives ------------------------------------------------------------------------

#: ``_meta`` with odd whitespace, key order, escapes and number forms: it must reach the member as
#: these very bytes.
ODD_META = (
    b'{ "io.modelcontextprotocol/clientCapabilities" :{ "experimental":{"z":{"b" : 1},"a":{}} } ,\n\t'
    b'"x.test/odd" : [1, 2.50, 1e2, "\\u00e9\\/", {"k":null}],'
    b'"io.modelcontextprotocol/protocolVersion":"2026-07-28" ,'
    b'"io.modelcontextprotocol/clientInfo":{"version":"0.0.1","name":"odd \\"client\\""}   }'
)


def odd_call(name: bytes) -> bytes:
    return (
        b'{"jsonrpc":"2.0", "id" : "odd-1","method":"tools/call","params":{"_meta":'
        + ODD_META
        + b', "name" : "'
        + name
        + b'" ,"arguments":{ "text" : "caf\\u00e9" }}}'
    )


async def test_a_call_reaches_the_member_with_its_own_name_in_body_and_mcp_name_and_the_meta_unchanged(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    reply = await post(http, agg_url(gw), odd_call(b"b__echo"), mcp_headers("tools/call", "b__echo"))
    assert reply.status == 200, reply.raw
    assert reply.json["id"] == "odd-1"
    assert reply.result["structuredContent"] == {"result": "café"}
    assert await calls(public_up, "tools/call") == []
    [call] = await calls(public_up_b, "tools/call")
    assert call.json()["params"]["name"] == "echo"
    assert call.header("mcp-name") == "echo"
    assert ODD_META in call.body  # byte for byte
    assert call.json()["id"] == "odd-1"
    assert call.json()["params"]["arguments"] == {"text": "café"}


async def test_a_call_body_reaches_the_member_with_only_the_name_changed(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    reply = await post(http, agg_url(gw), odd_call(b"a__echo"), mcp_headers("tools/call", "a__echo"))
    assert reply.status == 200, reply.raw
    [call] = await calls(public_up, "tools/call")
    assert call.body == odd_call(b"echo")


async def test_a_prompt_get_reaches_the_member_under_its_own_name(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    reply = await agg(http, gw, "prompts/get", {"name": "b__greet", "arguments": {"name": "Émile"}}, id=4)
    assert reply.status == 200, reply.raw
    assert reply.json["id"] == 4
    assert reply.result["messages"][0]["content"]["text"] == "Hello, Émile!"
    [get] = await calls(public_up_b, "prompts/get")
    assert get.json()["params"]["name"] == "greet"
    assert get.header("mcp-name") == "greet"
    assert await calls(public_up, "prompts/get") == []


@pytest.mark.parametrize(
    ("uri", "text"), [("res://hello", "hello world"), ("res://café", "café ☕"), ("res://items/7", "item 7")]
)
async def test_a_read_of_an_exposed_uri_reaches_the_member_with_its_own_uri_in_body_and_mcp_name(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream, uri: str, text: str
) -> None:
    reply = await agg(http, gw, "resources/read", {"uri": exposed_uri("a", uri)}, id="r")
    assert reply.status == 200, reply.raw
    assert reply.json["id"] == "r"
    # the contents' uri exposed, so that it reads through /mcp again
    assert [(c["uri"], c["text"]) for c in reply.result["contents"]] == [(exposed_uri("a", uri), text)]
    [read] = await calls(public_up, "resources/read")
    assert read.json()["params"]["uri"] == uri
    assert read.header("mcp-name") == header_value(uri)  # the base64 sentinel for res://café
    assert await calls(public_up_b, "resources/read") == []


async def test_a_members_error_for_a_read_is_relayed_as_it_came(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    direct = await agg(http, public_up.url, "resources/read", {"uri": "res://no-such-thing"}, id="nst")
    assert "error" in direct.json, direct.raw
    reply = await agg(http, gw, "resources/read", {"uri": exposed_uri("a", "res://no-such-thing")}, id="nst")
    assert (reply.status, reply.json) == (direct.status, direct.json)
    assert await count(public_up, "resources/read") == 2


async def test_a_read_of_a_uri_listed_in_a_read_reaches_the_member_again(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up_b: Upstream
) -> None:
    first = await agg(http, gw, "resources/read", {"uri": exposed_uri("b", "res://items/9")})
    [content] = first.result["contents"]
    again = await agg(http, gw, "resources/read", {"uri": content["uri"]})
    assert again.status == 200, again.raw
    assert again.result["contents"] == first.result["contents"]


async def test_completion_refs_are_mapped_to_the_members_own_prompt_name_and_template_uri(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    member = await start_upstream()

    async def complete(request: web.Request, msg: Any) -> web.StreamResponse:
        result = {"completion": {"values": ["Ada"], "hasMore": False}, "resultType": "complete"}
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    member.handlers["completion/complete"] = complete
    gw = await start_gateway(aggregate_config({"f": member.url}))
    argument = {"name": "name", "value": "A"}
    refs = [
        ({"type": "ref/prompt", "name": "f__greet"}, {"type": "ref/prompt", "name": "greet"}),
        (
            {"type": "ref/resource", "uri": "mcp-gateway:f/res://items/{item_id}"},
            {"type": "ref/resource", "uri": "res://items/{item_id}"},
        ),
    ]
    for i, (ref, _) in enumerate(refs):
        reply = await agg(http, gw, "completion/complete", {"ref": ref, "argument": argument}, id=i)
        assert reply.status == 200, reply.raw
        assert reply.json["id"] == i
        assert reply.result["completion"]["values"] == ["Ada"]
    received = [json.loads(r.body)["params"] for r in member.requests if r.method == "completion/complete"]
    assert [(p["ref"], p["argument"]) for p in received] == [(member_ref, argument) for _, member_ref in refs]

    for ref in ({"type": "ref/prompt", "name": "greet"}, {"type": "ref/resource", "uri": "res://items/{item_id}"}):
        reply = await agg(http, gw, "completion/complete", {"ref": ref, "argument": argument}, id="bad")
        assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, "bad")
    assert member.count("completion/complete") == 2


# -- one cache for both routes -----------------------------------------------------------------------


async def test_a_list_through_the_member_route_warms_the_aggregate_and_back(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    via_a = await agg(http, gw.url("a"), "tools/list")
    assert via_a.status == 200 and names(via_a.result) == list(FEATURE_TOOLS)
    assert await count(public_up, "tools/list") == 1

    composed = await agg(http, gw, "tools/list")
    assert composed.status == 200
    assert names(composed.result) == [exposed(m, n) for m in "ab" for n in FEATURE_TOOLS]
    assert await count(public_up, "tools/list") == 1  # a: from the entry /servers/a/mcp stored
    assert await count(public_up_b, "tools/list") == 1

    via_b = await agg(http, gw.url("b"), "tools/list")  # b: from the entry /mcp stored
    assert via_b.cache_hit
    assert names(via_b.result) == list(FEATURE_TOOLS)
    assert await count(public_up_b, "tools/list") == 1


async def test_a_read_through_the_aggregate_warms_the_member_route_and_back(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    first = await agg(http, gw, "resources/read", {"uri": exposed_uri("a", "res://hello")})
    assert first.status == 200 and not first.cache_hit
    direct = await agg(http, gw.url("a"), "resources/read", {"uri": "res://hello"})
    assert direct.cache_hit
    assert [{**c, "uri": exposed_uri("a", c["uri"])} for c in direct.result["contents"]] == first.result["contents"]
    assert direct.result["contents"][0]["uri"] == "res://hello"  # the member's own on its own route
    assert await count(public_up, "resources/read") == 1

    await agg(http, gw.url("b"), "resources/read", {"uri": "res://café"})
    again = await agg(http, gw, "resources/read", {"uri": exposed_uri("b", "res://café")})
    assert again.status == 200
    assert again.result["contents"] == [
        {"uri": exposed_uri("b", "res://café"), "mimeType": "text/plain", "text": "café ☕"}
    ]
    assert await count(public_up_b, "resources/read") == 1  # from the entry /servers/b/mcp stored


async def test_a_read_through_the_aggregate_answered_from_the_cache_says_hit(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, fake_clock: FakeClock
) -> None:
    await agg(http, gw.url("a"), "resources/read", {"uri": "res://hello"})
    fake_clock.advance(5)
    warm = await agg(http, gw, "resources/read", {"uri": exposed_uri("a", "res://hello")})
    assert await count(public_up, "resources/read") == 1
    assert warm.cache_hit, warm.cache_status  # as the member's own route says of the same entry
    assert 0 < warm.result["ttlMs"] <= 55_000
    again = await agg(http, gw, "resources/read", {"uri": exposed_uri("a", "res://hello")})
    assert again.cache_hit, again.cache_status
