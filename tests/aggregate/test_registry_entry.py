"""``POST /mcp`` in the registry: ``/v0.1/servers`` lists it as one more server,
``<server_namespace>/aggregate``, whose remote is ``<base>/mcp`` and whose live state names its
members, which of them it serves now and which it leaves out (legacy-era members), and its
separator; with ``[aggregate]`` no upstream may be named ``aggregate``.

The registry's own routes are tested in tests/registry/; here only what ``[aggregate]``
adds. The legacy member is the real legacy-only server (mcp 1.30.0 in ``.tools/legacy-venv``,
tests/servers/legacy_upstream.py), probed by the registry.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway import __version__
from gateway.app import REGISTRY
from gateway.config import ConfigError, load_config, parse_config
from gateway.registry import LIVE_META_KEY

from ..support import RunningGateway, StartGateway
from ..support.fleet import LEGACY_PYTHON, Upstream, run_legacy_server
from ..support.polling import wait_until
from .conftest import agg, aggregate_config, exposed, names

pytestmark = pytest.mark.timeout(60)

NS = "local.mcp-gateway"
#: Upstream URLs nothing listens on: with the registry off, nothing is asked of them.
NOWHERE = {"alpha": "http://127.0.0.1:9/mcp", "beta": "http://127.0.0.1:9/mcp", "gamma": "http://127.0.0.1:9/mcp"}
FAST_PROBES = {
    "probe_min_interval_s": 0.2,
    "probe_max_interval_s": 0.4,
    "probe_timeout_s": 3,
    "backoff_base_s": 0.1,
    "backoff_max_s": 0.4,
    "listen": False,
}


async def get(http: aiohttp.ClientSession, gw: RunningGateway, path: str) -> tuple[int, Any]:
    async with http.get(gw.base_url + path) as resp:
        return resp.status, await resp.json()


def by_name(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["server"]["name"]: entry for entry in listing["servers"]}


def live(entry: dict[str, Any]) -> dict[str, Any]:
    return dict(entry["_meta"][LIVE_META_KEY])


# -- the entry ----------------------------------------------------------------------------------------


async def test_the_aggregate_is_one_more_server_whose_remote_is_the_mcp_route(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gw = await start_gateway(aggregate_config(NOWHERE))
    status, listing = await get(http, gw, "/v0.1/servers")
    assert status == 200
    assert [e["server"]["name"] for e in listing["servers"]] == [
        f"{NS}/aggregate",
        f"{NS}/alpha",
        f"{NS}/beta",
        f"{NS}/gamma",
    ]
    assert listing["metadata"] == {"count": 4}
    entry = by_name(listing)[f"{NS}/aggregate"]
    server = entry["server"]
    assert server["remotes"] == [{"type": "streamable-http", "url": f"{gw.base_url}/mcp"}]
    assert server["version"] == __version__
    assert 0 < len(server["description"]) <= 100
    assert live(entry) == {
        "aggregate": True,
        "url": f"{gw.base_url}/mcp",
        "era": "modern",
        "members": ["alpha", "beta", "gamma"],
        "served": ["alpha", "beta", "gamma"],  # registry off: no member known to be legacy
        "leftOut": [],
        "separator": "__",
    }
    # the members' own entries are as without [aggregate]
    assert live(by_name(listing)[f"{NS}/alpha"])["url"] == gw.url("alpha")


async def test_the_entry_names_the_members_in_config_order_with_the_configured_separator_and_base(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    registry = {"enabled": False, "server_namespace": "example.fleet", "public_base_url": "https://mcp.example/"}
    config = aggregate_config(NOWHERE, {"upstreams": ["gamma", "alpha"], "separator": "."}, registry=registry)
    gw = await start_gateway(config)
    _, listing = await get(http, gw, "/v0.1/servers")
    entry = by_name(listing)["example.fleet/aggregate"]
    assert entry["server"]["remotes"] == [{"type": "streamable-http", "url": "https://mcp.example/mcp"}]
    state = live(entry)
    assert (state["members"], state["served"], state["separator"]) == (["gamma", "alpha"], ["gamma", "alpha"], ".")
    assert state["url"] == "https://mcp.example/mcp"


async def test_versions_routes_answer_for_the_aggregate_by_full_or_bare_name(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gw = await start_gateway(aggregate_config(NOWHERE))
    _, listing = await get(http, gw, "/v0.1/servers")
    expected = by_name(listing)[f"{NS}/aggregate"]
    for name in (f"{NS}/aggregate", "aggregate"):
        status, versions = await get(http, gw, f"/v0.1/servers/{name}/versions")
        assert (status, versions) == (200, {"servers": [expected], "metadata": {"count": 1}})
        for version in ("latest", __version__):
            assert await get(http, gw, f"/v0.1/servers/{name}/versions/{version}") == (200, expected)
        assert await get(http, gw, f"/v0.1/servers/{name}/versions/9.9.9") == (
            404,
            {"error": "Server version not found"},
        )
    assert (await get(http, gw, "/v0.1/servers/other.ns/aggregate/versions"))[0] == 404


async def test_paging_search_and_version_filter_treat_the_aggregate_as_any_other_server(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gw = await start_gateway(aggregate_config(NOWHERE))
    seen: list[str] = []
    cursor = ""
    for _ in range(10):
        _, page = await get(http, gw, f"/v0.1/servers?limit=1&cursor={cursor}")
        seen += [e["server"]["name"] for e in page["servers"]]
        if "nextCursor" not in page["metadata"]:
            break
        cursor = page["metadata"]["nextCursor"]
    assert seen == [f"{NS}/aggregate", f"{NS}/alpha", f"{NS}/beta", f"{NS}/gamma"]  # each once
    _, found = await get(http, gw, "/v0.1/servers?search=AGGREG")
    assert [e["server"]["name"] for e in found["servers"]] == [f"{NS}/aggregate"]
    _, versioned = await get(http, gw, f"/v0.1/servers?version={__version__}")
    assert f"{NS}/aggregate" in by_name(versioned)


async def test_without_aggregate_there_is_no_entry_and_an_upstream_may_be_named_aggregate(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    gw = await start_gateway({"upstreams": {"aggregate": {"url": NOWHERE["alpha"]}, "beta": {"url": NOWHERE["beta"]}}})
    _, listing = await get(http, gw, "/v0.1/servers")
    entry = by_name(listing)[f"{NS}/aggregate"]
    assert live(entry)["upstream"] == "aggregate"  # the upstream's own entry
    assert entry["server"]["remotes"][0]["url"] == gw.url("aggregate")
    assert (await get(http, gw, "/v0.1/servers/aggregate/versions/latest"))[1] == entry
    gw = await start_gateway({"upstreams": {"beta": {"url": NOWHERE["beta"]}}})
    _, listing = await get(http, gw, "/v0.1/servers")
    assert [e["server"]["name"] for e in listing["servers"]] == [f"{NS}/beta"]
    assert (await get(http, gw, "/v0.1/servers/aggregate/versions"))[0] == 404


async def test_with_auth_the_aggregate_entry_needs_a_token_like_the_rest(
    start_gateway: StartGateway, http: aiohttp.ClientSession
) -> None:
    token = "gateway-token-0123456789"
    gw = await start_gateway(aggregate_config(NOWHERE, auth={"tokens": [token]}))
    async with http.get(gw.base_url + "/v0.1/servers/aggregate/versions/latest") as resp:
        assert resp.status == 401
    async with http.get(
        gw.base_url + "/v0.1/servers/aggregate/versions/latest", headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        assert resp.status == 200
        assert live(await resp.json())["aggregate"] is True


# -- the config check ---------------------------------------------------------------------------------


def test_with_aggregate_an_upstream_named_aggregate_is_a_config_error(tmp_path: Path) -> None:
    upstreams = {"aggregate": {"url": NOWHERE["alpha"]}, "beta": {"url": NOWHERE["beta"]}}
    with pytest.raises(ConfigError) as raised:
        parse_config({"upstreams": upstreams, "aggregate": {}}, env={})
    message = str(raised.value)
    assert "aggregate: with [aggregate] no upstream may be named 'aggregate'" in message
    assert f"'{NS}/aggregate'" in message and "rename the upstream" in message
    # also when the aggregate's members leave it out: the registry name would still clash
    with pytest.raises(ConfigError, match="no upstream may be named 'aggregate'"):
        parse_config({"upstreams": upstreams, "aggregate": {"upstreams": ["beta"]}}, env={})
    # and from a file, as check-config reads it
    path = tmp_path / "gw.toml"
    path.write_text('[upstreams.aggregate]\nurl = "http://127.0.0.1:9/mcp"\n\n[aggregate]\n')
    with pytest.raises(ConfigError, match=r"^.*gw\.toml: line \d+: aggregate: with \[aggregate\]"):
        load_config(path, env={})
    # without [aggregate] the name is an upstream's like any other
    assert "aggregate" in parse_config({"upstreams": upstreams}, env={}).upstreams


# -- a legacy-era member --------------------------------------------------------------------------------


def legacy_venv_or_skip() -> None:
    if not LEGACY_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)")
        pytest.skip(f"{LEGACY_PYTHON} is missing: run scripts/install-tools.sh (make tools)")


async def test_a_legacy_era_member_is_listed_as_left_out_and_is_not_served_on_mcp(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    legacy_venv_or_skip()
    async with run_legacy_server() as legacy:
        config = aggregate_config({"old": legacy.url, "new": public_up}, registry=FAST_PROBES)
        gw = await start_gateway(config)
        state = gw.app[REGISTRY].state
        await wait_until(
            lambda: state.upstreams["old"].era == "legacy" and state.upstreams["new"].era == "modern",
            limit_s=15,
            what="both members probed",
        )
        _, listing = await get(http, gw, "/v0.1/servers")
        aggregate = live(by_name(listing)[f"{NS}/aggregate"])
        assert aggregate["members"] == ["old", "new"]
        assert aggregate["served"] == ["new"]
        assert aggregate["leftOut"] == [{"upstream": "old", "reason": "legacy"}]
        assert live(by_name(listing)[f"{NS}/old"])["era"] == "legacy"  # still listed on its own

        # what the registry says is what /mcp does: only the served member's tools
        tools = await agg(http, gw, "tools/list")
        assert tools.status == 200, tools.raw
        listed = names(tools.result)
        assert listed and all(name.startswith(exposed("new", "")) for name in listed)
        call = await agg(http, gw, "tools/call", {"name": exposed("old", "echo"), "arguments": {"text": "x"}})
        assert (call.status, call.error["code"]) == (400, -32602)
