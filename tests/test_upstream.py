"""One upstream's client (gateway.upstream): what a reload's new client of it shares with the old."""

from __future__ import annotations

import aiohttp

from gateway.config import UpstreamConfig
from gateway.upstream import Upstream


async def test_a_retuned_upstream_counts_the_requests_begun_on_either_config_together() -> None:
    async with aiohttp.ClientSession() as session:
        before = Upstream("a", UpstreamConfig(url="http://127.0.0.1:1/mcp", max_inflight=2), session)
        before.inflight += 1  # a request begun before the reload, still under way
        before.listening += 1
        after = before.retuned(UpstreamConfig(url="http://127.0.0.1:1/mcp", max_inflight=2, timeout_s=3))
        assert (after.inflight, after.listening, after.config.timeout_s) == (1, 1, 3)
        after.inflight += 1  # max_inflight (2) is reached, whichever client is asked
        before.inflight -= 1  # the old request ends
        assert (before.inflight, after.inflight) == (1, 1)
        assert before.config.timeout_s != 3  # the old request keeps its own config
