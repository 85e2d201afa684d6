"""Per-caller policy on ``/servers/{name}/mcp``, through a real gateway in front of a real SDK
upstream (``tests/servers/public_upstream.py``), with ``[[auth.static]]`` callers holding scopes:
lists filtered from the one shared entry, denials never forwarded, hidden upstreams unknown."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from gateway.app import PROXY
from gateway.protocol import parse_request
from gateway.proxy.handler import uses

from ..support import RunningGateway, StartGateway, mcp_headers, rpc, sse_events
from ..support.fleet import Upstream, add_tool, bump_resource, fetch_counts, reset_counts

pytestmark = pytest.mark.timeout(60)

READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789"
PLAIN = "plain-token-0123456789"
RULES = [
    {
        "name": "read",
        "scopes": ["mcp:read"],
        "upstreams": ["pub"],
        "tools": ["add", "ec*"],
        "resources": ["res://hello"],
    },
    {
        "name": "admin",
        "scopes": ["mcp:read", "mcp:admin"],
        "upstreams": ["pub", "hidden"],
        "tools": ["add", "echo", "slow_progress"],
        "prompts": ["*"],
        "resources": ["res://*"],
    },
]


def policy_config(up: Upstream, rules: list[dict[str, Any]] = RULES) -> dict[str, Any]:
    return {
        "auth": {
            "tokens": [PLAIN],
            "static": [
                {"token": READER, "subject": "reader", "scopes": ["mcp:read"]},
                {"token": ADMIN, "subject": "admin", "scopes": ["mcp:read", "mcp:admin"]},
            ],
        },
        "upstreams": {"pub": {"url": up.url}, "hidden": {"url": up.url}},
        "policy": {"rules": rules},
    }


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream) -> RunningGateway:
    await reset_counts(public_up)
    return await start_gateway(policy_config(public_up))


async def call(
    http: aiohttp.ClientSession, gw: RunningGateway, token: str, method: str, *, upstream: str = "pub", **params: Any
) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    name = params.get("name") or params.get("uri")
    headers = {
        **mcp_headers(method, name if method != "completion/complete" else None),
        "Authorization": f"Bearer {token}",
    }
    async with http.post(gw.url(upstream), data=orjson.dumps(rpc(method, **params)), headers=headers) as resp:
        return resp.status, orjson.loads(await resp.read()), resp.headers


def denied(gw: RunningGateway) -> float:
    return gw.registry.get_sample_value("mcp_gateway_auth_total", {"outcome": "denied"}) or 0.0


async def test_one_upstream_list_serves_callers_of_different_rights_each_its_own_items_unchanged(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream
) -> None:
    answers = await asyncio.gather(*(call(http, gw, token, "tools/list") for token in (READER, ADMIN) * 4))
    assert (await fetch_counts(public_up)).get("tools/list") == 1
    reader, admin = answers[0][1]["result"], answers[1][1]["result"]
    assert [t["name"] for t in reader["tools"]] == ["add", "echo"]
    assert [t["name"] for t in admin["tools"]] == ["add", "echo", "slow_progress"]
    assert reader["cacheScope"] == admin["cacheScope"] == "private"
    assert 0 < reader["ttlMs"] <= 60_000
    by_name = {t["name"]: t for t in admin["tools"]}
    assert all(orjson.dumps(t) == orjson.dumps(by_name[t["name"]]) for t in reader["tools"])
    for n, (status, body, _) in enumerate(answers):
        names = [t["name"] for t in body["result"]["tools"]]
        assert status == 200 and names == (["add", "echo"] if n % 2 == 0 else ["add", "echo", "slow_progress"])
    statuses = sorted(headers["Cache-Status"].split(";")[1].strip() for _, _, headers in answers)
    assert statuses.count("fwd=miss") == 1 and statuses.count("hit") == 7


async def test_two_sets_of_rights_make_two_views_each_computed_once(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream
) -> None:
    for _ in range(3):
        for token in (READER, ADMIN):
            status, body, _ = await call(http, gw, token, "tools/list")
            assert status == 200 and body["result"]["cacheScope"] == "private"
    views = gw.app[PROXY].views
    assert len(views) == 2
    made = next(iter(views._views.values()))
    before = dict(made)
    await call(http, gw, READER, "tools/list")
    assert all(made[key] is before[key] for key in before)  # the same objects: not computed again


async def test_a_miss_is_stored_whole_and_answered_filtered(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream
) -> None:
    status, body, headers = await call(http, gw, READER, "resources/list")
    assert status == 200 and "fwd=miss" in headers["Cache-Status"] and "stored" in headers["Cache-Status"]
    assert [r["uri"] for r in body["result"]["resources"]] == ["res://hello"]
    assert body["result"]["cacheScope"] == "private"
    _, admin, headers = await call(http, gw, ADMIN, "resources/list")
    assert "hit" in headers["Cache-Status"]
    assert sorted(r["uri"] for r in admin["result"]["resources"]) == ["res://café", "res://hello"]
    assert (await fetch_counts(public_up)).get("resources/list") == 1


async def test_a_call_no_rule_allows_is_answered_as_an_unknown_tool_and_never_forwarded(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream
) -> None:
    status, body, _ = await call(http, gw, ADMIN, "tools/call", name="confirm_action", arguments={"action": "x"})
    assert status == 400 and body["id"] == 1
    assert body["error"] == {"code": -32602, "message": "Unknown tool: confirm_action"}
    status, body, _ = await call(http, gw, READER, "resources/read", uri="other://nope")
    assert status == 400 and body["error"]["data"] == {"uri": "other://nope"}
    assert (await fetch_counts(public_up)) == {}
    assert denied(gw) == 2
    status, body, _ = await call(http, gw, READER, "tools/call", name="add", arguments={"a": 1, "b": 2})
    assert status == 200 and "error" not in body
    assert (await fetch_counts(public_up)).get("tools/call") == 1


async def test_what_more_scopes_would_allow_is_a_403_naming_the_rules_scopes(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream
) -> None:
    for method, params in [
        ("tools/call", {"name": "slow_progress", "arguments": {}}),
        ("prompts/get", {"name": "greet", "arguments": {"name": "x"}}),
        ("resources/read", {"uri": "res://café"}),
        (
            "completion/complete",
            {"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "name", "value": ""}},
        ),
    ]:
        status, body, headers = await call(http, gw, READER, method, **params)
        assert status == 403, method
        assert body["error"]["code"] == -32600
        assert headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="mcp:read mcp:admin"'
    assert (await fetch_counts(public_up)) == {}
    assert denied(gw) == 4


async def test_an_upstream_no_rule_allows_is_the_same_404_as_one_not_configured(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream
) -> None:
    _, unconfigured, _ = await call(http, gw, READER, "tools/list", upstream="nowhere")
    for token, upstream in ((READER, "hidden"), (PLAIN, "pub")):
        status, body, _ = await call(http, gw, token, "tools/list", upstream=upstream)
        assert status == 404
        assert body["error"]["code"] == unconfigured["error"]["code"] == -32601
        assert body["error"]["data"] == {"upstream": upstream}
        headers = {**mcp_headers("tools/list"), "Authorization": f"Bearer {token}"}
        async with http.post(gw.url(upstream), data=b"{not json", headers=headers) as resp:
            assert resp.status == 404  # not even a parse error tells it is there
    status, _, _ = await call(http, gw, ADMIN, "tools/list", upstream="hidden")
    assert status == 200
    assert (await fetch_counts(public_up)).get("tools/list") == 1
    # Each of the four hidden-upstream requests is a policy refusal (the unconfigured name is not).
    assert denied(gw) == 4


class Stream:
    """One caller's listen stream on ``/servers/{name}/mcp``, its messages read as they arrive."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.buf = b""
        self.read = 0

    async def next(self) -> dict[str, Any]:
        async with asyncio.timeout(10):
            while True:
                events = sse_events(self.buf, at_eof=False)
                if len(events) > self.read:
                    self.read += 1
                    return dict(orjson.loads(events[self.read - 1]))
                chunk = await self.resp.content.readany()
                assert chunk, f"the listen stream ended; it said {self.buf!r}"
                self.buf += chunk


