"""Stale-if-error through ``POST /mcp``: a member's expired entry answers for it only while fetching
it fails. A JSON-RPC answer the member gave through ``/mcp`` (an error included, whatever its HTTP
status) is its newest word on the key, on ``/mcp`` and on its own route alike: once the member then
fails, its older entry is not served stale on either. Scripted members
(:class:`~tests.support.FakeUpstream`) and a fake clock.
"""

from __future__ import annotations

from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web

from ..support import FakeClock, FakeUpstream, RunningGateway, StartGateway, StartUpstream
from .conftest import agg, aggregate_config, exposed_uri, names
from .scripted import member, result_of, tools_result

pytestmark = pytest.mark.timeout(60)

#: The JSON-RPC error a member answers for what does not exist (resource not found).
GONE: Final = -32002
DOC: Final = "res://doc"


class Member:
    """What member ``m`` answers, as ``mode`` says: ``public`` (its list and ``DOC``, public,
    ttlMs 1000), ``gone`` (a :data:`GONE` error with HTTP ``gone_status``), ``down`` (503 HTML)."""

    def __init__(self) -> None:
        self.mode = "public"
        self.gone_status = 200

    async def answer(self, request: web.Request, msg: Any) -> web.StreamResponse:
        if self.mode == "down":
            return web.Response(status=503, text="<html>down</html>", content_type="text/html")
        if self.mode == "gone":
            gone = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": GONE, "message": "no such thing"}}
            return web.json_response(gone, status=self.gone_status)
        if msg["method"] == "tools/list":
            return result_of(msg, tools_result("old_public", ttl_ms=1_000))
        contents = [{"uri": DOC, "mimeType": "text/plain", "text": "old text"}]
        return result_of(msg, {"contents": contents, "resultType": "complete", "cacheScope": "public", "ttlMs": 1_000})


async def start(
    start_gateway: StartGateway, start_upstream: StartUpstream, fake_clock: FakeClock
) -> tuple[Member, FakeUpstream, RunningGateway]:
    """Members ``m`` (a :class:`Member`, stale_if_error_ms 600 s) and ``o`` behind a gateway."""
    m = Member()
    up = await start_upstream()
    up.handlers["tools/list"] = up.handlers["resources/read"] = m.answer
    other = await member(start_upstream, "ok")
    config = aggregate_config({"m": {"url": up.url, "stale_if_error_ms": 600_000}, "o": other.url})
    return m, up, await start_gateway(config, clock=fake_clock)


@pytest.mark.parametrize("http_status", [200, 500])
async def test_a_member_list_answered_gone_through_mcp_is_not_answered_stale_in_its_next_outage(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    fake_clock: FakeClock,
    http_status: int,
) -> None:
    m, up, gw = await start(start_gateway, start_upstream, fake_clock)
    assert names((await agg(http, gw, "tools/list")).result) == ["m__old_public", "o__ok"]
    fake_clock.advance(2)  # m's entry expired: kept for its stale window
    m.mode, m.gone_status = "gone", http_status
    gone = await agg(http, gw, "tools/list")  # m answers, with an error: left out
    assert names(gone.result) == ["o__ok"], gone.raw
    m.mode = "down"
    composed = await agg(http, gw, "tools/list")
    assert names(composed.result) == ["o__ok"], f"m's old list answered stale: {composed.cache_status}"
    own = await agg(http, gw.url("m"), "tools/list", id="own")
    assert own.status == 502, f"m's old list answered stale on its own route: {own.cache_status}"
    assert up.count("tools/list") == 4  # stored, gone, then one attempt on each route


@pytest.mark.parametrize("http_status", [200, 500])
async def test_a_read_answered_gone_through_mcp_is_not_answered_stale_in_the_members_next_outage(
    start_gateway: StartGateway,
    http: aiohttp.ClientSession,
    start_upstream: StartUpstream,
    fake_clock: FakeClock,
    http_status: int,
) -> None:
    m, up, gw = await start(start_gateway, start_upstream, fake_clock)
    uri = exposed_uri("m", DOC)
    first = await agg(http, gw, "resources/read", {"uri": uri})
    assert first.result["contents"][0]["text"] == "old text", first.raw
    fake_clock.advance(2)
    m.mode, m.gone_status = "gone", http_status
    gone = await agg(http, gw, "resources/read", {"uri": uri}, id="gone")
    assert (gone.status, gone.error["code"]) == (http_status, GONE), gone.raw  # relayed as it came
    m.mode = "down"
    again = await agg(http, gw, "resources/read", {"uri": uri}, id="again")
    assert again.status == 502, f"the withdrawn read answered stale: {again.cache_status}"
    own = await agg(http, gw.url("m"), "resources/read", {"uri": DOC}, id="own")
    assert own.status == 502, f"the withdrawn read answered stale on m's own route: {own.cache_status}"
    assert up.count("resources/read") == 4  # stored, gone, then one attempt on each route
