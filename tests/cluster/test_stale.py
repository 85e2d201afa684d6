"""Stale-if-error and refresh-ahead with ``[cluster]``: gateways on one real Redis. A shared entry
stays in Redis for its stale window too (read then only as a stale answer), so every replica, one
that never held it included, answers stale while the upstream fails. Refresh-ahead refreshes once
per key per cluster (the cold key's lock), and what a refresh stores is shared."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web

from gateway.app import PROXY
from gateway.cache import CacheEntry, CacheKey, build_entry
from gateway.cluster.entries import decode, encode, key_digest
from gateway.cluster.mac import Keys
from tests.support import FakeUpstream, RunningGateway, StartGateway, StartUpstream
from tests.support.polling import wait_until
from tests.support.redis import RedisServer
from tests.support.wire import list_result

from .test_tier import call, cluster_config, connected

pytestmark = pytest.mark.timeout(60)

#: The JSON-RPC error an upstream answers for what does not exist (resource not found).
GONE: Final = -32002


async def shared_entries(redis_server: RedisServer, count: int) -> list[bytes]:
    """The names of the shared entries in Redis once there are ``count`` of them (they are
    written, and removed, in the background), within 10 s."""
    names: list[bytes] = []

    def counted() -> bool:
        nonlocal names
        with redis_server.client() as client:
            names = list(client.keys("t:entry:*"))
        return len(names) == count

    await wait_until(counted, what=f"{count} shared entries in Redis")
    return names


async def two_gateways_before_an_upstream_that_goes_down(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream
) -> tuple[FakeUpstream, dict[str, int], RunningGateway, RunningGateway]:
    """Two connected gateways (stale_if_error_ms 60 s) in front of an upstream answering a public
    list (ttlMs 300) until ``state["down"]`` is set, then 503 HTML; while ``state["gone"]`` is
    set (not down), the JSON-RPC error -32002 with that HTTP status."""
    upstream = await start_upstream()
    state = {"down": False, "gone": 0}

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        if state["down"]:
            return web.Response(status=503, text="<html>down</html>", content_type="text/html")
        if state["gone"]:
            gone = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": GONE, "message": "no such list"}}
            return web.json_response(gone, status=state["gone"])
        return web.json_response(list_result(msg["id"], ttl_ms=300))

    upstream.handlers["tools/list"] = answer
    config = cluster_config(redis_server, upstream, stale_if_error_ms=60_000)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    return upstream, state, a, b


async def test_each_replica_answers_stale_from_its_local_tier_when_the_upstream_fails(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream, state, a, b = await two_gateways_before_an_upstream_that_goes_down(
        redis_server, start_gateway, start_upstream
    )
    assert "stored" in (await call(http, a, 1))[1]
    await shared_entries(redis_server, 1)  # a writes it to Redis in the background
    assert (await call(http, b, 2))[1].endswith("detail=shared")  # b's local tier holds it too
    state["down"] = True
    await asyncio.sleep(0.4)  # expired everywhere; kept stale in the local tiers and in Redis
    for gw, id_ in ((a, "a"), (b, "b")):
        status, cache_status, body = await call(http, gw, id_)
        assert (status, body["id"], body["result"]["ttlMs"]) == (200, id_, 0)
        assert cache_status == "mcp-gateway; hit; ttl=-1"
    assert upstream.count("tools/list") == 3  # the first store, then one attempt per replica


async def test_a_refresh_ahead_is_shared_with_the_other_replicas(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        return web.json_response(list_result(msg["id"], ttl_ms=1_000))

    upstream.handlers["tools/list"] = answer
    config = cluster_config(redis_server, upstream, refresh_ahead=True)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    await call(http, a, 1)
    (name,) = await shared_entries(redis_server, 1)
    with redis_server.client() as client:
        first = client.get(name)
    await asyncio.sleep(0.6)  # the last half of a 1 s lifetime: a hit refreshes it
    assert "hit" in (await call(http, a, 2))[1]
    await refreshed(a)
    assert upstream.count("tools/list") == 2

    def rewritten() -> bool:  # the refreshed entry is shared in the background
        with redis_server.client() as client:
            return client.get(name) not in (first, None)

    await wait_until(rewritten, what="the refreshed entry in Redis")
    await asyncio.sleep(0.5)  # the first entry has expired; the refreshed one is in Redis
    status, cache_status, _ = await call(http, b, 3)
    assert status == 200 and cache_status.endswith("detail=shared")
    assert upstream.count("tools/list") == 2


async def refreshed(gw: RunningGateway) -> None:
    """Until ``gw``'s refreshes ended (what they stored is shared in the background after)."""
    await wait_until(lambda: not len(gw.app[PROXY].readthrough.refreshes), what="the refresh to end")


