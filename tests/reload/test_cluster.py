"""Config reload with ``[cluster]`` (gateway.reload, gateway.cluster.Cluster.reload): each replica
reloads its own file, and replicas on the old and the new file share one Redis.

Real ``mcp-gateway serve`` replicas (tests/support/replicas.py) on a real ``redis-server``
(tests/support/redis.py), in front of real SDK upstreams (tests/servers/public_upstream.py);
each replica reloaded with ``POST /admin/reload`` on its own rewritten file. Upstream ``b`` is
sent an ``X-Tag`` header: changing it makes ``b`` *changed* (its answers may differ), and the
upstream's recorded requests show which file each replica fetched it with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import pytest

from ..cluster.conftest import StartReplicas
from ..cluster.test_replicas import KEY_PREFIX, Answer, call, cluster_config, count, eventually, lease_holders, purge
from ..support.fleet import Upstream, fetch_requests
from ..support.redis import RedisServer
from ..support.reloading import admin_reload, begun, rewrite
from ..support.replicas import Replicas
from ..support.wire import rpc

pytestmark = pytest.mark.timeout(90)

#: A lease renewed just before a reload outlives it by at least this much (LEASE_TTL_S 10 s less
#: RENEW_S 3 s), in seconds: gone from Redis sooner, it was given up, not left to expire.
UNTIL_EXPIRY_S = 7.0


def config(redis: RedisServer, ups: Mapping[str, Upstream], *, tag: str = "old") -> dict[str, Any]:
    """The replicas' config: ``[cluster]`` on ``redis``, fast probes, ``b`` sent ``X-Tag: <tag>``."""
    out = cluster_config(redis, ups)
    if "b" in out["upstreams"]:
        out["upstreams"]["b"]["headers"] = {"X-Tag": tag}
    return out


def entry_keys(redis: RedisServer) -> int:
    return len(redis.scan_keys(f"{KEY_PREFIX}:entry:*"))


async def stored(http: aiohttp.ClientSession, redis: RedisServer, url: str, method: str) -> None:
    """``method`` through ``url``: an upstream fetch, stored here and (waited for) in Redis."""
    before = await asyncio.to_thread(entry_keys, redis)
    answer = await call(http, url, method)
    assert answer.status == 200 and answer.stored, (url, method, answer.cache_status)

    async def in_redis() -> bool:
        return await asyncio.to_thread(entry_keys, redis) > before

    await eventually(in_redis, limit_s=5, what=f"{method} of {url} in Redis")


async def reload(http: aiohttp.ClientSession, replicas: Replicas, index: int, new: Mapping[str, Any]) -> dict[str, Any]:
    rewrite(replicas, new, index)
    status, body = await admin_reload(http, replicas, index)
    assert status == 200, body
    return body


async def tags(up: Upstream, method: str) -> list[str | None]:
    """The ``X-Tag`` of each ``method`` request ``up`` received, oldest first."""
    return [dict(r.headers).get("x-tag") for r in await fetch_requests(up) if r.method == method]


async def test_an_unchanged_upstream_keeps_its_local_and_shared_entries_when_one_replica_reloads(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    counted: tuple[Upstream, Upstream],
) -> None:
    up_a, up_b = counted
    replicas = await start_replicas(config(redis_server, {"a": up_a, "b": up_b}), count=2)
    await stored(http, redis_server, replicas.url(0, "a"), "tools/list")
    assert (await call(http, replicas.url(1, "a"))).shared

    new = config(redis_server, {"a": up_a, "b": up_b}, tag="new")
    new["cluster"]["key_prefix"] = "another-prefix"  # needs a restart: the running one is kept
    body = await reload(http, replicas, 1, new)
    assert (body["changed"], body["added"], body["removed"]) == (["b"], [], [])
    assert body["not_applied"] == ["cluster.key_prefix"] and "restart" in body["detail"], body

    for i in (1, 0):  # each kept its local entry of a
        again = await call(http, replicas.url(i, "a"))
        assert again.hit and not again.shared, (i, again.cache_status)
    # New keys of a are shared both ways between the old file and the new one.
    await stored(http, redis_server, replicas.url(1, "a"), "resources/list")
    assert (await call(http, replicas.url(0, "a"), "resources/list")).shared
    await stored(http, redis_server, replicas.url(0, "a"), "prompts/list")
    assert (await call(http, replicas.url(1, "a"), "prompts/list")).shared
    assert [await count(up_a, m) for m in ("tools/list", "resources/list", "prompts/list")] == [1, 1, 1]


async def test_a_changed_upstream_is_never_shared_between_the_old_file_and_the_new_in_either_direction(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    counted: tuple[Upstream, Upstream],
) -> None:
    up_a, up_b = counted
    ups = {"a": up_a, "b": up_b}
    replicas = await start_replicas(config(redis_server, ups), count=3)
    await stored(http, redis_server, replicas.url(0, "b"), "tools/list")
    for i in (1, 2):
        assert (await call(http, replicas.url(i, "b"))).shared

    for i in (1, 2):  # 1 and 2 on the new file, 0 still on the old one
        assert (await reload(http, replicas, i, config(redis_server, ups, tag="new")))["changed"] == ["b"]

    # The new file's local entries went, and the old file's shared one is not read.
    await stored(http, redis_server, replicas.url(1, "b"), "tools/list")
    assert (await call(http, replicas.url(2, "b"))).shared  # the new file shares with itself
    assert (await call(http, replicas.url(0, "b"))).hit  # the old file keeps its own
    # An entry of the new file never answers the old, nor one of the old the new.
    await stored(http, redis_server, replicas.url(1, "b"), "resources/list")
    assert (await call(http, replicas.url(0, "b"), "resources/list")).stored
    await stored(http, redis_server, replicas.url(0, "b"), "prompts/list")
    assert (await call(http, replicas.url(2, "b"), "prompts/list")).stored
    assert await tags(up_b, "tools/list") == ["old", "new"]
    assert await tags(up_b, "resources/list") == ["new", "old"]
    assert await tags(up_b, "prompts/list") == ["old", "new"]


