"""``subscriptions/listen`` on ``POST /mcp``: served from the gateway's own listen streams to the
members (the registry on), so a change of one member's list reaches every listening client.

``changing_up`` (``tests/servers/changing_upstream.py``) adds a tool when asked (``add_tool``) and
publishes ``notifications/tools/list_changed`` on its listen streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.app import REGISTRY

from ..support import RunningGateway, StartGateway, mcp_headers, sse_events
from ..support.fleet import Upstream, add_tool, fetch_counts
from .conftest import FAST_REGISTRY, agg, agg_url, aggregate_config, body_of, eventually, names, reset

pytestmark = pytest.mark.timeout(60)

SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
WAIT_S = 10.0


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


class Listening:
    """One client's open ``subscriptions/listen`` stream on ``/mcp``, read as events arrive."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.buf = b""
        self.read = 0

    async def next(self, timeout_s: float = WAIT_S) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while True:
                events = sse_events(self.buf, at_eof=False)
                if len(events) > self.read:
                    self.read += 1
                    return dict(json.loads(events[self.read - 1]))
                chunk = await self.resp.content.readany()
                if not chunk:
                    raise AssertionError(f"the listen stream ended; it said {self.buf!r}")
                self.buf += chunk

    async def next_of(self, method: str, timeout_s: float = WAIT_S) -> dict[str, Any]:
        """The next message of ``method`` (keep-alives and other notifications skipped)."""
        async with asyncio.timeout(timeout_s):
            while True:
                msg = await self.next(timeout_s)
                if msg.get("method") == method:
                    return msg


@contextlib.asynccontextmanager
async def listen(
    http: aiohttp.ClientSession, gw: RunningGateway, request_id: Any, notifications: dict[str, Any]
) -> AsyncIterator[Listening]:
    body = json.dumps(body_of("subscriptions/listen", {"notifications": notifications}, id=request_id)).encode()
    async with asyncio.timeout(WAIT_S):
        resp = await http.post(agg_url(gw), data=body, headers=mcp_headers("subscriptions/listen"))
    try:
        assert resp.status == 200, await resp.read()
        assert resp.content_type == "text/event-stream"
        yield Listening(resp)
    finally:
        resp.close()


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream, changing_up: Upstream) -> AsyncIterator[RunningGateway]:
    """Members ``a`` (public_up) and ``c`` (changing_up), the registry on; returned once the
    gateway's own listen stream to ``c`` is acknowledged."""
    await reset(public_up, changing_up)
    running = await start_gateway(aggregate_config({"a": public_up, "c": changing_up}, registry=FAST_REGISTRY))
    state = running.app[REGISTRY].state

    async def listening() -> bool:
        return state.upstreams["c"].listen.state == "acknowledged"

    await eventually(listening, limit_s=WAIT_S, what="the gateway's listen stream to c")
    yield running


async def test_a_listen_client_is_acknowledged_first_then_told_of_a_tool_added_to_one_member(
    gw: RunningGateway, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    before = await agg(http, gw, "tools/list")
    assert before.status == 200
    upstream_listens = (await fetch_counts(changing_up)).get("subscriptions/listen", 0)

    async with listen(http, gw, "listen-1", {"toolsListChanged": True}) as stream:
        ack = await stream.next()
        assert ack["method"] == "notifications/subscriptions/acknowledged", ack
        assert ack["params"]["_meta"][SUBSCRIPTION_ID] == "listen-1"
        assert ack["params"]["notifications"] == {"toolsListChanged": True}

        added = (await add_tool(changing_up, unique("agg_tool")))["added"]
        changed = await stream.next_of("notifications/tools/list_changed")
        assert changed["params"]["_meta"][SUBSCRIPTION_ID] == "listen-1"

    after = await agg(http, gw, "tools/list")
    assert f"c__{added}" in names(after.result)
    assert f"c__{added}" not in names(before.result)
    # no upstream stream opened for the client: the gateway's own one carried the change
    assert (await fetch_counts(changing_up)).get("subscriptions/listen", 0) == upstream_listens


async def test_every_listening_client_that_asked_for_tools_is_told_and_only_those(
    gw: RunningGateway, http: aiohttp.ClientSession, changing_up: Upstream
) -> None:
    async with (
        listen(http, gw, 1, {"toolsListChanged": True}) as first,
        listen(http, gw, "two", {"toolsListChanged": True, "promptsListChanged": True}) as second,
        listen(http, gw, 3, {"promptsListChanged": True}) as prompts_only,
    ):
        for stream in (first, second, prompts_only):
            assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        await add_tool(changing_up, unique("agg_tool"))
        told = [await s.next_of("notifications/tools/list_changed") for s in (first, second)]
        assert [t["params"]["_meta"][SUBSCRIPTION_ID] for t in told] == [1, "two"]
        with pytest.raises(TimeoutError):
            await prompts_only.next_of("notifications/tools/list_changed", timeout_s=1.5)


async def test_the_acknowledgement_leaves_out_resource_subscriptions(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    asked = {
        "toolsListChanged": True,
        "resourcesListChanged": True,
        "resourceSubscriptions": ["mcp-gateway:c/res://counter"],
    }
    async with listen(http, gw, "r", asked) as stream:
        ack = await stream.next()
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["notifications"] == {"toolsListChanged": True, "resourcesListChanged": True}


async def test_listen_streams_past_max_listen_streams_are_503(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream, changing_up: Upstream
) -> None:
    gw = await start_gateway(
        aggregate_config({"a": public_up, "c": changing_up}, {"max_listen_streams": 1}, registry=FAST_REGISTRY)
    )
    async with listen(http, gw, "only", {"toolsListChanged": True}) as stream:
        assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        body = json.dumps(body_of("subscriptions/listen", {"notifications": {"toolsListChanged": True}}, id="x"))
        async with asyncio.timeout(WAIT_S):
            async with http.post(agg_url(gw), data=body, headers=mcp_headers("subscriptions/listen")) as resp:
                assert resp.status == 503
                msg = await resp.json()
        assert msg["id"] == "x" and isinstance(msg["error"]["code"], int)


async def test_on_shutdown_every_open_stream_ends_with_the_listen_result(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with listen(http, gw, "bye", {"toolsListChanged": True}) as stream:
        assert (await stream.next())["method"] == "notifications/subscriptions/acknowledged"
        closing = asyncio.create_task(gw.server.close())  # on_shutdown ends the streams
        try:
            final = await stream.next()
        finally:
            await closing
        # MCP 2026-07-28, basic/patterns/subscriptions: a graceful end is the listen request's result.
        assert final == {
            "jsonrpc": "2.0",
            "id": "bye",
            "result": {"resultType": "complete", "_meta": {SUBSCRIPTION_ID: "bye"}},
        }
