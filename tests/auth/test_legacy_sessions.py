"""Legacy (2025-11-25) sessions through a gateway with ``[auth]``: a session is used only by the
caller that opened it (a real SDK upstream serving both eras)."""

from __future__ import annotations

import json

import aiohttp

from ..support import StartGateway
from ..support.fleet import Upstream, fetch_counts, reset_counts
from ..support.wire import LEGACY_V

OPENER, OTHER = "opener-token-0123456789", "other-token-01234567890"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": LEGACY_V, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
BASE = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def test_a_legacy_session_answers_only_the_caller_that_opened_it(
    start_gateway: StartGateway, http: aiohttp.ClientSession, public_up: Upstream
) -> None:
    static = [{"token": OPENER, "subject": "opener"}, {"token": OTHER, "subject": "other"}]
    gw = await start_gateway({"auth": {"static": static}, "upstreams": {"pub": {"url": public_up.url}}})
    await reset_counts(public_up)
    async with http.post(
        gw.url("pub"), data=json.dumps(INITIALIZE), headers={**BASE, "Authorization": f"Bearer {OPENER}"}
    ) as resp:
        assert resp.status == 200
        session = resp.headers["Mcp-Session-Id"]
    in_session = {**BASE, "Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY_V}
    listing = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})

    async with http.post(gw.url("pub"), data=listing, headers={**in_session, "Authorization": f"Bearer {OTHER}"}) as r:
        assert r.status == 404 and (await r.json())["error"]["message"] == "Session not found"
    async with http.delete(gw.url("pub"), headers={**in_session, "Authorization": f"Bearer {OTHER}"}) as r:
        assert r.status == 404
    counts = await fetch_counts(public_up)
    assert counts.get("tools/list") is None and counts.get("<DELETE>") is None  # neither reached it

    async with http.post(gw.url("pub"), data=listing, headers={**in_session, "Authorization": f"Bearer {OPENER}"}) as r:
        assert r.status == 200 and '"tools"' in await r.text()  # JSON or SSE, as the upstream answers
    async with http.delete(gw.url("pub"), headers={**in_session, "Authorization": f"Bearer {OPENER}"}) as r:
        assert r.status < 300
