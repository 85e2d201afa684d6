"""Values in Redis are authenticated and checked before use: real gateway processes with a
``[cluster].secret`` on one real Redis, in front of the real SDK upstream ``public_upstream``;
the forgeries are written into Redis as anyone who can write to it could write them."""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from gateway.cache import CacheEntry, CacheKey, build_entry

from ..support.fleet import Upstream
from ..support.redis import RedisServer
from ..support.replicas import Replicas
from ..support.wire import mcp_headers, rpc
from .conftest import StartReplicas
from .test_replicas import (
    KEY_PREFIX,
    call,
    cluster_config,
    direct_results,
    eventually,
    metric_on,
    purge,
    without_ttl,
)

pytestmark = pytest.mark.timeout(90)

SECRET = "cluster-tests-secret-0123456789abcdef"
SECRET_ENV = {"MCP_GATEWAY_CLUSTER_SECRET": SECRET}
#: An entry's header: magic, the key's digest, expiry (wall ms), ttlMs, where the ttlMs value was cut.
FIELDS = struct.Struct(">5s16sqqI")
UNKEYED_LAYOUT = b"mcpg1"  # header, BLAKE2b checksum (16 bytes, no key), body
MAC_BYTES = 32  # the current layout: header, body, HMAC-SHA256


def split(value: bytes) -> tuple[bytes, bytes, bytes]:
    """A stored entry's ``(header, head, tail)``: the body around its cut ``ttlMs`` value."""
    fields = value[: FIELDS.size]
    at = FIELDS.unpack(fields)[4]
    body = value[FIELDS.size + 16 :] if fields.startswith(UNKEYED_LAYOUT) else value[FIELDS.size : -MAC_BYTES]
    return fields, body[:at], body[at:]


def forge(value: bytes, head: bytes, tail: bytes, *, secret: str | None) -> bytes:
    """``value`` with the body ``head`` + ``tail``, signed as well as ``secret`` allows: ``None``
    is what anyone can compute (the unkeyed checksum; the MAC under the public no-secret key)."""
    magic, digest, expires_ms, ttl_ms, _ = FIELDS.unpack(value[: FIELDS.size])
    fields = FIELDS.pack(magic, digest, expires_ms, ttl_ms, len(head))
    body = head + tail
    if magic == UNKEYED_LAYOUT:
        checksum = hashlib.blake2b(fields, digest_size=16, person=b"mcp-gateway-val")
        checksum.update(body)
        return fields + checksum.digest() + body
    from gateway.cluster.mac import Keys

    return fields + body + Keys(secret).mac(fields + body)


