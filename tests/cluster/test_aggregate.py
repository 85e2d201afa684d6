"""``POST /mcp`` over replicas on one Redis: the aggregate's parts are the shared tier's entries,
and a change of one member's list reaches the listening clients of every replica.

Real gateway processes, a real Redis, and the SDK upstreams of ``tests/servers``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from ..support.fleet import Upstream, add_tool, fetch_counts
from ..support.redis import RedisServer
from ..support.replicas import Replicas
from ..support.wire import mcp_headers, rpc
from .conftest import StartReplicas
from .test_replicas import KEY_PREFIX, cluster_config, eventually, unique, wait_for_listening_holder

pytestmark = pytest.mark.timeout(90)

AGGREGATE = {"upstreams": ["pub", "chg"]}


async def aggregate_call(http: aiohttp.ClientSession, base_url: str, method: str = "tools/list") -> dict[str, Any]:
    async with http.post(f"{base_url}/mcp", json=rpc(method), headers=mcp_headers(method)) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def read_events(resp: aiohttp.ClientResponse, into: list[dict[str, Any]]) -> None:
    """Every JSON event of a listen stream, into ``into``, as it arrives."""
    buffer = b""
    async for chunk in resp.content.iter_any():
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    into.append(json.loads(line[5:]))


@pytest.fixture
async def replicas(
    redis_server: RedisServer, start_replicas: StartReplicas, public_up: Upstream, changing_up: Upstream
) -> Replicas:
    """Three replicas whose /mcp is made of pub and chg."""
    return await start_replicas(
        cluster_config(redis_server, {"pub": public_up, "chg": changing_up}, aggregate=AGGREGATE)
    )


async def test_a_warm_aggregate_on_one_replica_is_composed_on_another_without_an_upstream_request(
    replicas: Replicas,
    redis_server: RedisServer,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    changing_up: Upstream,
) -> None:
    first = await aggregate_call(http, replicas.base_url(0))
    names = [tool["name"] for tool in first["result"]["tools"]]
    assert "pub__add" in names and any(n.startswith("chg__") for n in names)

    async def parts_shared() -> bool:  # replica 0 writes the parts (one page each) to Redis in the background
        return len(await asyncio.to_thread(redis_server.scan_keys, f"{KEY_PREFIX}:entry:*")) == 2

    await eventually(parts_shared, limit_s=5, what="both members' parts in Redis")
    before = {name: (await fetch_counts(up))["tools/list"] for name, up in (("pub", public_up), ("chg", changing_up))}
    for index in (1, 2):
        again = await aggregate_call(http, replicas.base_url(index))
        assert [tool["name"] for tool in again["result"]["tools"]] == names
    after = {name: (await fetch_counts(up))["tools/list"] for name, up in (("pub", public_up), ("chg", changing_up))}
    assert after == before


async def test_a_tool_added_to_one_member_reaches_listen_clients_on_every_replica(
    replicas: Replicas, http: aiohttp.ClientSession, public_up: Upstream, changing_up: Upstream
) -> None:
    await wait_for_listening_holder(replicas, "chg")
    events: list[list[dict[str, Any]]] = []
    readers = []
    streams = []
    try:
        for index in replicas.indices():
            body = rpc("subscriptions/listen", f"listen-{index}", notifications={"toolsListChanged": True})
            resp = await http.post(
                f"{replicas.base_url(index)}/mcp",
                json=body,
                headers=mcp_headers("subscriptions/listen"),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=None),
            )
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            streams.append(resp)
            got: list[dict[str, Any]] = []
            events.append(got)
            readers.append(asyncio.create_task(read_events(resp, got)))
        await eventually(
            lambda: _true(all(got for got in events)), limit_s=5, what="an acknowledgement on every stream"
        )
        for index, got in enumerate(events):
            ack = got[0]
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert ack["params"]["notifications"] == {"toolsListChanged": True}
            assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == f"listen-{index}"
        for index in replicas.indices():
            await aggregate_call(http, replicas.base_url(index))  # warm everywhere

        added = (await add_tool(changing_up, unique("agg_tool")))["added"]

        def told(got: list[dict[str, Any]]) -> bool:
            return any(m.get("method") == "notifications/tools/list_changed" for m in got[1:])

        await eventually(lambda: _true(all(told(got) for got in events)), limit_s=5, what="list_changed everywhere")
        for index, got in enumerate(events):
            note = next(m for m in got[1:] if m.get("method") == "notifications/tools/list_changed")
            assert note["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == f"listen-{index}"
        for index in replicas.indices():
            listed = await aggregate_call(http, replicas.base_url(index))
            assert f"chg__{added}" in [tool["name"] for tool in listed["result"]["tools"]]
    finally:
        for task in readers:
            task.cancel()
        for resp in streams:
            resp.close()


async def _true(value: bool) -> bool:
    return value
