"""Redis that reads but refuses writes (full: ``maxmemory`` reached with ``noeviction``): a purge
says it did not reach the cluster, and the replicas that cannot be told stop answering from
their caches until Redis takes writes again (gateway/cluster/link.py, gateway/cluster/outbox.py).

Real gateway processes (:mod:`tests.support.replicas`) on a real ``redis-server`` made full for
real (:meth:`~tests.support.redis.RedisServer.fill`), in front of the real SDK upstream
``public_up``. Waits poll with bounds.
"""

from __future__ import annotations

import time

import aiohttp
import pytest

from ..support.fleet import Upstream, reset_counts
from ..support.redis import RedisServer
from ..support.replicas import Replicas
from .conftest import StartReplicas
from .test_replicas import (
    INVALIDATION_S,
    UPSTREAM_TTL_MS,
    all_cluster_up,
    call,
    cluster_config,
    cluster_up,
    count,
    eventually,
    metric_on,
)

pytestmark = pytest.mark.timeout(90)

PENDING = "mcp_gateway_cluster_invalidations_pending"
#: How long Redis with room again may take to carry the pending invalidation and share again:
#: a heartbeat, the settling, and a loaded machine.
RECOVERY_S = 10.0


async def purge_answer(http: aiohttp.ClientSession, replicas: Replicas, index: int) -> tuple[int, dict[str, object]]:
    """``POST /admin/cache/purge?upstream=pub&method=tools/list`` on replica ``index``: status and JSON body."""
    url = f"{replicas.base_url(index)}/admin/cache/purge"
    headers = {"Authorization": f"Bearer {replicas.admin_token}"}
    async with http.post(url, params={"upstream": "pub", "method": "tools/list"}, headers=headers) as resp:
        return resp.status, dict(await resp.json())


async def test_a_purge_a_full_redis_refuses_is_pending_and_the_other_replica_goes_upstream_until_it_has_room(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
) -> None:
    replicas = await start_replicas(cluster_config(redis_server, {"pub": public_up}), 2)
    await eventually(lambda: all_cluster_up(replicas, 1), limit_s=10, what="cluster_up 1 on both replicas")
    await reset_counts(public_up)
    first = await call(http, replicas.url(0, "pub"), id_="a-1")
    received_by = time.monotonic()  # the old entry was received before this
    assert first.stored, first.cache_status
    assert (await call(http, replicas.url(1, "pub"), id_="b-1")).shared
    assert (await call(http, replicas.url(1, "pub"), id_="b-2")).hit  # in B's local tier too
    assert await count(public_up, "tools/list") == 1

    redis_server.fill()
    try:
        status, body = await purge_answer(http, replicas, 0)
        answered = time.monotonic()
        assert status == 503, body
        assert body["cluster"] == "pending" and body["purged"] == 1 and isinstance(body["detail"], str), body
        assert await metric_on(replicas, 0, PENDING) == 1

        # B cannot be told; it stops answering from what it holds within the cluster's promise.
        async def b_goes_upstream() -> bool:
            return not (await call(http, replicas.url(1, "pub"), id_="b-poll")).hit

        await eventually(b_goes_upstream, limit_s=INVALIDATION_S, what="replica B answering from the upstream")
        assert time.monotonic() - answered <= INVALIDATION_S + 0.5  # the poll's own last round trip
        before = await count(public_up, "tools/list")
        for n in range(3):
            answer = await call(http, replicas.url(1, "pub"), id_=f"b-full-{n}")
            assert answer.status == 200 and not answer.hit, answer.cache_status
            assert answer.params[1] == "fwd=miss", answer.cache_status
            assert answer.result["tools"] == first.result["tools"]
        assert await count(public_up, "tools/list") == before + 3  # each from the upstream
        assert await cluster_up(replicas, 1) == 0 and await cluster_up(replicas, 0) == 0
        assert await metric_on(replicas, 0, PENDING) == 1  # still waiting
    finally:
        redis_server.make_room()

    # Redis has room: the pending invalidation gets through, and both replicas share again.
    async def delivered() -> bool:
        return await metric_on(replicas, 0, PENDING) == 0 and await all_cluster_up(replicas, 1)

    await eventually(delivered, limit_s=RECOVERY_S, what="the invalidation through and cluster_up 1 on both")

    async def b_caches_again() -> bool:
        return (await call(http, replicas.url(1, "pub"), id_="b-again")).hit

    await eventually(b_caches_again, limit_s=RECOVERY_S, what="replica B answering from its cache again")
    asked = time.monotonic()
    answer = await call(http, replicas.url(1, "pub"), id_="b-last")
    assert answer.hit, answer.cache_status
    # Not the entry from before the purge (it would have at most this much left, with 50 ms for rounding).
    assert answer.ttl_ms > UPSTREAM_TTL_MS - (asked - received_by) * 1000 + 50, answer.cache_status
