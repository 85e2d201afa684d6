"""The shared index of cached resource URIs stays bounded: the store path of a gateway built by
``create_app`` driven directly with 10,000 distinct ``resources/read`` entries, on a real Redis."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gateway.app import CLUSTER
from gateway.cache import CacheEntry, CacheKey, build_entry, canonical_json
from tests.support import StartGateway, StartUpstream
from tests.support.redis import RedisServer

from .test_tier import cluster_config, connected

pytestmark = pytest.mark.timeout(120)

READS = 10_000
#: The index's cap (gateway.cluster.uris.MAX_INDEXED_URIS), as documented.
CAP = 1024
#: Redis's own bytes for one member of a sorted set (skiplist node, dict entry, score), at most.
MEMBER_OVERHEAD_BYTES = 128


def read_entry(uri: str, now: float, ttl_ms: int = 60_000) -> tuple[CacheKey, CacheEntry]:
    """A stored ``resources/read`` of ``uri`` at ``now`` (cache clock seconds)."""
    result = {
        "contents": [{"uri": uri, "mimeType": "text/plain", "text": "hello"}],
        "resultType": "complete",
        "cacheScope": "public",
        "ttlMs": ttl_ms,
    }
    entry = build_entry({"jsonrpc": "2.0", "id": 1, "result": result}, now, 3_600_000)
    assert entry is not None
    return CacheKey("a", "resources/read", canonical_json({"uri": uri}), "2026-07-28", None), entry


def index_of(redis: RedisServer) -> tuple[bytes, int, int, int]:
    """The URI index of upstream ``a``: ``(key, members, bytes Redis uses for it, ms it has left)``."""
    keys = redis.scan_keys("t:uris:*")
    assert len(keys) == 1, keys
    key = keys[0]
    kind = redis.command("TYPE", key)
    members = redis.command("ZCARD" if kind in (b"zset", "zset") else "SCARD", key)
    return (
        key,
        int(members),
        int(redis.command("MEMORY", "USAGE", key, "SAMPLES", "0")),
        int(redis.command("PTTL", key)),
    )


async def test_ten_thousand_stored_reads_leave_an_index_within_its_cap_that_expires_with_its_entries(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream
) -> None:
    gw = await start_gateway(cluster_config(redis_server, await start_upstream()))
    await connected(gw)
    cluster = gw.app[CLUSTER]
    uris = [f"res://items/{n:05d}-a-resource-uri-of-sixty-characters-or-so" for n in range(READS)]
    started = time.monotonic()
    for uri in uris:
        key, entry = read_entry(uri, cluster.clock())
        assert await cluster._write(key, cluster.ident(key), entry)
    took_s = time.monotonic() - started

    key, members, used, left_ms = index_of(redis_server)
    bound = CAP * (len(uris[0]) + MEMBER_OVERHEAD_BYTES)
    report = f"{READS} reads in {took_s:.1f} s: {members} URIs indexed in {used} bytes (bound {bound})"
    assert members <= CAP, report
    assert used <= bound, report
    assert 0 < left_ms <= 60_000, left_ms  # with the entries it describes
    newest = await cluster.cached_uris("a", 256)
    assert len(newest) == 256 and set(newest) <= set(uris[-CAP:]), newest[:3]
    entries = redis_server.scan_keys("t:entry:*")
    with redis_server.client() as client:
        pipe = client.pipeline(transaction=False)
        for k in entries:
            pipe.memory_usage(k)
        entry_bytes = sum(int(n) for n in pipe.execute())
    print(f"{report}; {len(entries)} entries in {entry_bytes} bytes, each expiring with itself")

    # Once every entry it describes is gone, the next write leaves only its own URI.
    real_wall = cluster.wall_clock
    cluster.wall_clock = lambda: real_wall() + 120.0
    later_key, later_entry = read_entry("res://items/later", cluster.clock())
    assert await cluster._write(later_key, cluster.ident(later_key), later_entry)
    assert index_of(redis_server)[1] == 1
    assert await cluster.cached_uris("a", 256) == ["res://items/later"]


async def test_an_index_written_over_with_another_type_is_replaced(
    redis_server: RedisServer, start_gateway: StartGateway, start_upstream: StartUpstream
) -> None:
    gw = await start_gateway(cluster_config(redis_server, await start_upstream()))
    await connected(gw)
    cluster = gw.app[CLUSTER]
    name = cluster.uris.name("a")
    redis_server.command("SET", name, "garbage")
    key, entry = read_entry("res://items/one", cluster.clock())
    assert await cluster._write(key, cluster.ident(key), entry)
    assert await cluster.cached_uris("a", 10) == ["res://items/one"]
    members: Any = redis_server.command("ZCARD", name)
    assert members == 1
