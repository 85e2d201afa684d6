"""Upstream MCP server (official SDK) whose tool list and one resource change at run time.

Usage: python tests/servers/changing_upstream.py PORT   -> http://127.0.0.1:PORT/mcp

Public cache hints (ttlMs = $UPSTREAM_TTL_MS, default 60000) and the same tools/resources/
template/prompt as public_upstream.py, plus the resource res://counter ("counter=N").
Serves `subscriptions/listen`, so server/discover declares tools/prompts/resources listChanged.

Extra test endpoints:
* POST /_add_tool        body optional {"name": "..."} (default "tool_1", "tool_2", ...):
                         registers a tool returning "<name> called" and publishes
                         notifications/tools/list_changed to subscriptions/listen streams.
                         Answers {"added": name, "tools": [all tool names]}.
* POST /_bump_resource   increments res://counter and publishes notifications/resources/updated
                         for it. Answers {"uri": "res://counter", "value": N}.
plus GET /_counts, POST /_counts/reset, GET /_requests (see _common.py).
"""

from __future__ import annotations

import json
from typing import Any

from _common import port_from_argv, serve, ttl_ms_from_env
from _features import build_server
from mcp.server.subscriptions import InMemorySubscriptionBus, ResourceUpdated, ToolsListChanged
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

COUNTER_URI = "res://counter"


def main() -> None:
    bus = InMemorySubscriptionBus()
    srv = build_server("changing-upstream", scope="public", ttl_ms=ttl_ms_from_env(), subscriptions=bus)
    state: dict[str, int] = {"added": 0, "counter": 0}

    @srv.resource(COUNTER_URI, name="counter", mime_type="text/plain")
    def counter() -> str:
        return f"counter={state['counter']}"

    async def add_tool(request: Request) -> Response:
        raw = await request.body()
        body: Any = json.loads(raw) if raw.strip() else {}
        state["added"] += 1
        name = body.get("name") if isinstance(body, dict) and body.get("name") else f"tool_{state['added']}"

        def added_tool() -> str:
            return f"{name} called"

        srv.add_tool(added_tool, name=name, description=f"Tool {name} added at run time.")
        await bus.publish(ToolsListChanged())
        tools = [t.name for t in await srv.list_tools()]
        return JSONResponse({"added": name, "tools": tools})

    async def bump_resource(request: Request) -> Response:
        state["counter"] += 1
        await bus.publish(ResourceUpdated(uri=COUNTER_URI))
        return JSONResponse({"uri": COUNTER_URI, "value": state["counter"]})

    # (called, not used as decorators: the SDK's custom_route is untyped)
    srv.custom_route("/_add_tool", methods=["POST"])(add_tool)
    srv.custom_route("/_bump_resource", methods=["POST"])(bump_resource)
    serve(srv, port_from_argv())


if __name__ == "__main__":
    main()
