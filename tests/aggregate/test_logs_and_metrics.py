"""``POST /mcp`` against what operators see of its members: a member answering a 1 MB error
message, and members reached only through ``/mcp``.

What must hold: log volume is bounded whatever a member sends (a member's text is cut short
in the log line); the requests ``/mcp`` sends to its members are counted in
``mcp_gateway_upstream_request_duration_seconds`` like the per-upstream route's, so a member
reached only through ``/mcp`` still shows its traffic (docs/aggregate.md "Metrics and logs").
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.app import PROXY, STORE

from ..support import StartGateway, StartUpstream
from ..support.fleet import Upstream
from ..support.telemetry import cache_sizes
from .conftest import agg, aggregate_config, names
from .scripted import member

pytestmark = pytest.mark.timeout(60)


async def test_a_members_long_error_message_is_not_logged_whole(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Log volume is bounded: a member's JSON-RPC error.message is cut short in the line that says
    # it was left out, as a caller's strings are. Written whole, a member answering a 1 MB error
    # message would make the gateway write a 1 MB log line (and put ~1 MB per member into the 502
    # answer when every member fails).
    good = await member(start_upstream, "ok")
    bad = await start_upstream()

    async def error(request: web.Request, msg: Any) -> web.StreamResponse:
        return web.json_response(
            {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": "x" * 1_000_000}}
        )

    bad.handlers["tools/list"] = error
    gw = await start_gateway(aggregate_config({"g": good.url, "b": bad.url}))
    with caplog.at_level(logging.INFO, logger="mcp_gateway.aggregate"):
        reply = await agg(http, gw, "tools/list")
    assert reply.status == 200 and names(reply.result) == ["g__ok"]
    longest = max((len(r.getMessage()) for r in caplog.records if r.name == "mcp_gateway.aggregate"), default=0)
    assert 0 < longest < 2_000, f"a log line of {longest} characters"


async def test_the_requests_mcp_sends_to_members_are_counted_in_the_upstream_durations(
    start_gateway: StartGateway, http: aiohttp.ClientSession, start_upstream: StartUpstream
) -> None:
    # docs/metrics.md "Metrics": mcp_gateway_upstream_request_duration_seconds is "time the
    # upstream took". A /mcp list that asks its members (Cache-Status fwd=miss) sends them requests
    # of their own: each is counted, as the per-upstream route counts one per request, so that a
    # member reached only through /mcp does not show as having no upstream traffic at all.
    a, b = await member(start_upstream, "ta"), await member(start_upstream, "tb")
    gw = await start_gateway(aggregate_config({"a": a.url, "b": b.url}, cache={"max_entries": 0}))
    for i in range(3):
        reply = await agg(http, gw, "tools/list", id=i)
        assert reply.status == 200 and "fwd=miss" in reply.cache_status
    assert a.count("tools/list") == b.count("tools/list") == 3
    assert (await agg(http, gw.url("a"), "tools/list")).status == 200  # the control: one on a's own route

    def counted(upstream: str) -> float:
        gw.app[PROXY].pipeline.journal.drain()
        labels = {"upstream": upstream, "method": "tools/list"}
        value = gw.registry.get_sample_value("mcp_gateway_upstream_request_duration_seconds_count", labels)
        return value or 0.0

    assert counted("a") >= 1  # the per-upstream request is counted
    by_mcp = counted("a") + counted("b") + counted("/mcp") - 1
    assert by_mcp >= 3, f"6 member requests made by 3 /mcp lists; the upstream histogram counts {by_mcp:g}"


async def test_a_composed_answer_stored_shows_in_the_cache_size_gauges_without_a_push(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    # docs/metrics.md: the size gauges are the entries and bytes stored, /mcp's composed answers
    # among them, whatever stored them.
    gw = await start_gateway(aggregate_config({"a": public_up.url}))
    reply = await agg(http, gw, "tools/list")
    assert reply.status == 200
    store = gw.app[STORE]
    assert len(store) == 2  # the member's page and the composed answer
    assert cache_sizes(gw.registry) == (2, store.total_bytes)
