"""``[cache] private_per_identity`` with ``[cluster]``: a private answer kept for its caller is
never written to Redis (real Redis, real SDK upstreams), while a public one is."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from gateway.app import STORE

from ..support import StartGateway, mcp_headers, rpc
from ..support.fleet import Upstream
from ..support.polling import wait_until
from ..support.redis import RedisServer

pytestmark = pytest.mark.timeout(60)

ALICE = "alice-token-0123456789"


async def test_a_private_answer_kept_for_its_caller_never_reaches_redis(
    redis_server: RedisServer,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    private_up: Upstream,
    public_up: Upstream,
) -> None:
    gw = await start_gateway(
        {
            "auth": {"static": [{"token": ALICE, "subject": "alice"}]},
            "cache": {"private_per_identity": True},
            "cluster": {"redis_url": redis_server.url, "key_prefix": "t"},
            "upstreams": {"priv": {"url": private_up.url}, "pub": {"url": public_up.url}},
        }
    )
    await wait_until(lambda: gw.registry.get_sample_value("mcp_gateway_cluster_up") == 1, what="the shared tier up")
    headers = {**mcp_headers("tools/list"), "Authorization": f"Bearer {ALICE}"}
    for name in ("priv", "pub"):
        async with http.post(gw.url(name), data=orjson.dumps(rpc("tools/list")), headers=headers) as resp:
            assert resp.status == 200 and "stored" in resp.headers["Cache-Status"]
    assert {k.upstream for k in gw.app[STORE].keys()} == {"priv", "pub"}

    def public_written() -> bool:
        return any(b'"cacheScope":"public"' in blob for blob in redis_server.blobs())

    # The public entry was stored after the private one and is written in the background:
    # once it is there, the private one would have been too.
    await wait_until(public_written, what="the public entry in Redis")
    assert not any(b'"cacheScope":"private"' in blob for blob in redis_server.blobs())
