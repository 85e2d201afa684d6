"""The shared tier's state machine (gateway/cluster/link.py) on a real Redis: the heartbeat's
verdicts, and what a read-only process must do before it is up again."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from gateway.cluster.link import SETTLE_S, RedisLink, State
from gateway.config import ClusterConfig
from gateway.telemetry import GatewayMetrics

from ..support.redis import RedisServer

pytestmark = pytest.mark.timeout(30)


async def test_a_refused_heartbeat_makes_the_link_read_only_until_writes_went_through_for_the_settling_time(
    redis_server: RedisServer,
) -> None:
    registry = CollectorRegistry()
    link = RedisLink(ClusterConfig(redis_url=redis_server.url, key_prefix="t"), GatewayMetrics(registry, cluster=True))
    changes: list[tuple[State, State]] = []
    link.on_change = lambda old, new, _reason: changes.append((old, new))
    flushed: list[float] = []

    async def before_writable() -> bool:
        flushed.append(asyncio.get_running_loop().time())
        return True

    link.before_writable = before_writable
    try:
        await link.beat(settle=False)  # a reconnecting process's first heartbeat
        link.mark(True)
        assert link.state == "up" and link.up and changes == [("down", "up")]
        assert redis_server.scan_keys("t:heartbeat:*") != []  # one key, expiring
        assert 0 < redis_server.command("PTTL", redis_server.scan_keys("t:heartbeat:*")[0]) <= 5_000

        redis_server.fill()
        try:
            await link.beat()
            assert link.state == "read_only" and not link.up and changes[-1] == ("up", "read_only")
            assert registry.get_sample_value("mcp_gateway_cluster_up") == 0
        finally:
            redis_server.make_room()
        loop = asyncio.get_running_loop()
        writes_back = loop.time()
        flushed.clear()
        while not link.up:
            assert loop.time() - writes_back < 10, "not up again"
            await link.beat()
            await asyncio.sleep(0.05)
        # The pending invalidations went at the first write through, up only after settling.
        assert flushed[0] - writes_back < SETTLE_S
        assert loop.time() - writes_back >= SETTLE_S
        assert changes[-1] == ("read_only", "up")
        assert registry.get_sample_value("mcp_gateway_cluster_up") == 1
    finally:
        await link.close()
