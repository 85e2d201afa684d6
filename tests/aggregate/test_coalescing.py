"""``POST /mcp`` against coalescing: cold bursts of ``/mcp`` and per-upstream lists of one key
at once, and callers waiting on a member's page that ``/mcp`` gives up on at the member's
``timeout_s``.

What must hold: concurrent misses on one key make one upstream request, whichever route leads
(docs/cache.md "What is stored": coalescing), each caller answered with its own id; a page
``/mcp`` stops waiting for still answers the callers waiting on it, rather than sending each of
them upstream alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ..support import StartGateway, StartUpstream
from ..support.polling import wait_until
from .conftest import agg, aggregate_config, names
from .scripted import member, result_of, tools_result

pytestmark = pytest.mark.timeout(60)


async def test_a_cold_burst_of_mcp_and_own_route_lists_is_one_member_request_each_caller_its_own_id(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # 10 /mcp lists and 10 /servers/m/mcp lists of a cold key at once: one request to m.
    up = await start_upstream()

    async def slow(request: web.Request, msg: Any) -> web.StreamResponse:
        await asyncio.sleep(0.3)
        return result_of(msg, tools_result("t"))

    up.handlers["tools/list"] = slow
    gw = await start_gateway(aggregate_config({"m": up.url}))
    replies = await asyncio.gather(
        *(agg(http, gw if i % 2 else gw.url("m"), "tools/list", id=f"c{i}") for i in range(20))
    )
    assert up.count("tools/list") == 1
    for i, reply in enumerate(replies):
        assert reply.json["id"] == f"c{i}"
        assert names(reply.result) == (["m__t"] if i % 2 else ["t"])


async def test_callers_waiting_on_a_page_mcp_gave_up_on_make_one_upstream_request_not_one_each(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/cache.md "What is stored": concurrent misses on one key make one upstream request. /mcp
    # leads the key of p's page 2 (cursor "c2") when it asks for it; callers of that same page on
    # /servers/p/mcp join it. When p's pages run past its timeout_s, /mcp stops waiting for the
    # page, but the callers that joined it must not then each send p the same request (8 here),
    # since p answers each within its timeout_s.
    up = await start_upstream()

    async def slow_pages(request: web.Request, msg: Any) -> web.StreamResponse:
        cursor = msg["params"].get("cursor")
        await asyncio.sleep(0.3 if cursor is None else 0.4)
        more: dict[str, Any] = {"nextCursor": "c2"} if cursor is None else {}
        return result_of(msg, tools_result("t2" if cursor else "t1", **more))

    up.handlers["tools/list"] = slow_pages
    good = await member(start_upstream, "ok")
    gw = await start_gateway(aggregate_config({"g": good.url, "p": {"url": up.url, "timeout_s": 0.5}}))
    composed = asyncio.create_task(agg(http, gw, "tools/list"))
    # /mcp asks for page 2 at 0.3 s (p answers it at 0.7 s); it gives up at 0.5 s.
    await wait_until(lambda: up.count("tools/list", '"c2"') == 1, limit_s=5, what="/mcp asking p for page 2")
    own = await asyncio.gather(*(agg(http, gw.url("p"), "tools/list", {"cursor": "c2"}, id=i) for i in range(8)))
    assert [r.json["id"] for r in own] == list(range(8)) and all(names(r.result) == ["t2"] for r in own)
    assert "detail=partial" in (await composed).cache_status  # p was cut short
    page_2 = up.count("tools/list", '"c2"')
    assert page_2 <= 2, f"8 callers waiting on one page made {page_2} requests for it"
