"""``POST /mcp`` against members that misbehave: they refuse, hang, answer garbage, someone
else's id, an item the gateway cannot write back, cursors that loop, pages that come slowly.

What must hold: the caller always gets a JSON-RPC answer with its own id; a failing member is
left out (``ttlMs`` 0, not stored) and the other members are still answered; a member's part of
one answer is bounded by its own ``timeout_s``; every item is listed once; only when every member
fails is the answer an error (502, ``detail=upstream-error``). Members are scripted
:class:`~tests.support.FakeUpstream` s in this process (:mod:`.scripted`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ..support import StartGateway, StartUpstream
from ..support.fleet import free_port
from .conftest import agg, aggregate_config, list_pages, names
from .scripted import Handler, listing, member, result_of, tools

pytestmark = pytest.mark.timeout(60)


async def refuse_later(request: web.Request, msg: Any) -> web.StreamResponse:
    raise AssertionError("unreachable")  # pragma: no cover - the member URL is a closed port


async def hang(request: web.Request, msg: Any) -> web.StreamResponse:
    await asyncio.sleep(10)
    return web.Response(status=204)  # pragma: no cover


async def not_json_rpc(request: web.Request, msg: Any) -> web.StreamResponse:
    return web.Response(text="<html>oops</html>", content_type="text/html")


async def other_id(request: web.Request, msg: Any) -> web.StreamResponse:
    return web.json_response({"jsonrpc": "2.0", "id": "someone-else", "result": {"contents": []}})


@pytest.mark.parametrize("fault", ["refused", "hang", "not-json-rpc", "other-id"])
async def test_a_read_of_a_failing_member_answers_with_the_callers_id(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fault: str
) -> None:
    # docs/routes.md "Errors": an error the gateway makes on an MCP route carries the request's id,
    # on /mcp as on the per-upstream route: the 502/504 of a read of a failing member says "r1".
    up = await start_upstream()
    up.handlers["resources/read"] = {"hang": hang, "not-json-rpc": not_json_rpc, "other-id": other_id}.get(
        fault, refuse_later
    )
    url = f"http://127.0.0.1:{free_port()}/mcp" if fault == "refused" else up.url
    gw = await start_gateway(aggregate_config({"d": {"url": url, "timeout_s": 0.5}}))
    reply = await agg(http, gw, "resources/read", {"uri": "mcp-gateway:d/res://x"}, id="r1")
    assert reply.status in (502, 504), reply.raw
    assert reply.error["code"] == -32603
    assert reply.json.get("id") == "r1", reply.raw
    # and, as on /servers/d/mcp, Cache-Status says forwarding failed (not detail=rejected)
    assert "detail=upstream-error" in reply.cache_params, reply.cache_status


async def test_when_every_member_fails_the_502_says_upstream_error(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    # docs/cache.md "Cache-Status": "detail=rejected" is the gateway refusing a request itself (a
    # 4xx, or 503); "fwd=...; detail=upstream-error" is forwarding failing (502, 504).
    gw = await start_gateway(aggregate_config({"d": f"http://127.0.0.1:{free_port()}/mcp"}))
    reply = await agg(http, gw, "tools/list", id="l1")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (502, -32603, "l1"), reply.raw
    assert "detail=upstream-error" in reply.cache_params, reply.cache_status


def unwritable(kind: str) -> Handler:
    """A public tools/list of one tool whose inputSchema JSON cannot be written back by the
    gateway: a number beyond the float range (RFC 8259 allows it), or nesting ~1000 deep."""
    schema = (
        '{"type":"object","properties":{"n":{"type":"number","maximum":1e400}}}'
        if kind == "1e400"
        else '{"type":"object","x":' + "[" * 1000 + "]" * 1000 + "}"
    )

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        text = (
            f'{{"jsonrpc":"2.0","id":{json.dumps(msg["id"])},"result":{{"tools":[{{"name":"odd","inputSchema":'
            f'{schema}}}],"resultType":"complete","cacheScope":"public","ttlMs":60000}}}}'
        )
        return web.Response(text=text, content_type="application/json")

    return handler


@pytest.mark.parametrize("kind", ["1e400", "deep"])
async def test_a_member_item_that_cannot_be_written_back_does_not_fail_the_whole_list(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, kind: str
) -> None:
    # docs/aggregate.md "Lists": a member whose list cannot be written back as JSON is left out,
    # not the whole answer: one member must not take every other member's tools away. Its own
    # route relays its list unchanged.
    good = await member(start_upstream, "ok")
    bad = await start_upstream()
    bad.handlers["tools/list"] = unwritable(kind)
    gw = await start_gateway(aggregate_config({"g": good.url, "b": bad.url}))
    own_route = await agg(http, gw.url("b"), "tools/list")
    assert own_route.status == 200, own_route.raw[:200]  # the member's own route serves it
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 200, reply.raw[:300]
    assert "g__ok" in names(reply.result)


def cycling(pages: dict[str | None, tuple[str, str]]) -> Handler:
    """tools/list: cursor -> (its one tool, the nextCursor it answers)."""

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        tool, next_cursor = pages[msg["params"].get("cursor")]
        result = {"tools": [{"name": tool, "inputSchema": {}}], "nextCursor": next_cursor}
        return result_of(msg, {**result, "resultType": "complete", "cacheScope": "public", "ttlMs": 60_000})

    return handler


@pytest.mark.parametrize(
    "pages",
    [
        {None: ("t0", "again"), "again": ("t1", "again")},
        {None: ("t0", "c1"), "c1": ("t1", "c2"), "c2": ("t2", "c1")},
    ],
    ids=["same-cursor", "two-cycle"],
)
async def test_a_member_whose_cursors_repeat_has_each_item_listed_once(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    pages: dict[str | None, tuple[str, str]],
) -> None:
    # docs/aggregate.md "Lists": every item exactly once. A cursor a member already gave in this
    # walk ends that member's pages (a loop; a partial answer, ttlMs 0, is fine), rather than
    # being followed max_member_pages times, listing the same tools over and over.
    up = await start_upstream()
    up.handlers["tools/list"] = cycling(pages)
    gw = await start_gateway(aggregate_config({"a": up.url}))
    listed = [n for page in await list_pages(http, gw, "tools/list") for n in names(page)]
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == {f"a__{tool}" for tool, _ in pages.values()}


async def test_a_slow_paged_member_does_not_hold_the_answer_past_its_timeout(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/aggregate.md "Lists": all of one member's pages come within its timeout_s, else it is
    # left out. A timeout per page would let a member answering each page in 0.15 s with one more
    # cursor hold every /mcp list for max_member_pages x 0.15 s = 3 s here (20 x 30 s = 10 min with
    # the defaults), and such an answer is partial, not stored: every request would wait again.
    good = await member(start_upstream, "ok")
    slow = await start_upstream()
    served = 0

    async def page(request: web.Request, msg: Any) -> web.StreamResponse:
        nonlocal served
        served += 1
        await asyncio.sleep(0.15)
        tool = {"name": f"t{served}", "inputSchema": {}}
        return result_of(
            msg,
            {
                "tools": [tool],
                "nextCursor": f"c{served}",
                "resultType": "complete",
                "cacheScope": "private",
                "ttlMs": 60_000,
            },
        )

    slow.handlers["tools/list"] = page
    gw = await start_gateway(aggregate_config({"g": good.url, "s": {"url": slow.url, "timeout_s": 0.5}}))
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 200 and "g__ok" in names(reply.result)
    assert reply.elapsed_s < 1.5, f"answered after {reply.elapsed_s:.1f} s; s's timeout_s is 0.5 s"


async def wrong_id(request: web.Request, msg: Any) -> web.StreamResponse:
    return await tools("x")(request, {**msg, "id": "not-yours"})


async def redirect(request: web.Request, msg: Any) -> web.StreamResponse:
    return web.Response(status=307, headers={"Location": "http://127.0.0.1:1/mcp"})


async def string_id(request: web.Request, msg: Any) -> web.StreamResponse:
    return await tools("x")(request, {**msg, "id": str(msg["id"])})  # "1" is not 1


async def result_not_object(request: web.Request, msg: Any) -> web.StreamResponse:
    return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": [1, 2]})


async def http_500_with_result(request: web.Request, msg: Any) -> web.StreamResponse:
    response = await tools("x")(request, msg)
    response.set_status(500)
    return response


async def sse_after_noise(request: web.Request, msg: Any) -> web.StreamResponse:
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    await out.write(b": comment\n\ndata: not json\n\n")
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    other = {"jsonrpc": "2.0", "id": "someone-else", "result": {"tools": [{"name": "stolen"}]}}
    for msg_ in (note, other):
        await out.write(b"event: message\ndata: " + json.dumps(msg_).encode() + b"\n\n")
    result = {"tools": [{"name": "x"}], "resultType": "complete", "cacheScope": "public", "ttlMs": 60_000}
    final = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
    await out.write(b"event: message\r\ndata: " + final[:10] + b"\r\n" + b"data: " + final[10:] + b"\r\n\r\n")
    await out.write_eof()
    return out


async def odd_items(request: web.Request, msg: Any) -> web.StreamResponse:
    items = [{"name": 5}, {"name": None}, "x", None, [], {"title": "no name"}, {"name": "x"}, {"name": ["y"]}]
    return await listing("tools", items)(request, msg)


async def huge(request: web.Request, msg: Any) -> web.StreamResponse:
    return await tools(*(f"t{i:06d}" + "x" * 100 for i in range(2000)))(request, msg)  # ~250 KB


@pytest.mark.parametrize(
    ("fault", "listed"),
    [
        (wrong_id, []),
        (redirect, []),
        (string_id, []),
        (result_not_object, []),
        (http_500_with_result, []),
        (sse_after_noise, ["f__x"]),
        (odd_items, ["f__x"]),
        (huge, []),
    ],
    ids=lambda v: getattr(v, "__name__", None) or repr(v),
)
async def test_a_misbehaving_member_is_left_out_or_read_right_and_the_rest_still_answered(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    fault: Handler,
    listed: list[str],
) -> None:
    good = await member(start_upstream, "ok")
    bad = await start_upstream()
    bad.handlers["tools/list"] = fault
    config = aggregate_config({"g": good.url, "f": {"url": bad.url, "max_response_bytes": 100_000}})
    gw = await start_gateway(config)
    for _ in range(2):
        reply = await agg(http, gw, "tools/list")
        assert reply.status == 200, reply.raw
        assert names(reply.result) == ["g__ok", *listed]
        assert (reply.result["ttlMs"] == 0) == (not listed), reply.result  # left out: ttlMs 0
