"""``POST /mcp``: answers of calls relayed as on the per-upstream route (SSE progress, -32021,
``input_required`` and its retry), to the member the exposed name belongs to."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import mcp_types as types
import pytest
from mcp import Client

from ..support import RunningGateway, StartGateway, V, mcp_headers, sse_events
from ..support.fleet import Upstream, fetch_requests
from .conftest import (
    CONFIRM_KEY,
    ELICIT_CAPS,
    REQUEST_TIMEOUT_S,
    agg,
    agg_url,
    aggregate_config,
    body_of,
    count,
    post,
    reset,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def gw(start_gateway: StartGateway, public_up: Upstream, public_up_b: Upstream) -> RunningGateway:
    await reset(public_up, public_up_b)
    return await start_gateway(aggregate_config({"a": public_up, "b": public_up_b}))


# -- progress ----------------------------------------------------------------------------------------


async def test_progress_notifications_of_a_call_stream_before_its_result_as_they_happen(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    params = {"name": "b__slow_progress", "arguments": {"steps": 3, "delay_ms": 200}}
    body = json.dumps(body_of("tools/call", params, id=9, meta={"progressToken": "tok-9"})).encode()
    loop = asyncio.get_running_loop()
    arrivals: list[tuple[float, dict[str, Any]]] = []
    async with asyncio.timeout(REQUEST_TIMEOUT_S):
        async with http.post(agg_url(gw), data=body, headers=mcp_headers("tools/call", "b__slow_progress")) as resp:
            assert resp.status == 200, await resp.read()
            assert resp.content_type == "text/event-stream"
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                events = sse_events(buf, at_eof=False)
                arrivals.extend((loop.time(), json.loads(e)) for e in events[len(arrivals) :])
    messages = [m for _, m in arrivals]
    assert [m.get("method") for m in messages] == ["notifications/progress"] * 3 + [None]
    assert [m["params"]["progress"] for m in messages[:3]] == [1, 2, 3]
    assert all(m["params"]["progressToken"] == "tok-9" for m in messages[:3])
    assert messages[-1]["id"] == 9
    assert messages[-1]["result"]["structuredContent"] == {"result": "done after 3 steps"}
    # progress 1 at t=0, the result at t~0.6 s: a relay that buffers shows no gap
    assert arrivals[-1][0] - arrivals[0][0] >= 0.3
    assert await count(public_up_b, "tools/call") == 1
    assert await count(public_up, "tools/call") == 0


async def test_the_sdk_client_gets_progress_callbacks_through_the_aggregate(
    gw: RunningGateway, public_up: Upstream
) -> None:
    seen: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total))

    async with Client(agg_url(gw), mode=V, cache=None) as c:
        result = await c.call_tool("a__slow_progress", {"steps": 3, "delay_ms": 20}, progress_callback=on_progress)
    assert result.structured_content == {"result": "done after 3 steps"}
    assert seen == [(1, 3), (2, 3), (3, 3)]


# -- form elicitation and MRTR -----------------------------------------------------------------------

CONFIRM = {"name": "confirm_action", "arguments": {"action": "deploy"}}
EXPOSED_CONFIRM = {**CONFIRM, "name": "a__confirm_action"}


async def test_32021_of_a_member_is_relayed_intact(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    direct = await agg(http, public_up.url, "tools/call", CONFIRM, id=5)
    assert direct.status == 400 and direct.error["code"] == -32021
    for _ in range(2):
        reply = await agg(http, gw, "tools/call", EXPOSED_CONFIRM, id=5)
        assert reply.status == 400, reply.raw
        assert reply.json == direct.json  # id, code, message and data as the member said them
        assert not reply.cache_hit
    assert await count(public_up, "tools/call") == 3


async def test_an_input_required_round_trip_through_the_aggregate(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream, public_up_b: Upstream
) -> None:
    direct = await agg(http, public_up.url, "tools/call", CONFIRM, id=1, caps=ELICIT_CAPS)
    first = await agg(http, gw, "tools/call", EXPOSED_CONFIRM, id=1, caps=ELICIT_CAPS)
    assert first.status == 200, first.raw
    assert first.json["id"] == 1
    result = first.result
    assert result["resultType"] == "input_required"
    state = result.pop("requestState")
    assert isinstance(state, str) and state
    expected = direct.result
    expected.pop("requestState")
    assert result == expected  # the member's inputRequests, unchanged
    assert CONFIRM_KEY in result["inputRequests"]
    assert not first.cache_hit

    retry = {
        **EXPOSED_CONFIRM,
        "inputResponses": {CONFIRM_KEY: {"action": "accept", "content": {"confirm": True}}},
        "requestState": state,
    }
    done = await agg(http, gw, "tools/call", retry, id=2, caps=ELICIT_CAPS)
    assert done.status == 200, done.raw
    assert done.json["id"] == 2
    assert done.result["resultType"] == "complete"
    assert done.result["structuredContent"] == {"result": "deploy: confirmed"}
    calls = [r.json()["params"] for r in await fetch_requests(public_up) if r.method == "tools/call"]
    assert len(calls) == 3  # direct, first, retry
    assert calls[2]["name"] == "confirm_action"
    assert calls[2]["requestState"] == state  # the state the member minted, back to it unchanged
    assert calls[2]["inputResponses"] == retry["inputResponses"]
    assert await count(public_up_b, "tools/call") == 0


async def test_the_sdk_client_answers_an_elicitation_through_the_aggregate(
    gw: RunningGateway, public_up: Upstream, public_up_b: Upstream
) -> None:
    asked: list[str] = []

    async def on_elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"confirm": False})

    async with Client(agg_url(gw), mode=V, cache=None, elicitation_callback=on_elicit) as c:
        result = await c.call_tool("b__confirm_action", {"action": "drop"})
    assert len(asked) == 1
    assert result.structured_content == {"result": "drop: not confirmed"}
    assert await count(public_up_b, "tools/call") == 2
    assert await count(public_up, "tools/call") == 0


async def test_a_call_the_member_refuses_is_relayed_with_the_callers_id(
    gw: RunningGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    # A tool the member does not have: its own answer, not the gateway's -32602.
    body = json.dumps(body_of("tools/call", {"name": "a__no_such_tool", "arguments": {}}, id="nst")).encode()
    reply = await post(http, agg_url(gw), body, mcp_headers("tools/call", "a__no_such_tool"))
    direct_body = json.dumps(body_of("tools/call", {"name": "no_such_tool", "arguments": {}}, id="nst")).encode()
    direct = await post(http, public_up.url, direct_body, mcp_headers("tools/call", "no_such_tool"))
    assert (reply.status, reply.json) == (direct.status, direct.json)
    assert await count(public_up, "tools/call") == 2
