"""Per-caller policy on ``POST /mcp``: a member the caller may not see is no member for it (names,
lists, calls, listen), and globs match the member's own names (``tools = ["add"]`` for member
``a`` allows ``a__add``). Members ``a`` and ``b`` are two processes of the same SDK server."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from gateway.aggregate.listen import ListenHub, _Client
from gateway.cache import Invalidation

from ..support import RunningGateway, StartGateway
from ..support.fleet import Upstream
from .conftest import FEATURE_TOOLS, agg, aggregate_config, count, exposed, exposed_uri, names, reset

pytestmark = pytest.mark.timeout(60)

READER = "reader-token-0123456789"
ADMIN = "admin-token-0123456789"
RULES = [
    {"name": "read", "scopes": ["mcp:read"], "upstreams": ["a"], "tools": ["add", "ec*"], "resources": ["res://hello"]},
    {"name": "admin", "scopes": ["mcp:read", "mcp:admin"], "tools": ["*"], "prompts": ["*"], "resources": ["*"]},
]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream, public_up_b: Upstream) -> RunningGateway:
    await reset(public_up, public_up_b)
    config = aggregate_config(
        {"a": public_up, "b": public_up_b},
        auth={
            "static": [
                {"token": READER, "subject": "reader", "scopes": ["mcp:read"]},
                {"token": ADMIN, "subject": "admin", "scopes": ["mcp:read", "mcp:admin"]},
            ]
        },
        policy={"rules": RULES},
    )
    return await start_gateway(config)


async def test_a_composed_list_holds_only_what_the_caller_may_see_from_the_shared_member_entries(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream, public_up_b: Upstream
) -> None:
    replies = await asyncio.gather(*(agg(http, gw, "tools/list", headers=auth(t)) for t in (READER, ADMIN) * 3))
    reader, admin = replies[0].result, replies[1].result
    assert names(reader) == [exposed("a", "add"), exposed("a", "echo")]
    assert names(admin) == [exposed(m, t) for m in ("a", "b") for t in FEATURE_TOOLS]
    assert reader["cacheScope"] == admin["cacheScope"] == "private"
    by_name = {t["name"]: t for t in admin["tools"]}
    assert all(t == by_name[t["name"]] for t in reader["tools"])
    assert all(
        r.result == (reader if n % 2 == 0 else admin) | {"ttlMs": r.result["ttlMs"]} for n, r in enumerate(replies)
    )
    assert (await count(public_up, "tools/list"), await count(public_up_b, "tools/list")) == (1, 1)
    resources = (await agg(http, gw, "resources/list", headers=auth(READER))).result["resources"]
    assert [r["uri"] for r in resources] == [exposed_uri("a", "res://hello")]


async def test_discover_names_only_the_members_the_caller_may_see(
    http: aiohttp.ClientSession, gw: RunningGateway
) -> None:
    reader = (await agg(http, gw, "server/discover", headers=auth(READER))).result
    admin = (await agg(http, gw, "server/discover", headers=auth(ADMIN))).result
    assert "1 members: a." in reader["instructions"]
    assert "2 members: a, b." in admin["instructions"]


async def test_a_call_on_a_hidden_member_is_a_name_that_names_nothing_and_is_never_forwarded(
    http: aiohttp.ClientSession, gw: RunningGateway, public_up: Upstream, public_up_b: Upstream
) -> None:
    params: dict[str, Any] = {"arguments": {"a": 1, "b": 2}}
    hidden = await agg(http, gw, "tools/call", {"name": exposed("b", "add"), **params}, headers=auth(READER))
    nowhere = await agg(http, gw, "tools/call", {"name": exposed("zz", "add"), **params}, headers=auth(READER))
    assert hidden.status == nowhere.status == 400
    assert hidden.json["error"]["code"] == -32602
    assert hidden.json["error"]["message"] == nowhere.json["error"]["message"].replace("zz__", "b__")
    scoped = await agg(
        http, gw, "tools/call", {"name": exposed("a", "slow_progress"), "arguments": {}}, headers=auth(READER)
    )
    assert scoped.status == 403
    assert scoped.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope", scope="mcp:read mcp:admin"'
    read = await agg(http, gw, "resources/read", {"uri": exposed_uri("a", "res://café")}, headers=auth(READER))
    assert read.status == 403
    assert (await count(public_up, "tools/call"), await count(public_up_b, "tools/call")) == (0, 0)
    assert await count(public_up, "resources/read") == 0
    assert gw.registry.get_sample_value("mcp_gateway_auth_total", {"outcome": "denied"}) == 2
    allowed = await agg(http, gw, "tools/call", {"name": exposed("a", "add"), **params}, headers=auth(READER))
    assert allowed.status == 200 and await count(public_up, "tools/call") == 1


def test_a_listening_client_is_told_only_of_the_members_it_may_see() -> None:
    hub = ListenHub(["a", "b"], 10, 5.0)
    reader, admin = _Client(1, {"toolsListChanged"}, frozenset({"a"})), _Client(2, {"toolsListChanged"})
    hub.clients.update((reader, admin))
    hub.purged(Invalidation("b", ("tools/list",)), "notification")
    assert (reader.pending, admin.pending) == (set(), {"toolsListChanged"})
    hub.purged(Invalidation("a", ("tools/list",)), "notification")
    assert reader.pending == {"toolsListChanged"}
