"""``POST /mcp`` attacked: a hostile caller, and hostile or faulty members (issue 14, issue 17's
threat model).

Every member here is a scripted :class:`~tests.support.FakeUpstream` in this process, so that
each test is quick and says exactly what the member answers. The tests under "defects" (D1-D8)
reproduce defects found so: each says what should happen and fails until it does. The tests
under "attacks that held" pin what resisted (regression tests). The memory tests read this
process's RSS from /proc (Linux): the gateway runs in-process.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.app import STORE
from gateway.config import ConfigError

from ..support import FakeUpstream, StartGateway, StartUpstream, V, mcp_headers
from ..support.fleet import free_port
from .conftest import agg, agg_url, aggregate_config, body_of, list_pages, names, post

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[web.Request, Any], Awaitable[web.StreamResponse]]


def result_of(msg: Any, result: dict[str, Any]) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": result})


def listing(field: str, items: list[Any], *, ttl_ms: int = 60_000, scope: str = "public", **more: Any) -> Handler:
    """A handler answering one page of ``items`` under ``field`` (``tools``, ...)."""

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        result = {field: items, "resultType": "complete", "cacheScope": scope, "ttlMs": ttl_ms, **more}
        return result_of(msg, result)

    return handler


def tools(*tool_names: str, **kw: Any) -> Handler:
    return listing("tools", [{"name": n, "inputSchema": {"type": "object"}} for n in tool_names], **kw)


async def called(request: web.Request, msg: Any) -> web.StreamResponse:
    """``tools/call``: says which tool it was asked for."""
    text = f"called {msg['params']['name']}"
    return result_of(msg, {"content": [{"type": "text", "text": text}], "resultType": "complete"})


async def member(start_upstream: StartUpstream, *tool_names: str) -> FakeUpstream:
    up = await start_upstream()
    up.handlers["tools/list"] = tools(*tool_names)
    up.handlers["tools/call"] = called
    return up


def raw_call(name: str, *, arguments: str = "{}", request_id: str = '"c1"') -> bytes:
    """A compact ``tools/call`` body with ``arguments`` as raw JSON text."""
    meta = json.dumps(
        {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}},
        separators=(",", ":"),
    )
    return (
        f'{{"jsonrpc":"2.0","id":{request_id},"method":"tools/call","params":'
        f'{{"name":{json.dumps(name)},"arguments":{arguments},"_meta":{meta}}}}}'
    ).encode()


# == defects ======================================================================================
# Each test below fails on the code as it is; its comment says what should happen instead.

# -- D1: a read through /mcp of a failing member loses the caller's id -----------------------------


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
    # Expected (docs/routes.md "Routes": errors the gateway makes on an MCP route carry the request's id;
    # the per-upstream route does): the 502/504 of a read through /mcp says "id": "r1". Today
    # gateway/aggregate/parts.py raises the member's BadGateway/GatewayTimeout (made in
    # upstream.open / fetch_answer without an id) straight out of Aggregate.read: "id" is missing.
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
    # and, as on /servers/d/mcp, Cache-Status says forwarding failed (today: detail=rejected)
    assert "detail=upstream-error" in reply.cache_params, reply.cache_status


# -- D2: one member's item that cannot be written back fails the whole list ---------------------


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
    # Expected (docs/aggregate.md "Partial outage"; issue 14: one upstream must not remove every tool): the
    # other members are still answered (the odd member, or its item, left out). Today
    # Aggregate._page raises BadGateway for the whole answer ("a member's list cannot be written
    # back as JSON", 502), on every request, while /servers/b/mcp relays b's list fine.
    good = await member(start_upstream, "ok")
    bad = await start_upstream()
    bad.handlers["tools/list"] = unwritable(kind)
    gw = await start_gateway(aggregate_config({"g": good.url, "b": bad.url}))
    own_route = await agg(http, gw.url("b"), "tools/list")
    assert own_route.status == 200, own_route.raw[:200]  # the member's own route serves it
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 200, reply.raw[:300]
    assert "g__ok" in names(reply.result)


# -- D3: a member whose cursors repeat is listed over and over ------------------------------------


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
    # Expected (issue 14: "every item exactly once"): a cursor a member already gave in this walk
    # ends that member's pages (it is a loop; partial, ttlMs 0, is fine). Today the gateway
    # follows it max_member_pages (20) times and lists the same tools 10-19 times over.
    up = await start_upstream()
    up.handlers["tools/list"] = cycling(pages)
    gw = await start_gateway(aggregate_config({"a": up.url}))
    listed = [n for page in await list_pages(http, gw, "tools/list") for n in names(page)]
    assert len(listed) == len(set(listed)), listed
    assert set(listed) == {f"a__{tool}" for tool, _ in pages.values()}


# -- D4: a slow paged member holds the answer past its timeout_s -----------------------------------


async def test_a_slow_paged_member_does_not_hold_the_answer_past_its_timeout(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Expected (docs/aggregate.md "Partial outage": a member not answering within its own timeout_s is left
    # out and the rest answered): a member's whole part of one answer, all its pages, is bounded
    # by its timeout_s. Today each page gets its own timeout_s, one after the other: a member that
    # answers every page in 0.15 s with one more cursor holds every /mcp list for
    # max_member_pages x 0.15 s = 3 s here (20 x 30 s = 10 min with the defaults); such an answer is
    # partial, so not stored, and every request waits again.
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


# -- D5: items listed that nothing can call or read --------------------------------------------


async def test_every_listed_name_and_uri_can_be_called_or_read(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Expected (docs/aggregate.md "Names": an item nothing could call is left out): a tool named "" (MCP:
    # names are 1-128 characters) and a resource whose uri is "" are either left out or callable.
    # Today they are listed as "a__" and "mcp-gateway:a/", and a call or read of what was listed
    # is -32602 ("names nothing served on /mcp").
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


# -- D6: composed answers larger than cache.max_entry_bytes are stored ----------------------------


async def test_a_composed_answer_over_max_entry_bytes_is_not_stored(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/configuration.md: cache.max_entry_bytes, "larger results are forwarded, not stored". Each member's
    # page (~6.4 KB) fits 8000 bytes and is stored; the composed page of both (~12.7 KB) does not
    # fit, yet Aggregate._store stores it (only cache.max_bytes is checked).
    a = await member(start_upstream, *[f"a{i}" + "x" * 1000 for i in range(6)])
    b = await member(start_upstream, *[f"b{i}" + "x" * 1000 for i in range(6)])
    gw = await start_gateway(aggregate_config({"a": a.url, "b": b.url}, cache={"max_entry_bytes": 8000}))
    first = await agg(http, gw, "tools/list")
    assert first.status == 200 and len(first.raw) > 8000
    assert "stored" not in first.cache_params, first.cache_status
    second = await agg(http, gw, "tools/list")  # composed again, from the member entries alone
    assert "detail=composed" in second.cache_params, second.cache_status


# -- D7: memory of one /mcp list is max_member_pages x max_response_bytes, parsed -------------------


def peak_rss_reset() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set size
            f.write("5")
    except OSError as exc:
        pytest.skip(f"cannot reset the peak RSS here: {exc}")


def peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_one_aggregate_list_does_not_hold_max_member_pages_of_parsed_pages(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Expected (issue 17: memory bounded by the configured figures): one /mcp request holds a
    # bounded amount, of the order of a member's max_response_bytes (2 MB here). Today it reads
    # every page of a member up to max_member_pages (20) and keeps them all parsed until it has
    # composed: a member answering 0.95 MB pages, each with one more cursor, makes one /mcp list
    # raise the process's peak RSS by ~240 MB (~12x the 19 MB read). With the
    # defaults (16 MiB, 20 pages) that is gigabytes per request, per member, times the callers.
    up = await start_upstream()
    tool = {"name": "t", "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}}}}
    page = json.dumps([{**tool, "name": f"t{i}"} for i in range(10_000)]).encode()
    served = 0

    async def pages(request: web.Request, msg: Any) -> web.StreamResponse:
        nonlocal served
        served += 1
        tail = {"nextCursor": f"c{served}", "resultType": "complete", "cacheScope": "private", "ttlMs": 1}
        head = b'{"jsonrpc":"2.0","id":' + json.dumps(msg["id"]).encode() + b',"result":{"tools":'
        return web.Response(
            body=head + page + b"," + json.dumps(tail).encode()[1:] + b"}", content_type="application/json"
        )

    up.handlers["tools/list"] = pages
    gw = await start_gateway(aggregate_config({"a": {"url": up.url, "max_response_bytes": 2_000_000}}))
    peak_rss_reset()
    before = peak_rss_mb()
    reply = await agg(http, gw, "tools/list")
    grown = peak_rss_mb() - before
    assert reply.status == 200
    assert grown < 80, f"one /mcp list of {served} pages of {len(page) / 1e6:.1f} MB: peak RSS +{grown:.0f} MB"


# -- D8: a listen stream holds its whole request for as long as it is open -----------------------


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def open_listen(url: str, body: bytes) -> tuple[asyncio.StreamWriter, bytes]:
    """A listen request on a raw connection (the client keeps nothing but the socket), read up to
    its acknowledgement or error."""
    u = URL(url)
    assert u.host is not None and u.port is not None
    reader, writer = await asyncio.open_connection(u.host, u.port)
    head = [f"POST {u.path} HTTP/1.1", f"Host: {u.host}:{u.port}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in mcp_headers("subscriptions/listen").items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    got = b""
    async with asyncio.timeout(10):
        while b"acknowledged" not in got and b"error" not in got and (chunk := await reader.read(65536)):
            got += chunk
    return writer, got


async def test_an_open_listen_stream_does_not_hold_its_request_body(
    start_gateway: StartGateway, start_upstream: StartUpstream
) -> None:
    # Expected (issue 17: memory held per long-lived caller bounded): an open listen stream keeps
    # what it needs (its id and flags), not its request; or a large listen request is refused.
    # Today each stream holds its body (Exchange.body, the parsed params, aiohttp's own copy) for
    # as long as it is open: 20 streams of 3 MB bodies hold ~120 MB; max_listen_streams (1024) x
    # max_body_bytes (4 MiB) lets one caller pin ~8 GB, and keep it with no more traffic than
    # reading the keep-alives.
    up = await start_upstream()
    gw = await start_gateway(aggregate_config({"a": up.url}))
    notifications = {"notifications": {"toolsListChanged": True}}
    before = rss_mb()
    writers = []
    try:
        for i in range(20):
            body = json.dumps(body_of("subscriptions/listen", {**notifications, "pad": "x" * 3_000_000}, id=i))
            writer, got = await open_listen(agg_url(gw), body.encode())
            writers.append(writer)
            status = int(got.split(b" ", 2)[1])
            assert status == 200 or 400 <= status < 500, got[:300]  # served, or refused as too large
        grown = rss_mb() - before
    finally:
        for writer in writers:
            writer.close()
    assert grown < 25, f"20 open listen streams of 3 MB requests hold {grown:.0f} MB"


# == attacks that held (regression tests) ==========================================================


# -- failing members ------------------------------------------------------------------------------


async def test_when_every_member_fails_the_502_says_upstream_error(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    # docs/cache.md: "detail=rejected" is the gateway refusing a request itself (a 4xx, or 503);
    # "fwd=...; detail=upstream-error" is forwarding failing (502, 504). (It said detail=rejected
    # before c83461c.)
    gw = await start_gateway(aggregate_config({"d": f"http://127.0.0.1:{free_port()}/mcp"}))
    reply = await agg(http, gw, "tools/list", id="l1")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (502, -32603, "l1"), reply.raw
    assert "detail=upstream-error" in reply.cache_params, reply.cache_status


# -- cross-caller leaks through the composed cache --------------------------------------------------


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


# -- two members' items under one exposed name (a config error since c83461c) -----------------------


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
    # An exposed name names one tool (MCP: tool names are unique within a server) and a call of a
    # listed name reaches the tool listed under it, or the config is refused. Before c83461c
    # member a's "_x" and member a_'s "x" were both listed as "a___x" (separator "__"; likewise
    # a's "b__x" and a__b's "x" as "a__b__x"), and a call of it reached the longer member only.
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


# -- cursors ----------------------------------------------------------------------------------------


def respelled(cursor: str, page: int | None = None, version: int | None = None, pad: bool = False) -> str:
    raw = bytearray(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    if page is not None:
        raw[1:5] = page.to_bytes(4, "big")
    if version is not None:
        raw[0] = version
    text = base64.urlsafe_b64encode(bytes(raw)).decode()
    return text if pad else text.rstrip("=")


@pytest.mark.parametrize(
    "forge",
    [
        lambda c: respelled(c, page=2**32 - 1),
        lambda c: respelled(c, page=3),  # just past the end
        lambda c: respelled(c, version=2),
        lambda c: respelled(c, pad=True),
        lambda c: base64.b64encode(base64.urlsafe_b64decode(c + "=" * (-len(c) % 4))).decode(),
        lambda c: c + "=",
        lambda c: c.upper(),
        lambda c: None,
        lambda c: "A" * 5000,  # a key over 4 KiB of params
        lambda c: c + "\u0000",
    ],
    ids=[
        "page-2^32-1",
        "page-past-end",
        "version",
        "padded",
        "std-b64",
        "trailing-=",
        "upper",
        "null",
        "5000-chars",
        "nul",
    ],
)
async def test_forged_spellings_of_a_real_cursor_are_32602_never_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, forge: Any
) -> None:
    up = await member(start_upstream, "t1", "t2", "t3")
    gw = await start_gateway(aggregate_config({"a": up.url}, {"page_size": 1}))
    cursor = (await agg(http, gw, "tools/list")).result["nextCursor"]
    forged = forge(cursor)
    reply = await agg(http, gw, "tools/list", {"cursor": forged}, id="f")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, "f"), (forged, reply.raw)
    for method in ("prompts/list", "resources/list", "resources/templates/list"):  # another list's method
        other = await agg(http, gw, method, {"cursor": cursor}, id="o")
        assert (other.status, other.error["code"]) == (400, -32602), (method, other.raw)


# -- names and URIs ----------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "ref",
    [
        None,
        "a__greet",
        ["a__greet"],
        {},
        {"type": "ref/prompt"},
        {"type": "ref/prompt", "name": 5},
        {"type": "ref/resource", "name": "a__greet"},
        {"type": "ref/resource", "uri": 5},
        {"type": "ref/prompt", "name": "greet"},
        {"type": "ref/prompt", "name": "zz__greet"},
    ],
    ids=repr,
)
async def test_completion_with_an_odd_ref_is_32602_never_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, ref: Any
) -> None:
    up = await start_upstream()
    gw = await start_gateway(aggregate_config({"a": up.url}))
    params: dict[str, Any] = {"argument": {"name": "x", "value": ""}}
    if ref is not None:
        params["ref"] = ref
    reply = await agg(http, gw, "completion/complete", params, id="c")
    assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, "c"), reply.raw
    assert not up.requests


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


# -- the body a member gets -------------------------------------------------------------------------

META = json.dumps(
    {"io.modelcontextprotocol/protocolVersion": V, "io.modelcontextprotocol/clientCapabilities": {}},
    separators=(",", ":"),
)


@pytest.mark.parametrize(
    "template",
    [
        # white space everywhere, the name key in nested objects, a big integer, a lone surrogate
        ' \r\n{ "jsonrpc" : "2.0" ,\t"id" : 12345678901234567890123 , "method" : "tools/call" , "params" :'
        ' { "arguments" : { "name" : "a__t" , "n" : 123456789012345678901234567890 , "s" : "\\ud800" ,'
        ' "deep" : [[[{"name": "a__t"}]]] } , "name" \n: NAME , "_meta" : ' + META + " } } \n",
        # the name key spelled with escapes, last; the method too
        '{"jsonrpc":"2.0","id":"x","meth\\u006fd":"tools/call","params":{"_meta":'
        + META
        + ',"arguments":{},"na\\u006de":NAME}}',
        # params first, id last
        '{"params":{"name":NAME,"_meta":' + META + '},"method":"tools/call","jsonrpc":"2.0","id":-1}',
    ],
    ids=["whitespace", "escaped-keys", "params-first"],
)
@pytest.mark.parametrize("spelled", ['"a__t"', '"a__\\u0074"', '"\\u0061__t"'])
async def test_a_call_body_reaches_the_member_byte_for_byte_but_the_name(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, template: str, spelled: str
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    body = template.replace("NAME", spelled).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call", "a__t"))
    assert reply.status == 200, reply.raw
    assert up.requests[-1].body == template.replace("NAME", '"t"').encode()
    assert up.requests[-1].headers["Mcp-Name"] == "t"


# -- members that misbehave in lists ----------------------------------------------------------------


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


# -- with [auth] ------------------------------------------------------------------------------------

TOKEN = "attack-tests-token-0123456789"


@pytest.mark.parametrize(
    ("method", "params", "body"),
    [
        ("tools/list", {}, None),
        ("tools/list", {"cursor": "forged"}, None),
        ("server/discover", {}, None),
        ("tools/call", {"name": "a__t", "arguments": {}}, None),
        ("tools/call", {"name": "zz__nothing", "arguments": {}}, None),
        ("resources/read", {"uri": "mcp-gateway:a/res://x"}, None),
        ("prompts/get", {"name": "a__p"}, None),
        ("completion/complete", {"ref": {"type": "ref/prompt", "name": "a__p"}, "argument": {}}, None),
        ("subscriptions/listen", {"notifications": {"toolsListChanged": True}}, None),
        ("ping", {}, None),
        ("tools/list", {}, b"{not json"),
        ("tools/list", {}, b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}'),
        ("tools/call", {}, b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}'),
    ],
)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789", "Basic " + TOKEN, TOKEN])
async def test_with_auth_every_mcp_request_needs_the_token_first(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    method: str,
    params: dict[str, Any],
    body: bytes | None,
    authorization: str | None,
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}, auth={"tokens": [TOKEN]}))
    headers = mcp_headers(method, params.get("name") or params.get("uri"))
    if authorization is not None:
        headers["Authorization"] = authorization
    data = body if body is not None else json.dumps(body_of(method, params)).encode()
    reply = await post(http, agg_url(gw), data, headers)
    assert reply.status == 401, reply.raw
    assert reply.headers["WWW-Authenticate"].startswith("Bearer")
    assert reply.error["code"] == -32600
    assert b"a__" not in reply.raw and b"member" not in reply.raw and b"mcp-gateway:" not in reply.raw
    assert not up.requests


# -- resource bounds --------------------------------------------------------------------------------


async def test_composed_entries_of_many_capability_sets_stay_within_max_entries(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}, cache={"max_entries": 8}))
    replies = await asyncio.gather(
        *(agg(http, gw, "tools/list", caps={"experimental": {f"x{i}": {"pad": "p" * 1000}}}) for i in range(60))
    )
    assert all(r.status == 200 for r in replies)
    assert len(gw.app[STORE]) <= 8


async def test_listen_streams_are_bounded_and_a_closed_one_frees_its_place(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}, {"max_listen_streams": 2}))
    body = json.dumps(body_of("subscriptions/listen", {"notifications": {"toolsListChanged": True}})).encode()
    headers = mcp_headers("subscriptions/listen")

    async def open_stream() -> aiohttp.ClientResponse:
        resp = await http.post(agg_url(gw), data=body, headers=headers)
        if resp.status == 200:
            async with asyncio.timeout(5):
                assert b"acknowledged" in await resp.content.readuntil(b"\n\n")
        return resp

    first, second = await open_stream(), await open_stream()
    assert (first.status, second.status) == (200, 200)
    third = await open_stream()
    assert (third.status, third.headers.get("Retry-After")) == (503, "1")
    third.release()
    first.close()  # the client goes away: its place is free again (soon)
    deadline = time.monotonic() + 5
    while True:
        again = await open_stream()
        if again.status == 200 or time.monotonic() > deadline:
            break
        again.release()
        await asyncio.sleep(0.05)
    assert again.status == 200
    assert not up.requests  # no upstream stream per client
    for resp in (second, again):
        resp.close()


# -- bodies that are odd but JSON -------------------------------------------------------------------


@pytest.mark.parametrize("depth", [*range(900, 1000, 10), 5000])
async def test_deeply_nested_call_arguments_are_never_a_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, depth: int
) -> None:
    # Parsing gives up (-32700) before rewriting the body could (gateway/aggregate/rewrite.py walks
    # it with the standard library's decoder); below that the call goes through.
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    arguments = '{"x":' + "[" * depth + "]" * depth + "}"
    reply = await post(http, agg_url(gw), raw_call("a__t", arguments=arguments), mcp_headers("tools/call", "a__t"))
    own = await post(http, gw.url("a"), raw_call("t", arguments=arguments), mcp_headers("tools/call", "t"))
    assert reply.status in (200, 400), reply.raw
    assert reply.status == own.status


@pytest.mark.parametrize(
    "params",
    ["[]", "null", "5", '"a__t"', '{"arguments":{"name":"a__t"},"_meta":' + META + "}"],
)
async def test_a_call_whose_params_are_odd_is_a_4xx_never_a_500(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, params: str
) -> None:
    up = await member(start_upstream, "t")
    gw = await start_gateway(aggregate_config({"a": up.url}))
    body = f'{{"jsonrpc":"2.0","id":"p","method":"tools/call","params":{params}}}'.encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call", "a__t"))
    assert 400 <= reply.status < 500, reply.raw
    assert reply.json["id"] == "p" and not up.requests


async def test_a_gateway_cursor_spelled_with_escapes_never_reaches_a_member(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # A list page after the first: each member gets the caller's body without the gateway's cursor
    # (whatever its key's spelling), every other member of params as sent.
    up = await member(start_upstream, "t1", "t2", "t3")
    gw = await start_gateway(aggregate_config({"a": up.url}, {"page_size": 1}))
    cursor = (await agg(http, gw, "tools/list")).result["nextCursor"]
    gw.app[STORE].purge(lambda key: True, "test")  # the members are asked again
    up.requests.clear()
    body = (
        '{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{ "curs\\u006fr" : '
        + json.dumps(cursor)
        + ' , "extra" : [1, 2] , "_meta" : '
        + META
        + " }}"
    ).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/list"))
    assert reply.status == 200 and names(reply.result) == ["a__t2"], reply.raw
    sent = json.loads(up.requests[-1].body)
    assert "cursor" not in sent["params"] and sent["params"]["extra"] == [1, 2]
    assert b"\\u006f" not in up.requests[-1].body and b'"extra" : [1, 2]' in up.requests[-1].body
