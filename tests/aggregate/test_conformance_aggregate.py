"""``POST /mcp`` against the official MCP conformance suite (``@modelcontextprotocol/conformance``).

Every 2026-07-28 server scenario of the suite (:data:`SCENARIOS`, 40) runs, at the same time and
each against its own fresh copy of the servers (scenarios toggle tools and prompts):

* directly against ``tests/servers/conformance_upstream.py`` (the baseline) and
  ``tests/servers/public_upstream.py``;
* against ``/mcp`` of a gateway whose ``[aggregate]`` has one member, ``conf`` (the conformance
  upstream): every check must have the direct verdict;
* against ``/mcp`` with two members, ``conf`` and ``pub`` (the public upstream): a check on which
  both members agree directly must have their verdict, any other check the verdict of one of them
  (``pub`` adds an ``x-mcp-header`` tool that ``conf`` lacks; its non-ASCII ``res://café`` fails
  the suite's URI schema check directly too).

Except, each listed with its reason: the checks that call one of the suite's fixtures by its bare
name (:data:`RENAMED`: on ``/mcp`` it is ``conf__<name>`` or ``mcp-gateway:conf/<uri>``, so the
bare name is -32602 there). The server-level
scenarios (:data:`SERVER_LEVEL`: header validation, statelessness, discovery, caching hints,
DNS rebinding, lists, error codes, listen streams) pass every check directly, so that the
comparison cannot pass vacuously.

Skipped when the suite is not installed in ``.tools/`` (``scripts/install-tools.sh``, which
``make test`` runs). The four suite runs share the 2 cores: about 15-20 s in all.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import parse_config

from ..support.conformance import SCENARIOS, run_suite, tools_available
from ..support.fleet import run_server

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not tools_available(),
        reason="conformance suite not installed (node 22 and @modelcontextprotocol/conformance in .tools/): "
        "run scripts/install-tools.sh or make tools",
    ),
]

#: Bound on one whole suite run (40 scenarios), seconds; the four run concurrently.
SUITE_TIME_LIMIT_S = 150.0

#: Scenarios that depend on no fixture name of the suite's server: every check passes against
#: the conformance upstream directly, and must on ``/mcp`` (but for :data:`RENAMED`).
SERVER_LEVEL = frozenset(
    {
        "server-stateless",
        "http-header-validation",
        "dns-rebinding-protection",
        "caching",
        "tools-list",
        "prompts-list",
        "resources-list",
        "sep-2164-resource-not-found",
        "input-required-result-unsupported-methods",
    }
)

_BARE = "calls a fixture by its bare name, which names nothing on /mcp (-32602)"
#: scenario -> check key -> why its verdict on ``/mcp`` differs from the direct one by design.
RENAMED: dict[str, dict[str, str]] = {
    "server-stateless": {
        "sep-2575-server-rejects-undeclared-capability": f"test_missing_capability {_BARE}",
        "sep-2575-missing-capability-http-400": f"test_missing_capability {_BARE}",
        "sep-2575-http-server-no-independent-requests-on-stream": f"test_streaming_elicitation {_BARE}",
        "sep-2575-server-no-log-without-loglevel": f"test_logging_tool {_BARE}",
        "sep-2575-server-sends-tools-list-changed-on-subscription": f"test_trigger_tool_change {_BARE}",
        "sep-2575-server-sends-prompts-list-changed-on-subscription": f"test_trigger_prompt_change {_BARE}",
    },
    "tools-call-simple-text": {"tools-call-simple-text": f"test_simple_text {_BARE}"},
    # No member has test_error_handling: directly the SDK answers an unknown tool with an
    # isError result, which the check accepts; /mcp answers the bare name with -32602.
    "tools-call-error": {"tools-call-error": f"test_error_handling {_BARE}"},
    "prompts-get-simple": {"prompts-get-simple": f"test_simple_prompt {_BARE}"},
    "prompts-get-with-args": {"prompts-get-with-args": f"test_prompt_with_arguments {_BARE}"},
    "resources-read-text": {"resources-read-text": f"test://static-text {_BARE}"},
    "resources-templates-read": {"resources-templates-read": f"test://template/123/data {_BARE}"},
    # No member has test_input_required_result_elicitation (the suite's fixture): directly its
    # unknown-tool isError result decides these, on /mcp the -32602 of the bare name.
    "input-required-result-ignore-extra-params": {"sep-2322-ignore-unexpected-params": _BARE},
    "input-required-result-validate-input": {"sep-2322-error-on-protocol-error": _BARE},
}

CONFIGS = ("one-member", "two-members")


@dataclass(frozen=True)
class Verdicts:
    """scenario -> (check key -> status) of each run."""

    direct: dict[str, dict[str, str]]  # the conformance upstream itself
    public: dict[str, dict[str, str]]  # the public upstream itself
    through: dict[str, dict[str, dict[str, str]]]  # config -> /mcp of that config


async def _gateway(upstreams: dict[str, str]) -> TestServer:
    """A gateway on a free port serving ``upstreams`` (name -> URL), all members of ``/mcp``."""
    config = parse_config({"upstreams": {n: {"url": u} for n, u in upstreams.items()}, "aggregate": {}}, env={})
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    return server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def verdicts(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Verdicts]:
    out = tmp_path_factory.mktemp("conformance-aggregate")
    async with (
        run_server("conformance_upstream") as direct_up,
        run_server("public_upstream") as public_up,
        run_server("conformance_upstream") as one_conf,
        run_server("conformance_upstream") as two_conf,
        run_server("public_upstream") as two_pub,
    ):
        one = await _gateway({"conf": one_conf.url})
        two = await _gateway({"conf": two_conf.url, "pub": two_pub.url})
        try:
            direct, public, via_one, via_two = await asyncio.gather(
                run_suite(direct_up.url, out / "direct", time_limit=SUITE_TIME_LIMIT_S),
                run_suite(public_up.url, out / "public", time_limit=SUITE_TIME_LIMIT_S),
                run_suite(str(one.make_url("/mcp")), out / "one-member", time_limit=SUITE_TIME_LIMIT_S),
                run_suite(str(two.make_url("/mcp")), out / "two-members", time_limit=SUITE_TIME_LIMIT_S),
            )
        finally:
            await one.close()
            await two.close()
    yield Verdicts(direct, public, {"one-member": via_one, "two-members": via_two})


def _excluded(scenario: str, key: str) -> bool:
    return key in RENAMED.get(scenario, {})


def _mismatches(verdicts: Verdicts, config: str, scenario: str) -> dict[str, Any]:
    """Check key -> (what was expected, what /mcp gave) for each check of ``scenario`` that does
    not hold (see the module docstring), :data:`RENAMED` left out."""
    conf = verdicts.direct.get(scenario, {})
    pub = verdicts.public.get(scenario, {})
    got = verdicts.through[config].get(scenario, {})
    wrong: dict[str, Any] = {}
    for key in sorted({*conf, *pub, *got} if config == "two-members" else {*conf, *got}):
        if _excluded(scenario, key):
            continue
        if config == "one-member" or conf.get(key) == pub.get(key):
            if got.get(key) != conf.get(key):
                wrong[key] = (conf.get(key), got.get(key))
        elif got.get(key) not in (conf.get(key), pub.get(key)):
            wrong[key] = ({"conf": conf.get(key), "pub": pub.get(key)}, got.get(key))
    return wrong


def test_every_scenario_ran_every_way(verdicts: Verdicts) -> None:
    assert sorted(verdicts.direct) == sorted(SCENARIOS)
    assert sorted(verdicts.public) == sorted(SCENARIOS)
    for config in CONFIGS:
        assert sorted(verdicts.through[config]) == sorted(SCENARIOS), config


def test_the_lists_of_exceptions_name_checks_the_suite_has(verdicts: Verdicts) -> None:
    named = [(s, k) for s, checks in RENAMED.items() for k in checks]
    assert [(s, k) for s, k in named if k not in verdicts.direct.get(s, {})] == []


@pytest.mark.parametrize("scenario", sorted(SERVER_LEVEL))
def test_the_direct_baseline_passes_every_check_of_the_server_level_scenarios(
    scenario: str, verdicts: Verdicts
) -> None:
    direct = verdicts.direct.get(scenario)
    assert direct, f"{scenario}: no checks ran directly"
    assert {k: v for k, v in direct.items() if v != "SUCCESS"} == {}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_verdicts_on_mcp_equal_the_members_direct_verdicts(
    scenario: str, config: str, verdicts: Verdicts
) -> None:
    assert verdicts.through[config].get(scenario), f"{scenario}: no checks ran on /mcp ({config})"
    wrong = _mismatches(verdicts, config, scenario)
    assert not wrong, f"{scenario} on /mcp ({config}): check -> (expected, got): {wrong}"
