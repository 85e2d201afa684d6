"""``POST /mcp`` over the shared tier (``[cluster]`` on a real Redis): Redis taking no writes,
two gateways composing from one another's parts, purges crossing between them, garbage over
every Redis key, Redis killed.

What must hold: callers are answered from the local tier or the members, never with an error
caused by Redis (docs/replicas.md "Redis down or slow"), and a paged member is still listed
whole while Redis is slow; a gateway composes from another's shared parts without asking the
members, hears its purges, and treats garbage as a miss. Gateways run in-process on the
``redis`` fixture's server.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import STORE

from ..cluster.test_tier import connected
from ..support import StartGateway, StartUpstream
from ..support.redis import RedisServer
from .conftest import agg, aggregate_config, eventually, names
from .scripted import ADMIN, Handler, member, purge, result_of, tools_result

pytestmark = pytest.mark.timeout(60)


def paged_tools(pages: int) -> Handler:
    """tools/list in ``pages`` pages of one tool each (cursor "p<n>"), answered at once."""

    async def handler(request: web.Request, msg: Any) -> web.StreamResponse:
        cursor = msg["params"].get("cursor")
        n = 1 if cursor is None else int(cursor[1:])
        more: dict[str, Any] = {"nextCursor": f"p{n + 1}"} if n < pages else {}
        return result_of(msg, tools_result(f"t{n}", **more))

    return handler


async def test_with_redis_paused_for_writes_a_paged_member_is_still_listed_whole(
    redis: RedisServer, start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/replicas.md "Redis down or slow": every Redis call waits at most cluster.timeout_s,
    # "callers are answered from the local tier or the upstream, never with an error caused by
    # Redis". While Redis takes no writes (CLIENT PAUSE WRITE: cluster_up stays 1, reads answer),
    # a cold page may wait a lock call's timeout_s (0.25 s) before it goes upstream. Paid once per
    # page, one page after another within the member's timeout_s, it would leave a 5-page member
    # with timeout_s 1 out of /mcp (detail=partial, ttlMs 0), while each of its pages is served
    # fine on /servers/p/mcp.
    paged = await start_upstream()
    paged.handlers["tools/list"] = paged_tools(5)
    good = await member(start_upstream, "ok")
    config = aggregate_config(
        {"g": good.url, "p": {"url": paged.url, "timeout_s": 1.0}},
        cluster={"redis_url": redis.url, "key_prefix": "paused-writes"},
    )
    gw = await start_gateway(config)
    await connected(gw)
    redis.pause(5, mode="WRITE")
    try:
        own = await agg(http, gw.url("p"), "tools/list", {"cursor": "p3"})
        assert own.status == 200 and names(own.result) == ["t3"], own.raw  # its own route: fine
        reply = await agg(http, gw, "tools/list")
    finally:
        redis.unpause()
    assert reply.status == 200
    assert names(reply.result) == ["g__ok", *(f"p__t{i}" for i in range(1, 6))], (reply.cache_status, reply.raw)


async def test_over_one_redis_mcp_composes_from_another_gateways_parts_hears_its_purge_and_survives_garbage(
    redis: RedisServer, start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # Two gateways on one Redis: b composes from a's shared parts (no member request), a purge
    # on a reaches b's parts (its composed answer is composed again), garbage over every Redis
    # key is a miss (answered from the members, right ids), and with Redis killed both serve.
    up = await start_upstream()
    listed = {"now": "v1"}

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        return result_of(msg, tools_result(listed["now"]))

    up.handlers["tools/list"] = answer
    other = await member(start_upstream, "ok")
    config = aggregate_config(
        {"m": up.url, "o": other.url},
        cluster={"redis_url": redis.url, "key_prefix": "two-gateways"},
        admin={"token": ADMIN},
    )
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    assert names((await agg(http, a, "tools/list")).result) == ["m__v1", "o__ok"]

    async def parts_shared() -> bool:  # a writes the parts to Redis in the background
        return len(redis.scan_keys("two-gateways:entry:*")) == 2

    await eventually(parts_shared, limit_s=5, what="both parts in Redis")
    on_b = await agg(http, b, "tools/list")
    assert names(on_b.result) == ["m__v1", "o__ok"] and up.count("tools/list") == 1, on_b.cache_status
    listed["now"] = "v2"
    await purge(http, a, upstream="m")  # on a: b's copy of m's part and its composed answer go too

    async def b_lists_v2() -> bool:
        return names((await agg(http, b, "tools/list")).result) == ["m__v2", "o__ok"]

    await eventually(b_lists_v2, limit_s=3, what="b composing m's list again after a's purge")

    async def locks_released() -> bool:  # garbage over a held lock: its followers would wait it out
        return not redis.scan_keys("two-gateways:lock:*")

    await eventually(locks_released, limit_s=5, what="the flights' locks released")
    assert redis.write_garbage_over_every_key() > 0
    a.app[STORE].purge(lambda _k: True, "test")  # the local tiers cold: the next parts come from Redis
    b.app[STORE].purge(lambda _k: True, "test")
    for gw in (a, b):
        reply = await agg(http, gw, "tools/list", id="g")
        assert (reply.status, reply.json["id"], names(reply.result)) == (200, "g", ["m__v2", "o__ok"]), reply.raw
    redis.kill()
    for gw in (a, b):
        reply = await agg(http, gw, "tools/list")
        assert reply.status == 200 and names(reply.result) == ["m__v2", "o__ok"], reply.raw
