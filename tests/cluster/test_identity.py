"""An upstream's shared state belongs to one configuration of it: real gateway processes on one
real Redis and key prefix, each with an upstream named ``tools`` but another ``url`` or another
credential header, in front of real SDK upstreams (``public_upstream``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from ..support.fleet import Upstream, fetch_counts, reset_counts, run_server
from ..support.redis import RedisServer
from .conftest import StartReplicas
from .test_replicas import (
    INVALIDATION_S,
    LIVE_META_KEY,
    UPSTREAM_TTL_MS,
    call,
    cluster_config,
    count,
    eventually,
    purge,
    stored_in_redis,
    unique,
)

pytestmark = pytest.mark.timeout(90)

KEY_ONE = "tenant-one-api-key-0123456789"
KEY_TWO = "tenant-two-api-key-9876543210"


@pytest.fixture(scope="module")
def other_public_up() -> Iterator[Upstream]:
    """A second ``public_upstream.py``: the same answers at another URL."""
    with run_server("public_upstream") as up:
        yield up


def gateway_config(redis: RedisServer, up: Upstream, api_key: str) -> dict[str, Any]:
    config = cluster_config(redis, {"tools": up})
    config["upstreams"]["tools"]["headers"] = {"X-Api-Key": api_key}
    return config


async def config_digest(replicas: Any, index: int) -> tuple[str, str]:
    """Upstream ``tools``'s ``configDigest`` in ``/v0.1/servers`` and in ``/registry/versions``."""
    status, listing = await replicas.get(index, "/v0.1/servers/tools/versions/latest")
    assert status == 200, listing
    status, versions = await replicas.get(index, "/registry/versions")
    assert status == 200, versions
    return listing["_meta"][LIVE_META_KEY]["configDigest"], versions["upstreams"]["tools"]["configDigest"]


@pytest.mark.parametrize("differs", ["url", "headers"])
async def test_gateways_configured_otherwise_for_an_upstream_never_answer_from_each_others_entries(
    redis_server: RedisServer,
    start_replicas: StartReplicas,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    other_public_up: Upstream,
    differs: str,
) -> None:
    first_up, second_up = (public_up, other_public_up) if differs == "url" else (public_up, public_up)
    second_key = KEY_TWO if differs == "headers" else KEY_ONE
    one = await start_replicas(gateway_config(redis_server, first_up, KEY_ONE), 1, name="one")
    two = await start_replicas(gateway_config(redis_server, second_up, second_key), 1, name="two")
    for up in {public_up.url: public_up, other_public_up.url: other_public_up}.values():
        await reset_counts(up)

    # One way: one stores tools/list; two asks its own upstream for it.
    assert (await call(http, one.url(0, "tools"))).stored
    await eventually(lambda: stored_in_redis(redis_server, b"slow_progress"), limit_s=5, what="one's entry in Redis")
    on_two = await call(http, two.url(0, "tools"))
    assert on_two.stored and not on_two.hit, on_two.cache_status
    # The other way: two stores a read first; one asks its own upstream for it.
    uri = f"res://items/{unique('two-first')}"
    assert (await call(http, two.url(0, "tools"), "resources/read", {"uri": uri})).stored
    on_one = await call(http, one.url(0, "tools"), "resources/read", {"uri": uri})
    assert on_one.stored and not on_one.hit, on_one.cache_status
    if differs == "url":
        for up in (public_up, other_public_up):
            counts = await fetch_counts(up)
            assert (counts.get("tools/list"), counts.get("resources/read")) == (1, 1), (up.url, counts)
    else:
        assert (await count(public_up, "tools/list"), await count(public_up, "resources/read")) == (2, 2)

    # The same configuration as one's still shares one's entries.
    three = await start_replicas(gateway_config(redis_server, first_up, KEY_ONE), 1, name="three")
    assert (await call(http, three.url(0, "tools"))).shared
    assert (await call(http, three.url(0, "tools"), "resources/read", {"uri": uri})).shared

    # The registry says which configuration each replica has; Redis holds no credential.
    digests = [await config_digest(replicas, 0) for replicas in (one, two, three)]
    assert all(listed == versions for listed, versions in digests), digests
    assert digests[0] == digests[2] != digests[1]
    blobs = redis_server.blobs()
    assert not [b[:100] for b in blobs if KEY_ONE.encode() in b or KEY_TWO.encode() in b]


async def test_a_purge_by_name_on_a_gateway_configured_otherwise_reaches_the_shared_entries_of_every_configuration(
    redis_server: RedisServer, start_replicas: StartReplicas, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    one = await start_replicas(gateway_config(redis_server, public_up, KEY_ONE), 1, name="one")
    two = await start_replicas(gateway_config(redis_server, public_up, KEY_TWO), 2, name="two")
    assert (await call(http, one.url(0, "tools"))).stored
    assert (await call(http, two.url(0, "tools"))).stored
    assert (await call(http, two.url(1, "tools"))).shared  # two's entry, in Redis and on both of two's
    old_received_by = time.monotonic()

    await purge(http, one, 0, upstream="tools")
    await asyncio.sleep(INVALIDATION_S)  # the contract's bound for every replica
    for index in (0, 1):
        asked = time.monotonic()
        answer = await call(http, two.url(index, "tools"), id_=f"after-{index}")
        assert answer.status == 200, (index, answer.cache_status)
        oldest_possible = UPSTREAM_TTL_MS - (asked - old_received_by) * 1000 + 50
        assert answer.ttl_ms > oldest_possible, (
            f"two's replica {index} answered from the purged entry: {answer.cache_status}"
        )
    assert not (await call(http, one.url(0, "tools"))).hit
