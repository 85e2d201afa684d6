"""The shared tier in-process: gateways built by ``create_app`` on one real Redis, with scripted
upstreams for the faults real servers will not produce (a leader that never finishes, private
answers). The replica tests (``test_replicas.py``) run real processes and SDK servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import CLUSTER, STORE
from gateway.cache import CacheEntry, CacheKey, build_entry
from gateway.cluster.entries import CORRUPT, FORGED, decode, encode, key_digest
from gateway.cluster.mac import Keys
from tests.support import FakeUpstream, RunningGateway, StartGateway, StartUpstream
from tests.support.polling import wait_until
from tests.support.redis import RedisServer
from tests.support.telemetry import cache_sizes
from tests.support.wire import list_result, mcp_headers, rpc

pytestmark = pytest.mark.timeout(60)

ADMIN = "admin-token-0123456789"


def cluster_config(redis: RedisServer, upstream: FakeUpstream, **up: Any) -> dict[str, Any]:
    return {
        "cluster": {"redis_url": redis.url, "key_prefix": "t"},
        "admin": {"token": ADMIN},
        "upstreams": {"a": {"url": upstream.url, **up}},
    }


async def connected(*gateways: RunningGateway) -> None:
    await wait_until(
        lambda: all(g.registry.get_sample_value("mcp_gateway_cluster_up") == 1 for g in gateways),
        what="the shared tier up",
    )


async def in_redis(redis: RedisServer, gw: RunningGateway, cursor: str | None = None) -> None:
    """Until the entry ``gw`` holds for ``tools/list`` (with ``cursor``) is in Redis: a gateway
    writes it there in the background, after answering; within 10 s."""
    params = b"{}" if cursor is None else b'{"cursor":"' + cursor.encode() + b'"}'
    (key,) = [k for k in gw.app[STORE].keys() if k.method == "tools/list" and k.params == params]
    cluster = gw.app[CLUSTER]

    def written() -> bool:
        with redis.client() as client:
            return bool(client.exists(cluster.link.key("entry", cluster.ident(key))))

    await wait_until(written, what=f"the entry of {key} in Redis")


async def call(http: aiohttp.ClientSession, gw: RunningGateway, id_: object, **params: Any) -> tuple[int, str, Any]:
    async with http.post(
        gw.url("a"), json=rpc("tools/list", id_=id_, **params), headers=mcp_headers("tools/list")
    ) as r:
        return r.status, r.headers.get("Cache-Status", ""), await r.json()


# -- values in Redis ---------------------------------------------------------------------------------------


def _entry(now: float, ttl_ms: int = 60_000) -> CacheEntry:
    entry = build_entry(list_result(1, ttl_ms=ttl_ms), now, 3_600_000)
    assert entry is not None
    return entry


KEY = CacheKey("a", "tools/list", b"{}", "2026-07-28", None)
OTHER = CacheKey("a", "tools/list", b'{"cursor":"x"}', "2026-07-28", None)
KEYS = Keys(None)
IDENTITY = "00" * 12


def test_an_entry_read_back_answers_as_the_one_stored_with_the_time_left() -> None:
    entry = _entry(100.0)
    value, left_ms = encode(KEYS, key_digest(KEY, IDENTITY), entry, clock_now=110.0, wall_now=5_000.0)
    assert left_ms == 50_000
    # Another process: another clock, the same wall clock 2 s later.
    read = decode(
        KEYS,
        value,
        key_digest(KEY, IDENTITY),
        clock_now=7.0,
        wall_now=5_002.0,
        max_ttl_ms=3_600_000,
        max_entry_bytes=1 << 20,
    )
    assert isinstance(read, CacheEntry)
    assert read.response(b'"x"', 7.0) == entry.response(b'"x"', 112.0)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda v: v[:-1],  # truncated
        lambda v: b"X" + v[1:],  # wrong magic
        lambda v: v[:10] + bytes([v[10] ^ 1]) + v[11:],  # a byte of the key's digest changed
        lambda v: v[:40] + bytes([v[40] ^ 4]) + v[41:],  # the ttlMs cut moved
        lambda v: v.replace(b'"tools"', b'"tool\\"'),  # not JSON any more
        lambda v: v.replace(b'"public"', b'"private"'),  # a private result
        lambda v: b"",
        lambda v: b"\x00" * 64,
    ],
)
def test_a_spoilt_value_is_a_miss(spoil: Any) -> None:
    value, _ = encode(KEYS, key_digest(KEY, IDENTITY), _entry(100.0), clock_now=100.0, wall_now=5_000.0)
    bounds = {"clock_now": 0.0, "wall_now": 5_000.0, "max_ttl_ms": 3_600_000, "max_entry_bytes": 1 << 20}
    assert isinstance(decode(KEYS, value, key_digest(KEY, IDENTITY), **bounds), CacheEntry)
    assert decode(KEYS, spoil(value), key_digest(KEY, IDENTITY), **bounds) in (FORGED, CORRUPT)


def test_a_value_of_another_key_or_expired_or_over_the_bounds_is_a_miss() -> None:
    value, _ = encode(KEYS, key_digest(KEY, IDENTITY), _entry(100.0, ttl_ms=10_000), clock_now=100.0, wall_now=5_000.0)
    bounds = {"clock_now": 0.0, "max_entry_bytes": 1 << 20}
    assert decode(KEYS, value, key_digest(OTHER, IDENTITY), wall_now=5_000.0, max_ttl_ms=3_600_000, **bounds) == CORRUPT
    assert decode(KEYS, value, key_digest(KEY, IDENTITY), wall_now=5_010.0, max_ttl_ms=3_600_000, **bounds) == CORRUPT
    assert decode(KEYS, value, key_digest(KEY, IDENTITY), wall_now=5_000.0, max_ttl_ms=5_000, **bounds) == CORRUPT
    assert (
        decode(
            KEYS,
            value,
            key_digest(KEY, IDENTITY),
            wall_now=5_000.0,
            max_ttl_ms=3_600_000,
            clock_now=0.0,
            max_entry_bytes=10,
        )
        == CORRUPT
    )


# -- two gateways, one Redis ---------------------------------------------------------------------------------


async def test_a_leader_that_never_finishes_holds_followers_for_the_upstream_timeout_only(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    first = asyncio.Event()

    async def hang_once(request: web.Request, msg: Any) -> web.StreamResponse:
        if not first.is_set():
            first.set()
            await asyncio.sleep(30)  # the leader's upstream request never ends in time
        return web.json_response(list_result(msg["id"]))

    upstream.handlers["tools/list"] = hang_once
    config = cluster_config(redis_server, upstream, timeout_s=1.5)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    leader = asyncio.ensure_future(call(http, a, "leader"))
    await asyncio.wait_for(first.wait(), 5)
    started = time.monotonic()
    status, cache_status, body = await call(http, b, "follower")
    waited = time.monotonic() - started
    assert (status, body["id"]) == (200, "follower")
    assert "fwd=miss" in cache_status  # it went upstream itself
    assert 1.0 <= waited < 4.0, waited
    assert (await leader)[0] == 504
    assert upstream.count("tools/list") == 2


async def test_a_lock_written_over_without_expiry_does_not_hold_anyone(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    a = await start_gateway(cluster_config(redis_server, upstream, timeout_s=20))
    await connected(a)
    key = CacheKey("a", "tools/list", b"{}", "2026-07-28", None)
    ident = a.app[CLUSTER].ident(key._replace(capabilities=_empty_caps()))
    redis_server.command("SET", f"t:lock:{ident}", "garbage")  # no expiry: not a lock a leader took
    started = time.monotonic()
    status, cache_status, _ = await call(http, a, 1)
    assert status == 200 and "fwd=miss" in cache_status
    assert time.monotonic() - started < 5


def _empty_caps() -> bytes:
    import hashlib

    from gateway.cache import canonical_json

    return hashlib.sha256(canonical_json({})).digest()


async def test_private_answers_and_entries_keyed_on_a_callers_authorization_stay_out_of_redis(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    private = await start_upstream(lambda _r, msg: _json(list_result(msg["id"], scope="private")))
    own_auth = await start_upstream()
    config = {
        "cluster": {"redis_url": redis_server.url, "key_prefix": "t"},
        "upstreams": {"p": {"url": private.url}, "o": {"url": own_auth.url, "forward_authorization": True}},
    }
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    secret = "Bearer caller-secret-0123456789"
    for gw in (a, b):
        for name in ("p", "o"):
            async with http.post(
                f"{gw.base_url}/servers/{name}/mcp",
                json=rpc("tools/list", id_=1),
                headers={**mcp_headers("tools/list"), "Authorization": secret},
            ) as r:
                assert r.status == 200
                assert "detail=shared" not in r.headers["Cache-Status"]
    assert private.count("tools/list") == 2  # never shared
    assert own_auth.count("tools/list") == 2  # stored per process only
    assert not [k for k in redis_server.scan_keys() if b":entry:" in k]
    assert all(b"caller-secret" not in blob for blob in redis_server.blobs())


async def _json(payload: Any) -> web.Response:
    return web.json_response(payload)


async def test_with_redis_paused_callers_are_answered_within_the_bound_and_sharing_resumes(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    config = cluster_config(redis_server, upstream)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    redis_server.pause(3.0)
    started = time.monotonic()
    answers = [await call(http, gw, i, cursor=f"c{i}") for i, gw in enumerate((a, b, a, b))]
    assert [s for s, _, _ in answers] == [200] * 4
    assert time.monotonic() - started < 2.5  # bounded per Redis call, then served without it
    await wait_until(lambda: a.registry.get_sample_value("mcp_gateway_cluster_up") == 0, what="down", limit_s=5)
    await connected(a, b)  # the pause ends: back by itself
    assert (await call(http, a, "x", cursor="after"))[1].endswith("stored; ttl=60")
    await in_redis(redis_server, a, "after")
    assert "detail=shared" in (await call(http, b, "y", cursor="after"))[1]


# -- invalidation when Redis misbehaves ------------------------------------------------------------------


class Versioned:
    """An upstream whose tools list names its current version (``t<n>``): an answer shows which
    version it was fetched at."""

    def __init__(self) -> None:
        self.version = 1

    async def __call__(self, request: web.Request, msg: Any) -> web.StreamResponse:
        body = list_result(msg["id"])
        body["result"]["tools"][0]["name"] = f"t{self.version}"
        return web.json_response(body)


def tool(answer: tuple[int, str, Any]) -> str:
    return str(answer[2]["result"]["tools"][0]["name"])


async def purge_answer(http: aiohttp.ClientSession, gw: RunningGateway) -> tuple[int, dict[str, Any]]:
    """``POST /admin/cache/purge`` (everything): the status and the JSON body."""
    async with http.post(f"{gw.base_url}/admin/cache/purge", headers={"Authorization": f"Bearer {ADMIN}"}) as r:
        return r.status, dict(await r.json())


async def purge(http: aiohttp.ClientSession, gw: RunningGateway) -> int:
    """A purge the cluster takes: the local count."""
    status, body = await purge_answer(http, gw)
    assert status == 200 and body["cluster"] == "done", (status, body)
    return int(body["purged"])


async def versioned_pair(
    redis: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> tuple[Versioned, RunningGateway, RunningGateway]:
    """Two gateways in front of a :class:`Versioned` upstream, both holding its ``t1`` list (B from Redis)."""
    versioned = Versioned()
    upstream = await start_upstream(versioned)
    config = cluster_config(redis, upstream)
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    assert tool(await call(http, a, 1)) == "t1"
    await in_redis(redis, a)
    assert "detail=shared" in (await call(http, b, 2))[1]
    return versioned, a, b


async def everyone_serves(http: aiohttp.ClientSession, version: str, *gateways: RunningGateway) -> None:
    async def fresh() -> bool:
        for i, gw in enumerate(gateways):
            if tool(await call(http, gw, f"check-{i}")) != version:
                return False
        return True

    await wait_until(fresh, limit_s=5, what=f"{version} on every gateway")


async def test_a_purge_the_cluster_took_says_done_and_leaves_nothing_pending(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    _versioned, a, _b = await versioned_pair(redis_server, start_gateway, start_upstream, http)
    assert await purge_answer(http, a) == (200, {"purged": 1, "cluster": "done"})
    assert a.registry.get_sample_value("mcp_gateway_cluster_invalidations_pending") == 0


async def test_a_purge_on_another_gateway_shows_in_this_ones_cache_size_gauges_without_a_push(
    redis_server: RedisServer,
    start_gateway: StartGateway,
    start_upstream: StartUpstream,
    http: aiohttp.ClientSession,
) -> None:
    _versioned, a, b = await versioned_pair(redis_server, start_gateway, start_upstream, http)
    assert cache_sizes(b.registry) == (1, b.app[STORE].total_bytes)  # copied from Redis
    await purge(http, a)
    await wait_until(lambda: cache_sizes(b.registry) == (0, 0), what="the purge in b's size gauges")


async def test_a_purge_redis_refuses_to_write_is_kept_until_it_gets_through(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    versioned, a, b = await versioned_pair(redis_server, start_gateway, start_upstream, http)
    versioned.version = 2
    redis_server.pause(1.5, mode="WRITE")
    status, body = await purge_answer(http, a)
    assert (status, body["purged"], body["cluster"]) == (503, 1, "pending"), body
    # The purging gateway never answers from what it purged, not even through Redis.
    assert tool(await call(http, a, 3)) == "t2"
    assert tool(await call(http, a, 4)) == "t2"
    # Once Redis takes writes again the purge gets through to the other one.
    await everyone_serves(http, "t2", a, b)


async def test_a_purge_after_redis_was_flushed_and_a_replica_restarted_still_reaches_everyone(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    versioned, a, b = await versioned_pair(redis_server, start_gateway, start_upstream, http)
    await purge(http, a)  # generations raised once
    redis_server.flush()
    assert tool(await call(http, a, 5)) == "t1"  # stored again, under a's generation
    c = await start_gateway(cluster_config(redis_server, await start_upstream(versioned)))  # a newcomer
    await connected(c)
    versioned.version = 2
    await purge(http, c)
    await everyone_serves(http, "t2", a, b, c)


@pytest.mark.parametrize(
    "spoil",
    [
        ("DEL", "t:events"),
        ("SET", "t:events", "x"),
        ("SET", "{generations}", "x"),
        ("HSET", "{generations}", "tools/list", "9223372036854775807"),
        ("HSET", "{generations}", "tools/list", "not a number"),
    ],
    ids=["events-deleted", "events-a-string", "generations-a-string", "generation-huge", "generation-garbage"],
)
async def test_a_purge_gets_through_after_the_shared_state_was_written_over(
    redis_server: RedisServer,
    start_gateway: StartGateway,
    start_upstream: StartUpstream,
    http: aiohttp.ClientSession,
    spoil: tuple[str, ...],
) -> None:
    versioned, a, b = await versioned_pair(redis_server, start_gateway, start_upstream, http)
    generations = a.app[CLUSTER].generations.name("a")  # the hash of upstream a as both reach it
    redis_server.command(*(part.replace("{generations}", generations) for part in spoil))
    if spoil[:2] == ("SET", "t:events"):
        # The feeds read the stream all the time: one finds it is not one and removes it (a purge
        # published to the string would be kept pending). Nothing reads the rest before the purge.
        await wait_until(
            lambda: redis_server.command("TYPE", "t:events") != b"string", what="a feed to replace t:events"
        )
    versioned.version = 2
    await purge(http, a)
    await everyone_serves(http, "t2", a, b)
    # And again: the shared tier still works as one cache afterwards.
    versioned.version = 3
    await purge(http, b)
    await everyone_serves(http, "t3", a, b)


async def test_a_lease_holder_whose_lease_was_taken_lets_go(redis_server: RedisServer) -> None:
    from prometheus_client import CollectorRegistry

    from gateway.cluster.lease import Leases
    from gateway.cluster.link import RedisLink
    from gateway.config import ClusterConfig
    from gateway.telemetry import GatewayMetrics

    link = RedisLink(ClusterConfig(redis_url=redis_server.url, key_prefix="t"), GatewayMetrics(CollectorRegistry()))
    link.mark(True)
    changes: list[tuple[str, bool]] = []
    leases = Leases(link, ["a"], lambda job, doing: changes.append((job, doing)))
    try:
        await leases.step("a")
        assert leases.doing["a"] and changes == [("a", True)]
        redis_server.command("SET", "t:lease:a", "someone-else", "PX", "10000")  # it expired and was taken
        await leases.step("a")
        assert not leases.doing["a"] and changes[-1] == ("a", False)
        redis_server.command("SET", "t:lease:a", "written-over")  # no expiry: removed, then taken
        await leases.step("a")
        await leases.step("a")
        assert leases.doing["a"]
    finally:
        await link.close()


# -- events and registry state are authenticated too -----------------------------------------------------------

SECRET = "tier-tests-secret-0123456789abcdef"


async def test_an_event_not_macd_with_the_secret_is_ignored_and_counted(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    import json

    upstream = await start_upstream()
    config = cluster_config(redis_server, upstream)
    config["cluster"]["secret"] = SECRET
    a, b = await start_gateway(config), await start_gateway(config)
    await connected(a, b)
    assert "stored" in (await call(http, a, 1))[1]
    assert "detail=shared" in (await call(http, b, 2))[1]
    purge_all = {"type": "invalidate", "invalidation": {"upstream": None, "methods": None, "uri": None}}
    event = json.dumps({**purge_all, "reason": "purge", "generations": {}, "origin": "someone"})
    for mac in (None, Keys(None).mac(event.encode(), "event"), Keys(SECRET).mac(event.encode(), "value")):
        redis_server.command("XADD", "t:events", "*", "e", event, *(("m", mac) if mac is not None else ()))

    def forged_events(gw: RunningGateway) -> float:
        return gw.registry.get_sample_value("mcp_gateway_cluster_errors_total", {"operation": "forged_event"}) or 0.0

    await wait_until(lambda: forged_events(a) == forged_events(b) == 3, what="three forged events counted on each")
    for n, gw in enumerate((a, b)):
        assert "detail=" not in (answer := await call(http, gw, f"after-{n}"))[1] and "hit" in answer[1], answer[1]


async def test_registry_state_not_macd_with_the_secret_is_ignored_and_counted(redis_server: RedisServer) -> None:
    import json

    from prometheus_client import CollectorRegistry

    from gateway.cluster.link import RedisLink
    from gateway.config import ClusterConfig
    from gateway.registry.shared import RegistryMirror
    from gateway.registry.state import RegistryState
    from gateway.telemetry import GatewayMetrics

    registry = CollectorRegistry()
    link = RedisLink(ClusterConfig(redis_url=redis_server.url, key_prefix="t"), GatewayMetrics(registry))
    link.mark(True)
    identities = {"a": "cd" * 12}
    try:
        holder = RegistryMirror(link, RegistryState(["a"]), identities, Keys(SECRET))
        holder.state.upstreams["a"].era = "modern"
        await holder.publish("a")
        reader = RegistryMirror(link, RegistryState(["a"]), identities, Keys(SECRET))
        assert await reader.load("a") and reader.state.upstreams["a"].era == "modern"
        name = f"t:registry:a:{identities['a']}"
        genuine = redis_server.command("GET", name)
        state = json.loads(genuine[32:])
        forged = {**state, "era": "legacy"}
        forged_json = json.dumps(forged).encode()
        for value in (forged_json, Keys(None).mac(forged_json, "state") + forged_json, genuine[:32] + forged_json):
            redis_server.command("SET", name, value, "PX", "60000")
            assert not await reader.load("a")
            assert reader.state.upstreams["a"].era == "modern"  # the last good copy kept
        counted = registry.get_sample_value("mcp_gateway_cluster_errors_total", {"operation": "forged_registry"})
        assert counted == 3
    finally:
        await link.close()


async def test_every_generations_hash_expires_a_day_after_its_last_use(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream, http: aiohttp.ClientSession
) -> None:
    upstream = await start_upstream()
    a = await start_gateway(cluster_config(redis_server, upstream))
    await connected(a)
    generations = a.app[CLUSTER].generations
    name = generations.name("a")
    day_ms = 86_400_000
    assert 0 < redis_server.command("PTTL", name) <= day_ms  # set when it was loaded
    redis_server.command("PEXPIRE", name, 5_000)
    await purge(http, a)  # raised: used again
    assert day_ms - 60_000 < redis_server.command("PTTL", name) <= day_ms
    redis_server.command("PEXPIRE", name, 5_000)
    await generations.touch()  # what every process does every hour
    assert day_ms - 60_000 < redis_server.command("PTTL", name) <= day_ms
    assert set(redis_server.command("HKEYS", name)) == {m.encode() for m in generations.methods}
