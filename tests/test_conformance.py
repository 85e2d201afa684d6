"""Transparency against the official MCP conformance suite (``@modelcontextprotocol/conformance``).

Every 2026-07-28 server scenario of the suite (:data:`SCENARIOS`, 40) runs against a real SDK
upstream directly and, at the same time, against a second copy of that upstream through the
gateway: each copy starts in the same state, so scenarios that change the upstream (tools or
prompts toggled) cannot leak from one run into the other. The per-check verdicts of every
scenario must be identical.

Many scenarios look for fixtures that only the suite's own server has (an image tool, an
``x-mcp-header`` tool, input-required flows...) and fail the same way against any server; so
that the comparison cannot pass vacuously (a dead upstream, a broken suite), the direct baseline
must pass at least one check in every scenario and every check of the scenarios the upstream
implements in full (:data:`FULL_BASELINE`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import parse_config

from .support.conformance import SCENARIOS, list_scenarios, run_suite, tools_available
from .support.fleet import run_server

pytestmark = pytest.mark.timeout(300)

#: The scenarios whose every check passes against tests/servers/conformance_upstream.py directly.
FULL_BASELINE = frozenset(
    {
        "server-stateless",
        "tools-list",
        "tools-call-simple-text",
        "tools-call-error",
        "resources-list",
        "resources-read-text",
        "resources-templates-read",
        "sep-2164-resource-not-found",
        "prompts-list",
        "prompts-get-simple",
        "prompts-get-with-args",
        "dns-rebinding-protection",
        "caching",
        "http-header-validation",
        "input-required-result-unsupported-methods",
        "input-required-result-ignore-extra-params",
    }
)


@dataclass(frozen=True)
class Verdicts:
    """scenario -> (check key -> status), of the direct run and of the run through the gateway."""

    direct: dict[str, dict[str, str]]
    through: dict[str, dict[str, str]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def verdicts(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Verdicts]:
    assert tools_available(), "conformance suite missing: run scripts/install-tools.sh (make test does)"
    out = tmp_path_factory.mktemp("conformance")
    async with run_server("conformance_upstream") as direct_up, run_server("conformance_upstream") as proxied_up:
        config = parse_config({"upstreams": {"conf": {"url": proxied_up.url}}}, env={})
        server = TestServer(create_app(config), host="127.0.0.1")  # port 0: chosen at run time
        await server.start_server()
        try:
            gateway_url = str(server.make_url("/servers/conf/mcp"))
            direct, through = await asyncio.gather(
                run_suite(direct_up.url, out / "direct"), run_suite(gateway_url, out / "gateway")
            )
        finally:
            await server.close()
    yield Verdicts(direct, through)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_pinned_scenarios_are_every_2026_07_28_server_scenario_of_the_suite() -> None:
    assert await list_scenarios() == SCENARIOS


def test_every_scenario_ran_both_ways(verdicts: Verdicts) -> None:
    assert sorted(verdicts.direct) == sorted(SCENARIOS)
    assert sorted(verdicts.through) == sorted(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_verdicts_through_the_gateway_equal_direct(scenario: str, verdicts: Verdicts) -> None:
    direct = verdicts.direct.get(scenario)
    assert direct, f"{scenario}: no checks ran directly"
    assert "SUCCESS" in direct.values(), f"{scenario}: the direct baseline passes nothing: {direct}"
    if scenario in FULL_BASELINE:
        failing = {k: v for k, v in direct.items() if v != "SUCCESS"}
        assert not failing, f"{scenario}: the direct baseline is not all SUCCESS: {failing}"
    assert verdicts.through.get(scenario) == direct
