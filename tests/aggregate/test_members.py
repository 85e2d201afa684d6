"""``POST /mcp`` and the registry: a legacy-era member (answering only ``initialize``, found so by
the registry's probes) is left out of ``/mcp`` and still served on its own route."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import aiohttp
import pytest
from mcp import Client

from gateway.app import REGISTRY

from ..support import LEGACY_V, RunningGateway, StartGateway, V
from ..support.fleet import LEGACY_PYTHON, Upstream, free_port, run_legacy_server
from .conftest import FAST_REGISTRY, FEATURE_TOOLS, agg, agg_url, aggregate_config, eventually, exposed, names, reset

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def legacy_up() -> Iterator[Upstream]:
    if not LEGACY_PYTHON.exists():
        message = f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with run_legacy_server() as up:
        yield up


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream, legacy_up: Upstream) -> RunningGateway:
    """Members ``a`` (modern) and ``l`` (legacy), the registry on; returned once ``l`` is probed."""
    await reset(public_up)
    running = await start_gateway(aggregate_config({"a": public_up, "l": legacy_up}, registry=FAST_REGISTRY))
    state = running.app[REGISTRY].state

    async def probed_legacy() -> bool:
        return state.upstreams["l"].era == "legacy"

    await eventually(probed_legacy, limit_s=15, what="the registry finding l legacy")
    return running


async def test_a_legacy_member_is_left_out_of_the_aggregate_lists(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 200, reply.raw
    assert names(reply.result) == [exposed("a", n) for n in FEATURE_TOOLS]
    assert reply.result["ttlMs"] > 0  # left out by design, not failed: a whole answer
    assert "detail=composed" in reply.cache_params, reply.cache_status
    assert (await agg(http, gw, "tools/list")).cache_hit
    discover = await agg(http, gw, "server/discover")
    assert discover.result["supportedVersions"] == [V]


async def test_a_call_to_a_legacy_member_through_the_aggregate_is_32602(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    reply = await agg(http, gw, "tools/call", {"name": "l__add", "arguments": {"a": 1, "b": 2}}, id=3)
    assert (reply.status, reply.error["code"], reply.json["id"]) == (400, -32602, 3), reply.raw


async def test_a_legacy_member_is_still_served_on_its_own_route(gw: RunningGateway) -> None:
    async with Client(gw.url("l"), mode="legacy", cache=None) as c:
        assert c.protocol_version == LEGACY_V
        assert {t.name for t in (await c.list_tools()).tools} == {"add", "echo"}
    async with Client(agg_url(gw), mode=V, cache=None) as c:
        assert [t.name for t in (await c.list_tools()).tools] == [exposed("a", n) for n in FEATURE_TOOLS]


async def test_a_dead_member_is_logged_once_not_on_every_list(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    # A flood writes bounded log volume: every /mcp list meets the dead member again, and the log
    # says so once (docs/aggregate.md "Partial outage": at most once per member every 10 s).
    await reset(public_up)
    gw = await start_gateway(aggregate_config({"a": public_up, "d": f"http://127.0.0.1:{free_port()}/mcp"}))
    with caplog.at_level(logging.INFO, logger="mcp_gateway.aggregate"):
        for i in range(50):
            reply = await agg(http, gw, "tools/list", id=i)
            assert reply.status == 200 and "detail=partial" in reply.cache_params, reply.cache_status
    lines = [r.getMessage() for r in caplog.records if r.name == "mcp_gateway.aggregate"]
    assert len(lines) == 1 and lines[0].startswith("/mcp: left d out of a tools/list answer"), lines
    # ... and counted every time, for an alert to see.
    async with http.get(f"{gw.base_url}/metrics") as resp:
        text = await resp.text()
    expected = 'mcp_gateway_aggregate_parts_missing_total{method="tools/list",outcome="left_out",upstream="d"} 50.0'
    assert expected in text.splitlines(), [line for line in text.splitlines() if "parts_missing" in line]
