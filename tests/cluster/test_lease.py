"""Leases following a reload (gateway.cluster.lease.Leases.update): a job renamed or gone gives its
lease up in the next round, which starts at once; against a real ``redis-server``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.cluster.lease import Leases
from gateway.cluster.link import RedisLink
from gateway.config import ClusterConfig
from gateway.telemetry import GatewayMetrics

from ..support.polling import wait_until
from ..support.redis import RedisServer

pytestmark = pytest.mark.timeout(30)

#: Far longer than the waits below: a round that came by itself would time them out.
SLOW_RENEW_S = 60.0


@pytest.fixture
async def link(redis_server: RedisServer) -> AsyncIterator[RedisLink]:
    config = ClusterConfig(redis_url=redis_server.url, key_prefix="t", timeout_s=5)
    link = RedisLink(config, GatewayMetrics(CollectorRegistry()))
    link.mark(True)
    try:
        yield link
    finally:
        await link.close()


def lease_keys(redis: RedisServer) -> list[bytes]:
    return sorted(redis.scan_keys("t:lease:*"))


async def test_a_job_renamed_or_gone_gives_up_its_lease_at_once_and_a_new_one_is_taken(
    redis_server: RedisServer, link: RedisLink
) -> None:
    changes: list[tuple[str, bool]] = []
    leases = Leases(link, ["a", "b"], lambda job, doing: changes.append((job, doing)), names={"a": "a:old", "b": "b:1"})
    leases.renew_s = SLOW_RENEW_S
    runner = asyncio.create_task(leases.run())
    try:
        await wait_until(lambda: leases.doing == {"a": True, "b": True}, limit_s=10, what="both leases held")
        assert lease_keys(redis_server) == [b"t:lease:a:old", b"t:lease:b:1"]

        leases.update({"a": "a:new", "c": "c:1"})
        expected = [b"t:lease:a:new", b"t:lease:c:1"]
        await wait_until(lambda: lease_keys(redis_server) == expected, limit_s=5, what=f"the leases {expected}")
        await wait_until(lambda: leases.doing == {"a": True, "c": True}, limit_s=5, what="a and c done here")
        # a's owner stopped its old job itself: only the new one is announced.
        assert changes == [("a", True), ("b", True), ("a", True), ("c", True)]
        assert not runner.done()
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await leases.release_all()


async def test_a_lease_taken_while_its_job_went_is_given_up_not_kept(
    redis_server: RedisServer, link: RedisLink
) -> None:
    leases = Leases(link, ["a"], lambda job, doing: None)
    await asyncio.to_thread(redis_server.pause, 1.0)  # the next command waits in Redis
    step = asyncio.create_task(leases.step("a"))
    await asyncio.sleep(0)  # the step has its lock and waits for Redis
    leases.update({})
    await step  # Redis took the lease for a job gone meanwhile
    assert leases.doing == {}
    await leases.release_all()
    assert lease_keys(redis_server) == []
