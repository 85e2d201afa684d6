"""``POST /mcp`` against the freshness of what it answers: a member slow enough for another
member's part to age meanwhile, a member whose newer answer is private, a member busy (at
``max_inflight``) when ``/mcp`` asks.

What must hold: a composed answer, and its stored entry, never say more ``ttlMs`` than its
stalest part has left (docs/aggregate.md "Hints"); a member's answer read through ``/mcp`` is
its newest word on the key, on both routes (it ends an older entry's stale-if-error window); only
a failed attempt backs a key off, not a member being busy. A fake clock moves the time; members
are scripted in this process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ..support import FakeClock, StartGateway, StartUpstream
from .conftest import agg, aggregate_config, eventually, names
from .scripted import member, result_of, tools_result

pytestmark = pytest.mark.timeout(60)


async def test_a_composed_answer_never_says_more_ttl_than_its_stalest_part_has_left(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    # docs/aggregate.md "Hints": "ttlMs is the least time left among the parts", reckoned when the
    # answer is made, not when its first part was read. Member f's entry has 10 s left when the
    # composition reads it; member s takes 4 s (of the gateway's clock) to answer: the answer may
    # say at most the 6 s f has left, and a hit 5 s later at most f's last second.
    fast = await member(start_upstream, "f", ttl_ms=10_000)
    slow = await start_upstream()

    async def slow_list(request: web.Request, msg: Any) -> web.StreamResponse:
        fake_clock.advance(4)
        return result_of(msg, tools_result("s", ttl_ms=60_000))

    slow.handlers["tools/list"] = slow_list
    gw = await start_gateway(aggregate_config({"f": fast.url, "s": slow.url}), clock=fake_clock)
    assert (await agg(http, gw.url("f"), "tools/list")).status == 200  # f's entry: 10 s from now
    composed = await agg(http, gw, "tools/list")
    assert names(composed.result) == ["f__f", "s__s"]
    assert composed.result["ttlMs"] <= 6_000, f"f has 6000 ms left; the answer says {composed.result['ttlMs']}"
    fake_clock.advance(5)  # f: 1 s left
    hit = await agg(http, gw, "tools/list")
    assert hit.cache_hit, hit.cache_status
    assert hit.result["ttlMs"] <= 1_000, f"f has 1000 ms left; the hit says {hit.result['ttlMs']}"


async def test_a_private_answer_read_through_mcp_ends_the_members_stale_window(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    # docs/cache.md "Stale-if-error": any JSON-RPC answer the upstream gives to a key (a private
    # one included) ends its older entry's stale window, for a member's part of /mcp as on
    # /servers/m/mcp. Once m then fails, its old public list must not be served stale on either
    # route, to any caller: m's last word was that the list is private.
    up = await start_upstream()
    state = {"mode": "public"}

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        if state["mode"] == "public":
            return result_of(msg, tools_result("old_public", ttl_ms=1_000))
        if state["mode"] == "private":
            return result_of(msg, tools_result("mine", scope="private"))
        return web.Response(status=503, text="<html>down</html>", content_type="text/html")

    up.handlers["tools/list"] = answer
    other = await member(start_upstream, "ok")
    config = aggregate_config({"m": {"url": up.url, "stale_if_error_ms": 600_000}, "o": other.url})
    gw = await start_gateway(config, clock=fake_clock)
    assert "stored" in (await agg(http, gw.url("m"), "tools/list")).cache_status
    fake_clock.advance(2)  # expired: kept for its stale window
    state["mode"] = "private"
    private = await agg(http, gw, "tools/list")  # m asked through /mcp: its newer answer is private
    assert names(private.result) == ["m__mine", "o__ok"]
    state["mode"] = "down"
    own = await agg(http, gw.url("m"), "tools/list", id="own")
    assert own.status == 502, f"m's old public list served stale after a private answer: {own.cache_status}"
    composed = await agg(http, gw, "tools/list")
    assert "m__old_public" not in names(composed.result), composed.raw


async def _true(value: bool) -> bool:
    return value


async def test_a_member_busy_when_mcp_asks_is_not_taken_for_a_failing_one_on_its_own_route(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream, fake_clock: FakeClock
) -> None:
    # docs/cache.md "Stale-if-error": an expired entry answers only when fetching it again fails
    # (the upstream refused, reset, timed out, a 5xx...), and "after a failed attempt the key backs
    # off". Over max_inflight is not an attempt: on /servers/m/mcp it is a 503 and no backoff, and
    # /mcp meeting m busy must not back m's key off either, or for the next second (up to 8 s
    # after more) /servers/m/mcp would answer m's stale list without asking m, idle by then.
    up = await start_upstream()
    release = asyncio.Event()
    listed = {"now": "old"}

    async def answer_list(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(listed["now"], ttl_ms=1_000))

    async def hang(request: web.Request, msg: Any) -> web.StreamResponse:
        await release.wait()
        return result_of(msg, {"content": [], "resultType": "complete"})

    up.handlers["tools/list"] = answer_list
    up.handlers["tools/call"] = hang
    other = await member(start_upstream, "ok")
    config = aggregate_config({"m": {"url": up.url, "max_inflight": 1, "stale_if_error_ms": 600_000}, "o": other.url})
    gw = await start_gateway(config, clock=fake_clock)
    assert "stored" in (await agg(http, gw.url("m"), "tools/list")).cache_status
    fake_clock.advance(2)  # m's entry expired; kept for stale-if-error
    call = asyncio.create_task(agg(http, gw.url("m"), "tools/call", {"name": "slow", "arguments": {}}))
    await eventually(lambda: _true(up.count("tools/call") == 1), limit_s=5, what="the call at m")
    busy = await agg(http, gw, "tools/list")  # m is at max_inflight: its stale part stands in (documented)
    assert "detail=stale" in busy.cache_status  # its expired entry stood in
    release.set()
    await call
    listed["now"] = "new"
    fake_clock.advance(0.5)
    own = await agg(http, gw.url("m"), "tools/list")
    assert names(own.result) == ["new"], f"m idle and answering, yet: {own.cache_status} {names(own.result)}"
