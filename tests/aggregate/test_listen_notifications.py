"""``subscriptions/listen`` on ``POST /mcp`` against floods and echoes of changes: a burst of
1000 purges, changes of an upstream that is not a member, one change heard twice with
``[cluster]`` (the local purge and its echo from Redis) or with ``--workers 2`` (each worker's
own stream and the other's message).

What must hold: a listening client is told of each change of a member's list once, per kind
it asked for, and of nothing else (docs/aggregate.md "``subscriptions/listen``"). The members
are real SDK servers (``changing_up`` adds a tool when asked), but for the burst's scripted one;
``--workers 2`` runs the real command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import REGISTRY, STORE
from gateway.cache import Invalidation

from ..support import RunningGateway, StartGateway, StartUpstream, mcp_headers
from ..support.fleet import Upstream, add_tool, fetch_counts, reset_counts
from ..support.redis import RedisServer
from ..test_workers import serve_group
from .conftest import FAST_REGISTRY, aggregate_config, body_of, eventually
from .scripted import member
from .test_listen import listen, unique

pytestmark = pytest.mark.timeout(60)


CHANGED = b"notifications/tools/list_changed"


async def listening_to(gw: RunningGateway, upstream: str) -> None:
    """Until the gateway's own listen stream to ``upstream`` is acknowledged."""
    state = gw.app[REGISTRY].state

    async def acknowledged() -> bool:
        return state.upstreams[upstream].listen.state == "acknowledged"

    await eventually(acknowledged, limit_s=10, what=f"the gateway's listen stream to {upstream}")


async def test_a_burst_of_changes_is_one_notification_per_kind_for_a_listening_client(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # A client's pending changes are a set of kinds, not a queue: 1000 changes while it is being
    # written to are one notification.
    up = await member(start_upstream, "t")  # never probed right: every flag offered
    gw = await start_gateway(aggregate_config({"a": up.url}, registry=FAST_REGISTRY))
    async with listen(http, gw, "burst", {"toolsListChanged": True, "promptsListChanged": True}) as stream:
        assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        for _ in range(1000):
            gw.app[STORE].purge(Invalidation("a", ("tools/list",)), "notification")
        told = [await stream.next()]
        with contextlib.suppress(TimeoutError):
            while True:
                told.append(await stream.next(timeout_s=0.5))
    assert [m["method"] for m in told] == ["notifications/tools/list_changed"], told


async def test_changes_of_an_upstream_that_is_not_a_member_never_reach_mcp_listen_clients(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, changing_up: Upstream
) -> None:
    # Invalidations of upstreams outside [aggregate].upstreams are not /mcp's changes, a lost
    # stream of one included.
    gw = await start_gateway(
        aggregate_config({"a": public_up, "c": changing_up}, {"upstreams": ["a"]}, registry=FAST_REGISTRY)
    )
    await listening_to(gw, "c")  # c is an upstream of the gateway, not a member of /mcp
    async with listen(http, gw, "only-a", {"toolsListChanged": True}) as stream:
        assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        await add_tool(changing_up, unique("not_a_member"))
        gw.app[STORE].purge(Invalidation("c", None), "stream_lost")  # a non-member's stream lost, too
        with pytest.raises(TimeoutError):
            await stream.next_of("notifications/tools/list_changed", timeout_s=1.5)


async def test_with_cluster_one_change_of_a_member_is_one_notification(
    redis: RedisServer,
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    changing_up: Upstream,
) -> None:
    # With [cluster], one change purges the local tier twice: at once, and again after Redis took
    # the generation bump (for entries stored meanwhile). Each /mcp listen client must still be
    # told once, or every client lists again twice. Without [cluster] it is one (the control,
    # which shows that the member does not send two).
    cluster = {"redis_url": redis.url, "key_prefix": "one-change"}
    counts = {}
    for with_cluster in (False, True):
        more: dict[str, Any] = {"cluster": cluster} if with_cluster else {}
        gw = await start_gateway(aggregate_config({"a": public_up, "c": changing_up}, registry=FAST_REGISTRY, **more))
        await listening_to(gw, "c")
        async with listen(http, gw, "one", {"toolsListChanged": True}) as stream:
            assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
            await add_tool(changing_up, unique("one_change"))
            await stream.next_of("notifications/tools/list_changed")
            told = 1
            with contextlib.suppress(TimeoutError):
                while True:
                    await stream.next_of("notifications/tools/list_changed", timeout_s=1.0)
                    told += 1
        counts[with_cluster] = told
        await gw.server.close()
    assert counts[False] == 1, counts  # the control: one change, one notification
    assert counts[True] == 1, f"with [cluster] one change was {counts[True]} notifications"


async def test_with_two_workers_each_change_of_a_member_is_one_notification_per_stream(
    tmp_path: Path, public_up: Upstream, changing_up: Upstream
) -> None:
    # Without [cluster] each worker probes the members and holds its own listen stream to them
    # (registry per process), and passes every invalidation to the other worker on the bus
    # (gateway/cluster/workers.py). So each worker hears each change twice, from its own stream
    # and from the other's message: every /mcp listen stream must still get one
    # notifications/tools/list_changed per change.
    await reset_counts(changing_up)
    config = (
        "[registry]\nprobe_min_interval_s = 0.2\nprobe_max_interval_s = 0.4\nbackoff_base_s = 0.1\n"
        f'backoff_max_s = 0.4\n[upstreams.a]\nurl = "{public_up.url}"\n[upstreams.c]\nurl = "{changing_up.url}"\n'
        "[aggregate]\n"
    )
    async with serve_group(tmp_path, config, log_level="info") as base_url:

        async def both_listening() -> bool:  # each worker holds its own listen stream to c
            return (await fetch_counts(changing_up)).get("subscriptions/listen", 0) >= 2

        await eventually(both_listening, limit_s=15, what="both workers' listen streams to c")

        async def both_acknowledged() -> bool:
            # Each worker logs this once its stream is acknowledged, after the purge that comes
            # with a first acknowledgement (a list_changed the /mcp streams below must not get).
            log = (tmp_path / "gateway.log").read_text(errors="replace")
            return log.count("upstream c: listening for") >= 2

        await eventually(both_acknowledged, limit_s=15, what="both workers' listen streams to c acknowledged")
        body = json.dumps(body_of("subscriptions/listen", {"notifications": {"toolsListChanged": True}}))
        streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(4):  # new connections: either worker may accept each
                reader, writer = await asyncio.open_connection("127.0.0.1", int(base_url.rsplit(":", 1)[1]))
                head = ["POST /mcp HTTP/1.1", f"Host: {base_url[7:]}", f"Content-Length: {len(body)}"]
                head += [f"{k}: {v}" for k, v in mcp_headers("subscriptions/listen").items()]
                writer.write(("\r\n".join(head) + "\r\n\r\n" + body).encode())
                got = b""
                async with asyncio.timeout(10):
                    while b"acknowledged" not in got:
                        got += await reader.read(65536)
                streams.append((reader, writer))
            for _ in range(3):  # three changes, a second apart
                await add_tool(changing_up, unique("worker_change"))
                await asyncio.sleep(1)  # the pace of the changes: each its own notification, not one for all
            told = []
            for reader, _ in streams:
                got = b""
                # Until the three have come (at most 10 s), then 0.2 s more for any extra one.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        while got.count(CHANGED) < 3 and (chunk := await reader.read(65536)):
                            got += chunk
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        while chunk := await reader.read(65536):
                            got += chunk
                told.append(got.count(CHANGED))
        finally:
            for _, writer in streams:
                writer.close()
    assert told == [3, 3, 3, 3], f"notifications per stream for three changes: {told}"
