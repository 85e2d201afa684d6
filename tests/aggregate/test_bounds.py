"""``POST /mcp`` against its bounds: composed answers over ``cache.max_entry_bytes``, a flood of
capability sets against ``cache.max_entries``, a member paging out ~1 MB pages without end,
listen requests of 3 MB held open, more listen streams than ``max_listen_streams``.

What must hold: memory and entries stay within the configured figures, whatever callers and
members send: a composed answer too large to store is forwarded, not stored; one /mcp list holds
of the order of a member's ``max_response_bytes``, not ``max_member_pages`` parsed pages; an open
listen stream keeps what it needs, not its request; a listen stream past the bound is a 503 with
``Retry-After``, and a closed one frees its place. The memory tests read this process's RSS from
/proc (Linux): the gateway runs in-process.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.app import STORE

from ..support import StartGateway, StartUpstream, mcp_headers
from .conftest import agg, agg_url, aggregate_config, body_of
from .scripted import member

pytestmark = pytest.mark.timeout(60)


async def test_a_composed_answer_over_max_entry_bytes_is_not_stored(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/configuration.md: cache.max_entry_bytes, "larger results are forwarded, not stored",
    # for a composed answer too (not only cache.max_bytes). Each member's page (~6.4 KB) fits
    # 8000 bytes and is stored; the composed page of both (~12.7 KB) does not fit.
    a = await member(start_upstream, *[f"a{i}" + "x" * 1000 for i in range(6)])
    b = await member(start_upstream, *[f"b{i}" + "x" * 1000 for i in range(6)])
    gw = await start_gateway(aggregate_config({"a": a.url, "b": b.url}, cache={"max_entry_bytes": 8000}))
    first = await agg(http, gw, "tools/list")
    assert first.status == 200 and len(first.raw) > 8000
    assert "stored" not in first.cache_params, first.cache_status
    second = await agg(http, gw, "tools/list")  # composed again, from the member entries alone
    assert "detail=composed" in second.cache_params, second.cache_status


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
    # Memory is bounded by the configured figures: one /mcp request holds of the order of a
    # member's max_response_bytes (2 MB here; docs/aggregate.md "Lists": no next page once the
    # pages read reach it together). Reading every page up to max_member_pages (20) and keeping
    # them all parsed until composing would raise the peak RSS by ~240 MB here for 0.95 MB pages
    # (~12x the 19 MB read), and by gigabytes per request with the defaults (16 MiB, 20 pages).
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
    # Memory held per long-lived caller is bounded: an open listen stream keeps what it needs (its
    # id and flags), not its request; or a large listen request is refused. A stream holding its
    # body (the raw bytes, the parsed params, aiohttp's copy) would let 20 streams of 3 MB bodies
    # hold ~120 MB, and max_listen_streams (1024) x max_body_bytes (4 MiB) one caller pin ~8 GB
    # with no more traffic than reading the keep-alives.
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
