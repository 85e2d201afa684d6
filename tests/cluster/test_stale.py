"""Stale-if-error and refresh-ahead with ``[cluster]``: two gateways on one real Redis. A shared
entry leaves Redis when it expires; each local tier that holds it keeps it for the stale window
and answers from it while the upstream fails. Refresh-ahead refreshes once per key per process,
and what a refresh stores is shared."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import PROXY
from tests.support import RunningGateway, StartGateway, StartUpstream
from tests.support.redis import RedisServer
from tests.support.wire import list_result

from .test_tier import call, cluster_config, connected

pytestmark = pytest.mark.timeout(60)


async def test_each_replica_answers_stale_from_its_local_tier_when_the_upstream_fails(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    state = {"down": False}

    async def answer(request: web.Request, msg: Any) -> web.StreamResponse:
        if state["down"]:
            return web.Response(status=503, text="<html>down</html>", content_type="text/html")
        return web.json_response(list_result(msg["id"], ttl_ms=300))

    upstream.handlers["tools/list"] = answer
    config = cluster_config(redis_server, upstream, stale_if_error_ms=60_000)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    assert "stored" in (await call(http, a, 1))[1]
    assert (await call(http, b, 2))[1].endswith("detail=shared")  # b's local tier holds it too
    state["down"] = True
    await asyncio.sleep(0.4)  # expired everywhere, and gone from Redis
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
    await asyncio.sleep(0.6)  # the last half of a 1 s lifetime: a hit refreshes it
    assert "hit" in (await call(http, a, 2))[1]
    await refreshed(a)
    assert upstream.count("tools/list") == 2
    await asyncio.sleep(0.5)  # the first entry has expired; the refreshed one is in Redis
    status, cache_status, _ = await call(http, b, 3)
    assert status == 200 and cache_status.endswith("detail=shared")
    assert upstream.count("tools/list") == 2


async def refreshed(gw: RunningGateway) -> None:
    for _ in range(400):
        if not len(gw.app[PROXY].forwarder.refreshes):
            await asyncio.sleep(0.05)  # the share to Redis is written in the background
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the refresh did not end")