async def test_a_replica_that_never_had_the_entry_answers_stale_from_redis_when_the_upstream_fails(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream, state, a, b = await two_gateways_before_an_upstream_that_goes_down(
        redis_server, start_gateway, start_upstream
    )
    assert "stored" in (await call(http, a, 1))[1]
    (name,) = await shared_entries(redis_server, 1)  # written to Redis in the background
    with redis_server.client() as client:
        assert 59_000 < client.pttl(name) <= 60_300  # its life and its window
    state["down"] = True
    await asyncio.sleep(0.4)  # expired; b never held it
    status, cache_status, body = await call(http, b, "b")
    assert (status, body["id"], body["result"]["ttlMs"]) == (200, "b", 0)
    assert cache_status == "mcp-gateway; hit; ttl=-1"
    assert upstream.count("tools/list") == 2  # the first store, then b's one attempt
    state["down"] = False
    status, cache_status, _ = await call(http, b, "again")  # backing off: stale without asking
    assert cache_status == "mcp-gateway; hit; ttl=-1"


@pytest.mark.parametrize("http_status", [200, 500])
async def test_no_replica_answers_stale_from_redis_once_the_upstream_answered_gone(
    redis_server: RedisServer,
    start_gateway: StartGateway,
    start_upstream: StartUpstream,
    http: aiohttp.ClientSession,
    http_status: int,
) -> None:
    upstream, state, a, b = await two_gateways_before_an_upstream_that_goes_down(
        redis_server, start_gateway, start_upstream
    )
    assert "stored" in (await call(http, a, 1))[1]
    await shared_entries(redis_server, 1)
    await asyncio.sleep(0.4)  # expired (shared entries expire on the wall clock); kept stale in a and in Redis
    state["gone"] = http_status
    status, cache_status, body = await call(http, a, "gone")
    assert (status, body["error"]["code"]) == (http_status, GONE), cache_status  # relayed
    await shared_entries(redis_server, 0)  # its stale window ended in Redis too
    state["down"] = True
    for gw, id_ in ((b, "b"), (a, "a")):  # b never held it; a holds nothing stale any more
        status, cache_status, _ = await call(http, gw, id_)
        assert status == 502, f"answered stale after the upstream said it is gone: {cache_status}"
    assert upstream.count("tools/list") == 4  # the store, "gone", then one attempt per replica


async def test_a_replica_that_read_the_stale_entry_while_the_leader_was_asking_does_not_answer_it_after_gone(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    state = {"gone": False}
    release = asyncio.Event()

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        if not state["gone"]:
            return web.json_response(list_result(msg["id"], ttl_ms=300))
        if not release.is_set():
            await release.wait()
            gone = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": GONE, "message": "no such list"}}
            return web.json_response(gone)  # the leader's answer; every later request fails
        return web.Response(status=503, text="<html>down</html>", content_type="text/html")

    upstream.handlers["tools/list"] = answer
    config = cluster_config(redis_server, upstream, stale_if_error_ms=60_000)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    assert "stored" in (await call(http, a, 1))[1]
    await shared_entries(redis_server, 1)
    await asyncio.sleep(0.4)  # expired (on the wall clock); kept stale in Redis
    state["gone"] = True
    leader = asyncio.create_task(call(http, a, "leader"))  # a leads the key for the cluster
    await wait_until(lambda: upstream.count("tools/list") == 2, what="the leader's request upstream")
    follower = asyncio.create_task(call(http, b, "follower"))

    def b_read_it() -> bool:
        return b.registry.get_sample_value("mcp_gateway_cluster_reads_total", {"result": "hit"}) == 1

    await wait_until(b_read_it, what="b reading the stale entry while a's request is upstream")
    release.set()
    assert (await leader)[2]["error"]["code"] == GONE
    status, cache_status, _ = await follower
    assert status == 502, f"b answered the entry it read before a's answer, stale: {cache_status}"


async def test_a_key_in_steady_demand_on_three_replicas_is_refreshed_once_per_lifetime_for_the_cluster(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        await asyncio.sleep(0.01)
        return web.json_response(list_result(msg["id"], ttl_ms=2_000))

    upstream.handlers["tools/list"] = answer
    config = cluster_config(redis_server, upstream, refresh_ahead=True)
    gateways = [await start_gateway(config) for _ in range(3)]
    await connected(*gateways)
    assert "stored" in (await call(http, gateways[0], 0))[1]
    replies = []
    started = asyncio.get_running_loop().time()
    while asyncio.get_running_loop().time() - started < 4.5:  # 20 a second on each, across 2+ lifetimes
        replies += await asyncio.gather(*(call(http, gw, 1) for gw in gateways))
        await asyncio.sleep(0.05)
    assert all(r[0] == 200 and r[1].startswith("mcp-gateway; hit; ttl=") for r in replies), [
        r[1] for r in replies if "hit" not in r[1]
    ]
    # Refreshed in the last 1 s of a 2 s lifetime: about one request a second for the cluster
    # (once per process would be three).
    requests = upstream.count("tools/list")
    assert 4 <= requests <= 6, requests
    for gw in gateways:
        await refreshed(gw)

    def refreshes(outcome: str) -> float:
        return sum(
            gw.registry.get_sample_value(
                "mcp_gateway_cache_refreshes_total", {"upstream": "a", "method": "tools/list", "outcome": outcome}
            )
            or 0.0
            for gw in gateways
        )

    assert refreshes("stored") == requests - 1
    assert refreshes("shared") + refreshes("skipped") >= requests - 1  # the other replicas took theirs
    assert refreshes("failed") == refreshes("unstored") == 0


KEY = CacheKey("a", "tools/list", b"{}", "2026-07-28", None)


def test_a_shared_entry_past_its_expiry_reads_back_only_within_its_stale_window() -> None:
    entry = build_entry(list_result(1, ttl_ms=1_000), 100.0, 3_600_000)
    assert entry is not None
    value, _ = encode(Keys(None), key_digest(KEY, "00" * 12), entry, clock_now=100.0, wall_now=5_000.0)
    bounds = {"clock_now": 0.0, "max_ttl_ms": 3_600_000, "max_entry_bytes": 1 << 20}
    read = decode(Keys(None), value, key_digest(KEY, "00" * 12), wall_now=5_003.0, stale_if_error_ms=5_000, **bounds)
    assert isinstance(read, CacheEntry) and read.expires_at == -2.0 and read.keep_until == 3.0  # stale, never a hit
    assert (
        decode(Keys(None), value, key_digest(KEY, "00" * 12), wall_now=5_003.0, **bounds) == "corrupt"
    )  # no window: gone
    assert (
        decode(Keys(None), value, key_digest(KEY, "00" * 12), wall_now=5_006.5, stale_if_error_ms=5_000, **bounds)
        == "corrupt"
    )
