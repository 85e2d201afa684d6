"""Transparency against the official MCP conformance suite (``@modelcontextprotocol/conformance``).

Each scenario runs once against a real SDK upstream directly and once through the gateway;
the per-check verdicts must be identical, and the direct baseline must be all SUCCESS (so
a dead upstream or a broken suite cannot make the comparison pass vacuously).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import parse_config

from .support.conformance import SCENARIOS, run_scenario, tools_available
from .support.fleet import Upstream, run_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    assert tools_available(), "conformance suite missing: run scripts/install-tools.sh (make test does)"
    with run_server("conformance_upstream") as up:
        yield up


@pytest.fixture
async def gateway_url(upstream: Upstream) -> AsyncIterator[str]:
    config = parse_config({"upstreams": {"conf": {"url": upstream.url}}}, env={})
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("/servers/conf/mcp"))
    finally:
        await server.close()


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_scenario_verdicts_through_the_gateway_equal_direct(
    scenario: str, upstream: Upstream, gateway_url: str, tmp_path: Path
) -> None:
    direct = await run_scenario(upstream.url, scenario, tmp_path / "direct")
    assert direct, f"{scenario}: no checks ran"
    failing = {k: v for k, v in direct.items() if v != "SUCCESS"}
    assert not failing, f"{scenario}: the direct baseline is not all SUCCESS: {failing}"
    through = await run_scenario(gateway_url, scenario, tmp_path / "gateway")
    assert through == direct