async def test_an_added_upstream_is_shared_and_its_registry_lease_held_by_exactly_one_replica(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    counted: tuple[Upstream, Upstream],
) -> None:
    up_a, up_b = counted
    replicas = await start_replicas(config(redis_server, {"a": up_a}), count=2)
    for i in (0, 1):
        assert (await reload(http, replicas, i, config(redis_server, {"a": up_a, "c": up_b})))["added"] == ["c"]

    async def one_holder() -> bool:
        return len(await lease_holders(replicas, "c")) == 1

    await eventually(one_holder, limit_s=15, what="one replica holding c's lease")
    held = [await replicas.metric(i, "mcp_gateway_cluster_leases_held", upstream="c") for i in (0, 1)]
    assert sorted(held) == [0, 1], held
    await stored(http, redis_server, replicas.url(0, "c"), "tools/list")
    assert (await call(http, replicas.url(1, "c"))).shared
    assert await count(up_b, "tools/list") == 1
    assert len(await lease_holders(replicas, "c")) == 1


async def test_a_removed_upstream_gives_up_its_lease_and_drops_its_local_entries(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    counted: tuple[Upstream, Upstream],
) -> None:
    up_a, up_b = counted
    replicas = await start_replicas(config(redis_server, {"a": up_a, "b": up_b}), count=2)

    async def one_holder() -> bool:
        return len(await lease_holders(replicas, "b")) == 1

    await eventually(one_holder, limit_s=15, what="one replica holding b's lease")
    holder = (await lease_holders(replicas, "b"))[0]
    await stored(http, redis_server, replicas.url(holder, "b"), "tools/list")
    for i in (1 - holder, holder):  # the holder last: it gives the lease up as it reloads
        assert (await reload(http, replicas, i, config(redis_server, {"a": up_a})))["removed"] == ["b"]
    reloaded = asyncio.get_running_loop().time()

    async def lease_gone() -> bool:
        return not await asyncio.to_thread(redis_server.scan_keys, f"{KEY_PREFIX}:lease:b:*")

    await eventually(lease_gone, limit_s=UNTIL_EXPIRY_S, what="b's lease gone from Redis")
    assert asyncio.get_running_loop().time() - reloaded < UNTIL_EXPIRY_S
    for i in (0, 1):
        gone = await call(http, replicas.url(i, "b"))
        assert (gone.status, gone.json["error"]["code"]) == (404, -32601), gone.raw
        assert await replicas.metric(i, "mcp_gateway_cluster_leases_held", upstream="b") is None
    dropped = await replicas.metric(holder, "mcp_gateway_cache_evictions_total", reason="reload")
    assert dropped == 1
    assert (await call(http, replicas.url(holder, "a"))).status == 200  # a served on as before


async def test_the_purge_route_reaches_both_replicas_when_only_one_reloaded(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    counted: tuple[Upstream, Upstream],
) -> None:
    up_a, up_b = counted
    ups = {"a": up_a, "b": up_b}
    replicas = await start_replicas(config(redis_server, ups), count=2)
    await reload(http, replicas, 1, config(redis_server, ups, tag="new"))
    for name in ("a", "b"):
        for i in (0, 1):
            assert (await call(http, replicas.url(i, name))).status == 200
            assert (await call(http, replicas.url(i, name))).hit, (name, i)
    # From either file, of an upstream the same in both files or changed: each replica's entry
    # (a 60 s one, a local hit until then) goes.
    for name, where in (("a", 1), ("b", 1), ("a", 0), ("b", 0)):
        await purge(http, replicas, where, upstream=name)
        for i in (0, 1):
            url = replicas.url(i, name)
            await answers_until(http, url, lambda a: not a.hit or a.shared, f"no local hit on {url} (purge on {where})")
            await answers_until(http, url, lambda a: a.hit and not a.shared, f"{url} cached again")


async def answers_until(http: aiohttp.ClientSession, url: str, wanted: Callable[[Answer], bool], what: str) -> None:
    """``tools/list`` through ``url`` until an answer (a 200) is ``wanted``, at most 5 s."""
    seen: list[str] = []

    async def condition() -> bool:
        answer = await call(http, url)
        seen[:] = [f"{answer.status} {answer.cache_status}"]
        return answer.status == 200 and wanted(answer)

    await eventually(condition, limit_s=5, what=what, last=lambda: seen)


async def test_a_request_begun_on_the_old_file_stores_nothing_a_replica_on_the_new_file_reads(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    counted: tuple[Upstream, Upstream],
) -> None:
    up_a, up_b = counted
    ups = {"a": up_a, "b": up_b}
    replicas = await start_replicas(config(redis_server, ups), count=2)
    async with begun(replicas[1].port, "/servers/b/mcp", rpc("tools/list", "old")) as finish:
        for i in (0, 1):
            assert (await reload(http, replicas, i, config(redis_server, ups, tag="new")))["changed"] == ["b"]
        answer = await finish()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert await tags(up_b, "tools/list") == ["old"]  # it went upstream on the file it began with
    # What it fetched answers no request on the new file: not on another replica (nothing in
    # Redis), nor here (nothing stored); what the new file fetched is shared as before.
    await stored(http, redis_server, replicas.url(0, "b"), "tools/list")
    assert (await call(http, replicas.url(1, "b"))).shared
    assert await tags(up_b, "tools/list") == ["old", "new"]
