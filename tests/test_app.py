"""``create_app`` (gateway.app): the cache-size gauges follow the store whatever changed it.

``mcp_gateway_cache_entries`` and ``mcp_gateway_cache_bytes`` are read from the store when
``/metrics`` is scraped, so no part of the gateway has to set them after it changed the store
(none does). Each test scrapes ``/metrics`` of a gateway in front of the real SDK server
``public_upstream``.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import STORE

from .support import FakeClock, RunningGateway, StartGateway, mcp_headers, rpc
from .support.fleet import Upstream

pytestmark = pytest.mark.timeout(60)


async def scrape(http: aiohttp.ClientSession, gw: RunningGateway) -> dict[str, float]:
    """``GET /metrics``: every unlabelled sample, and ``evictions:<reason>`` for each eviction count."""
    async with http.get(f"{gw.base_url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "mcp_gateway_cache_evictions_total":
                samples[f"evictions:{s.labels['reason']}"] = s.value
            elif not s.labels:
                samples[s.name] = s.value
    return samples


async def call(http: aiohttp.ClientSession, gw: RunningGateway, method: str) -> dict[str, Any]:
    async with http.post(gw.url("up"), json=rpc(method), headers=mcp_headers(method)) as resp:
        assert resp.status == 200, await resp.text()
        return dict(await resp.json())


async def test_an_answer_a_request_stored_shows_in_the_next_scrape_without_a_push(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    gw = await start_gateway({"upstreams": {"up": {"url": public_up.url}}})
    assert (await scrape(http, gw))["mcp_gateway_cache_entries"] == 0
    await call(http, gw, "tools/list")
    samples = await scrape(http, gw)
    store = gw.app[STORE]
    assert samples["mcp_gateway_cache_entries"] == len(store) == 1
    assert samples["mcp_gateway_cache_bytes"] == store.total_bytes > 0


async def test_entries_evicted_for_room_or_expired_leave_the_next_scrape_without_a_push(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    public_up: Upstream,
    fake_clock: FakeClock,
) -> None:
    config = {"cache": {"max_entries": 1}, "upstreams": {"up": {"url": public_up.url}}}
    gw = await start_gateway(config, clock=fake_clock)
    await call(http, gw, "tools/list")
    await call(http, gw, "prompts/list")  # room for one entry: the tools list goes
    samples = await scrape(http, gw)
    assert samples["evictions:size"] == 1
    assert samples["mcp_gateway_cache_entries"] == 1
    assert samples["mcp_gateway_cache_bytes"] == gw.app[STORE].total_bytes > 0
    fake_clock.advance(61)  # past public_upstream's ttlMs of 60 s; no request comes
    samples = await scrape(http, gw)
    assert (samples["mcp_gateway_cache_entries"], samples["mcp_gateway_cache_bytes"]) == (0, 0)
    # The scrape that read the store found the expired entry: counted by the next one.
    assert (await scrape(http, gw))["evictions:expired"] == 1