def not_json(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return b',"result":{"tools":[{"name":"evil","description":"\xff\xfe not UTF-8 ' + head[-40:], tail


def replaced(head: bytes, tail: bytes, old: bytes, new: bytes) -> tuple[bytes, bytes]:
    """``old`` replaced by ``new`` once, in whichever side of the cut holds it."""
    assert (old in head) != (old in tail), (old, head[:100], tail[:100])
    return head.replace(old, new, 1), tail.replace(old, new, 1)


def rewritten(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return replaced(head, tail, b'"description":"', b'"description":"FORGED ')


def private(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return replaced(head, tail, b'"cacheScope":"public"', b'"cacheScope":"private"')


def not_an_object(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return b',"result":[{"tools":[],"ttlMs":', b"}]}"


def input_required(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return replaced(head, tail, b'"resultType":"complete"', b'"resultType":"input_required"')


async def tools_list_entry(redis: RedisServer) -> tuple[bytes, bytes]:
    """``(key, value)`` of the shared ``tools/list`` entry, once a replica has written it."""
    found: list[tuple[bytes, bytes]] = []

    async def written() -> bool:
        for key in await asyncio.to_thread(redis.scan_keys, f"{KEY_PREFIX}:entry:*"):
            value = await asyncio.to_thread(redis.command, "GET", key)
            if isinstance(value, bytes) and b'"tools":[' in value:
                found[:] = [(key, value)]
                return True
        return False

    await eventually(written, limit_s=5, what="the tools/list entry in Redis")
    return found[0]


async def aggregate_tools(http: aiohttp.ClientSession, replicas: Replicas, index: int) -> tuple[int, Any]:
    """``POST /mcp`` ``tools/list`` on replica ``index``: ``(status, JSON or bytes)``."""
    body = json.dumps(rpc("tools/list", "agg"))
    async with http.post(f"{replicas.base_url(index)}/mcp", data=body, headers=mcp_headers("tools/list")) as resp:
        raw = await resp.read()
        return resp.status, json.loads(raw) if raw.startswith(b"{") else raw


def assert_composed(status: int, composed: Any, expected: dict[str, Any], index: int) -> None:
    """The member's own list under ``/mcp``: every tool, prefixed, its description unchanged."""
    assert status == 200, (index, status, composed)
    tools = composed["result"]["tools"]
    assert [t["name"] for t in tools] == [f"pub__{t['name']}" for t in expected["tools"]], index
    assert [t.get("description") for t in tools] == [t.get("description") for t in expected["tools"]], index


async def forged_entry_is_a_miss_everywhere(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    spoil: Callable[[bytes, bytes], tuple[bytes, bytes]],
    secret: str | None,
    outcome: str,
) -> None:
    """Replica 0 stores ``tools/list``; its Redis value is replaced by ``spoil``'s body signed with
    ``secret``; replicas 1 and 2 (which never held it) must answer the upstream's own list, with
    no hit, on ``/servers/pub/mcp`` and ``POST /mcp``, and count the read as ``outcome``."""
    config = cluster_config(redis_server, {"pub": public_up}, aggregate={"upstreams": ["pub"]})
    config["cluster"]["secret"] = "${MCP_GATEWAY_CLUSTER_SECRET}"
    replicas = await start_replicas(config, 3, env=SECRET_ENV)
    expected = (await direct_results(http, public_up))[0]
    assert (await call(http, replicas.url(0, "pub"))).stored
    key, value = await tools_list_entry(redis_server)
    _, head, tail = split(value)
    forged = forge(value, *spoil(head, tail), secret=secret)

    redis_server.command("SET", key, forged, "KEEPTTL")
    assert_composed(*await aggregate_tools(http, replicas, 2), expected, 2)  # the part read from Redis
    redis_server.command("SET", key, forged, "KEEPTTL")  # replica 2 stored its own answer over it
    answer = await call(http, replicas.url(1, "pub"), id_="b")
    assert answer.status == 200, (answer.status, answer.raw[:300])
    assert not answer.hit, answer.cache_status
    assert without_ttl(answer.result) == without_ttl(expected)
    assert b"FORGED" not in answer.raw
    again = await call(http, replicas.url(1, "pub"), id_="b2")  # its own answer, from its local tier
    assert again.status == 200 and without_ttl(again.result) == without_ttl(expected)
    assert_composed(*await aggregate_tools(http, replicas, 1), expected, 1)
    for index in (1, 2):
        counted = await metric_on(replicas, index, "mcp_gateway_cluster_reads_total", result=outcome)
        assert counted is not None and counted >= 1, (index, outcome)


@pytest.mark.parametrize("spoil", [not_json, rewritten], ids=["not-json", "descriptions-rewritten"])
async def test_a_forged_entry_with_a_recomputed_unkeyed_checksum_is_a_miss_counted_as_forged(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    spoil: Callable[[bytes, bytes], tuple[bytes, bytes]],
) -> None:
    await forged_entry_is_a_miss_everywhere(
        redis_server, start_replicas, http, public_up, spoil, secret=None, outcome="forged"
    )


@pytest.mark.parametrize(
    "spoil",
    [not_json, private, not_an_object, input_required],
    ids=["not-json", "private", "result-not-an-object", "input-required"],
)
async def test_an_entry_with_a_valid_mac_and_a_body_the_cache_would_not_store_is_a_miss_counted_as_corrupt(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    spoil: Callable[[bytes, bytes], tuple[bytes, bytes]],
) -> None:
    await forged_entry_is_a_miss_everywhere(
        redis_server, start_replicas, http, public_up, spoil, secret=SECRET, outcome="corrupt"
    )


async def test_an_entry_copied_under_the_generation_a_purge_raised_is_a_miss_counted_as_forged(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    """Anyone who can write to Redis, without the secret, copies a purged entry's value under
    the key of the generation the purge raised: no replica may answer from it (the value names
    the key it was written under, and the MAC covers that)."""
    config = cluster_config(redis_server, {"pub": public_up})
    config["cluster"]["secret"] = "${MCP_GATEWAY_CLUSTER_SECRET}"
    replicas = await start_replicas(config, 2, env=SECRET_ENV)
    assert (await call(http, replicas.url(0, "pub"))).stored
    old_key, value = await tools_list_entry(redis_server)
    await purge(http, replicas, 0, upstream="pub", method="tools/list")
    generation, digest = old_key.decode().rsplit(":", 2)[-2:]

    generations = redis_server.scan_keys(f"{KEY_PREFIX}:generations:pub:*")
    assert len(generations) == 1
    new_generation = int(redis_server.command("HGET", generations[0], "tools/list"))
    assert new_generation > int(generation)  # raised before the purge answered
    new_key = f"{KEY_PREFIX}:entry:{new_generation}:{digest}"
    assert redis_server.command("SET", new_key, value, "PX", 60_000)
    answer = await call(http, replicas.url(1, "pub"), id_="after")  # it never held the entry
    assert answer.status == 200, answer.raw[:300]
    assert not answer.hit, answer.cache_status
    counted = await metric_on(replicas, 1, "mcp_gateway_cluster_reads_total", result="corrupt")
    assert counted is not None and counted >= 1


# -- the value's checks, in-process ------------------------------------------------------------------------

KEY = CacheKey("a", "tools/list", b"{}", "2026-07-28", None)
IDENTITY = "ab" * 12
BOUNDS = {"clock_now": 0.0, "wall_now": 5_000.0, "max_ttl_ms": 3_600_000, "max_entry_bytes": 1 << 20}


def stored_value(keys: Any, result: dict[str, Any] | None = None) -> bytes:
    from gateway.cluster.entries import encode, key_digest

    result = result or {
        "tools": [{"name": "t", "description": "a tool", "inputSchema": {"type": "object", "ttlMs": {"x": 1}}}],
        "resultType": "complete",
        "cacheScope": "public",
        "ttlMs": 60_000,
    }
    entry = build_entry({"jsonrpc": "2.0", "id": 1, "result": result}, 100.0, 3_600_000)
    assert entry is not None
    return encode(keys, key_digest(KEY, IDENTITY), entry, clock_now=100.0, wall_now=5_000.0)[0]


def test_a_value_macd_under_another_secret_or_none_is_forged() -> None:
    from gateway.cluster.entries import FORGED, decode, key_digest
    from gateway.cluster.mac import Keys

    ours = Keys(SECRET)
    for writer in (Keys(None), Keys(SECRET + "x"), Keys(SECRET[:-1])):
        assert decode(ours, stored_value(writer), key_digest(KEY, IDENTITY), **BOUNDS) == FORGED
    assert isinstance(decode(ours, stored_value(ours), key_digest(KEY, IDENTITY), **BOUNDS), CacheEntry)


def nested_cut(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    """The cut moved to a ``"ttlMs":`` inside the result (an input schema's property)."""
    body = head + b"0" + tail
    at = body.index(b'"ttlMs":{"x":1}') + len(b'"ttlMs":')
    return body[:at], body[at + len(b'{"x":1}') :].replace(b'"ttlMs":0', b'"ttlMs":{"x":1}', 1)


def duplicate_ttl(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return head.replace(b'"tools":', b'"ttlMs":5,"tools":', 1), tail


def trailing_member(head: bytes, tail: bytes) -> tuple[bytes, bytes]:
    return head, tail[:-1] + b',"extra":1}'


@pytest.mark.parametrize(
    "spoil",
    [None, not_json, private, not_an_object, input_required, nested_cut, duplicate_ttl, trailing_member],
    ids=["genuine", "not-json", "private", "not-an-object", "input-required", "nested-cut", "duplicate", "trailing"],
)
def test_the_simdjson_check_and_the_full_parse_agree_on_a_value(
    spoil: Callable[[bytes, bytes], tuple[bytes, bytes]] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.cluster import entries
    from gateway.cluster.mac import Keys

    keys = Keys(SECRET)
    value = stored_value(keys)
    if spoil is not None:
        _, head, tail = split(value)
        value = forge(value, *spoil(head, tail), secret=SECRET)
    assert entries._PARSER is not None, "the speed extra (simdjson) is installed for the tests"
    fast = entries.decode(keys, value, entries.key_digest(KEY, IDENTITY), **BOUNDS)
    monkeypatch.setattr(entries, "_PARSER", None)
    full = entries.decode(keys, value, entries.key_digest(KEY, IDENTITY), **BOUNDS)
    if spoil is None:
        assert isinstance(fast, CacheEntry) and isinstance(full, CacheEntry)
        assert fast.response(b"7", 1.0) == full.response(b"7", 1.0)
    else:
        assert fast == full == entries.CORRUPT
