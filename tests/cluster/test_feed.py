"""The event feed's reader loop (gateway/cluster/feed.py) on a real Redis: it ends when it is
cancelled, even when the client library hands the cancellation back as one of its own errors."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.cluster.feed import Feed
from gateway.cluster.link import RedisLink, Unavailable
from gateway.cluster.mac import Keys
from gateway.config import ClusterConfig
from gateway.telemetry import GatewayMetrics
from tests.support.polling import wait_until

from ..support.redis import RedisServer

pytestmark = pytest.mark.timeout(30)


def _swallowing(call: Any) -> Any:
    """``call`` as a client that turns a cancellation into a lost connection would make it."""

    async def swallowing(*args: Any, **kwargs: Any) -> Any:
        try:
            return await call(*args, **kwargs)
        except asyncio.CancelledError:
            raise RedisConnectionError("Connection closed by server.") from None

    return swallowing


async def test_a_cancelled_feed_ends_even_when_the_client_turns_the_cancellation_into_an_error(
    redis_server: RedisServer,
) -> None:
    config = ClusterConfig(redis_url=redis_server.url, key_prefix="t")
    link = RedisLink(config, GatewayMetrics(CollectorRegistry(), cluster=True))
    feed = Feed(config, link, keys=Keys(None), on_event=lambda _e: None, on_up=lambda: None, on_lost=lambda _r: None)
    feed._reader.xread = _swallowing(feed._reader.xread)  # type: ignore[method-assign]
    task = asyncio.get_running_loop().create_task(feed.run())
    try:
        await wait_until(lambda: link.reading, what="the feed reading")
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=10)
        where = io.StringIO()
        if not done:
            task.print_stack(file=where)
        assert done, f"the feed went on reading after it was cancelled, at:\n{where.getvalue()}"
        assert task.cancelled()
    finally:
        task.cancel()
        await feed.close()
        await link.close()


async def test_a_command_cancelled_inside_the_client_is_a_cancellation_not_unavailable(
    redis_server: RedisServer,
) -> None:
    config = ClusterConfig(redis_url=redis_server.url, key_prefix="t", timeout_s=5)
    link = RedisLink(config, GatewayMetrics(CollectorRegistry(), cluster=True))
    blocked = _swallowing(link.client.blpop)
    outcome: list[BaseException] = []

    async def command() -> None:
        try:
            await link.run("read", lambda: blocked(["t:nothing"], timeout=0), force=True)
        except BaseException as exc:
            outcome.append(exc)
            raise

    task = asyncio.get_running_loop().create_task(command())
    try:
        await wait_until(  # the BLPOP is sent and waits (timeout 0: for good)
            lambda: b"cmd=blpop" in redis_server.command("CLIENT", "LIST"), what="the BLPOP waiting"
        )
        task.cancel()
        await asyncio.wait([task], timeout=5)
        assert task.done() and isinstance(outcome[0], asyncio.CancelledError), outcome
        assert not isinstance(outcome[0], Unavailable)
    finally:
        task.cancel()
        await link.close()
