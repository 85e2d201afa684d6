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

from ..support.fleet import Upstream
from ..support.redis import RedisServer
from ..support.replicas import Replicas
from ..support.wire import mcp_headers, rpc
from .conftest import StartReplicas
from .test_replicas import KEY_PREFIX, call, cluster_config, direct_results, eventually, metric_on, without_ttl

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
