"""``POST /mcp``: composed lists, from the per-member cache entries, paged by the gateway.

Members: ``public_up`` (``a``, ttlMs 60000), ``public_up_b`` (``b``, ttlMs 30000), ``paged_up``
(``tools/list`` in 3 pages), ``private_up`` (private answers) and scripted upstreams that hang or
fail. Counts and records of the real upstreams show what the gateway asked of them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from mcp import Client
from mcp.shared.exceptions import MCPError

from ..support import FakeClock, RunningGateway, StartGateway, StartUpstream, V, list_result, mcp_headers
from ..support.fleet import Upstream, fetch_counts, fetch_requests, free_port, run_server
from .conftest import (
    A_TTL_MS,
    B_TTL_MS,
    FEATURE_PROMPTS,
    FEATURE_TOOLS,
    LIST_KEYS,
    PAGED_TOOL_CURSORS,
    PAGED_TOOLS,
    agg,
    agg_url,
    aggregate_config,
    count,
    exposed,
    items,
    list_pages,
    names,
    post,
    reset,
)

pytestmark = pytest.mark.timeout(60)

A_AND_B = [exposed(m, n) for m in "ab" for n in FEATURE_TOOLS]


@pytest.fixture
async def gw(
    start_gateway: StartGateway, fake_clock: FakeClock, public_up: Upstream, public_up_b: Upstream
) -> RunningGateway:
    await reset(public_up, public_up_b)
    return await start_gateway(aggregate_config({"a": public_up, "b": public_up_b}), clock=fake_clock)


class restartable_server(run_server):
    """``run_server`` on a given port that a stopped server may just have used (uvicorn binds
    with SO_REUSEADDR; ``run_server`` itself would refuse it as taken)."""

    def __init__(self, script: str, port: int, **kwargs: Any) -> None:
        super().__init__(script, **kwargs)
        self.port = port


# -- warm lists --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(LIST_KEYS))
async def test_a_warm_aggregate_list_makes_no_upstream_request(
    gw: RunningGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    public_up_b: Upstream,
    fake_clock: FakeClock,
    method: str,
) -> None:
    first = await agg(http, gw, method, id="first")
    assert first.status == 200, first.raw
    assert first.json["id"] == "first"
    assert not first.cache_hit
    assert "fwd=miss" in first.cache_params and "detail=composed" in first.cache_params, first.cache_status
    assert first.result["cacheScope"] == "public"
    assert first.result["ttlMs"] == B_TTL_MS  # the least of the parts
    before = (await fetch_counts(public_up), await fetch_counts(public_up_b))
    assert before[0].get(method) == 1 and before[1].get(method) == 1

    fake_clock.advance(10)
    second = await agg(http, gw, method, id="second")
    assert second.status == 200
    assert second.cache_hit, second.cache_status
    assert second.json["id"] == "second"
    assert (await fetch_counts(public_up), await fetch_counts(public_up_b)) == before
    key = LIST_KEYS[method]
    assert second.result[key] == first.result[key]
    assert second.result["cacheScope"] == "public"
    assert 0 < second.result["ttlMs"] <= B_TTL_MS - 10_000  # lowered to the least time left


async def test_a_member_whose_entry_expired_is_asked_again_and_the_others_are_not(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream, fake_clock: FakeClock
) -> None:
    await agg(http, gw, "tools/list")
    fake_clock.advance(B_TTL_MS / 1000 + 0.001)  # b's entry expired, a's has 30 s left
    again = await agg(http, gw, "tools/list")
    assert again.status == 200 and not again.cache_hit
    assert names(again.result) == A_AND_B
    assert await count(public_up_b, "tools/list") == 2
    assert await count(public_up, "tools/list") == 1
    assert 0 < again.result["ttlMs"] <= A_TTL_MS - B_TTL_MS  # a's time left is now the least


async def test_the_sdk_client_sees_a_warm_list_twice_with_one_upstream_request_per_member(
    gw: RunningGateway, public_up: Upstream, public_up_b: Upstream
) -> None:
    async with Client(agg_url(gw), mode=V, cache=None) as c:
        first = await c.list_tools()
        second = await c.list_tools()
    assert [t.name for t in first.tools] == [t.name for t in second.tools] == A_AND_B
    assert await count(public_up, "tools/list") == 1
    assert await count(public_up_b, "tools/list") == 1


async def test_concurrent_cold_aggregate_lists_ask_each_member_once(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    replies = await asyncio.gather(*(agg(http, gw, "prompts/list", id=i) for i in range(12)))
    for i, reply in enumerate(replies):
        assert reply.status == 200, reply.raw
        assert reply.json["id"] == i
        assert names(reply.result, "prompts") == [exposed(m, n) for m in "ab" for n in FEATURE_PROMPTS]
    assert await count(public_up, "prompts/list") == 1
    assert await count(public_up_b, "prompts/list") == 1


# -- the member's request ----------------------------------------------------------------------------

ODD_LIST = (
    b'{ "id" : 77 , "method" : "tools/list", "jsonrpc":"2.0",\n "params" : { "_meta" : {'
    b'"io.modelcontextprotocol/clientCapabilities":{ "experimental" : {"y":{"n" : [1,2.0]}} },\r\n'
    b' "x.test/k" : "\\u00e9" , "io.modelcontextprotocol/protocolVersion" : "2026-07-28" } } }'
)
ODD_LIST_META = (
    b'{"io.modelcontextprotocol/clientCapabilities":{ "experimental" : {"y":{"n" : [1,2.0]}} },\r\n'
    b' "x.test/k" : "\\u00e9" , "io.modelcontextprotocol/protocolVersion" : "2026-07-28" }'
)


async def test_each_member_gets_the_callers_list_request_unchanged(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    reply = await post(http, agg_url(gw), ODD_LIST, mcp_headers("tools/list"))
    assert reply.status == 200, reply.raw
    assert reply.json["id"] == 77
    for up in (public_up, public_up_b):
        [listed] = [r for r in await fetch_requests(up) if r.method == "tools/list"]
        assert ODD_LIST_META in listed.body
        assert listed.body == ODD_LIST  # no cursor to add or remove: the caller's bytes


async def test_a_paged_members_later_pages_are_asked_with_its_cursor_and_the_callers_meta(
    start_gateway: StartGateway, http: aiohttp.ClientSession, paged_up: Upstream
) -> None:
    await reset(paged_up)
    gw = await start_gateway(aggregate_config({"p": paged_up}))
    reply = await post(http, agg_url(gw), ODD_LIST, mcp_headers("tools/list"))
    assert reply.status == 200, reply.raw
    assert names(reply.result) == [exposed("p", n) for n in PAGED_TOOLS]
    pages = [r for r in await fetch_requests(paged_up) if r.method == "tools/list"]
    assert [r.json()["params"].get("cursor") for r in pages] == PAGED_TOOL_CURSORS
    for page in pages:
        assert ODD_LIST_META in page.body
        assert page.header("mcp-method") == "tools/list"


async def test_a_member_asked_again_for_a_later_gateway_page_gets_the_callers_meta_without_the_cursor(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, fake_clock: FakeClock
) -> None:
    await reset(public_up)
    gw = await start_gateway(aggregate_config({"a": public_up}, {"page_size": 2}), clock=fake_clock)
    first = await post(http, agg_url(gw), ODD_LIST, mcp_headers("tools/list"))
    cursor = first.result["nextCursor"]
    fake_clock.advance(A_TTL_MS / 1000 + 1)  # a's entry expired: the next page asks a again
    follow = ODD_LIST.replace(
        b'"params" : { "_meta"', b'"params" : { "cursor" : ' + json.dumps(cursor).encode() + b', "_meta"'
    )
    assert follow != ODD_LIST
    second = await post(http, agg_url(gw), follow, mcp_headers("tools/list"))
    assert second.status == 200, second.raw
    assert names(second.result) == [exposed("a", n) for n in FEATURE_TOOLS[2:4]]
    asked = [r for r in await fetch_requests(public_up) if r.method == "tools/list"]
    assert len(asked) == 2
    assert "cursor" not in asked[1].json()["params"]  # the gateway's cursor is not the member's
    assert ODD_LIST_META in asked[1].body


# -- paging ------------------------------------------------------------------------------------------


@pytest.fixture
async def paged_gw(start_gateway: StartGateway, paged_up: Upstream, public_up: Upstream) -> RunningGateway:
    """Members ``p`` (8 tools in 3 pages) and ``a`` (5 tools in 1 page); pages of 2 items."""
    await reset(paged_up, public_up)
    return await start_gateway(aggregate_config({"p": paged_up, "a": public_up}, {"page_size": 2}))


PAGED_AND_A = [exposed("p", n) for n in PAGED_TOOLS] + [exposed("a", n) for n in FEATURE_TOOLS]


async def test_following_the_gateways_cursors_yields_every_item_of_every_member_page_exactly_once(
    paged_gw: RunningGateway, http: aiohttp.ClientSession, paged_up: Upstream, public_up: Upstream
) -> None:
    pages = await list_pages(http, paged_gw, "tools/list")
    listed = [t["name"] for t in items(pages, "tools/list")]
    assert listed == PAGED_AND_A  # each once, in config order, each member's in its order
    assert [len(p["tools"]) for p in pages] == [2, 2, 2, 2, 2, 2, 1]
    assert all(p["cacheScope"] == "public" and p["ttlMs"] > 0 for p in pages)
    cursors = [r.json()["params"].get("cursor") for r in await fetch_requests(paged_up) if r.method == "tools/list"]
    assert cursors == PAGED_TOOL_CURSORS  # every page of p asked once, then from the cache
    assert await count(public_up, "tools/list") == 1
    # the paged member's items are its own, but for the prefix
    assert items(pages, "tools/list")[0] == {
        "name": "p__paged_1",
        "description": "Tool paged_1 of the paged upstream.",
        "inputSchema": {"type": "object", "properties": {"arg_paged_1": {"type": "string"}}},
    }


async def test_the_sdk_client_follows_the_gateways_cursors_to_every_item_once(
    paged_gw: RunningGateway, paged_up: Upstream
) -> None:
    listed: list[str] = []
    async with Client(agg_url(paged_gw), mode=V, cache=None) as c:
        cursor: str | None = None
        for _ in range(20):
            page = await c.list_tools(cursor=cursor)
            listed += [t.name for t in page.tools]
            cursor = page.next_cursor
            if cursor is None:
                break
    assert listed == PAGED_AND_A


async def test_paged_prompts_are_composed_and_paged_too(
    start_gateway: StartGateway, http: aiohttp.ClientSession, paged_up: Upstream, public_up: Upstream
) -> None:
    await reset(paged_up, public_up)
    gw = await start_gateway(aggregate_config({"a": public_up, "p": paged_up}, {"page_size": 4}))
    pages = await list_pages(http, gw, "prompts/list")
    assert [len(p["prompts"]) for p in pages] == [4, 2]
    assert [p["name"] for p in items(pages, "prompts/list")] == [exposed("a", n) for n in FEATURE_PROMPTS] + [
        exposed("p", f"paged_prompt_{i}") for i in range(1, 6)
    ]


async def test_past_max_member_pages_the_rest_is_left_out_with_ttl_0_and_not_stored(
    start_gateway: StartGateway, http: aiohttp.ClientSession, paged_up: Upstream, public_up: Upstream
) -> None:
    await reset(paged_up, public_up)
    gw = await start_gateway(aggregate_config({"p": paged_up, "a": public_up}, {"max_member_pages": 2}))
    for i in range(2):
        reply = await agg(http, gw, "tools/list", id=i)
        assert reply.status == 200, reply.raw
        assert names(reply.result) == [exposed("p", n) for n in PAGED_TOOLS[:6]] + [
            exposed("a", n) for n in FEATURE_TOOLS
        ]
        assert reply.result["ttlMs"] == 0
        assert "nextCursor" not in reply.result
        assert not reply.cache_hit, reply.cache_status
    cursors = [r.json()["params"].get("cursor") for r in await fetch_requests(paged_up) if r.method == "tools/list"]
    assert "page-3" not in cursors


# -- cursors -----------------------------------------------------------------------------------------


def forged_cursors() -> Iterator[Any]:
    yield "garbage"
    yield ""
    yield "x" * 10_000
    yield "page-2"  # the member's own cursor, not the gateway's
    yield base64.urlsafe_b64encode(json.dumps({"offset": 2}).encode()).decode()
    yield "\u00e9\u0000\ud7ff"
    yield 2
    yield {"offset": 2}
    yield ["a"]
    yield True


@pytest.mark.parametrize("cursor", list(forged_cursors()), ids=lambda c: repr(c)[:24])
async def test_a_cursor_the_gateway_did_not_mint_is_32602_never_500(
    paged_gw: RunningGateway, http: aiohttp.ClientSession, cursor: Any
) -> None:
    reply = await agg(http, paged_gw, "tools/list", {"cursor": cursor}, id="forged")
    assert reply.status == 400, (reply.status, reply.raw)
    assert reply.error["code"] == -32602
    assert reply.json["id"] == "forged"


def tampered(cursor: str) -> Iterator[str]:
    middle = len(cursor) // 2
    swap = "A" if cursor[middle] != "A" else "B"
    yield cursor[:middle] + swap + cursor[middle + 1 :]
    yield cursor + "x"
    yield cursor[:-1]
    yield cursor[::-1]


async def test_a_tampered_gateway_cursor_is_32602(paged_gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    first = await agg(http, paged_gw, "tools/list")
    cursor = first.result["nextCursor"]
    assert isinstance(cursor, str) and cursor
    for bad in tampered(cursor):
        if bad == cursor:
            continue
        reply = await agg(http, paged_gw, "tools/list", {"cursor": bad}, id=3)
        assert (reply.status, reply.error["code"]) == (400, -32602), (bad, reply.raw)
    ok = await agg(http, paged_gw, "tools/list", {"cursor": cursor})  # the real one still works
    assert ok.status == 200
    assert names(ok.result) == PAGED_AND_A[2:4]


async def test_a_cursor_of_one_list_is_32602_on_another(paged_gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    cursor = (await agg(http, paged_gw, "tools/list")).result["nextCursor"]
    reply = await agg(http, paged_gw, "prompts/list", {"cursor": cursor})
    assert (reply.status, reply.error["code"]) == (400, -32602), reply.raw


async def test_the_sdk_client_gets_32602_for_a_forged_cursor(paged_gw: RunningGateway) -> None:
    async with Client(agg_url(paged_gw), mode=V, cache=None) as c:
        with pytest.raises(MCPError) as raised:
            await c.list_tools(cursor="forged-by-the-client")
    assert raised.value.code == -32602


def tools_answer(tools: list[str], ttl_ms: int) -> Any:
    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        result = {
            "tools": [{"name": n, "inputSchema": {"type": "object"}} for n in tools],
            "resultType": "complete",
            "cacheScope": "public",
            "ttlMs": ttl_ms,
        }
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    return answer


async def test_a_cursor_minted_for_a_list_that_has_changed_since_is_32602(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    member = await start_upstream()
    member.handlers["tools/list"] = tools_answer(["t1", "t2", "t3"], 1000)
    gw = await start_gateway(aggregate_config({"f": member.url}, {"page_size": 2}), clock=fake_clock)
    first = await agg(http, gw, "tools/list")
    assert names(first.result) == ["f__t1", "f__t2"]
    cursor = first.result["nextCursor"]

    member.handlers["tools/list"] = tools_answer(["t0", "t1", "t2", "t3"], 1000)  # t0 first: page 2 would repeat t2
    fake_clock.advance(1.5)
    stale = await agg(http, gw, "tools/list", {"cursor": cursor}, id="stale")
    assert (stale.status, stale.error["code"], stale.json["id"]) == (400, -32602, "stale"), stale.raw

    pages = await list_pages(http, gw, "tools/list")  # a walk from the start sees the new list once
    assert [t["name"] for t in items(pages, "tools/list")] == ["f__t0", "f__t1", "f__t2", "f__t3"]


async def test_a_cursor_stays_good_when_the_list_was_fetched_again_unchanged(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    member = await start_upstream()
    member.handlers["tools/list"] = tools_answer(["t1", "t2", "t3"], 1000)
    gw = await start_gateway(aggregate_config({"f": member.url}, {"page_size": 2}), clock=fake_clock)
    cursor = (await agg(http, gw, "tools/list")).result["nextCursor"]
    fake_clock.advance(1.5)  # expired: fetched again, same items
    second = await agg(http, gw, "tools/list", {"cursor": cursor})
    assert second.status == 200, second.raw
    assert names(second.result) == ["f__t3"]
    assert member.count("tools/list") == 2


# -- private members ---------------------------------------------------------------------------------


async def test_a_private_member_makes_the_aggregate_private_and_is_asked_every_time_with_the_callers_context(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, private_up: Upstream
) -> None:
    await reset(public_up, private_up)
    gw = await start_gateway(aggregate_config({"a": public_up, "p": private_up}))
    for i in range(3):
        who = {"io.modelcontextprotocol/clientInfo": {"name": f"caller-{i}", "version": "1"}}
        reply = await agg(http, gw, "tools/list", id=i, meta=who)
        assert reply.status == 200, reply.raw
        assert reply.json["id"] == i
        assert names(reply.result) == [exposed(m, n) for m in ("a", "p") for n in FEATURE_TOOLS]
        assert reply.result["cacheScope"] == "private"
        assert isinstance(reply.result["ttlMs"], int)
        assert not reply.cache_hit, reply.cache_status
    assert await count(private_up, "tools/list") == 3
    assert await count(public_up, "tools/list") == 1
    asked = [r.json()["params"]["_meta"] for r in await fetch_requests(private_up) if r.method == "tools/list"]
    assert [m["io.modelcontextprotocol/clientInfo"]["name"] for m in asked] == ["caller-0", "caller-1", "caller-2"]


# -- members that fail -------------------------------------------------------------------------------


async def test_a_hanging_member_is_left_out_within_its_timeout_with_ttl_0_and_back_when_it_answers(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, public_up: Upstream
) -> None:
    await reset(public_up)
    member = await start_upstream()
    answering = asyncio.Event()  # clear: tools/list hangs (until set, at most 10 s)

    async def tools_list(request: web.Request, msg: Any) -> web.StreamResponse:
        if not answering.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(answering.wait(), 10)
        return web.json_response(list_result(msg["id"]))  # one tool "t", public, ttlMs 60000

    member.handlers["tools/list"] = tools_list
    config = aggregate_config({"a": public_up, "h": {"url": member.url, "timeout_s": 1.0}})
    gw = await start_gateway(config)

    for i in range(2):
        reply = await agg(http, gw, "tools/list", id=i)
        assert reply.status == 200, reply.raw
        assert names(reply.result) == [exposed("a", n) for n in FEATURE_TOOLS]
        assert reply.result["ttlMs"] == 0
        assert 0.9 <= reply.elapsed_s < 3.0  # h's timeout_s, not the 10 s it hangs
        assert "detail=partial" in reply.cache_params, reply.cache_status
        assert not reply.cache_hit
    assert member.count("tools/list") == 2  # not stored: h asked again
    assert await count(public_up, "tools/list") == 1  # a's own entry was stored

    answering.set()
    back = await agg(http, gw, "tools/list", id="back")
    assert back.status == 200
    assert names(back.result) == [exposed("a", n) for n in FEATURE_TOOLS] + ["h__t"]
    assert back.result["ttlMs"] > 0
    assert "detail=composed" in back.cache_params, back.cache_status
    warm = await agg(http, gw, "tools/list", id="warm")
    assert warm.cache_hit and names(warm.result) == names(back.result)
    assert member.count("tools/list") == 3


async def test_a_killed_member_is_left_out_and_back_when_it_is_started_again(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, fake_clock: FakeClock
) -> None:
    await reset(public_up)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    gw = await start_gateway(aggregate_config({"a": public_up, "k": url}), clock=fake_clock)
    with_k = [exposed(m, n) for m in ("a", "k") for n in FEATURE_TOOLS]
    async with restartable_server("public_upstream", port):
        up = await agg(http, gw, "tools/list", id=1)
        assert names(up.result) == with_k
    # killed; once the entries expire the list is fetched again and k refuses
    fake_clock.advance(A_TTL_MS / 1000 + 1)
    down = await agg(http, gw, "tools/list", id=2)
    assert down.status == 200, down.raw
    assert names(down.result) == [exposed("a", n) for n in FEATURE_TOOLS]
    assert down.result["ttlMs"] == 0
    assert "detail=partial" in down.cache_params, down.cache_status
    again = await agg(http, gw, "tools/list", id=3)
    assert not again.cache_hit and again.result["ttlMs"] == 0
    async with restartable_server("public_upstream", port):
        back = await agg(http, gw, "tools/list", id=4)
        assert names(back.result) == with_k
        assert back.result["ttlMs"] > 0


async def test_members_answering_errors_are_left_out(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, public_up: Upstream
) -> None:
    await reset(public_up)
    rpc_error = await start_upstream()
    server_error = await start_upstream()

    async def jsonrpc_error(request: web.Request, msg: Any) -> web.StreamResponse:
        error = {"code": -32603, "message": "broken"}
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "error": error})

    async def http_500(request: web.Request, msg: Any) -> web.StreamResponse:
        return web.Response(status=500, text="oops")

    rpc_error.answer = jsonrpc_error
    server_error.answer = http_500
    gw = await start_gateway(
        aggregate_config(
            {"e": rpc_error.url, "a": public_up, "s": server_error.url, "r": f"http://127.0.0.1:{free_port()}/mcp"}
        )
    )
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 200, reply.raw
    assert names(reply.result) == [exposed("a", n) for n in FEATURE_TOOLS]
    assert reply.result["ttlMs"] == 0
    assert "detail=partial" in reply.cache_params
    assert rpc_error.count("tools/list") == 1 and server_error.count("tools/list") == 1


async def test_when_every_member_fails_the_answer_is_32603_502(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    broken = await start_upstream()

    async def http_500(request: web.Request, msg: Any) -> web.StreamResponse:
        return web.Response(status=500, text="oops")

    broken.answer = http_500
    gw = await start_gateway(aggregate_config({"s": broken.url, "r": f"http://127.0.0.1:{free_port()}/mcp"}))
    reply = await agg(http, gw, "tools/list", id="all-down")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (502, -32603, "all-down"), reply.raw


# -- server/discover ---------------------------------------------------------------------------------


async def test_server_discover_describes_the_gateway_made_of_its_members(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    from importlib.metadata import version

    reply = await agg(http, gw, "server/discover", id="d")
    assert reply.status == 200, reply.raw
    result = reply.result
    assert reply.json["id"] == "d"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"] == {
        "name": "mcp-gateway",
        "version": version("mcp-gateway"),
    }
    assert result["supportedVersions"] == [V]
    caps = result["capabilities"]
    assert caps["tools"]["listChanged"] is True
    assert caps["prompts"]["listChanged"] is True
    assert "resources" in caps and not caps["resources"].get("subscribe")
    assert "a" in result["instructions"] and "b" in result["instructions"]
    assert result["cacheScope"] == "public"
    assert result["ttlMs"] == B_TTL_MS
    warm = await agg(http, gw, "server/discover", id="d2")
    assert warm.status == 200 and warm.json["id"] == "d2"
    assert await count(public_up, "server/discover") == 1
    assert await count(public_up_b, "server/discover") == 1