async def test_a_listen_stream_drops_what_the_caller_may_not_read_and_relays_the_rest(
    http: aiohttp.ClientSession, start_gateway: StartGateway, changing_up: Upstream
) -> None:
    gw = await start_gateway(policy_config(changing_up))
    body = orjson.dumps(
        rpc(
            "subscriptions/listen", notifications={"toolsListChanged": True, "resourceSubscriptions": ["res://counter"]}
        )
    )
    streams = []
    try:
        for token in (READER, ADMIN):
            headers = {**mcp_headers("subscriptions/listen"), "Authorization": f"Bearer {token}"}
            resp = await http.post(gw.url("pub"), data=body, headers=headers)
            assert resp.status == 200
            streams.append(Stream(resp))
            assert (await streams[-1].next())["method"] == "notifications/subscriptions/acknowledged"
        reader, admin = streams
        await bump_resource(changing_up)
        await add_tool(changing_up)
        updated = await admin.next()
        assert updated["method"] == "notifications/resources/updated"
        assert updated["params"]["uri"] == "res://counter"
        assert (await admin.next())["method"] == "notifications/tools/list_changed"
        # In the order the upstream sent them: the update it may not read was dropped.
        assert (await reader.next())["method"] == "notifications/tools/list_changed"
    finally:
        for stream in streams:
            stream.resp.close()


async def test_a_list_that_bypasses_the_cache_is_filtered_too(
    http: aiohttp.ClientSession, start_gateway: StartGateway, public_up: Upstream
) -> None:
    gw = await start_gateway({**policy_config(public_up), "cache": {"max_entries": 0}})
    status, body, headers = await call(http, gw, READER, "tools/list")
    assert status == 200 and "fwd=bypass" in headers["Cache-Status"]
    assert [t["name"] for t in body["result"]["tools"]] == ["add", "echo"]
    assert body["result"]["cacheScope"] == "private"


@pytest.mark.parametrize("method", ["resources/subscribe", "resources/unsubscribe"])
def test_a_legacy_subscription_names_the_resource_a_rule_must_allow(method: str) -> None:
    body = orjson.dumps({"jsonrpc": "2.0", "id": 3, "method": method, "params": {"uri": "notes://secret"}})
    parsed = parse_request(body, CIMultiDict({"Content-Type": "application/json"}))
    assert uses(parsed) == ("resources", "notes://secret")
